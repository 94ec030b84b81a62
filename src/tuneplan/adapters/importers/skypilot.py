"""SkyPilot catalog ``vms.csv`` text -> offers (schemas v6-v8; columns are read by name).

Pure parsing of text already read (the bundled snapshot and the live refresh both use it).
Quirks handled (see data/skypilot_snapshot/README.md): fractional GPUs rejected; vast.ai's
0.00 spot price is a placeholder (dropped); GCP accelerator rows are priced without their host
VM: joined with the host row of the same zone where one is listed, else kept as
``attachable=True`` offers whose price covers the GPUs only.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.adapters.importers.base import ImportResult
from tuneplan.adapters.importers.validation import (
    OfferCollector,
    PayloadError,
    RowRejected,
    read_name,
    read_number,
    read_price,
)
from tuneplan.core.catalog.gpu_names import GPU_ALIASES, gpu_name_key
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name, normalise_provider_name
from tuneplan.core.catalog.providers import resold_provider_name
from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB, MiB

_REQUIRED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "Region")
# Clouds whose GpuInfo MemoryInfo holds the total over all GPUs, not per GPU.
_TOTAL_MEMORY_CLOUDS = frozenset({"vast", "primeintellect"})
# Source names whose bare GPU name means the PCIe card (RunPod lists SXM/NVL separately).
_PCIE_BY_DEFAULT = frozenset({"runpod"})
# Aggregators whose instance names start with the cloud that runs the machine, and the
# separator after that prefix (Shadeform ``scaleway_H100x2``, Prime Intellect
# ``datacrunch__8xH100_80GB__176__1480``): their offers are ``<cloud> (via <aggregator>)``.
_RESELLER_PREFIX = {"shadeform": "_", "primeintellect": "__"}
# Aggregators that name the cloud running the machine in a column instead (Spheron
# ``Provider``: ``sesterce``, ``data-crunch``; ``spheron-ai`` is Spheron's own).
_RESELLER_COLUMN = {"spheron": ("Provider", "spheronai")}
# Spheron's AcceleratorName carries the form factor, memory and product variant:
# ``H100_PCIE_BAREMETAL``, ``A100_80G_SXM4``, ``A6000_PCIE_LOW_RAM`` -> H100 / A100 / A6000
# (the form factor still reaches ``_gpu`` through the GpuInfo name, the memory through
# its MiB; bare metal, "high perf" and "low RAM" are machine variants, not GPUs).
_SPHERON_SUFFIXES = re.compile(r"(?:_(?:BAREMETAL|HIGH_PERF|LOW_RAM))*$")
_SPHERON_FORM = re.compile(r"(?:_\d+G)?(?:_(?:PCIE|SXM\d?|NVL))?$")
# Known errors in the source: (cloud, instance type) -> real GPU count, with the reason.
_COUNT_FIXES = {("azure", "Standard_ND96isr_H100_v5"): (8, "source says 12 GPUs; the ND96isr "
                                                        "H100 v5 size has 8 (Azure docs)")}
# GCP host VM for an accelerator row: (SkyPilot name, count) -> machine type.
_GCP_HOSTS: dict[tuple[str, int], str] = {
    **{("A100", n): f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)}, ("A100", 16): "a2-megagpu-16g",
    **{("A100-80GB", n): f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)},
    **{("H100", n): f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)}, ("H100-MEGA", 8): "a3-megagpu-8g",
    ("H200", 8): "a3-ultragpu-8g", ("B200", 8): "a4-highgpu-8g",
}


def parse_skypilot_csv(text: str, cloud: str, fetched_at: datetime, source: str) -> ImportResult:
    """Offers from one SkyPilot ``vms.csv``; ``cloud`` is SkyPilot's cloud name (``aws``).

    Every row becomes an offer, an unknown GPU name, or a rejected row ``"line N: why"``.
    CPU-only rows (no accelerator) are skipped, except GCP host VMs, which are joined with
    accelerator rows. Raises PayloadError when required columns are missing.
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or ())]
    if missing:
        raise PayloadError(f"{source}: not a SkyPilot vms.csv (missing columns {missing})")
    hosts: dict[tuple[str, str], dict[str, str]] = {}
    rows: list[tuple[int, dict[str, str]]] = []
    for row in reader:
        if cloud == "gcp" and row.get("InstanceType") and not row.get("AcceleratorName"):
            hosts[(row["InstanceType"], row.get("AvailabilityZone") or "")] = row
        else:
            rows.append((reader.line_num, row))
    collector = OfferCollector()
    for line, row in rows:
        collector.add(f"line {line}", partial(_offer, row, hosts, cloud, fetched_at, source))
    return collector.result()


