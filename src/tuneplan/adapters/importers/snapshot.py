"""The bundled SkyPilot catalog snapshot (data/skypilot_snapshot/) as offers, one source per cloud.

Reads package data only. ``SNAPSHOT_FETCHED_AT`` is the day the snapshot was assembled; the
rows' own commit dates are unknown (see the snapshot README), so prices may be older.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache

from tuneplan.adapters.bundled import SNAPSHOT_DIR, list_snapshot_files, read_data_text
from tuneplan.adapters.importers.base import ImportResult
from tuneplan.adapters.importers.skypilot import parse_skypilot_csv, row_gpu
from tuneplan.core.launch.targets import SkyCatalog

#: When the bundled snapshot was assembled (UTC); every seeded offer carries it.
SNAPSHOT_FETCHED_AT = datetime(2026, 11, 30, tzinfo=UTC)
SOURCE_PREFIX = "skypilot-snapshot/"


def load_bundled_snapshot() -> list[tuple[str, ImportResult, datetime]]:
    """(source, result, fetched_at) for every bundled cloud file, sorted by source.

    ``runpod_v7.csv`` (older) loses the instance types that ``runpod.csv`` (v8) also lists.
    """
    results: list[tuple[str, ImportResult, datetime]] = []
    for name in list_snapshot_files():
        cloud = name.removesuffix(".csv")
        source = SOURCE_PREFIX + cloud.replace("_", "-")
        result = parse_skypilot_csv(read_data_text(SNAPSHOT_DIR, name), cloud,
                                    SNAPSHOT_FETCHED_AT, source)
        results.append((source, result, SNAPSHOT_FETCHED_AT))
    return _drop_superseded_runpod(results)


def _drop_superseded_runpod(results: list[tuple[str, ImportResult, datetime]]
                            ) -> list[tuple[str, ImportResult, datetime]]:
    by_source = {source: result for source, result, _ in results}
    newer = by_source.get(SOURCE_PREFIX + "runpod")
    older = by_source.get(SOURCE_PREFIX + "runpod-v7")
    if newer is None or older is None:
        return results
    v8_types = {offer.instance_type for offer in newer.offers}
    trimmed = replace(older, offers=tuple(o for o in older.offers
                                          if o.instance_type not in v8_types))
    return [(s, trimmed if s == SOURCE_PREFIX + "runpod-v7" else r, t) for s, r, t in results]


@cache
def load_sky_catalog() -> SkyCatalog:
    """SkyPilot's names from the bundled snapshot: per cloud (file name, ``runpod_v7`` read
    as ``runpod``), the AcceleratorName of each canonical GPU with its row count, and the
    instance types and regions listed. What SkyPilot's own catalog would accept."""
    names: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    instances: dict[str, set[str]] = defaultdict(set)
    by_instance: dict[str, dict[str, str]] = defaultdict(dict)
    regions: dict[str, set[str]] = defaultdict(set)
    for file_name in list_snapshot_files():
        source = file_name.removesuffix(".csv")
        cloud = source.removesuffix("_v7")
        for row in csv.DictReader(io.StringIO(read_data_text(SNAPSHOT_DIR, file_name))):
            if (row.get("InstanceType") or "").strip():
                instances[cloud].add(row["InstanceType"].strip())
            if (row.get("Region") or "").strip():
                regions[cloud].add(row["Region"].strip())
            gpu = row_gpu(row, source)
            if gpu is not None:
                name = row["AcceleratorName"].strip()
                names[cloud][gpu][name] += 1
                if (row.get("InstanceType") or "").strip():
                    by_instance[cloud][row["InstanceType"].strip()] = name
    return SkyCatalog(
        names={c: {g: dict(n) for g, n in by_gpu.items()} for c, by_gpu in names.items()},
        instance_names={c: dict(v) for c, v in by_instance.items()},
        instance_types={c: frozenset(v) for c, v in instances.items()},
        regions={c: frozenset(v) for c, v in regions.items()})
