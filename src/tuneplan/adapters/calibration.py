"""Probe measurements in the catalog's SQLite file (table ``probes``, schema version 2 of
``adapters/store.py``), shared as JSON, and turned into calibrated assumptions for one GPU.

Only what hardware alone decides is calibrated: CUDA context size and allocator reserve
fraction from the newest CUDA probe on that GPU, and matmul efficiency from all of them: the
median of the efficiencies the GPU's probes imply, per GPU
(``ThroughputAssumptions.matmul_efficiency_by_gpu``) and per GPU and job class
(``matmul_efficiency_by_gpu_job``, ``core.compute.step.job_class``: full or adapter training,
precision), so a LoRA probe calibrates LoRA jobs and does not slow the full fine-tunes, and
no single probe (the newest, a host-bound one) decides the GPU's figure. One set of
assumptions can carry the probes of several GPUs (``calibrated_for_gpus``: what ``plan``
uses). The maths stays in the core.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.errors import CatalogError, InvalidValueError

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Job
    from tuneplan.core.planner.plan import PlanAssumptions

FORMAT = "tuneplan-calibration"
FORMAT_VERSION = 1
DEVICES = ("cuda", "cpu", "simulated")
# Figures a CUDA probe must carry to calibrate (bytes are ints, the rest floats).
CUDA_BYTES = ("max_allocated_bytes", "max_reserved_bytes", "device_total_bytes", "context_bytes")
CUDA_FLOATS = ("tokens_per_second", "step_seconds")
_COLUMNS = ("created_at", "model", "strategy", "device", "device_name", "gpu", "versions",
            "measured", "origin")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRecord:
    """One saved probe: what ran, where, with which libraries, and what was measured."""

    created_at: datetime
    model: str
    strategy: Mapping[str, Any]
    device: str                     # cuda | cpu | simulated
    device_name: str                # torch.cuda.get_device_name, or "cpu"
    gpu: str | None                 # canonical GPU name (gpu_specs), None if unknown / CPU
    versions: Mapping[str, str]
    measured: Mapping[str, Any]
    origin: str = "probe"           # "probe" or "import"
    id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at.isoformat(), "model": self.model,
                "strategy": dict(self.strategy), "device": self.device,
                "device_name": self.device_name, "gpu": self.gpu,
                "versions": dict(self.versions), "measured": dict(self.measured),
                "origin": self.origin}

    def label(self) -> str:
        return (f"probe #{self.id} on {self.device_name}, "
                f"{self.created_at.astimezone(UTC).date().isoformat()}")


class CalibrationStore:
    """The ``probes`` table. Open with ``CalibrationStore.open()``; a context manager."""

    def __init__(self, catalog: CatalogStore) -> None:
        self._catalog = catalog
        self._db = catalog.connection
        self.path = catalog.path

    @classmethod
    def open(cls, path: str | Path | None = None) -> CalibrationStore:
        """Open the catalog file through the catalog store (one connection, its migrations
        create the probes table); nothing is seeded. Raises CatalogError."""
        return cls(CatalogStore.open(path, seed=False))

    def close(self) -> None:
        self._catalog.close()

    def __enter__(self) -> CalibrationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_all(self, records: Iterable[ProbeRecord]) -> list[int]:
        """Insert records in one transaction; their new ids."""
        ids = []
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for r in records:
                    cur = self._db.execute(
                        f"INSERT INTO probes({','.join(_COLUMNS)}) VALUES (?,?,?,?,?,?,?,?,?)",
                        _row(r))
                    ids.append(int(cur.lastrowid or 0))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise CatalogError(f"could not save probes to {self.path}: {exc}") from exc
        return ids

    def add(self, record: ProbeRecord) -> ProbeRecord:
        return replace(record, id=self.add_all([record])[0])

    def records(self, gpu: str | None = None) -> list[ProbeRecord]:
        """Saved probes, oldest first; only CUDA probes on ``gpu`` when given."""
        sql = f"SELECT id,{','.join(_COLUMNS)} FROM probes"
        args: tuple[object, ...] = ()
        if gpu is not None:
            sql += " WHERE gpu=? AND device='cuda'"
            args = (gpu,)
        try:
            rows = self._db.execute(sql + " ORDER BY id", args).fetchall()
        except sqlite3.Error as exc:
            raise CatalogError(f"{self.path}: cannot read probes ({exc})") from exc
        return [_record(row, self.path) for row in rows]

    def latest_for(self, gpu: str) -> ProbeRecord | None:
        found = self.records(gpu)
        return found[-1] if found else None


def _row(r: ProbeRecord) -> tuple[object, ...]:
    return (r.created_at.astimezone(UTC).isoformat(), r.model, json.dumps(dict(r.strategy)),
            r.device, r.device_name, r.gpu, json.dumps(dict(r.versions)),
            json.dumps(dict(r.measured)), r.origin)


def _record(row: tuple[Any, ...], path: Path) -> ProbeRecord:
    try:
        return ProbeRecord(
            id=int(row[0]), created_at=datetime.fromisoformat(row[1]), model=row[2],
            strategy=json.loads(row[3]), device=row[4], device_name=row[5], gpu=row[6],
            versions=json.loads(row[7]), measured=json.loads(row[8]), origin=row[9])
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"{path}: probe #{row[0]} is corrupt ({exc})") from exc


# --- JSON export / import -------------------------------------------------------------------

def export_document(records: Iterable[ProbeRecord]) -> dict[str, Any]:
    return {"format": FORMAT, "version": FORMAT_VERSION,
            "records": [r.as_dict() for r in records]}


def parse_document(data: Any) -> list[ProbeRecord]:
    """Validate an exported document; InvalidValueError listing every bad record."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidValueError(f"not a {FORMAT} document (no \"format\": \"{FORMAT}\")")
    if data.get("version") != FORMAT_VERSION:
        raise InvalidValueError(f"unsupported {FORMAT} version {data.get('version')!r}")
    raw = data.get("records")
    if not isinstance(raw, list):
        raise InvalidValueError("\"records\" must be a list")
    records, problems = [], []
    for i, item in enumerate(raw, start=1):
        try:
            records.append(_parse_record(item))
        except (InvalidValueError, TypeError, ValueError, KeyError) as exc:
            problems.append(f"record {i}: {exc}")
    if problems:
        raise InvalidValueError(f"{len(problems)} bad record(s), nothing imported: "
                                + "; ".join(problems))
    return records


