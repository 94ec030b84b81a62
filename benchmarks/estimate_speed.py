"""Time one analytic memory estimate (the planner sweeps thousands): prints µs per estimate.

Run: ``.venv/bin/python benchmarks/estimate_speed.py``.
"""

from __future__ import annotations

import time

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.memory import estimate_memory


def main() -> None:
    model = resolve_model("meta-llama/Llama-3.1-8B")
    strategies = [Strategy(method=m, batch_size=b, seq_len=s)
                  for m in (Method.FULL, Method.LORA, Method.QLORA) for b in (1, 4)
                  for s in (512, 4096)]
    strategies.append(Strategy(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3))
    for strategy in strategies:  # warm up
        estimate_memory(model, strategy)
    rounds = 300
    start = time.perf_counter()
    for _ in range(rounds):
        for strategy in strategies:
            estimate_memory(model, strategy)
    per = (time.perf_counter() - start) / (rounds * len(strategies))
    print(f"{per * 1e6:.1f} µs per estimate ({rounds * len(strategies)} estimates, "
          f"Llama-3.1-8B, full/LoRA/QLoRA, ZeRO-3)")


if __name__ == "__main__":
    main()
