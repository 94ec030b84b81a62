"""Time a whole-catalog plan (the `tuneplan plan` compute, catalog load excluded) and how it grows.

Seeds a private catalog from the bundled snapshot (load timed separately), then times
``core.planner.plan_offers`` for a few jobs in CPU seconds of this process (the machine is
shared; wall time is printed beside) as the median of N cold runs (each run builds its own
strategy search and memory cache), and for one job over catalog subsets and synthetic copies
(the same offers in made-up regions with shifted prices, so no cache is shared): the README's
auto job up to 4x, and the QLoRA job at 1x, 10x and 100x the catalog (``--factors``).
Jobs run with the CLI's default (more nodes only for an offer one node cannot hold); two run
again with ``--no-multi-node`` and ``--multi-node`` (more nodes beside a starved node too).
Run: python benchmarks/plan.py [--runs 5] [--factors 1,10,100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.memory.estimate import clear_cache
from tuneplan.core.planner.plan import PlanResult, plan_offers

JOBS = {
    "Llama-3.1-8B qlora 50M": ("meta-llama/Llama-3.1-8B", Method.QLORA),
    "Llama-3.1-8B auto 50M (README)": ("meta-llama/Llama-3.1-8B", Method.AUTO),
    "Llama-3.1-70B full 50M": ("meta-llama/Llama-3.1-70B", Method.FULL),
    "Qwen2.5-0.5B auto 50M": ("Qwen/Qwen2.5-0.5B", Method.AUTO),
    "DeepSeek-V3 lora 50M": ("deepseek-ai/DeepSeek-V3", Method.LORA),
}
#: the same jobs with --multi-node (more nodes searched where one node is starved)
MULTI_NODE = ("Llama-3.1-8B auto 50M (README)", "Llama-3.1-70B full 50M")


def _timed(model: str, method: Method, offers: list[Offer],
           runs: int, *, multi_node: bool | None = None) -> tuple[float, float, PlanResult]:
    from tuneplan.adapters.bundled import load_gpu_specs, load_providers
    from tuneplan.adapters.hub import resolve_model

    spec = resolve_model(model)
    gpus = {g.name: g for g in load_gpu_specs()}
    providers = load_providers()
    job = Job(model=model, strategy=Strategy(method=method), tokens=50_000_000,
              multi_node=multi_node)
    cpu, wall, result = [], [], None
    for _ in range(runs):
        clear_cache()  # cold: no memory work kept from the previous run
        start, start_cpu = time.perf_counter(), time.process_time()
        result = plan_offers(spec, job, offers, gpus, {p.name: p for p in providers},
                             now=datetime.now(UTC))
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(cpu), statistics.median(wall), result


def _copies(offers: list[Offer], factor: int) -> list[Offer]:
    out = list(offers)
    for k in range(1, factor):
        out += [replace(o, region=f"{o.region}-copy{k}",
                        price_per_hour=None if o.price_per_hour is None
                        else o.price_per_hour * Decimal(1 + k / 100)) for o in offers]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--factors", default="1,10,100",
                        help="catalog copies for the QLoRA growth check (comma-separated)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TUNEPLAN_HOME"] = folder
        from tuneplan.adapters.store import load_catalog

        start = time.perf_counter()
        offers = load_catalog()
        print(f"catalog load (seed + read, {len(offers)} offers): "
              f"{(time.perf_counter() - start) * 1000:.0f} ms")
        # the CLI's default (None: several nodes only for an offer one node cannot hold), then
        # --no-multi-node (one node only) and --multi-node for two of the jobs
        runs: list[tuple[str, str, Method, bool | None]] = [
            (label, model, method, None) for label, (model, method) in JOBS.items()]
        runs += [(f"{label} --no-multi-node", *JOBS[label], False) for label in MULTI_NODE]
        runs += [(f"{label} --multi-node", *JOBS[label], True) for label in MULTI_NODE]
        for label, model, method, multi in runs:
            seconds, wall, result = _timed(model, method, offers, args.runs, multi_node=multi)
            print(f"{label:45s} {seconds * 1000:5.0f} ms CPU ({wall * 1000:5.0f} wall) "
                  f"{len(result.plans):5d} plans  "
                  f"{len(result.rejected):5d} rejected  {result.memory_estimates:5d} memory "
                  "estimates")
        print("growth, Llama-3.1-8B auto:")
        readme = JOBS["Llama-3.1-8B auto 50M (README)"]
        sizes = [offers[:: round(1 / share)] for share in (0.1, 0.25, 0.5)]
        for part in [*sizes, *(_copies(offers, factor) for factor in (1, 2, 4))]:
            seconds, wall, _ = _timed(*readme, part, args.runs)
            print(f"  {len(part):6d} offers {seconds * 1000:5.0f} ms CPU ({wall * 1000:5.0f} wall)")
        print("growth, Llama-3.1-8B qlora (catalog copies):")
        qlora = JOBS["Llama-3.1-8B qlora 50M"]
        for factor in (int(f) for f in args.factors.split(",")):
            part = _copies(offers, factor)
            runs = args.runs if factor < 100 else max(1, args.runs // 2)
            seconds, wall, result = _timed(*qlora, part, runs)
            print(f"  {factor:4d}x {len(part):7d} offers {seconds * 1000:6.0f} ms CPU "
                  f"({wall * 1000:6.0f} wall) {len(result.plans):5d} plans "
                  f"{len(result.rejected):7d} rejected")
            del part, result


if __name__ == "__main__":
    main()
