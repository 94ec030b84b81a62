"""gpu_memory_totals.csv: what the driver offers per GPU, its sources, the rule for the rest,
and the capacity the planner compares a whole-device peak with."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tuneplan.adapters.bundled import (
    load_gpu_spec,
    load_gpu_specs,
    load_memory_totals,
    read_data_text,
)
from tuneplan.core.catalog.hardware import (
    MemoryTotals,
    assumed_driver_mib,
    card_capacity_bytes,
    cuda_reserve_mib,
    memory_class,
    memory_figures,
    parse_gpu_specs,
    parse_memory_totals,
    usable_phrase,
)
from tuneplan.errors import CatalogError
from tuneplan.units import GiB, MiB

REPO = Path(__file__).resolve().parents[2]

TEXT = read_data_text("gpu_memory_totals.csv")
ROWS = list(csv.DictReader(io.StringIO(TEXT)))
SPECS = {s.name: s for s in load_gpu_specs()}
HEADER = TEXT.splitlines()[0]


def _kind(name: str) -> str:
    spec = SPECS[name]
    return memory_class(spec.is_hbm, load_memory_totals()[name].ecc, spec.architecture)


def test_the_table_covers_every_bundled_gpu_once() -> None:
    bundled = [r["gpu"] for f in ("gpu_specs.csv", "gpu_specs_extra.csv")
               for r in csv.DictReader(io.StringIO(read_data_text(f)))]
    assert len(bundled) == 94
    assert sorted(r["gpu"] for r in ROWS) == sorted(bundled)
    assert len({r["gpu"] for r in ROWS}) == len(ROWS) == 94


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["gpu"])
def test_every_row_has_a_source_for_each_figure(row: dict[str, str]) -> None:
    for value, source, confidence in (
            ("driver_total_mib", "driver_total_source", "driver_confidence"),
            ("cuda_total_gib", "cuda_total_source", "cuda_confidence")):
        if row[value]:  # a stated figure names its report: an issue URL, the bundled catalog,
            # or a reading of this repo's own on a lent GPU (a file that must exist)
            local = re.findall(r"benchmarks/calibration/device/[\w./-]+", row[source])
            assert "https://" in row[source] or local, row[source]
            assert all((REPO / path.rstrip(".)")).is_file() for path in local), local
            assert row[confidence] in ("high", "medium", "low")
        else:
            assert not row[source]
    assert row["ecc"] in ("on", "off")
    assert row["driver_total_mib"] or row["cuda_total_gib"] or "no report found" in row["notes"]
    spec = SPECS[row["gpu"]]  # and the spec says where each of its figures comes from
    for figure in (spec.driver_memory, spec.usable_memory):
        assert figure.source and figure.confidence in ("high", "medium", "low")
        assert figure.basis in ("reported", "derived", "assumed")
        if figure.basis != "reported":
            assert figure.source.startswith("rule ")


def test_sourced_counts() -> None:
    with_driver = [r for r in ROWS if r["driver_total_mib"]]
    with_cuda = [r for r in ROWS if r["cuda_total_gib"]]
    neither = [r for r in ROWS if not r["driver_total_mib"] and not r["cuda_total_gib"]]
    assert (len(with_driver), len(with_cuda), len(neither)) == (26, 22, 61)


def test_l40s_exact_bytes() -> None:
    l40s = load_gpu_spec("L40S")
    assert l40s.memory_bytes == 48 * GiB
    assert l40s.driver_memory_bytes == 45_776 * MiB          # AWS g6e (vast.ai: 46,068)
    assert l40s.usable_memory_bytes == 45_486 * MiB == 47_695_527_936  # torch: 44.42 GiB
    assert l40s.usable_memory.basis == "reported" and l40s.usable_memory.confidence == "high"
    assert "Step-Video-T2V/issues/8" in l40s.usable_memory.source
    assert usable_phrase(l40s) == "44.4 GiB usable of 48 GiB (CUDA-visible total, reported)"


def test_a_gpu_with_only_a_nominal_size_gets_the_assumed_rule_and_says_so() -> None:
    h100_pcie = load_gpu_spec("H100 PCIe")  # nothing reported: HBM rule
    assert h100_pcie.driver_memory_bytes == 81_920 * 986 // 1000 * MiB == 80_773 * MiB
    assert h100_pcie.usable_memory_bytes == (80_773 - 900) * MiB
    for figure in (h100_pcie.driver_memory, h100_pcie.usable_memory):
        assert figure.basis == "assumed" and figure.confidence == "low"
        assert figure.label.startswith("assumed (rule HBM:")
    assert "assumed by rule HBM" in usable_phrase(h100_pcie)
    t4g = load_gpu_spec("T4G")  # GDDR with ECC on: 0.931 of nominal, less 600 MiB
    assert t4g.usable_memory_bytes == (16_384 * 931 // 1000 - 600) * MiB
    titan = load_gpu_spec("Titan RTX")  # GDDR without ECC: 0.995, less 600 MiB
    assert titan.usable_memory_bytes == (24_576 * 995 // 1000 - 600) * MiB
    a40 = load_gpu_spec("A40")  # nvidia-smi reported, CUDA reserve by rule: derived
    assert a40.usable_memory.basis == "derived" and a40.usable_memory.confidence == "medium"
    assert a40.usable_memory_bytes == (46_068 - 600) * MiB


@pytest.mark.parametrize("row", [r for r in ROWS if r["cuda_total_gib"]], ids=lambda r: r["gpu"])
def test_the_rule_never_promises_more_than_a_sourced_report(row: dict[str, str]) -> None:
    spec, kind = SPECS[row["gpu"]], _kind(row["gpu"])
    reported = int(float(row["cuda_total_gib"]) * 1024)  # whole MiB, rounded down
    assert spec.usable_memory_bytes == reported * MiB
    nominal_mib = spec.memory_bytes // MiB
    assert assumed_driver_mib(nominal_mib, kind) - cuda_reserve_mib(kind) <= reported
    if row["driver_total_mib"]:  # the reserve covers what the driver kept here
        assert int(row["driver_total_mib"]) - cuda_reserve_mib(kind) <= reported


@pytest.mark.parametrize("row", [r for r in ROWS if r["driver_total_mib"]],
                         ids=lambda r: r["gpu"])
def test_the_driver_share_is_below_every_reported_total(row: dict[str, str]) -> None:
    spec = SPECS[row["gpu"]]
    assert assumed_driver_mib(spec.memory_bytes // MiB, _kind(row["gpu"])) <= int(
        row["driver_total_mib"])


def test_parse_refuses_a_value_without_source_and_cuda_above_driver() -> None:
    with pytest.raises(CatalogError) as info:
        parse_memory_totals("\n".join([HEADER, "X1,on,40000,,,,,,",
                                       "X2,maybe,,,,,,,",
                                       "X3,on,100,https://x,high,1.00,https://y,high,"]))
    text = str(info.value)
    assert "X1: driver_total_mib needs a value, a source" in text
    assert "X2: needs gpu and ecc" in text and "X3: CUDA total 1024 MiB exceeds" in text
    with pytest.raises(CatalogError, match="lacks columns"):
        parse_memory_totals("gpu,ecc\nT4,on\n")


def test_a_spec_without_a_totals_row_gets_the_ecc_on_rule() -> None:
    specs = parse_gpu_specs(read_data_text("gpu_specs.csv"))  # no totals given at all
    l4 = next(s for s in specs if s.name == "L4")
    assert l4.usable_memory.basis == "assumed"
    assert l4.usable_memory_bytes == (24_576 * 931 // 1000 - 600) * MiB


def test_gib_text_is_read_to_whole_mib() -> None:
    totals = MemoryTotals(gpu="Y", ecc=True, driver_mib=None, driver_source="",
                          driver_confidence="", cuda_mib=45_486, cuda_source="s",
                          cuda_confidence="high", notes="")
    _, usable = memory_figures(48 * GiB, False, totals)
    assert usable.bytes == 45_486 * MiB
    row = parse_memory_totals(HEADER + "\nY,on,,,,44.42,https://z,high,\n")["Y"]
    assert row.cuda_mib == 45_486   # 44.42 x 1024 = 45,486.08 -> 45,486


def test_card_capacity_is_usable_not_nominal_and_scales_smaller_listings() -> None:
    l40s = load_gpu_spec("L40S")
    assert card_capacity_bytes(l40s, l40s.memory_bytes) == l40s.usable_memory_bytes
    assert card_capacity_bytes(l40s, 46_068 * MiB) == l40s.usable_memory_bytes
    half = replace(l40s).memory_bytes // 2   # a listing of half the card
    assert card_capacity_bytes(l40s, half) == half * l40s.usable_memory_bytes // l40s.memory_bytes
    assert card_capacity_bytes(l40s, half) < half
