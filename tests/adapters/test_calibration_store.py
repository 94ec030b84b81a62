"""Saved probes: schema migration, reuse as calibrated constants, JSON export/import."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuneplan.adapters.bundled import resolve_gpu_spec
from tuneplan.adapters.calibration import (
    CalibrationStore,
    ProbeRecord,
    calibrate,
    calibration_for,
    export_document,
)
from tuneplan.adapters.store import _MIGRATIONS, SCHEMA_VERSION, CatalogStore
from tuneplan.cli.app import app
from tuneplan.core.compute.throughput import estimate_throughput, model_shape_from_spec
from tuneplan.core.job.strategy import Strategy
from tuneplan.errors import InvalidValueError
from tuneplan.service.memory_report import run_memory

MiB = 2**20
runner = CliRunner()


def h100_probe(**measured: object) -> ProbeRecord:
    figures = {"max_allocated_bytes": 20_000 * MiB, "max_reserved_bytes": 20_800 * MiB,
               "device_total_bytes": 81_559 * MiB, "context_bytes": 520 * MiB,
               "tokens_per_second": 3000.0, "step_seconds": 1.4, "matmul_efficiency": 0.30,
               **measured}
    return ProbeRecord(created_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
                       model="meta-llama/Llama-3.1-8B", strategy={"method": "lora"},
                       device="cuda", device_name="NVIDIA H100 80GB HBM3", gpu="H100 SXM5",
                       versions={"torch": "2.13.0"}, measured=figures)


def test_probes_table_is_added_to_an_old_catalog_and_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    with sqlite3.connect(path) as db:  # a version-1 catalog written before probes were stored
        db.executescript(_MIGRATIONS[1] + "INSERT INTO snapshots VALUES "
                         "(7,'x','2026-11-30T00:00:00+00:00',0,1); PRAGMA user_version=1;")
    with CalibrationStore.open(path) as store:
        saved = store.add(h100_probe())
        assert saved.id == 1
        assert [r.measured["context_bytes"] for r in store.records()] == [520 * MiB]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT id FROM snapshots").fetchall() == [(7,)]
    with CatalogStore.open(path, seed=False) as catalog:  # the catalog opens it as before
        assert catalog.offers() == []


def test_latest_cuda_probe_for_a_gpu_wins(tmp_path: Path) -> None:
    with CalibrationStore.open(tmp_path / "c.sqlite") as store:
        store.add(h100_probe(context_bytes=500 * MiB))
        store.add(h100_probe(context_bytes=530 * MiB))
        cpu = h100_probe()
        store.add(ProbeRecord(**{**_fields(cpu), "device": "cpu", "gpu": None}))
        latest = store.latest_for("H100 SXM5")
        assert latest is not None and latest.id == 2
        assert store.latest_for("A100 SXM4 80GB") is None


def _fields(r: ProbeRecord) -> dict[str, object]:
    return {k: getattr(r, k) for k in r.__dataclass_fields__}


def test_an_estimate_changes_after_a_probe_and_says_why() -> None:
    from tuneplan.service.jobs import JobRequest

    args = JobRequest(model="meta-llama/Llama-3.1-8B", command="memory",
                      values={"method": "qlora", "gpu": "H100", "seq-len": "1024"})
    before, _, _ = run_memory(args)
    with CalibrationStore.open() as store:  # TUNEPLAN_HOME is private to each test
        store.add(h100_probe())
    after, _, _ = run_memory(args)
    terms = {t.path: t for t in after.breakdown}
    assert after.allocated_peak_bytes == before.allocated_peak_bytes  # tensors: not hardware
    assert int(terms["overheads/cuda_context"].value) == 520 * MiB
    assert int(before.breakdown.value("overheads/cuda_context")) == 771 * MiB  # hopper default
    # reserve fraction (20800-20000)/20000 = 0.04 with the floor lowered to the 800 MiB seen.
    assert after.assumptions.allocator_reserve_fraction == 0.04
    assert after.device_total_bytes < before.device_total_bytes
    why = "calibrated from probe #1 on NVIDIA H100 80GB HBM3, 2026-11-30"
    assert terms["overheads/cuda_context"].source == why
    assert terms["overheads/allocator_reserve"].source == why


def test_throughput_uses_the_measured_efficiency() -> None:
    gpu = resolve_gpu_spec("H100")
    from tuneplan.adapters.hub import resolve_model

    shape = model_shape_from_spec(resolve_model("meta-llama/Llama-3.1-8B"))
    job = Strategy(seq_len=1024)
    plain = estimate_throughput(shape, job, gpu)
    cal = calibrate(h100_probe(matmul_efficiency=0.22), gpu)  # default H100: 0.80 x 0.71 = 0.57
    slower = estimate_throughput(shape, job, gpu, assumptions=cal.throughput)
    assert slower.tokens_per_second < 0.75 * plain.tokens_per_second
    assert any("calibrated from a probe on NVIDIA H100 80GB HBM3" in n
               for n in cal.throughput.notes)
    assert calibration_for(None).record is None


def test_export_import_round_trip(tmp_path: Path) -> None:
    with CalibrationStore.open() as store:
        store.add(h100_probe())
    out = tmp_path / "probes.json"
    result = runner.invoke(app, ["calibration", "export", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "tuneplan-calibration" and len(doc["records"]) == 1
    assert runner.invoke(app, ["calibration", "import", str(out)]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["calibration", "list", "--json"]).stdout)
    assert [r["origin"] for r in listed] == ["probe", "import"]
    assert listed[1]["measured"] == listed[0]["measured"]
    assert listed[1]["created_at"] == "2026-11-30T12:00:00+00:00"


def test_import_refuses_a_bad_file_and_writes_nothing(tmp_path: Path) -> None:
    good = export_document([h100_probe()])["records"][0]
    bad_bytes = {**good, "measured": {**good["measured"], "max_reserved_bytes": -1}}
    no_gpu = {**good, "gpu": None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": "tuneplan-calibration", "version": 1,
                                "records": [good, bad_bytes, no_gpu]}))
    result = runner.invoke(app, ["calibration", "import", str(path)])
    assert isinstance(result.exception, InvalidValueError)
    message = str(result.exception)
    assert "record 2: measured.max_reserved_bytes" in message
    assert "record 3: a cuda record needs" in message
    with CalibrationStore.open() as store:
        assert store.records() == []


@pytest.mark.parametrize("document", [[], {"format": "other"},
                                      {"format": "tuneplan-calibration", "version": 9}])
def test_import_refuses_foreign_documents(tmp_path: Path, document: object) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps(document))
    result = runner.invoke(app, ["calibration", "import", str(path)])
    assert isinstance(result.exception, InvalidValueError)


H200_DOC = (Path(__file__).resolve().parents[2] / "benchmarks" / "calibration" / "device"
            / "h200-2026-12-04" / "calibration.json")


def test_probes_pool_per_job_class_and_no_single_probe_decides() -> None:
    from tuneplan.adapters.calibration import parse_document, pooled_throughput
    from tuneplan.core.compute.assumptions import ThroughputAssumptions
    from tuneplan.core.compute.step import matmul_efficiency
    from tuneplan.core.job.strategy import Precision

    # the 11 HF Trainer steps measured on an H200: 3 pure-bf16 full fine-tunes (0.7767,
    # 0.7777, 0.7859), one bf16-mixed (0.5493), six LoRA that imply one (0.252 .. 0.6904), and
    # a host-bound LoRA that implies none
    records = parse_document(json.loads(H200_DOC.read_text()))
    assert len(records) == 11 and records[-1].measured.get("matmul_efficiency") is None
    tp, notes = pooled_throughput(records, "H200 SXM", ThroughputAssumptions())
    classes = {cls: value for _, cls, value, _ in tp.matmul_efficiency_by_gpu_job}
    assert classes == pytest.approx({"full/bf16": 0.7777, "full/bf16-mixed": 0.5493,
                                     "adapter/bf16-mixed": (0.4603 + 0.4934) / 2})
    overall = tp.gpu_override("H200 SXM")
    assert overall is not None and overall[0] == pytest.approx((0.4993 + 0.5493) / 2)
    assert "10 probes" in overall[1] and "median" in overall[1] and "per job class" in notes[0]
    gpu = resolve_gpu_spec("H200 SXM")
    peak = float(gpu.bf16_flops_per_s or 0)
    assert matmul_efficiency(gpu, Precision.BF16, peak, tp, "full/bf16")[0] == 0.7777
    # a class no probe ran falls back to the GPU's median; no probe, no override
    assert matmul_efficiency(gpu, Precision.BF16, peak, tp, "adapter/bf16")[0] == overall[0]
    assert pooled_throughput(records[-1:], "H200 SXM", ThroughputAssumptions())[1] == []
    # the newest probe alone (the old rule) would price every job with the q,v LoRA's 0.69
    newest, _ = pooled_throughput(records[-2:], "H200 SXM", ThroughputAssumptions())
    found = newest.gpu_override("H200 SXM", "full/bf16")
    assert found is not None and found[0] == 0.6904
    assert found[1] == "calibrated from a probe on NVIDIA H200 (newest 2026-12-04)"