def _parse_record(item: Any) -> ProbeRecord:
    if not isinstance(item, dict):
        raise InvalidValueError("not an object")
    for key in ("created_at", "model", "device", "device_name"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise InvalidValueError(f"{key!r} must be a non-empty string")
    if item["device"] not in DEVICES:
        raise InvalidValueError(f"device {item['device']!r} is not one of {DEVICES}")
    for key in ("strategy", "versions", "measured"):
        if not isinstance(item.get(key), dict):
            raise InvalidValueError(f"{key!r} must be an object")
    created = datetime.fromisoformat(item["created_at"])
    if created.tzinfo is None:
        raise InvalidValueError("created_at must carry a timezone")
    gpu = item.get("gpu")
    if item["device"] == "cuda":
        if not isinstance(gpu, str) or not gpu:
            raise InvalidValueError("a cuda record needs its canonical 'gpu' name")
        _check_cuda_measured(item["measured"])
    return ProbeRecord(created_at=created, model=item["model"], strategy=item["strategy"],
                       device=item["device"], device_name=item["device_name"], gpu=gpu,
                       versions={str(k): str(v) for k, v in item["versions"].items()},
                       measured=item["measured"], origin="import")


def _check_cuda_measured(m: Mapping[str, Any]) -> None:
    for key in CUDA_BYTES:
        value = m.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidValueError(f"measured.{key} must be a non-negative integer (bytes)")
    for key in CUDA_FLOATS:
        value = m.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise InvalidValueError(f"measured.{key} must be a positive number")
    if m["max_reserved_bytes"] < m["max_allocated_bytes"]:
        raise InvalidValueError("measured.max_reserved_bytes is below max_allocated_bytes")
    if m["max_reserved_bytes"] + m["context_bytes"] > m["device_total_bytes"]:
        raise InvalidValueError("reserved + context exceed the device total")


# --- calibrated assumptions -----------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Assumptions for one GPU, calibrated from a probe (or the defaults, record None)."""

    memory: MemoryAssumptions
    throughput: ThroughputAssumptions
    record: ProbeRecord | None
    notes: tuple[str, ...] = field(default=())


def calibrate(record: ProbeRecord, gpu: GpuSpec,
              memory: MemoryAssumptions | None = None,
              throughput: ThroughputAssumptions | None = None,
              pool: Sequence[ProbeRecord] = ()) -> Calibration:
    """The hardware-only constants measured by a CUDA probe, as assumption overrides; the
    matmul efficiency pooled over ``pool`` (the GPU's probes) when given, else ``record``'s."""
    m = record.measured
    mem = memory or MemoryAssumptions()
    tp = throughput or ThroughputAssumptions()
    label = f"calibrated from {record.label()}"
    context = {**mem.context_bytes_by_generation, gpu.generation: int(m["context_bytes"])}
    reserve = int(m["max_reserved_bytes"]) - int(m["max_allocated_bytes"])
    fraction = reserve / max(1, int(m["max_allocated_bytes"]))
    mem = replace(mem, context_bytes_by_generation=context,
                  allocator_reserve_fraction=round(fraction, 4),
                  allocator_reserve_min_bytes=min(mem.allocator_reserve_min_bytes, reserve),
                  sources={**mem.sources, "context_bytes": label,
                           "allocator_reserve_fraction": label})
    notes = [f"memory: CUDA context and allocator reserve {label}"]
    tp, said = pooled_throughput(pool or (record,), gpu.name, tp)
    notes += said
    return Calibration(memory=mem, throughput=tp, record=record, notes=tuple(notes))


def _efficiency(record: ProbeRecord) -> float | None:
    value = record.measured.get("matmul_efficiency")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)


