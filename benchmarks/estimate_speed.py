"""Time one analytic memory estimate (the planner sweeps thousands): prints µs per estimate.

Three numbers: the median of single estimates after warm-up (the same strategies again: what
the 50 µs target is about), the mean over the loop, and the median of estimates at
micro-batch sizes not seen before (the planner's bisection: batch-independent work cached,
the batch-dependent work done again; each strategy once, so no whole estimate is reused).
Single estimates are timed in CPU time of this process (the machine is shared); the mean is
wall time.
Run: ``.venv/bin/python benchmarks/estimate_speed.py``; ``--profile`` instead prints the
cProfile statistics (internal time) of the estimates at micro-batches not seen before.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from dataclasses import replace

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import ModelSpec


def main() -> None:
    model = resolve_model("meta-llama/Llama-3.1-8B")
    strategies = [Strategy(method=m, batch_size=b, seq_len=s)
                  for m in (Method.FULL, Method.LORA, Method.QLORA) for b in (1, 4)
                  for s in (512, 4096)]
    strategies.append(Strategy(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3))
    for strategy in strategies:  # warm up
        estimate_memory(model, strategy)
    if "--profile" in sys.argv[1:]:
        _profile(model, strategies)
        return
    rounds = 300
    single: list[float] = []
    start = time.perf_counter()
    for _ in range(rounds):
        for strategy in strategies:
            t0 = time.process_time()
            estimate_memory(model, strategy)
            single.append(time.process_time() - t0)
    per = (time.perf_counter() - start) / (rounds * len(strategies))
    fresh: list[float] = []
    seen: set[Strategy] = set()
    for batch in range(5, 5 + rounds):
        for strategy in strategies:
            other = replace(strategy, batch_size=batch)
            if other in seen:   # strategies differing only in their batch meet again here
                continue
            seen.add(other)
            t0 = time.process_time()
            estimate_memory(model, other)
            fresh.append(time.process_time() - t0)
    print(f"{statistics.median(single) * 1e6:.1f} µs median per estimate, "
          f"{per * 1e6:.1f} µs mean ({rounds * len(strategies)} estimates, Llama-3.1-8B, "
          "full/LoRA/QLoRA, ZeRO-3)")
    print(f"{statistics.median(fresh) * 1e6:.1f} µs median at a micro-batch not seen before "
          f"({len(fresh)} estimates)")


def _profile(model: ModelSpec, strategies: list[Strategy]) -> None:
    fresh = [replace(s, batch_size=b) for b in range(5, 305) for s in strategies]
    profile = cProfile.Profile()
    profile.enable()
    for strategy in dict.fromkeys(fresh):   # each strategy once, as in the timed loop
        estimate_memory(model, strategy)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
