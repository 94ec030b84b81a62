"""The estimate against real peaks: 11 HF Trainer steps measured on an NVIDIA H200 (torch 2.11,
transformers 5.17, peft 0.21; benchmarks/calibration/device/h200-2026-12-04, recorded by
benchmarks/device_probe.py). No constant was fitted on them except the Hopper CUDA context,
which is read off these runs (held to them below)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.adapters.hub import load_model_config
from tuneplan.core.memory import MemoryEstimate, estimate_memory
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.models import parse_model_config
from tuneplan.service.jobflags import job_from_values

FOLDER = (Path(__file__).resolve().parents[3] / "benchmarks" / "calibration" / "device"
          / "h200-2026-12-04")
ROWS = [json.loads(line) for line in (FOLDER / "probes.jsonl").read_text().splitlines()
        if line.strip()]
#: The allocated peak is held to 0.1 %: a missing 33 MiB cuBLAS workspace is 0.2 % of the
#: smaller jobs. Known gaps, with what causes them:
KNOWN = {
    # bf16-mixed full fine-tuning of a tied-embedding model, peaking at the embedding's
    # backward (the moment was missing: -1.8 % before it): 58 MB more, not yet traced.
    5: 0.002,
    # Qwen2.5-7B q/v LoRA: 69 MB more than the estimate, not yet traced.
    9: 0.002,
}


def _estimate(row: dict[str, Any]) -> MemoryEstimate:
    strategy = job_from_values(row["model"], row["flags"], command="probe").strategy
    config, name = load_model_config(row["model"])
    gpu = load_gpu_spec(row["gpu"])
    return estimate_memory(parse_model_config(config, name=name), strategy,
                           MemoryAssumptions(), generation=gpu.generation)


def test_the_gpu_data_says_what_the_h200_reported() -> None:
    # gpu_memory_totals.csv cites these readings: its H200 SXM row must be them
    assert len(ROWS) == 11 and {r["gpu"] for r in ROWS} == {"H200 SXM"}
    smi = next(csv.DictReader((FOLDER / "smi.csv").read_text().splitlines(),
                              skipinitialspace=True))
    assert smi["ecc.mode.current"] == "Enabled"
    spec = load_gpu_spec("H200 SXM")
    assert spec.driver_memory_bytes == int(smi["memory.total [MiB]"].split()[0]) * 2**20
    torch_total = json.loads((FOLDER / "device.json").read_text())["total_bytes"]
    # the CSV keeps torch's total as printed GiB, read down to whole MiB: within 10 MiB below
    assert 0 <= torch_total - spec.usable_memory_bytes < 10 * 2**20
    assert {r["measured"]["device_total_bytes"] for r in ROWS} == {torch_total}


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_allocated_peak_matches_the_h200(index: int) -> None:
    row = ROWS[index]
    est = _estimate(row)
    measured = row["measured"]["max_allocated_bytes"]
    assert est.allocated_peak_bytes == pytest.approx(
        measured, rel=KNOWN.get(index, 0.001))


def test_a_tied_full_fine_tune_peaks_at_the_embeddings_backward() -> None:
    est = _estimate(ROWS[5])  # Llama-3.2-3B (tied) full bf16-mixed: fp32 gradients
    assert est.peak_phase == "backward-embedding"
    extra = int(est.breakdown.value("gradients/embedding_backward"))
    assert extra == 128256 * 3072 * 4


def test_hopper_context_is_the_one_measured() -> None:
    contexts = [r["measured"]["context_bytes"] for r in ROWS]
    est = _estimate(ROWS[0])
    context = int(est.breakdown.value("overheads/cuda_context"))
    assert min(contexts) <= context <= max(contexts) * 1.001


def test_the_whole_device_error_is_the_reserved_peaks_alone() -> None:
    """Beyond the reserved peak the whole device adds only the CUDA context, which the
    estimate has right: what it still misses on the device is the caching allocator's
    reserve (benchmarks/device_report.py prints it)."""
    for row in ROWS:
        est = _estimate(row)
        m = row["measured"]
        device_err = est.device_total_bytes - (
            m["max_reserved_bytes"] + m["context_bytes"])
        reserved_err = est.reserved_peak_bytes - m["max_reserved_bytes"]
        assert abs(device_err - reserved_err) <= 0.002 * m["max_reserved_bytes"]