def _job_class(record: ProbeRecord) -> str | None:
    from tuneplan.core.compute.step import job_class
    from tuneplan.core.job.strategy import Strategy

    try:
        return job_class(Strategy.from_dict(record.strategy))
    except (TypeError, ValueError, KeyError, InvalidValueError):
        return None


def pooled_throughput(records: Sequence[ProbeRecord], gpu_name: str,
                      throughput: ThroughputAssumptions) -> tuple[ThroughputAssumptions,
                                                                  list[str]]:
    """``throughput`` with ``gpu_name``'s matmul efficiency the median of what ``records`` (its
    CUDA probes) imply, overall and per job class, with notes saying from which probes;
    unchanged when none implies one (a probe whose estimated step is less than half matmuls
    records none: ``report_cuda.implied_efficiency``)."""
    found = [(r, e) for r in records if (e := _efficiency(r)) is not None]
    if not found:
        return throughput, []

    def label(group: list[tuple[ProbeRecord, float]]) -> str:
        first = group[0][0]
        if len(group) == 1 and first.id is not None:
            return f"calibrated from {first.label()}"
        ids = ", ".join(f"#{r.id}" for r, _ in group if r.id is not None)
        newest = max(r.created_at for r, _ in group).astimezone(UTC).date().isoformat()
        count = f"{len(group)} probes" if len(group) > 1 else "a probe"
        return (f"calibrated from {count} on {first.device_name} ({ids + '; ' if ids else ''}"
                f"newest {newest})" + (", median" if len(group) > 1 else ""))

    by_class: dict[str, list[tuple[ProbeRecord, float]]] = {}
    for r, e in found:
        cls = _job_class(r)
        if cls is not None:
            by_class.setdefault(cls, []).append((r, e))
    overall = statistics.median(e for _, e in found)
    classes = tuple((gpu_name, cls, statistics.median(e for _, e in group), label(group))
                    for cls, group in sorted(by_class.items()))
    tp = replace(
        throughput,
        matmul_efficiency_by_gpu=((gpu_name, overall, label(found)),
                                  *throughput.matmul_efficiency_by_gpu),
        matmul_efficiency_by_gpu_job=(*classes, *throughput.matmul_efficiency_by_gpu_job),
        notes=(*throughput.notes, f"{gpu_name}: matmul efficiency {overall:.3f} {label(found)}",
               *(f"{gpu_name} {cls} jobs: {value:.3f} {src}" for _, cls, value, src in classes)))
    return tp, [f"throughput: {gpu_name} matmul efficiency {label(found)}"
                + (f", per job class ({', '.join(c for _, c, _, _ in classes)})"
                   if classes else "")]