def _gcp_host(row: dict[str, str], count: int, hosts: dict[tuple[str, str], dict[str, str]]
              ) -> dict[str, str] | None:
    machine = _GCP_HOSTS.get(((row.get("AcceleratorName") or "").strip(), count))
    return hosts.get((machine, row.get("AvailabilityZone") or "")) if machine else None


def _offer(row: dict[str, str], hosts: dict[tuple[str, str], dict[str, str]], cloud: str,
           fetched_at: datetime, source: str) -> Offer | None:
    raw_name = (row.get("AcceleratorName") or "").strip()
    instance = (row.get("InstanceType") or "").strip()
    if not raw_name:
        if instance and not (row.get("Price") or "").strip():
            raise RowRejected(f"{instance}: no accelerator and no price")
        raise RowRejected(f"{instance or 'row'}: no accelerator name")
    count, notes = _count(row, cloud, instance)
    host = _gcp_host(row, count, hosts) if cloud == "gcp" else None
    gpu = _gpu(raw_name, instance, row.get("GpuInfo"), cloud, count)
    price, spot, price_notes = _prices(row, host, cloud)
    spec = load_gpu_spec(gpu)
    multi_link = count > 1 and any(f in spec.form_factor for f in ("SXM", "OAM", "Superchip"))
    source_host = host or row
    provider, via_note = _provider(cloud, instance, row)
    notes.append(via_note)
    return Offer(
        provider=provider,
        instance_type=host["InstanceType"] if host else instance,
        gpu=gpu, gpu_count=count, gpu_memory_bytes=spec.memory_bytes,
        vcpus=read_number(source_host.get("vCPUs"), "vCPUs"),
        ram_bytes=_gib(source_host.get("MemoryGiB"), "MemoryGiB"),
        disk_bytes=_gib(row.get("StorageGiB"), "StorageGiB"),
        region=read_name(row.get("Region"), "Region") if _has(row, "Region") else "unknown",
        zone=(row.get("AvailabilityZone") or "").strip() or None,
        price_per_hour=price, spot_price_per_hour=spot,
        interconnect=spec.interconnect if multi_link else None,
        fetched_at=fetched_at, source=source,
        attachable=cloud == "gcp" and not instance and host is None,
        notes="; ".join(n for n in (*notes, *price_notes) if n)
        + ("" if _has(row, "Region") else "; the source gives no region"),
    )


def _provider(cloud: str, instance: str, row: dict[str, str]) -> tuple[str, str]:
    """(provider, note): the cloud itself, or for an aggregator's row the cloud named by the
    instance-name prefix or the provider column, resold (``Scaleway (via Shadeform)``); a row
    naming no other cloud stays the aggregator's own."""
    own = normalise_provider_name(cloud.removesuffix("_v7"))
    separator = _RESELLER_PREFIX.get(cloud)
    upstream, found, _ = instance.partition(separator) if separator else ("", "", "")
    if cloud in _RESELLER_COLUMN:
        column, own_key = _RESELLER_COLUMN[cloud]
        upstream = (row.get(column) or "").strip()
        found = "" if re.sub(r"[^a-z0-9]", "", upstream.lower()) == own_key else column
    if not found or not upstream.strip():
        return own, ""
    return resold_provider_name(upstream, own), (
        f"sold through {own} (aggregator): the machine is {normalise_provider_name(upstream)}'s,"
        f" the price and rental terms are {own}'s")


def row_gpu(row: dict[str, str], cloud: str) -> str | None:
    """The canonical GPU of one catalog row, as ``parse_skypilot_csv`` names it; None for a
    row without a (whole, known) accelerator."""
    raw = (row.get("AcceleratorName") or "").strip()
    if not raw:
        return None
    instance = (row.get("InstanceType") or "").strip()
    try:
        count, _ = _count(row, cloud, instance)
        return _gpu(raw, instance, row.get("GpuInfo"), cloud, count)
    except (RowRejected, UnknownGpuError):
        return None


