"""``tuneplan probe``: measure a short run (CPU/CUDA) or simulate one, set it beside the
estimate, and save it as a calibration record. Returns the JSON document; prints nothing.

Weights: random from the config (``random_weights``), a local folder holding weights, or a hub
download only when ``download`` is asked for. Progress goes through the ``report`` callback.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tuneplan.core.job.strategy import Strategy
from tuneplan.errors import InvalidValueError

Report = Callable[[str, int, int], None]  # (what, done, total)
_WEIGHT_FILES = ("*.safetensors", "*.bin")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRequest:
    """One probe: the job (``strategy``) on ``model`` (bundled name, HF id or folder)."""

    model: str
    strategy: Strategy
    steps: int = 10
    device: str = "auto"          # auto | cpu | cuda
    random_weights: bool = False
    simulate: bool = False
    download: bool = False
    save: bool = True
    store_path: str | Path | None = None


def weights_source(req: ProbeRequest) -> str | Path | None:
    """Where real weights come from; None means random weights from the config."""
    if req.random_weights or req.simulate:
        return None
    path = Path(req.model).expanduser()
    if path.is_dir() and any(any(path.glob(p)) for p in _WEIGHT_FILES):
        return path
    if req.download:
        return req.model
    raise InvalidValueError(
        f"{req.model} has no local weights: pass --random-weights (built from the config, no "
        "download), a local folder with weights, or --download to fetch them from the hub")


def pick_device(asked: str, simulate: bool) -> str:
    if asked not in ("auto", "cpu", "cuda"):
        raise InvalidValueError(f"--device {asked!r} is not auto, cpu or cuda")
    if simulate:
        return "simulated"
    if asked != "auto":
        return asked
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def library_versions() -> dict[str, str]:
    out = {}
    for name in ("tuneplan", "torch", "transformers", "peft", "bitsandbytes"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import torch

    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def _refuse_litgpt(req: ProbeRequest, device: str, weights: str | Path | None) -> None:
    """``--recipe litgpt`` / ``torchtune`` run that framework's own step on the CPU (random
    weights) or simulated."""
    from tuneplan.core.job.recipes import Recipe

    recipe = req.strategy.recipe
    if recipe not in (Recipe.LITGPT, Recipe.TORCHTUNE):
        return
    from tuneplan.errors import UnsupportedError

    if device == "cuda":
        raise UnsupportedError(f"the probe runs --recipe {recipe} on the CPU or with "
                               "--simulate, not on CUDA (the CUDA probe runs the HF Trainer "
                               "step)")
    if weights is not None:
        raise UnsupportedError(f"--recipe {recipe} probes build {recipe}'s model from the "
                               "config: pass --random-weights or --simulate")


def run_probe(req: ProbeRequest, report: Report | None = None) -> dict[str, Any]:
    """Measure (or simulate) the job, compare with the estimate, save; the JSON document."""
    from tuneplan.adapters.hub import load_model_config
    from tuneplan.adapters.probe import report_fsdp
    from tuneplan.adapters.probe.harness import refuse_unrunnable
    from tuneplan.core.models import parse_model_config

    if req.steps < 1:
        raise InvalidValueError("--steps must be at least 1")
    started = time.perf_counter()
    # before reading the model: the job decides first
    sharded = report_fsdp.covers(req.strategy)
    if sharded:
        report_fsdp.refuse_unsimulated(req.strategy, req.simulate)
    else:
        refuse_unrunnable(req.strategy, fake=req.simulate)
    config, label = load_model_config(req.model)  # read once: the spec and the real model
    spec = parse_model_config(config, name=label)
    device = pick_device(req.device, req.simulate)
    weights = weights_source(req)
    _refuse_litgpt(req, device, weights)
    say = report or (lambda what, done, total: None)
    if sharded:
        doc = report_fsdp.probe_fsdp(req, spec, config, say)
    elif device == "cuda":
        from tuneplan.adapters.probe.report_cuda import probe_cuda

        doc = probe_cuda(req, spec, config, weights, say)
    else:
        from tuneplan.adapters.probe.report_cpu import probe_cpu

        doc = probe_cpu(req, spec, config, weights, device, say)
    doc["seconds"] = round(time.perf_counter() - started, 2)
    doc["versions"] = library_versions()
    if req.save:
        doc["probe_id"] = save_record(req, doc)
    return doc


def save_record(req: ProbeRequest, doc: dict[str, Any]) -> int:
    """Store a probe document as a calibration record in ``req.store_path``; its id."""
    from tuneplan.adapters.calibration import CalibrationStore, ProbeRecord

    record = ProbeRecord(
        created_at=datetime.now(UTC), model=doc["model"], strategy=doc["strategy"],
        device=doc["device"], device_name=doc["device_name"], gpu=doc.get("gpu"),
        versions=doc["versions"], measured=doc["record"])
    with CalibrationStore.open(req.store_path) as store:
        saved = store.add(record)
    return int(saved.id or 0)
