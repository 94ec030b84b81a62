"""`plan` and `fit` apply the saved probe of the user's GPU, and every time figure says
whether it is calibrated or assumed, with its range (text and JSON)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from tests.cli.conftest import CliResult
from tuneplan.adapters.calibration import CalibrationStore, ProbeRecord
from tuneplan.core.compute.assumptions import ThroughputAssumptions

Run = Callable[..., CliResult]
MiB = 2**20
A = ThroughputAssumptions()


def _save_h100_probe(efficiency: float = 0.22) -> None:
    figures = {"max_allocated_bytes": 20_000 * MiB, "max_reserved_bytes": 20_800 * MiB,
               "device_total_bytes": 81_559 * MiB, "context_bytes": 520 * MiB,
               "tokens_per_second": 3000.0, "step_seconds": 1.4,
               "matmul_efficiency": efficiency}
    with CalibrationStore.open() as store:  # TUNEPLAN_HOME is private to each test
        store.add(ProbeRecord(created_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
                              model="meta-llama/Llama-3.1-8B", strategy={"method": "lora"},
                              device="cuda", device_name="NVIDIA H100 80GB HBM3",
                              gpu="H100 SXM5", versions={"torch": "2.13.0"},
                              measured=figures))


def _speeds(doc: dict[str, object]) -> dict[str, tuple[float, dict[str, object]]]:
    plans = doc["plans"]
    assert isinstance(plans, list)
    return {p["offer"]["id"]: (p["throughput"]["tokens_per_second"],
                               p["throughput"]["time_basis"]) for p in plans
            if p["offer"]["gpu"] == "H100 SXM5"}


PLAN = ("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "20M",
        "--top", "50", "--json")


def test_plan_applies_the_probe_of_the_gpu_and_says_so(run_cli: Run) -> None:
    before = _speeds(run_cli(*PLAN, "--gpu", "H100").ok_json())
    assert before and all(basis["basis"] == "assumed" for _, basis in before.values())
    _save_h100_probe()
    after = _speeds(run_cli(*PLAN, "--gpu", "H100").ok_json())
    same = set(before) & set(after)
    assert same
    for offer in same:
        speed, basis = after[offer]
        # 0.22 of peak is well below the default ceiling x step share (0.80 x 0.71 = 0.57)
        assert speed < 0.8 * before[offer][0]
        assert basis["basis"] == "calibrated"
        assert "probe #1 on NVIDIA H100 80GB HBM3" in str(basis["source"])
        low, high = A.calibrated_error_range
        assert basis["error_range_pct"] == [round(100 * low, 1), round(100 * high, 1)]
        slow, fast = basis["tokens_per_second_range"]
        assert slow == pytest.approx(speed / (1 + high))
        assert fast == pytest.approx(speed / (1 + low))
        h_low, h_high = basis["hours_range"]
        assert h_low < h_high


def test_plan_over_all_gpus_calibrates_only_the_probed_one(run_cli: Run) -> None:
    _save_h100_probe()
    doc = run_cli(*PLAN).ok_json()
    bases = {(p["offer"]["gpu"], p["throughput"]["time_basis"]["basis"]) for p in doc["plans"]}
    assert all(basis == ("calibrated" if gpu == "H100 SXM5" else "assumed")
               for gpu, basis in bases)
    assert any(basis == "assumed" for _, basis in bases)


def test_plan_text_prints_each_plans_time_basis_and_range(run_cli: Run) -> None:
    result = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "20M",
                     "--top", "3", "--gpu", "H100")
    assert result.code == 0, result.stderr
    low, high = A.assumed_error_range
    assert result.stdout.count(
        f"of training, assumed (model error {100 * low:+.0f}..{100 * high:+.0f} %)") == 3


def test_fit_applies_the_probe_to_memory_and_speed(run_cli: Run) -> None:
    args = ("fit", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--method", "full",
            "--seq-len", "4096", "--batch-size", "8", "--json")
    before = run_cli(*args).ok_json()
    assert before["time_basis"]["basis"] == "assumed"
    _save_h100_probe()
    after = run_cli(*args).ok_json()
    assert after["time_basis"]["basis"] == "calibrated"
    # the probe's CUDA context (520 MiB against Hopper's default 700 MiB) lowers every peak
    peaks = {m["method"]: m["peak_bytes"] for m in before["methods"]}
    for m in after["methods"]:
        if m["peak_bytes"] is not None and peaks[m["method"]] is not None:
            assert m["peak_bytes"] < peaks[m["method"]]
    speeds = [s for s in after["suggestions"] if s["tokens_per_second"]]
    assert speeds
    old = {s["change"]: s["tokens_per_second"] for s in before["suggestions"]}
    for s in speeds:
        assert s["tokens_per_second"] < old[s["change"]]
        low, high = s["tokens_per_second_range"]
        assert low < s["tokens_per_second"] < high


def test_throughput_states_its_basis_in_text_and_json(run_cli: Run) -> None:
    args = ("throughput", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--method", "lora",
            "--tokens", "10M")
    doc = run_cli(*args, "--json").ok_json()
    assert doc["time_basis"]["basis"] == "assumed"
    assert doc["time_basis"]["hours_range"][0] < doc["hours"] < doc["time_basis"]["hours_range"][1]
    assert "time basis" in run_cli(*args).stdout
    _save_h100_probe()
    doc = run_cli(*args, "--json").ok_json()
    assert doc["time_basis"]["basis"] == "calibrated"
    text = run_cli(*args).stdout
    assert "calibrated (model error" in text and "training time range" in text


def test_cost_of_a_saved_plan_reprices_it_with_the_same_probe(run_cli: Run) -> None:
    _save_h100_probe()
    plan = run_cli(*PLAN, "--gpu", "H100").ok_json()
    first = next(p for p in plan["plans"] if p["offer"]["gpu"] == "H100 SXM5")
    cost = run_cli("cost", first["id"], "--json").ok_json()
    assert cost["throughput"]["tokens_per_second"] == pytest.approx(
        first["throughput"]["tokens_per_second"])
    assert cost["throughput"]["time_basis"]["basis"] == "calibrated"