def calibrated_for_gpus(path: str | Path | None = None,
                        throughput: ThroughputAssumptions | None = None
                        ) -> ThroughputAssumptions:
    """``throughput`` (default: the defaults) with the pooled matmul efficiency
    (``pooled_throughput``) of every GPU the store holds CUDA probes of: what ``plan`` prices
    each offer's GPU with."""
    tp = throughput or ThroughputAssumptions()
    with CalibrationStore.open(path) as store:
        by_gpu: dict[str, list[ProbeRecord]] = {}
        for record in store.records():
            if record.device == "cuda" and record.gpu:
                by_gpu.setdefault(record.gpu, []).append(record)
    for name, records in sorted(by_gpu.items()):
        tp, _ = pooled_throughput(records, name, tp)
    return tp


def calibration_for(gpu: GpuSpec | None, path: str | Path | None = None) -> Calibration:
    """The calibration of ``gpu`` by its CUDA probes (memory from the newest, matmul efficiency
    pooled over all), or the defaults when there is none."""
    plain = Calibration(memory=MemoryAssumptions(), throughput=ThroughputAssumptions(),
                        record=None)
    if gpu is None:
        return plain
    with CalibrationStore.open(path) as store:
        records = store.records(gpu.name)
    return plain if not records else calibrate(records[-1], gpu, pool=records)


def calibrated_plan_assumptions(gpu: GpuSpec | None, path: str | Path | None = None,
                                base: PlanAssumptions | None = None) -> PlanAssumptions:
    """The planner's assumptions with the stored probes applied: every probed GPU's matmul
    efficiency (``calibrated_for_gpus``), and, when the job names one GPU (``--gpu``), that
    GPU's CUDA context and allocator reserve too (memory is calibrated only there: its
    constants are not kept per GPU)."""
    from tuneplan.core.planner.plan import PlanAssumptions

    a = base or PlanAssumptions()
    memory = a.memory
    if gpu is not None:
        with CalibrationStore.open(path) as store:
            record = store.latest_for(gpu.name)
        if record is not None:
            memory = calibrate(record, gpu, memory=a.memory).memory
    return replace(a, memory=memory, throughput=calibrated_for_gpus(path, a.throughput))


def calibrated_for_job(job: Job, path: str | Path | None = None) -> PlanAssumptions:
    """``calibrated_plan_assumptions`` for a job: the GPU it names (``--gpu``) when that is
    one spec, else none (a word-prefix filter such as ``A100`` names several). What ``plan``
    prices with and ``cost PLAN_ID`` re-prices with."""
    from tuneplan.adapters.bundled import resolve_gpu_spec

    gpu = None
    if job.gpu:
        try:
            gpu = resolve_gpu_spec(job.gpu)
        except InvalidValueError:
            gpu = None
    return calibrated_plan_assumptions(gpu, path)
