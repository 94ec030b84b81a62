"""GPU specifications: memory in exact bytes, bandwidth, dense FLOP/s per precision, links.

Pure: ``parse_gpu_specs`` takes the text of ``gpu_specs.csv`` (the adapter
``adapters.bundled.load_gpu_specs`` reads the bundled file). Blank cells stay None.

Memory: ``memory_bytes`` = ``vram_gb`` x 2^30. GPU vendors' "GB" counts binary capacity (an
A100 80GB reports exactly 81,920 MiB = 80 GiB); ``memory_label`` keeps the marketing text.
``device_memory_bytes`` is what CUDA reports as total where it is known (H100 80GB reports
81,559 MiB = 85,520,809,984 bytes: ECC and the driver take the rest); ``usable_memory_bytes``
prefers it. Offers carry ``memory_bytes``.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from tuneplan.errors import CatalogError
from tuneplan.units import GB, TERA, GiB, MiB

# Total memory as reported by the device (nvidia-smi / cudaMemGetInfo total), MiB, with where
# it was seen. Only values observed in a listing are here; the rest fall back to memory_bytes.
DEVICE_REPORTED_MIB: dict[str, tuple[int, str]] = {
    "H100 SXM5": (81_559, "Hyperbolic offer GpuInfo 'NVIDIA-H100-80GB-HBM3' (SkyPilot v8)"),
    "H200 SXM": (143_771, "vast.ai offer GpuInfo (SkyPilot v8 vast.csv)"),
    "B200 (HGX)": (183_359, "AWS p6-b200 GpuInfo (SkyPilot v8 aws.csv)"),
    "B300 (HGX)": (275_040, "AWS p6-b300 GpuInfo (SkyPilot v8 aws.csv)"),
    "RTX 5090": (32_607, "Yotta offer GpuInfo (SkyPilot v8 yotta.csv)"),
    "RTX PRO 6000 Blackwell": (97_887, "vast.ai offer GpuInfo (SkyPilot v8 vast.csv)"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator SKU. Rates are dense (no sparsity) peaks; None = not published/unknown."""

    name: str
    vendor: str
    architecture: str
    form_factor: str
    memory_label: str
    memory_bytes: int
    device_memory_bytes: int | None
    memory_type: str | None
    memory_bandwidth_bytes_per_s: int | None
    fp32_flops_per_s: float | None
    tf32_flops_per_s: float | None
    bf16_flops_per_s: float | None
    fp8_flops_per_s: float | None
    int8_ops_per_s: float | None
    fp4_flops_per_s: float | None
    supports_bf16: bool | None
    supports_fp8: bool | None
    interconnect: str | None
    interconnect_bytes_per_s: int | None
    pcie_gen: int | None
    tdp_w: int | None
    compute_capability: str | None
    confidence: str
    notes: str
    source: str

    @property
    def generation(self) -> str:
        """Generation word the memory model keys its constants by (CUDA context, workspaces):
        the architecture's first word, lower case (``hopper``), or ``default``."""
        words = self.architecture.split()
        return words[0].lower() if words else "default"

    @property
    def usable_memory_bytes(self) -> int:
        """Device-reported total when known, else the nominal ``memory_bytes``."""
        return self.device_memory_bytes or self.memory_bytes

    @property
    def is_hbm(self) -> bool:
        """HBM (stacked) memory rather than GDDR."""
        return (self.memory_type or "").upper().startswith("HBM")


_REQUIRED = ("gpu", "vendor", "vram_gb", "memory_type", "source")


def _number(row: dict[str, str], column: str, scale: int, problems: list[str]) -> float | None:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        problems.append(f"{row.get('gpu')}: {column}={text!r} is not a number")
        return None
    if not value.is_finite() or value <= 0:
        problems.append(f"{row.get('gpu')}: {column}={text!r} must be > 0")
        return None
    return float(value * scale)


def _flag(text: str | None) -> bool | None:
    lowered = (text or "").strip().lower()
    return True if lowered == "yes" else False if lowered == "no" else None


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else round(value)


def _spec_from_row(row: dict[str, str], problems: list[str]) -> GpuSpec | None:
    name = (row.get("gpu") or "").strip()
    vram = _number(row, "vram_gb", 1, problems)
    if not name or vram is None:
        problems.append(f"row {name or '?'}: needs gpu and vram_gb")
        return None
    memory_bytes = int(Decimal(row["vram_gb"].strip()) * GiB)
    reported = DEVICE_REPORTED_MIB.get(name)
    link = (row.get("gpu_interconnect") or "").strip()
    pcie = _number(row, "pcie_gen", 1, problems)
    return GpuSpec(
        name=name, vendor=row["vendor"].strip(),
        architecture=(row.get("architecture") or "").strip(),
        form_factor=(row.get("form_factor") or "").strip(),
        memory_label=f"{row['vram_gb'].strip()} GB", memory_bytes=memory_bytes,
        device_memory_bytes=None if reported is None else reported[0] * MiB,
        memory_type=(row.get("memory_type") or "").strip() or None,
        memory_bandwidth_bytes_per_s=_int_or_none(_number(row, "mem_bw_gbs", GB, problems)),
        fp32_flops_per_s=_number(row, "fp32_tflops", TERA, problems),
        tf32_flops_per_s=_number(row, "tf32_tensor_tflops_dense", TERA, problems),
        bf16_flops_per_s=_number(row, "fp16_bf16_tensor_tflops_dense", TERA, problems),
        fp8_flops_per_s=_number(row, "fp8_tensor_tflops_dense", TERA, problems),
        int8_ops_per_s=_number(row, "int8_tensor_tops_dense", TERA, problems),
        fp4_flops_per_s=_number(row, "fp4_tensor_tflops_dense", TERA, problems),
        supports_bf16=_flag(row.get("bf16_tensor")), supports_fp8=_flag(row.get("fp8_tensor")),
        interconnect=None if link.lower() in ("", "none") else link,
        interconnect_bytes_per_s=_int_or_none(
            _number(row, "interconnect_gbs_per_gpu", GB, problems)),
        pcie_gen=_int_or_none(pcie), tdp_w=_int_or_none(_number(row, "tdp_w", 1, problems)),
        compute_capability=(row.get("compute_capability") or "").strip() or None,
        confidence=(row.get("confidence") or "").strip() or "unknown",
        notes=(row.get("notes") or "").strip(), source=row["source"].strip(),
    )


def parse_gpu_specs(text: str) -> tuple[GpuSpec, ...]:
    """Parse gpu_specs.csv text into GpuSpecs, in file order.

    Raises CatalogError listing every problem at once (missing columns, non-numbers,
    non-positive values, duplicate names).
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or ())]
    if missing:
        raise CatalogError(f"GPU spec table lacks columns {missing}")
    problems: list[str] = []
    specs = [spec for row in reader if (spec := _spec_from_row(row, problems)) is not None]
    names = [spec.name for spec in specs]
    problems += [f"duplicate GPU {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise CatalogError("bad GPU spec table: " + "; ".join(problems))
    return tuple(specs)


def spec_by_name(specs: tuple[GpuSpec, ...], name: str) -> GpuSpec:
    """The spec with this canonical name; CatalogError when absent."""
    for spec in specs:
        if spec.name == name:
            return spec
    raise CatalogError(f"no GPU spec named {name!r}: see `tuneplan gpus`")
