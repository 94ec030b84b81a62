"""adapters.launch_files and the bundled train.py's checkpoint bookkeeping (no torch needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tuneplan.adapters.launch_files import load_plan, read_train_script
from tuneplan.errors import InvalidValueError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"
MARKER = "TUNEPLAN_COMPLETE.json"


@pytest.fixture(scope="module")
def train(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("bundle") / "train.py"
    path.write_text(read_train_script())
    spec = importlib.util.spec_from_file_location("bundle_train_helpers", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checkpoint(root: Path, step: int, train: Any, *, marked: bool = True) -> Path:
    ckpt = root / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"w" * step)
    (ckpt / "optimizer.pt").write_bytes(b"o" * 10)
    if marked:
        train.write_marker(ckpt, MARKER, {"step": step, "world_size": 1})
    return ckpt


def test_newest_complete_skips_unmarked_and_damaged_checkpoints(train: Any,
                                                                tmp_path: Path) -> None:
    _checkpoint(tmp_path, 3, train)
    damaged = _checkpoint(tmp_path, 6, train)
    (damaged / "optimizer.pt").write_bytes(b"short")  # a file changed after the marker
    _checkpoint(tmp_path, 9, train, marked=False)     # died while saving
    (tmp_path / "checkpoint-x").mkdir()               # not a checkpoint name
    found = train.newest_complete(tmp_path, MARKER)
    assert found is not None
    path, info = found
    assert path.name == "checkpoint-3" and info["step"] == 3
    assert info["files"] == {"model.safetensors": 3, "optimizer.pt": 10}


def test_marker_is_written_last_and_lists_every_file(train: Any, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 5, train)
    info = json.loads((ckpt / MARKER).read_text())
    assert set(info["files"]) == {"model.safetensors", "optimizer.pt"}
    assert not list(ckpt.glob("*.tmp"))
    assert train.read_complete_marker(ckpt, MARKER)["world_size"] == 1


def test_world_size_change_under_zero_warns(train: Any, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    train.warn_world_size({"world_size": 8}, 16, "zero3")
    assert "ds_to_universal" in capsys.readouterr().err
    train.warn_world_size({"world_size": 8}, 8, "zero3")
    assert capsys.readouterr().err == ""


def test_load_plan_picks_by_id_or_first_and_rejects_other_files(tmp_path: Path) -> None:
    assert load_plan(None, FIXTURE).id == "b9d2e2d7f4db"
    picked = load_plan("591488aa26ff", FIXTURE)
    assert picked.id == "591488aa26ff" and picked.model_id == "meta-llama/Llama-3.1-8B"
    assert picked.offer.id == "b83e21e08206" and picked.strategy.method.value == "qlora"
    doc = json.loads(FIXTURE.read_text())
    entry = next(p for p in doc["plans"] if p["id"] == "591488aa26ff")
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"job": doc["job"], **entry}))
    assert load_plan(None, single).id == "591488aa26ff"
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps({"job": doc["job"], **entry,
                                    "offer": entry["offer"] | {"price_per_hour": "nope"}}))
    with pytest.raises(InvalidValueError, match="price_per_hour"):
        load_plan(None, tampered)
    not_plan = tmp_path / "x.json"
    not_plan.write_text("[1, 2]")
    with pytest.raises(InvalidValueError):
        load_plan(None, not_plan)
    with pytest.raises(InvalidValueError, match="cannot read"):
        load_plan(None, tmp_path / "missing.json")
