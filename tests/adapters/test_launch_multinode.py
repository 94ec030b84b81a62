"""A 2-node resume drill on the CPU: two local processes act as two nodes, each running the
bundle's own ``launch_accelerate.sh`` from its own copy of the bundle (``NODE_RANK`` 0 / 1,
node 0's address, one process per node: accelerate launch -> torch elastic, static
rendezvous, gloo) on a tiny random Llama.

Storage is the layout the bundle emits for several nodes (RUN.md; ``core.launch.targets``:
a bucket mount or a shared volume/host path, never a disk per node): one checkpoint folder
that both nodes see (``TUNEPLAN_CHECKPOINT_DIR``). Process 0 writes the shared files and the
marker, each rank its own RNG state, and process 0 picks the checkpoint to resume from and
broadcasts it (train.py ``resume_point``).

A SIGTERM mid-run (to both nodes, or to node 1 alone) stops both nodes with exit 143 after
one agreed save; restarted, both ranks resume from that same step and the final weights equal
an uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.launch_drill import cpu_env, plan_entry, write_bundle
from tests.waiting import HANG_GUARD_S, wait_until

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.probe
#: The 70B multi-node fixture plan (AWS, 4 nodes x 1 L40S, ZeRO-3) made 2 nodes x 1 process
#: under DDP: the tiny model needs no sharding and DeepSpeed is not what is drilled here.
PLAN = ("plan_llama70b_multinode_aws.json", "da81eb4f39ff")
TWO_NODES = {"gpus": 1, "nodes": 2, "sharding": "ddp", "offload": "none", "batch_size": 1,
             "grad_accum": 1}
RESUMED = re.compile(r"\[train\.py\] resuming from (checkpoint-\d+) \(process (\d) of (\d)\)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cluster(root: Path) -> tuple[list[Path], Path]:
    """(each node's own bundle folder, the one checkpoint folder both see)."""
    nodes = []
    for rank in (0, 1):
        folder = root / f"node{rank}"
        files = write_bundle(folder, plan_entry(*PLAN, **TWO_NODES), ("accelerate",))
        nodes.append(folder)
    assert "2 nodes share one checkpoint folder" in files["RUN.md"]
    return nodes, root / "shared"


def _start(nodes: list[Path], shared: Path, *, per_node: tuple[dict[str, str], ...] = ({}, {})
           ) -> list[subprocess.Popen[str]]:
    """Both nodes' launch_accelerate.sh, as RUN.md says to run it on every node; each
    node's stderr goes to its ``launch.log``."""
    port = str(_free_port())
    procs = []
    for rank, folder in enumerate(nodes):
        env = cpu_env(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      TUNEPLAN_CHECKPOINT_DIR=str(shared), **per_node[rank])
        with (folder / "launch.log").open("w") as log:
            procs.append(subprocess.Popen(["bash", "launch_accelerate.sh"], cwd=folder,
                                          env=env, stdout=subprocess.DEVNULL, stderr=log,
                                          text=True))
    return procs


def _finish(procs: list[subprocess.Popen[str]], nodes: list[Path]) -> list[tuple[int, str]]:
    return [(proc.wait(timeout=HANG_GUARD_S), (folder / "launch.log").read_text())
            for proc, folder in zip(procs, nodes, strict=True)]


def _run_dir(nodes: list[Path], shared: Path) -> Path:
    return shared / json.loads((nodes[0] / "train_config.json").read_text())["plan_id"]


def _progress(run: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in
            (run / f"progress-rank{rank}.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-node run; its run folder."""
    nodes, shared = _cluster(tmp_path_factory.mktemp("two-nodes") / "reference")
    for code, err in _finish(_start(nodes, shared), nodes):
        assert code == 0, err[-3000:]
    return _run_dir(nodes, shared)


def _assert_resumed_like(reference: Path, nodes: list[Path], shared: Path, step: int) -> None:
    """Restart both nodes: each rank says it resumes from checkpoint-``step`` (its own node's
    log), the run ends, every rank's step log and the final weights equal the reference's."""
    import torch

    run = _run_dir(nodes, shared)
    results = _finish(_start(nodes, shared), nodes)
    for rank, (code, err) in enumerate(results):
        assert code == 0, err[-3000:]
        assert RESUMED.findall(err) == [(f"checkpoint-{step}", str(rank), "2")], err[-3000:]
    for rank in (0, 1):  # 8 rows over 2 ranks: 4 steps, the same samples in the same steps
        assert _progress(run, rank) == _progress(reference, rank)
        assert [s["step"] for s in _progress(run, rank)] == [1, 2, 3, 4]
    done, want = _weights(run), _weights(reference)
    assert done.keys() == want.keys() and done
    assert [k for k in done if not torch.equal(done[k], want[k])] == []


def _assert_saved_on_sigterm(run: Path, step: int) -> None:
    """One checkpoint of ``step``, saved on SIGTERM by both ranks into the shared folder."""
    marker = json.loads((run / f"checkpoint-{step}" / "TUNEPLAN_COMPLETE.json").read_text())
    assert marker["reason"] == "sigterm" and marker["world_size"] == 2
    assert marker["step"] == step
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= marker["files"].keys()  # one per rank
    later = [p.name for p in run.glob("checkpoint-*") if int(p.name.split("-")[1]) > step]
    assert later == [] and not (run / "final").exists()


def test_sigterm_to_both_nodes_then_both_resume_from_the_same_step(
        reference: Path, tmp_path: Path) -> None:
    nodes, shared = _cluster(tmp_path)
    run = _run_dir(nodes, shared)
    hold = {"TUNEPLAN_FAULT_HOLD_AT_STEP": "3"}  # process 0 waits after step 3 for the signal
    procs = _start(nodes, shared, per_node=(hold, hold))
    wait_until(lambda: any(p.poll() is not None for p in procs) or (run / "HOLDING").exists(),
               "process 0 holding at step 3")
    for proc in procs:  # to each node's preemptible.sh, as a scheduler stops a task
        proc.send_signal(signal.SIGTERM)
    for code, err in _finish(procs, nodes):
        assert code == 143, err[-3000:]
        assert "stopped on SIGTERM after saving step 3" in err
    _assert_saved_on_sigterm(run, 3)
    _assert_resumed_like(reference, nodes, shared, 3)


def test_node1_alone_preempted_stops_both_at_one_agreed_step(
        reference: Path, tmp_path: Path) -> None:
    """Only node 1 gets the SIGTERM (inside its step 3): node 0 saves and stops with it, so a
    restart of both finds one checkpoint that every rank agrees on."""
    nodes, shared = _cluster(tmp_path)
    run = _run_dir(nodes, shared)
    procs = _start(nodes, shared, per_node=({}, {"TUNEPLAN_FAULT_SIGTERM_AT_STEP": "3"}))
    for code, err in _finish(procs, nodes):
        assert code == 143, err[-3000:]
    _assert_saved_on_sigterm(run, 3)
    _assert_resumed_like(reference, nodes, shared, 3)
