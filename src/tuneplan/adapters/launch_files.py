"""Disk side of ``tuneplan launch``: find the plan (a ``--plan`` file or the last saved
result), read the bundled training entry point, and write a bundle into a folder.

The plan comes back typed (``adapters.plans.saved_plan_from_entry``); the bundle's text
comes from ``core.launch.render_bundle``; nothing here decides content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from tuneplan.core.planner.record import SavedPlan
from tuneplan.errors import InvalidValueError

EXECUTABLE = (".sh", "train.py")


def read_train_script() -> str:
    """The text of ``train.py`` shipped as package data (``tuneplan/data/launch/train.py``)."""
    return resources.files("tuneplan").joinpath("data", "launch", "train.py").read_text(
        encoding="utf-8")


def _pick(document: Mapping[str, Any], plan_id: str | None, source: str) -> dict[str, Any]:
    """One plan entry with its ``job`` from a ``tuneplan plan --json`` document, or the
    document itself when it is a single plan."""
    if "plans" not in document:
        if "strategy" not in document:
            raise InvalidValueError(f"{source} holds neither a plan nor a `tuneplan plan "
                                    "--json` document")
        if plan_id and document.get("id") != plan_id:
            raise InvalidValueError(f"{source} holds plan {document.get('id')!r}, "
                                    f"not {plan_id!r}")
        return dict(document)
    plans = document.get("plans") or []
    if not plans:
        raise InvalidValueError(f"{source} has no plans: the job fits nowhere")
    context = {"job": document.get("job"), "model": document.get("model")}
    if plan_id is None:
        return {**context, **plans[0]}
    for entry in plans:
        if isinstance(entry, dict) and entry.get("id") == plan_id:
            return {**context, **entry}
    ids = ", ".join(str(p.get("id")) for p in plans[:5])
    raise InvalidValueError(f"no plan {plan_id!r} in {source} (it has {ids}...)")


def load_plan(plan_id: str | None, plan_file: Path | None) -> SavedPlan:
    """The plan to launch, typed: from ``plan_file`` when given (the first plan unless
    ``plan_id``), else ``plan_id`` from the last ``tuneplan plan`` result. Raises
    InvalidValueError."""
    if plan_file is None:
        if not plan_id:
            raise InvalidValueError("give a PLAN_ID from `tuneplan plan` or --plan plan.json")
        from tuneplan.adapters.plans import find_saved_plan

        return find_saved_plan(plan_id)
    try:
        document = json.loads(plan_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidValueError(f"cannot read {plan_file}: {exc.strerror}") from exc
    except ValueError as exc:
        raise InvalidValueError(f"{plan_file} is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidValueError(f"{plan_file} is not a plan document")
    from tuneplan.adapters.plans import saved_plan_from_entry

    return saved_plan_from_entry(_pick(document, plan_id, str(plan_file)))


def write_bundle(files: Mapping[str, str], out: Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` under ``out``; a folder that exists and is not empty is refused unless
    ``force`` (then the bundle's files are overwritten, other files left alone)."""
    if out.exists() and not out.is_dir():
        raise InvalidValueError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InvalidValueError(f"{out} is not empty: choose another --out or add --force")
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(EXECUTABLE):
            path.chmod(0o755)
        written.append(path)
    return written
