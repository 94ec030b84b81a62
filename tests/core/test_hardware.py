"""GPU specs: the shipped tables against their invariants, exact bytes and parse errors."""

from __future__ import annotations

import pytest

from tuneplan.adapters.bundled import (
    load_gpu_spec,
    load_gpu_specs,
    read_data_text,
    resolve_gpu_spec,
)
from tuneplan.core.catalog.gpu_names import CANONICAL_GPUS
from tuneplan.core.catalog.hardware import GpuSpec, parse_gpu_specs
from tuneplan.errors import CatalogError, InvalidValueError
from tuneplan.units import GB, TERA, GiB, MiB

SPECS = load_gpu_specs()


def test_spec_names_are_exactly_the_canonical_gpus_in_order() -> None:
    assert [s.name for s in SPECS] == list(CANONICAL_GPUS)
    assert len(parse_gpu_specs(read_data_text("gpu_specs.csv"))) == 35


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_shipped_spec_meets_its_invariants(spec: GpuSpec) -> None:
    assert spec.memory_bytes > 0 and spec.memory_bytes % MiB == 0
    assert spec.memory_label.endswith(" GB")
    # nominal >= driver total (nvidia-smi) > CUDA-visible total, all whole MiB
    assert spec.usable_memory_bytes < spec.driver_memory_bytes <= spec.memory_bytes
    assert 0.8 * spec.memory_bytes < spec.usable_memory_bytes  # ECC, driver, CUDA reserve
    assert spec.usable_memory_bytes % MiB == 0 and spec.driver_memory_bytes % MiB == 0
    if spec.fp8_flops_per_s is not None:
        assert spec.supports_fp8 is True
        assert spec.bf16_flops_per_s is not None and spec.fp8_flops_per_s >= spec.bf16_flops_per_s
    if spec.bf16_flops_per_s is not None and spec.fp32_flops_per_s is not None:
        if "no fast FP16" in spec.notes:  # Kepler/Maxwell/GP104: FP16 GEMMs run at the FP32 rate
            assert spec.bf16_flops_per_s == spec.fp32_flops_per_s
        else:
            assert spec.bf16_flops_per_s > spec.fp32_flops_per_s
    if spec.confidence in ("high", "medium") and "memory only" not in spec.notes:
        assert spec.memory_bandwidth_bytes_per_s and spec.memory_bandwidth_bytes_per_s > 1e11
    assert spec.source and spec.memory_type


def test_h100_sxm_exact_values() -> None:
    h100 = load_gpu_spec("H100 SXM5")
    assert h100.memory_bytes == 80 * GiB == 85_899_345_920
    assert h100.driver_memory_bytes == 85_520_809_984  # nvidia-smi 81,559 MiB = 79.65 GiB
    assert h100.usable_memory_bytes == 81_008 * MiB == 84_943_044_608  # torch: 79.11 GiB
    assert (h100.driver_memory.basis, h100.usable_memory.basis) == ("reported", "reported")
    assert h100.memory_bandwidth_bytes_per_s == 3_350 * GB
    assert h100.bf16_flops_per_s == pytest.approx(989.5 * TERA)
    assert h100.interconnect_bytes_per_s == 900 * GB and h100.pcie_gen == 5
    assert h100.tdp_w == 700 and h100.is_hbm


@pytest.mark.parametrize(("a", "b"), [
    ("H100 SXM5", "H100 PCIe"),        # same die, different memory and bandwidth
    ("H100 SXM5", "H100 NVL"),
    ("A100 40GB SXM4", "A100 80GB SXM4"),
    ("A10", "A10G"),                    # AWS's variant is its own GPU
])
def test_variants_stay_distinct(a: str, b: str) -> None:
    first, second = load_gpu_spec(a), load_gpu_spec(b)
    assert first != second
    assert (first.memory_bytes, first.memory_bandwidth_bytes_per_s, first.tdp_w) != (
        second.memory_bytes, second.memory_bandwidth_bytes_per_s, second.tdp_w)


def test_unknown_stays_none() -> None:
    a10g = load_gpu_spec("A10G")
    assert a10g.tdp_w is None  # blank in the table: not invented
    t4 = load_gpu_spec("T4")
    assert t4.tf32_flops_per_s is None and t4.supports_bf16 is False and t4.interconnect is None


def test_parse_reports_every_problem_at_once() -> None:
    header = read_data_text("gpu_specs.csv").splitlines()[0]
    text = "\n".join([header, "X1,NVIDIA,a,b,-5,HBM3,1" + "," * 16 + "src",
                      "X2,NVIDIA,a,b,80,HBM3,fast" + "," * 16 + "src"])
    with pytest.raises(CatalogError) as info:
        parse_gpu_specs(text)
    assert "X1" in str(info.value) and "'fast'" in str(info.value)


def test_parse_rejects_duplicates_and_missing_columns() -> None:
    text = read_data_text("gpu_specs.csv")
    row = text.splitlines()[1]
    with pytest.raises(CatalogError, match="duplicate GPU 'T4'"):
        parse_gpu_specs(text + row + "\n")
    with pytest.raises(CatalogError, match="lacks columns"):
        parse_gpu_specs("gpu,vendor\nT4,NVIDIA\n")


@pytest.mark.parametrize(("name", "canonical"), [
    ("h100", "H100 SXM5"), ("A100-80GB", "A100 80GB SXM4"), ("4090", "RTX 4090"),
    ("RTX 4090", "RTX 4090"), ("H100 NVL", "H100 NVL"),
])
def test_resolve_a_users_gpu_name(name: str, canonical: str) -> None:
    assert resolve_gpu_spec(name).name == canonical


def test_unknown_user_gpu_is_bad_input() -> None:
    with pytest.raises(InvalidValueError, match="tuneplan gpus"):
        resolve_gpu_spec("Z9000")
