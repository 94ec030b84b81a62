"""Read the bundled data files (GPU specs, provider features, offer snapshot) from the package.

Only reads package data and hands the text to the pure parsers in ``core``; results are
cached because the files never change while the process runs.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from tuneplan.core.catalog.gpu_names import normalise_gpu_name
from tuneplan.core.catalog.hardware import (
    GpuSpec,
    MemoryTotals,
    parse_gpu_specs,
    parse_memory_totals,
    spec_by_name,
)
from tuneplan.core.catalog.providers import Provider, parse_providers
from tuneplan.errors import InvalidValueError, UnknownGpuError

SNAPSHOT_DIR = "skypilot_snapshot"


def read_data_text(*parts: str) -> str:
    """Text of a file under ``tuneplan/data`` (UTF-8)."""
    return resources.files("tuneplan").joinpath("data", *parts).read_text(encoding="utf-8")


def list_snapshot_files() -> list[str]:
    """Names of the bundled SkyPilot snapshot CSV files, sorted."""
    folder = resources.files("tuneplan").joinpath("data", SNAPSHOT_DIR)
    return sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".csv"))


@cache
def load_memory_totals() -> dict[str, MemoryTotals]:
    """What the driver offers per GPU (nvidia-smi and CUDA-visible totals, sourced) from the
    bundled gpu_memory_totals.csv."""
    return parse_memory_totals(read_data_text("gpu_memory_totals.csv"))


@cache
def load_gpu_specs() -> tuple[GpuSpec, ...]:
    """Every GPU spec: gpu_specs.csv (full specs) then gpu_specs_extra.csv (memory facts),
    with their memory totals from gpu_memory_totals.csv."""
    totals = load_memory_totals()
    return parse_gpu_specs(read_data_text("gpu_specs.csv"), totals) + parse_gpu_specs(
        read_data_text("gpu_specs_extra.csv"), totals)


@cache
def load_gpu_spec(name: str) -> GpuSpec:
    """The bundled spec of one canonical GPU; CatalogError when absent."""
    return spec_by_name(load_gpu_specs(), name)


@cache
def load_providers() -> tuple[Provider, ...]:
    """Provider features from the bundled providers.csv."""
    return parse_providers(read_data_text("providers.csv"))


def resolve_gpu_spec(name: str) -> GpuSpec:
    """The spec for a user's GPU name: canonical (``H100 SXM5``) or any alias (``h100``,
    ``A100-80GB``, ``4090``). Raises InvalidValueError (exit 2) naming the choices."""
    for candidate in (name, f"RTX {name}"):
        try:
            return load_gpu_spec(normalise_gpu_name(candidate))
        except UnknownGpuError:
            continue
    raise InvalidValueError(f"unknown GPU {name!r}: see `tuneplan gpus` for the names")