def _count(row: dict[str, str], cloud: str, instance: str) -> tuple[int, list[str]]:
    text = (row.get("AcceleratorCount") or "").strip()
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        raise RowRejected(f"AcceleratorCount {text[:20]!r} is not a number") from exc
    if not number.is_finite() or number < 1 or number != number.to_integral_value():
        raise RowRejected(f"fractional or zero GPU count {text} ({instance}): not supported")
    fix = _COUNT_FIXES.get((cloud, instance))
    if fix:
        return fix[0], [fix[1]]
    return int(number), []


def _gpu(raw: str, instance: str, gpu_info: str | None, cloud: str, count: int) -> str:
    info_name, memory = _gpu_info(gpu_info, cloud, count)
    if cloud == "spheron":
        raw = _SPHERON_FORM.sub("", _SPHERON_SUFFIXES.sub("", raw)) or raw
    hints = f"{instance} {info_name}".lower()
    for word, suffix in (("pcie", " PCIe"), ("nvl", " NVL"), ("sxm", " SXM")):
        if word in hints or (suffix == " PCIe" and cloud.removesuffix("_v7") in _PCIE_BY_DEFAULT):
            candidate = f"{raw}{suffix}"
            if gpu_name_key(candidate) in GPU_ALIASES and gpu_name_key(raw) not in _EXPLICIT:
                return normalise_gpu_name(candidate, memory)
    return normalise_gpu_name(raw, memory)


# Names that already say their form factor; an instance-name hint must not override them.
_EXPLICIT = frozenset({"a10080gbsxm", "h100sxm", "h100nvl", "h200sxm", "h10080gpcie",
                       "h10080gsxm5", "a10080gpcie", "h10080gpcienvlink", "a10080gpcienvlink",
                       "h100mega"})


def _gpu_info(text: str | None, cloud: str, count: int) -> tuple[str, int | None]:
    """GPU name and per-GPU memory (bytes) from the GpuInfo literal; quirks per source."""
    if not text or not text.strip().startswith("{"):
        return "", None
    try:
        info: Any = json.loads(text) if '"' in text[:3] else ast.literal_eval(text)
        gpu = info["Gpus"][0]
        mib = float(gpu.get("MemoryInfo", {}).get("SizeInMiB") or 0)
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError, AttributeError):
        return "", None
    if cloud in _TOTAL_MEMORY_CLOUDS and count > 1:
        mib /= count
    if 0 < mib < 1024:  # GB written in the MiB field (Shadeform, RunPod)
        mib *= 1024
    return str(gpu.get("Name") or ""), int(mib * MiB) if mib > 0 else None


def _prices(row: dict[str, str], host: dict[str, str] | None, cloud: str
            ) -> tuple[Decimal | None, Decimal | None, list[str]]:
    if cloud == "mithril":
        raise RowRejected("Mithril is an auction market: its 1.0/8.0 prices are placeholders")
    notes: list[str] = []
    price = read_price(row.get("Price"), "Price")
    spot_text = (row.get("SpotPrice") or "").strip()
    if _is_zero(spot_text):
        spot = None
        notes.append("source spot price 0.00 is a placeholder: dropped")
    else:
        spot = read_price(spot_text, "SpotPrice")
    if cloud == "runpod_v7" and spot is not None:
        spot = None
        notes.append("v7 SpotPrice dropped: it matches RunPod's community on-demand price")
    if host is not None:
        host_price = read_price(host.get("Price"), "host Price")
        host_spot = read_price(host.get("SpotPrice"), "host SpotPrice")
        price = None if price is None or host_price is None else price + host_price
        spot = None if spot is None or host_spot is None else spot + host_spot
        notes.append(f"GCP: host VM {host['InstanceType']} + GPU price")
    elif cloud == "gcp" and not (row.get("InstanceType") or "").strip():
        notes.append("GPU only: the price excludes the host VM (add an N1/G2/A3 machine type)")
    if price is not None and spot is not None and spot >= price:
        notes.append("spot price >= on-demand in the source")
    return price, spot, notes


def _has(row: dict[str, str], column: str) -> bool:
    return bool((row.get(column) or "").strip())


def _is_zero(text: str) -> bool:
    try:
        return bool(text) and Decimal(text) == 0
    except InvalidOperation:
        return False


def _gib(value: str | None, label: str) -> int | None:
    number = read_number(value, label)
    return None if number is None else round(number * GiB)
