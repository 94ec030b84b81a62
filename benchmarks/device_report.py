"""Estimates and simulations against the jobs measured on a lent GPU (held out: no constant was
fitted on them).

Reads ``benchmarks/calibration/device/h200-2026-12-04/probes.jsonl`` (11 HF-Trainer-step jobs
measured on an H200 by ``benchmarks/device_probe.py``) and prints, per job, the estimate's
error on the allocated peak, the reserved peak, the whole device (reserved + CUDA context)
and tokens/s, with the default (uncalibrated) assumptions, then the medians. ``--replay`` adds
the fake-tensor simulation of the same step replayed through the caching-allocator model
(``adapters/probe/allocator.py``): its allocated and reserved peaks, with the step's cuBLAS and
cuBLASLt workspaces added (the estimate's ``overheads/cublas_workspace``, and its segments
replayed alone: ``allocator.workspace_reserved_bytes``).

    PYTHONPATH=src .venv/bin/python benchmarks/device_report.py [--replay | --calibrated]
        [--assume N=V] [ROW ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path
from typing import Any

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.adapters.hub import load_model_config
from tuneplan.core.compute.throughput import estimate_throughput
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.overheads import workspace_term
from tuneplan.core.models import parse_model_config
from tuneplan.service.jobflags import job_from_values

PROBES = (Path(__file__).resolve().parent / "calibration" / "device" / "h200-2026-12-04"
          / "probes.jsonl")
GPU = "H200 SXM"


def rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in PROBES.read_text().splitlines() if line.strip()]


def label(row: dict[str, Any]) -> str:
    f = row["flags"]
    bits = [row["model"].split("/")[-1], f["method"], f.get("precision", ""),
            f.get("attention", ""), f"b{f['batch-size']} s{f['seq-len']}",
            "ckpt" if f.get("gradient-checkpointing") else ""]
    return " ".join(b for b in bits if b)


def simulate(config: dict[str, Any], strategy: Strategy, generation: str | None,
             steps: int = 3) -> tuple[int, int]:
    """(allocated, reserved) peaks in bytes of the fake-tensor step, replayed, with the GPU's
    cuBLAS workspaces added."""
    from tuneplan.adapters.probe.allocator import workspace_reserved_bytes
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = measure_step(StepSetup(config=config, strategy=strategy, steps=steps, fake=True))
    a = MemoryAssumptions()
    return (m.peak_bytes + int(workspace_term(generation, a).value),
            m.allocator_reserved_bytes + workspace_reserved_bytes(generation, a))


def pct(value: float, truth: float) -> float:
    return 100.0 * (value - truth) / truth


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="*", type=int)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--assume", action="append", default=[], metavar="NAME=VALUE",
                    help="price tokens/s with one ThroughputAssumptions number changed")
    ap.add_argument("--calibrated", action="store_true",
                    help="also tokens/s calibrated leave-one-probe-out: by the newest other "
                         "probe (the old rule) and pooled per job class (the rule now)")
    args = ap.parse_args(argv)
    from throughput_accuracy import assumed

    speed_assumptions = assumed(args.assume)
    if args.calibrated:
        calibrated_report(speed_assumptions)
        return
    data = rows()
    gpu = load_gpu_spec(GPU)
    cols: dict[str, list[float]] = {}
    head = f"{'row':>3} {'job':<44} {'alloc':>7} {'reserved':>8} {'device':>7} {'tok/s':>7}"
    print(head + (f" {'sim alloc':>9} {'sim res':>8}" if args.replay else ""))
    for i in args.rows or range(len(data)):
        row, m = data[i], data[i]["measured"]
        strategy = job_from_values(row["model"], row["flags"], command="probe").strategy
        config, name = load_model_config(row["model"])
        spec = parse_model_config(config, name=name)
        est = estimate_memory(spec, strategy, MemoryAssumptions(), generation=gpu.generation)
        speed = estimate_throughput(spec, strategy, gpu, assumptions=speed_assumptions)
        errs = {"alloc": pct(est.allocated_peak_bytes, m["max_allocated_bytes"]),
                "reserved": pct(est.reserved_peak_bytes, m["max_reserved_bytes"]),
                "device": pct(est.device_total_bytes,
                              m["max_reserved_bytes"] + m["context_bytes"]),
                "tok/s": pct(speed.tokens_per_second_per_gpu, m["tokens_per_second"])}
        if args.replay:
            alloc, reserved = simulate(config, strategy, gpu.generation)
            errs["sim alloc"] = pct(alloc, m["max_allocated_bytes"])
            errs["sim res"] = pct(reserved, m["max_reserved_bytes"])
        for k, v in errs.items():
            cols.setdefault(k, []).append(abs(v))
        cells = " ".join(f"{v:+{8 if k in ('reserved', 'sim res') else 7}.2f}"
                         for k, v in errs.items())
        print(f"{i:>3} {label(row)[:44]:<44} {cells}", flush=True)
    print("median |error| %: " + ", ".join(f"{k} {statistics.median(v):.2f}"
                                          for k, v in cols.items())
          + f" ({len(next(iter(cols.values())))} jobs)")


def calibrated_report(base: Any) -> None:
    """tokens/s error per job, uncalibrated and calibrated from the other ten probes: by the
    newest of them (calibration.py before pooling) and by their per-class median (now)."""
    from tuneplan.adapters.calibration import parse_document, pooled_throughput

    records = parse_document(json.loads((PROBES.parent / "calibration.json").read_text()))
    data = rows()
    gpu = load_gpu_spec(GPU)
    cols: dict[str, list[float]] = {}
    print(f"{'row':>3} {'job':<44} {'assumed':>8} {'newest':>8} {'pooled':>8}")
    for i, row in enumerate(data):
        strategy = job_from_values(row["model"], row["flags"], command="probe").strategy
        config, name = load_model_config(row["model"])
        spec = parse_model_config(config, name=name)
        others = [r for j, r in enumerate(records) if j != i]
        newest = [r for r in others if r.measured.get("matmul_efficiency")][-1:]
        cases = {"assumed": base, "newest": pooled_throughput(newest, GPU, base)[0],
                 "pooled": pooled_throughput(others, GPU, base)[0]}
        errs = {k: pct(estimate_throughput(spec, strategy, gpu, assumptions=a)
                       .tokens_per_second_per_gpu, row["measured"]["tokens_per_second"])
                for k, a in cases.items()}
        for k, v in errs.items():
            cols.setdefault(k, []).append(abs(v))
        print(f"{i:>3} {label(row)[:44]:<44} " + " ".join(f"{v:+8.2f}" for v in errs.values()))
    print("median |error| %: " + ", ".join(f"{k} {statistics.median(v):.2f}"
                                          for k, v in cols.items()) + f" ({len(data)} jobs)")


if __name__ == "__main__":
    main()
