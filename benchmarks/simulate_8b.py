"""Time one simulated (fake-tensor) Llama-3.1-8B LoRA training step, batch 2, seq 2048.

Prints the tensor-level peak in GiB by category and the seconds it took. Needs the probe
extra (torch, transformers, peft); no downloads, no real memory: FakeTensorMode on "cpu".
Run: python benchmarks/simulate_8b.py [--batch 2] [--seq 2048] [--method lora] [--gc]
Target (kept here, not in a timed test): the default run finishes in < 120 s.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

from tuneplan.adapters.probe.harness import StepSetup, measure_step
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Checkpointing, Optimizer, Precision, Strategy
from tuneplan.units import GiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--method", default="lora", type=Method)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--gc", action="store_true", help="gradient checkpointing")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    path = resources.files("tuneplan") / "data" / "models" / "meta-llama__Llama-3.1-8B.json"
    config = json.loads(path.read_text())
    strategy = Strategy(
        method=args.method,
        lora_rank=args.rank,
        lora_alpha=2 * args.rank,
        batch_size=args.batch,
        seq_len=args.seq,
        checkpointing=Checkpointing.FULL if args.gc else Checkpointing.NONE,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
    )
    setup = StepSetup(config=config, strategy=strategy, optimizer_impl="fused",
                      steps=args.steps, fake=True)
    m = measure_step(setup)
    print(
        f"Llama-3.1-8B {args.method} r{args.rank} batch {args.batch} seq {args.seq}"
        f" gc={args.gc} bf16 params, fused AdamW, {args.steps} steps (fake tensors)"
    )
    print(f"trainable {m.trainable_params:,} / total {m.total_params:,} parameters")
    print(
        f"peak {m.peak_bytes / GiB:.2f} GiB ({m.peak_bytes:,} B) in {m.peak_phase}"
        f" of step {m.peak_step}"
    )
    for cat, b in m.peak_by_category.items():
        own = m.max_by_category[cat] / GiB
        print(f"  at peak  {cat:<12} {b / GiB:8.3f} GiB   (own max {own:8.3f})")
    phases = ", ".join(f"{k} {v / GiB:.2f}" for k, v in m.peak_by_phase.items())
    print(f"peak by phase (GiB): {phases}")
    print(f"seconds: {m.seconds:.1f} total, {m.step_seconds:.1f} for the steps")


if __name__ == "__main__":
    main()
