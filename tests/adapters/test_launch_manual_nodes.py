"""The manual multi-node scripts (``launch_accelerate.sh``/``launch_torchrun.sh``) refuse to
train where ranks could resume from different checkpoints: no checkpoint folder named, or a
folder that is not one filesystem shared by every node. Both checks stop the script before
the launcher starts (bash only: no torch needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.adapters.launch_drill import cpu_env, plan_entry, write_bundle
from tests.waiting import HANG_GUARD_S

PLAN = ("plan_llama70b_multinode_aws.json", "da81eb4f39ff")
TWO_NODES = {"gpus": 1, "nodes": 2, "sharding": "ddp", "offload": "none", "batch_size": 1,
             "grad_accum": 1}
ENGINES = ("accelerate", "torchrun")


def _run(folder: Path, engine: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", f"launch_{engine}.sh"], cwd=folder, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=cpu_env(**env))


@pytest.mark.parametrize("engine", ENGINES)
def test_several_nodes_without_a_checkpoint_folder_refuse_to_start(
        tmp_path: Path, engine: str) -> None:
    files = write_bundle(tmp_path, plan_entry(*PLAN, **TWO_NODES), ("accelerate", "deepspeed"))
    assert "checkpoint_store.sh" in files
    done = _run(tmp_path, engine, NODE_RANK="0", MASTER_ADDR="127.0.0.1")
    assert done.returncode == 2
    assert "set TUNEPLAN_CHECKPOINT_DIR to one folder every node shares" in done.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_a_folder_per_node_stops_both_nodes_before_training(tmp_path: Path) -> None:
    """Two nodes, each with its own (unshared) folder: each sees one rank of two and stops
    with exit 2 and the reason; nothing trains (no run folder, no log of the launcher)."""
    procs = []
    for rank in (0, 1):
        folder = tmp_path / f"node{rank}"
        write_bundle(folder, plan_entry(*PLAN, **TWO_NODES), ("accelerate",))
        procs.append(subprocess.Popen(
            ["bash", "launch_accelerate.sh"], cwd=folder, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cpu_env(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                        TUNEPLAN_CHECKPOINT_DIR=str(folder / "own"),
                        TUNEPLAN_SHARED_WAIT_S="1")))
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 2, err
        assert f"is not shared by all 2 nodes (rank {rank} sees 1)" in err
        own = tmp_path / f"node{rank}" / "own"
        assert sorted(p.name for p in own.iterdir()) == [".tuneplan_nodes"]


def test_a_shared_folder_passes_the_check_for_every_node(tmp_path: Path) -> None:
    """The check alone (``checkpoint_store.sh shared``), as the script runs it: both nodes
    on one folder see both ranks and pass. Each waits up to the hang guard for the other, so a
    slow machine starting the second late still passes (no clock in the outcome)."""
    shared = tmp_path / "shared"
    procs = []
    for rank in (0, 1):
        folder = tmp_path / f"node{rank}"
        write_bundle(folder, plan_entry(*PLAN, **TWO_NODES), ("accelerate",))
        assert 'checkpoint_store.sh shared "${NODE_RANK:-0}" "${NUM_NODES:-2}"' in \
            (folder / "launch_accelerate.sh").read_text()
        procs.append(subprocess.Popen(
            ["bash", "checkpoint_store.sh", "shared", str(rank), "2"], cwd=folder, text=True,
            stderr=subprocess.PIPE,
            env=cpu_env(TUNEPLAN_CHECKPOINT_DIR=str(shared),
                        TUNEPLAN_SHARED_WAIT_S=str(int(HANG_GUARD_S)))))
    for proc in procs:
        _, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0, err
    assert sorted(p.name for p in (shared / ".tuneplan_nodes").iterdir()) == ["0", "1"]


def test_one_node_keeps_the_local_default_and_needs_no_check(tmp_path: Path) -> None:
    one = dict(TWO_NODES, nodes=1)
    files = write_bundle(tmp_path, plan_entry(*PLAN, **one), ("accelerate",))
    script = files["launch_accelerate.sh"]
    assert 'TUNEPLAN_CHECKPOINT_DIR:-./checkpoints' in script
    assert "checkpoint_store.sh" not in script and "checkpoint_store.sh" not in files
