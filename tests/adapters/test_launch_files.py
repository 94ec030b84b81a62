"""adapters.launch_files and the bundled train.py's checkpoint bookkeeping (no torch needed)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tuneplan.adapters.launch_files import load_plan, read_train_script
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import render_bundle
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
    assert {rel: entry["bytes"] for rel, entry in info["files"].items()} == {
        "model.safetensors": 3, "optimizer.pt": 10}
    assert info["files"]["optimizer.pt"]["sha256"] == hashlib.sha256(b"o" * 10).hexdigest()


def test_a_same_size_damaged_checkpoint_is_refused_by_its_hash(
        train: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checkpoint(tmp_path, 3, train)
    newest = _checkpoint(tmp_path, 6, train)
    (newest / "model.safetensors").write_bytes(b"x" * 6)  # same size, other bytes
    assert train.read_complete_marker(newest, MARKER) is not None  # sizes alone pass
    found = train.newest_complete(tmp_path, MARKER)
    assert found is not None and found[0].name == "checkpoint-3"
    err = capsys.readouterr().err
    assert "REFUSING checkpoint-6: model.safetensors no longer match the SHA-256" in err
    # Damage that leaves no good checkpoint stops the run instead of starting it over.
    (tmp_path / "checkpoint-3" / "optimizer.pt").write_bytes(b"p" * 10)
    with pytest.raises(SystemExit, match="checkpoint-6, checkpoint-3 failed the content check"):
        train.newest_complete(tmp_path, MARKER)


def test_a_marker_listing_sizes_only_is_still_read(train: Any, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 2, train, marked=False)
    (ckpt / MARKER).write_text(json.dumps(
        {"step": 2, "files": {"model.safetensors": 2, "optimizer.pt": 10}}))
    found = train.newest_complete(tmp_path, MARKER)
    assert found is not None and found[0] == ckpt


def _guard(tmp_path: Path, launcher: str, *, stale_flag: bool = False
           ) -> subprocess.CompletedProcess[str]:
    """preemptible.sh of a real bundle around a stand-in launcher (a bash snippet)."""
    doc = json.loads(FIXTURE.read_text())
    plan = saved_plan_from_entry({"job": doc["job"], "model": doc.get("model"),
                                  **doc["plans"][0]})
    (tmp_path / "preemptible.sh").write_text(
        render_bundle(plan, ["accelerate"], train_script="")["preemptible.sh"])
    flag = tmp_path / ".tuneplan_preempted"
    if stale_flag:
        flag.write_text("{}")  # left by an earlier run: must not count for this one
    env = {k: v for k, v in os.environ.items() if k != "TUNEPLAN_PREEMPTED_FILE"}
    return subprocess.run(["bash", "preemptible.sh", "bash", "-c", launcher], cwd=tmp_path,
                          env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("launcher", "stale", "code"), [
    ('echo saved > "$TUNEPLAN_PREEMPTED_FILE"; exit 1', False, 143),  # saved on SIGTERM
    ("exit 1", False, 1),                                             # a real failure
    ("exit 1", True, 1),                                              # stale flag removed
    ('echo saved > "$TUNEPLAN_PREEMPTED_FILE"; exit 0', False, 0),    # finished anyway
    ("exit 3", False, 3),
])
def test_guard_turns_the_saved_on_sigterm_flag_into_143(
        tmp_path: Path, launcher: str, stale: bool, code: int) -> None:
    done = _guard(tmp_path, launcher, stale_flag=stale)
    assert done.returncode == code, done.stderr
    if code == 143:
        assert "launcher exited 1 after train.py saved on SIGTERM" in done.stderr


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
