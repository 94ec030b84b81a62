"""The leave-one-group-out machinery of the accuracy benchmarks (benchmarks/loso.py) on tiny
synthetic calibration sets whose refits and held-out errors are known, plus the two shortcuts
the real benchmarks take (the memory refit's fast path, the throughput transfer rule)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # the scripts set HF_HUB_OFFLINE for a run by hand (accuracy.py, at import): that must not
    # leak into the other tests of this process (the fake-hub tests ask the hub)
    before = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(before)
    return module


loso = _load("loso")


@dataclass(frozen=True)
class K:
    k: float = 1.5
    m: float = 1.5


@dataclass(frozen=True)
class Row:
    id: str
    group: str
    x: float
    expected: float


def _rows() -> list[Row]:
    # groups A and B: expected = 1.0 x; group C (one row): expected = 3.0 x
    rows = [Row(f"{g}{i}", g, x, 1.0 * x) for g in "AB" for i, x in enumerate((1.0, 2.0, 4.0))]
    return [*rows, Row("C0", "C", 2.0, 6.0)]


def _predict(c: K, r: Row) -> float:
    return c.k * r.x * (c.m if r.group == "C" else 1.0)


def _fits(fallback: bool) -> list:
    return [
        loso.Fit("k", "A and B", selects=lambda r: r.group != "C", low=0.5, high=2.5,
                 get=lambda c: c.k, set=lambda c, v: replace(c, k=v)),
        loso.Fit("m", "C", selects=lambda r: r.group == "C", low=1.0, high=5.0,
                 get=lambda c: c.m, set=lambda c, v: replace(c, m=v),
                 fallback=(lambda c, train: (replace(c, m=2.0), "set to 2")) if fallback
                 else None),
    ]


def _by_group(fallback: bool) -> dict:
    helds = loso.leave_one_out(_rows(), lambda r: r.group, K(), _fits(fallback), _predict,
                               lambda r: r.expected)
    return {h.group: h for h in helds}


def test_refit_on_all_rows_recovers_both_constants() -> None:
    done = loso.refit(K(), _fits(True), _rows(), _predict, lambda r: r.expected)
    assert done.values == {"k": pytest.approx(1.0), "m": pytest.approx(3.0)}
    assert done.status == {"k": "refitted on 6 rows", "m": "refitted on 1 row"}


def test_held_out_group_is_scored_with_constants_fitted_without_it() -> None:
    held = _by_group(fallback=True)
    # without A: k from B alone (1.0), m from C (3.0); A is then predicted exactly
    assert held["A"].refit.values["k"] == pytest.approx(1.0)
    assert held["A"].errors == pytest.approx([0.0, 0.0, 0.0])
    # without C: nothing fits m, so the fallback's 2.0 is used: 2/3 of the published figure
    assert held["C"].refit.status["m"] == "no training rows: set to 2"
    assert held["C"].errors == pytest.approx([-100 / 3])
    assert held["C"].median_abs == pytest.approx(100 / 3)
    assert loso.median_abs(loso.pooled(list(held.values()))) == pytest.approx(0.0)


def test_constant_without_rows_or_fallback_is_held_and_said_so() -> None:
    held = _by_group(fallback=False)
    assert held["C"].refit.values["m"] == 1.5           # the starting value, not refitted
    assert held["C"].refit.status["m"].startswith("held (no training rows)")
    assert held["C"].errors == pytest.approx([(1.5 / 3 - 1) * 100])


def test_joint_fit_finds_two_constants_sharing_rows() -> None:
    # expected = 2 x + 5 on five rows: only k = 2, m = 5 puts three or more rows on the line
    rows = [Row(str(x), "A", x, 2 * x + 5) for x in (1.0, 2.0, 3.0, 5.0, 8.0)]
    fits = [loso.Fit("k", "all", selects=lambda r: True, low=0.0, high=4.0,
                     get=lambda c: c.k, set=lambda c, v: replace(c, k=v)),
            loso.Fit("m", "all", selects=lambda r: True, low=0.0, high=10.0,
                     get=lambda c: c.m, set=lambda c, v: replace(c, m=v))]
    done = loso.refit(K(k=1.0, m=1.0), fits, rows, lambda c, r: c.k * r.x + c.m,
                      lambda r: r.expected, joint=True)
    assert done.values == {"k": pytest.approx(2.0), "m": pytest.approx(5.0)}


def test_plain_turns_nan_into_null() -> None:
    assert json.dumps(loso.plain({"a": float("nan"), "b": [1.0, float("nan")]})) == \
        '{"a": null, "b": [1.0, null]}'


def test_memory_fast_path_matches_the_full_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    # the benchmark sets HF_HUB_OFFLINE when unset, at import: keep that inside this test
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    accuracy = _load("accuracy")
    cases = [json.loads(line) for line in
             (BENCH / "calibration" / "cases.jsonl").read_text().splitlines()]
    case = next(c for c in cases if c["id"] == "qwen-profiling-7b-lora-1gpu-seq256")
    base = accuracy.MemoryAssumptions()
    row = accuracy.prepare(case, base)
    assert row.status == "ok" and row.metric == "device_total_bytes"
    other = accuracy._with_context(replace(base, allocator_reserve_fraction=0.1), "ampere",
                                   1500)
    full = accuracy.estimate(other, row)
    assert accuracy.fast_estimate(other, row) == full
    assert full != accuracy.estimate(base, row)


def test_a_held_out_pre_ampere_gpu_takes_no_fitted_factor() -> None:
    # the matmul ceiling is measured per GPU (no transfer between architectures); the one
    # pre-Ampere constant falls back to 1 when no Volta/Turing row is left to fit it
    speed = _load("throughput_accuracy")
    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.core.compute.assumptions import ThroughputAssumptions
    from tuneplan.core.job.strategy import Strategy

    a100 = speed.SpeedRow("a", "g", "A100 80GB SXM4", load_gpu_spec("A100 80GB SXM4"),
                          None, Strategy(), None, 1.0, "m")
    fit = next(f for f in speed.speed_fits([a100]) if f.name == "pre_ampere_step_factor")
    assert fit.fallback is not None
    got, what = fit.fallback(ThroughputAssumptions(), [a100])
    assert got.pre_ampere_step_factor == 1.0 and ThroughputAssumptions().pre_ampere_step_factor < 1
    assert "no pre-Ampere rows" in what


def test_the_4bit_blog_cases_run_on_their_stated_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    accuracy = _load("accuracy")
    cases = [json.loads(line) for line in
             (BENCH / "calibration" / "cases.jsonl").read_text().splitlines()]
    blog = [c for c in cases if c["source_group"] == "hf-blog-4bit"]
    assert len(blog) == 14 and all(c["args"]["stack"] == (
        "transformers=4.30,peft=0.4,bitsandbytes=0.39,torch=2.0") for c in blog)
    case = next(c for c in blog if c["id"] == "hf-blog-4bit-llama-7b-hf-05")
    row = accuracy.prepare(case, accuracy.MemoryAssumptions())
    assert row.status == "ok"
    stack = row.request.job().strategy.stack
    assert (stack.transformers, stack.peft, stack.bitsandbytes) == ((4, 30), (0, 4), (0, 39))
    # the same case on the default stack: bitsandbytes >= 0.43.2 drops the 4-bit inputs that
    # 0.39 keeps: q, k, v, gate, up and down (fp32 in, a bf16 copy each) and o_proj's (eager
    # attention: its own bf16 input), 32 blocks x T·(6·H + I)·2 on the Llama-7B shapes; and
    # transformers 4.30's loss sees B·(S-1) positions: one fp32 log-softmax row and its two
    # gradient rows fewer, 3·V·4; and 4.30's eager LLaMA attention keeps the masked scores'
    # sum for its torch.max clamp: B·heads·S·S per block, fp32 after peft 0.4's k-bit upcast
    today = accuracy.prepare(case | {"args": {k: v for k, v in case["args"].items()
                                              if k != "stack"}}, accuracy.MemoryAssumptions())
    old, new = (accuracy.run_memory(r.request, model=r.model)[0] for r in (row, today))
    assert old.phases["backward-start"] - new.phases["backward-start"] == \
        32 * 1024 * (6 * 4096 + 11008) * 2 - 3 * 32000 * 4 + 32 * 32 * 1024 * 1024 * 4


def test_the_risk_line_quotes_the_benchmarks_held_out_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # risk.HELD_OUT_MEDIAN_ERROR is copied from a run of benchmarks/accuracy.py; a change to
    # the estimate or to the calibration set that moves the leave-one-source-out median must
    # move the figure the planner's risk line quotes (to its printed 0.1 %)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    accuracy = _load("accuracy")
    from tuneplan.core.planner.risk import HELD_OUT_MEDIAN_ERROR

    cases = [json.loads(line) for line in
             (BENCH / "calibration" / "cases.jsonl").read_text().splitlines() if line.strip()]
    base = accuracy.MemoryAssumptions()
    rows = [accuracy.prepare(c, base) for c in cases if c.get("cli_supported", True)]
    overall = accuracy.loso_report(rows, base)["overall"]
    assert round(overall["loso_median_abs_error_pct"], 1) == round(HELD_OUT_MEDIAN_ERROR * 100, 1)


def test_the_device_probes_jobs_run_in_the_harness_and_are_estimated() -> None:
    # benchmarks/device_probe.py runs on a lent GPU, where a bad flag costs device minutes:
    # every job of its lists must parse, be runnable by the probe's harness and be estimated
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    device_probe = _load("device_probe")
    from tuneplan.adapters.hub import load_model_config
    from tuneplan.adapters.probe.harness import refuse_unrunnable
    from tuneplan.core.memory import estimate_memory
    from tuneplan.core.models import parse_model_config
    from tuneplan.service.jobflags import job_from_values

    jobs = [*device_probe.JOBS, *device_probe.HOLDOUT]
    assert len(jobs) == 23 and len({json.dumps(j, sort_keys=True) for j in jobs}) == 23
    for model, flags in jobs:
        strategy = job_from_values(model, flags, command="probe").strategy
        refuse_unrunnable(strategy)
        config, name = load_model_config(model)
        est = estimate_memory(parse_model_config(config, name=name), strategy,
                              generation="hopper")
        assert 0 < est.device_total_bytes < 139 * 2**30, (model, flags)  # fits the H200
