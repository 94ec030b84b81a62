"""Time full-catalog queries: open the SQLite catalog, filter, sort (the `tuneplan offers` path).

Seeds a private catalog from the bundled snapshot in a temporary folder (timed separately),
then times open + query + sort for a few typical filters; prints the median of N runs in ms.
Run: python benchmarks/catalog_query.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import OfferFilter, OfferSort

QUERIES = {
    "all offers, by price": OfferFilter(),
    "--gpu H100": OfferFilter(gpu="H100"),
    "--min-gpu-memory 80GB --count 8": OfferFilter(min_gpu_memory_bytes=80 * 10**9, gpu_count=8),
    "--spot --max-price 4 --provider aws,runpod": OfferFilter(
        spot=True, max_price_per_hour=Decimal(4), providers=("aws", "runpod")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "catalog.sqlite"
        start = time.perf_counter()
        CatalogStore.open(path).close()
        print(f"seed from bundled snapshot: {(time.perf_counter() - start) * 1000:.0f} ms")
        for label, query in QUERIES.items():
            times, found = [], 0
            for _ in range(args.runs):
                start = time.perf_counter()
                with CatalogStore.open(path) as store:
                    found = len(store.offers(query, sort=OfferSort.PRICE))
                times.append(time.perf_counter() - start)
            print(f"{label:45s} {found:5d} offers  median {statistics.median(times) * 1000:6.1f} ms"
                  f"  (min {min(times) * 1000:.1f} ms, {args.runs} runs: open+filter+sort)")


if __name__ == "__main__":
    main()
