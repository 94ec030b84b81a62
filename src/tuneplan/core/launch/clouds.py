"""The cloud side of a launch bundle: a SkyPilot task (managed-job recovery) and a dstack
task + fleet (+ volume), with checkpoint storage each tool can really provide on the offer's
cloud (``core.launch.targets`` decides names and storage; this module writes them down).

Cloud pinning: SkyPilot gets the cloud only (``infra: <cloud>``), so a recovery may fail over
to another region or instance type with the same GPUs; dstack gets its backend, and a region
only where the checkpoint volume lives (a network volume is bound to one region). Pure text;
SkyPilot's schemas and dstack's models check it in the tests.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuneplan.core.launch.bundle import CHECKPOINT_DIR, LaunchSpec
from tuneplan.core.launch.engines import (
    DSTACK_ENV,
    EXIT_PREEMPTED,
    GUARD_SCRIPT,
    PREEMPTED_FILE,
    SKYPILOT_ENV,
    NodeEnv,
    guarded_argv,
    manual_env,
    shell_line,
)
from tuneplan.core.launch.targets import (
    DstackChoice,
    SkyChoice,
    Storage,
)
from tuneplan.core.launch.yamltext import render_yaml
from tuneplan.units import GB, MINUTE_S

if TYPE_CHECKING:
    from tuneplan.core.launch.native import NativeRun

#: The bundle's checkpoint-store helper (pull / periodic push / shared-path check).
STORE_SCRIPT = "checkpoint_store.sh"
#: Where a multi-node dstack run expects a filesystem every node shares (instance volume).
SHARED_HOST_PATH = "/mnt/tuneplan-checkpoints"
#: Secrets the run reads: the Hub token (gated models), and S3-style keys for the sync.
HF_SECRET = "HF_TOKEN"
SYNC_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
SYNC_URL_ENV = "TUNEPLAN_SYNC_URL"


def bucket_name(spec: LaunchSpec) -> str:
    return f"tuneplan-ckpt-{spec.plan_id}"


def fleet_name(spec: LaunchSpec) -> str:
    return f"tuneplan-{spec.plan_id}"


def _disk_gb(spec: LaunchSpec) -> int:
    return max(100, math.ceil(spec.disk_bytes / GB))


#: Written by the task's shell once the training command has exited: the store loop then
#: makes its last push without waiting for the flag, which cannot come any more (a
#: framework's own run never writes it; a train.py that crashed neither).
EXITED_FILE = f"{PREEMPTED_FILE}.exited"


def sync_every_s(spec: LaunchSpec) -> int:
    """Seconds between pushes of the local checkpoint folder: the checkpoint interval
    (a push right after each save), at least 5 minutes."""
    interval = spec.checkpoint_interval_s if math.isfinite(spec.checkpoint_interval_s) \
        else 3600.0
    return max(5 * MINUTE_S, math.ceil(interval))


def launch_lines(spec: LaunchSpec, engine: str, storage: Storage, env: NodeEnv,
                 native: NativeRun | None = None) -> list[str]:
    """Shell lines that start training under ``storage``. A mounted bucket or a volume: the
    guard replaces the shell (``exec``). A multi-node host path: the shared-folder check
    first. Local disk + sync: remove an earlier start's flag and exit marker, pull, push in
    the background (the pusher starts with SIGTERM ignored), run the guard (the shell traps
    SIGTERM so it lives on), then mark the command's exit (``EXITED_FILE``: the pusher makes
    its last push within a second) and exit with the guard's code. ``native``: the
    framework's own command (after its prelude) instead of the guard and train.py, which a
    plan of another recipe never runs."""
    argv = guarded_argv(spec, engine, env) if native is None else ["exec", *native.command]
    prelude = list(native.prelude) if native is not None else []
    if storage is Storage.LOCAL_SYNC:
        return ["trap ':' TERM INT HUP", f'rm -f "{PREEMPTED_FILE}" "{EXITED_FILE}"',
                f"bash {STORE_SCRIPT} pull || exit 2",
                # the pusher inherits SIGTERM ignored (no window before its own start-up)
                f"trap '' TERM INT HUP; bash {STORE_SCRIPT} loop & pusher=$!; "
                "trap ':' TERM INT HUP", *prelude,
                f"rc=0; {shell_line(argv[1:])} || rc=$?",
                f': > "{EXITED_FILE}"; wait "$pusher" || true', 'exit "$rc"']
    lines = [*prelude, shell_line(argv)]
    if storage is Storage.SHARED_HOST_PATH:
        lines.insert(0, f'bash {STORE_SCRIPT} shared "{env.node_rank}" "{env.num_nodes}"'
                        " || exit 2")
    return lines


def manual_script(spec: LaunchSpec, engine: str) -> str:
    """``launch_<engine>.sh`` for machines you manage yourself: run it on every node with
    NODE_RANK, MASTER_ADDR (node 0's address) and, if they differ from the plan, NUM_NODES,
    GPUS_PER_NODE and MASTER_PORT set.

    One node: checkpoints default to ``./checkpoints``. Several nodes: no default; the run
    refuses to start until ``TUNEPLAN_CHECKPOINT_DIR`` names a folder, and the bundle's
    shared-folder check proves every node sees the same one before training, since a folder
    per node would resume each rank from a different step (or none)."""
    env = manual_env(spec)
    head = ["#!/usr/bin/env bash",
            f"# Plan {spec.plan_id}: {spec.strategy.gpus} GPU(s) x {spec.strategy.nodes} "
            f"node(s), {spec.strategy.sharding.value}, launched with {engine}.",
            "# On every node: NODE_RANK=<0..N-1> MASTER_ADDR=<node 0 address> "
            + ("TUNEPLAN_CHECKPOINT_DIR=<a folder all nodes share> "
               if spec.strategy.nodes > 1 else "") + f"bash launch_{engine}.sh",
            "set -euo pipefail", 'cd "$(dirname "$0")"']
    if spec.strategy.nodes <= 1:
        body = ['export TUNEPLAN_CHECKPOINT_DIR="${TUNEPLAN_CHECKPOINT_DIR:-./checkpoints}"',
                shell_line(guarded_argv(spec, engine, env))]
    else:
        body = ['if [ -z "${TUNEPLAN_CHECKPOINT_DIR:-}" ]; then',
                f'  echo "[launch_{engine}.sh] set TUNEPLAN_CHECKPOINT_DIR to one folder every '
                'node shares (NFS, EFS, Filestore, a cluster filesystem): every rank must '
                'resume from the same checkpoint" >&2',
                "  exit 2", "fi", "export TUNEPLAN_CHECKPOINT_DIR",
                *launch_lines(spec, engine, Storage.SHARED_HOST_PATH, env)]
    return "\n".join([*head, *body]) + "\n"


def manual_needs_store_script(spec: LaunchSpec) -> bool:
    """Several nodes: the manual scripts run the store script's shared-folder check."""
    return spec.strategy.nodes > 1


def _run_script(spec: LaunchSpec, engine: str, storage: Storage,
                native: NativeRun | None = None) -> str:
    said = ("# train.py resumes from the newest complete checkpoint in $TUNEPLAN_CHECKPOINT_DIR."
            if native is None else
            f"# {native.tool}'s own run of the plan (RUN.md says how a restart resumes).")
    lines = ["set -euo pipefail", said,
             *launch_lines(spec, engine, storage, SKYPILOT_ENV, native)]
    return "\n".join(lines) + "\n"


def skypilot_task(spec: LaunchSpec, choice: SkyChoice, *, engine: str = "accelerate",
                  native: NativeRun | None = None) -> dict[str, Any]:
    """SkyPilot task: ``sky jobs launch sky.yaml`` gives managed-job recovery on preemption.
    ``native``: a framework's own run instead of train.py's."""
    resources: dict[str, Any] = {
        "infra": choice.cloud.name,
        "accelerators": f"{choice.accelerator}:{spec.strategy.gpus}",
        "use_spot": spec.use_spot, "disk_size": _disk_gb(spec)}
    if choice.network_best:
        resources["network_tier"] = "best"
    resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3,
                                 "recover_on_exit_codes": [EXIT_PREEMPTED]}
    out: dict[str, Any] = {
        "name": f"tuneplan-{spec.plan_id}", "num_nodes": spec.strategy.nodes, "workdir": ".",
        "resources": resources}
    envs: dict[str, Any] = {"TUNEPLAN_CHECKPOINT_DIR": CHECKPOINT_DIR}
    secrets: dict[str, Any] = {HF_SECRET: None}
    if choice.storage is Storage.BUCKET_MOUNT:
        store: dict[str, Any] = {"name": bucket_name(spec)}
        if choice.cloud.store:
            store["store"] = choice.cloud.store
        out["file_mounts"] = {CHECKPOINT_DIR: store | {"mode": "MOUNT"}}
    else:
        envs |= {SYNC_URL_ENV: "", "TUNEPLAN_SYNC_EVERY_S": str(sync_every_s(spec)),
                 "TUNEPLAN_SYNC_REQUIRED": "1" if spec.use_spot else "0"}
        # Required (null) where the sync is (spot), optional (empty) otherwise.
        secrets |= {name: None if spec.use_spot else "" for name in SYNC_SECRETS}
    out |= {"envs": envs, "secrets": secrets,
            "setup": "set -euo pipefail\npip install -r requirements.txt\n"
                     + ("pip install awscli\n" if choice.storage is Storage.LOCAL_SYNC else ""),
            "run": _run_script(spec, engine, choice.storage, native)}
    return out


def render_skypilot(spec: LaunchSpec, choice: SkyChoice, *,
                    native: NativeRun | None = None) -> str:
    pinned = (f"Planned on {spec.offer.instance_type or '-'} in {spec.offer.region} "
              f"(SkyPilot's catalog lists that instance type: "
              f"{'yes' if choice.instance_listed else 'no'}, that region: "
              f"{'yes' if choice.region_listed else 'no'}); only the cloud is pinned, so a "
              "recovery may fail over to another region or instance with the same GPUs.")
    return render_yaml(skypilot_task(spec, choice, native=native), header=(
        f"SkyPilot task for plan {spec.plan_id}: sky jobs launch sky.yaml "
        f"(managed job, recovers from preemption).\n{pinned}"))


# ------------------------------------------------------------------------------ dstack
#: /dev/shm per GPU for dstack's container: NCCL moves intra-node traffic through shared
#: memory when peer-to-peer is off, and Docker's default is 64 MB (NCCL's troubleshooting
#: guide: "increase shared memory"); 8 GB a GPU also holds pinned DataLoader batches.
SHM_GB_PER_GPU = 8


def _gpu_resources(spec: LaunchSpec, choice: DstackChoice) -> dict[str, Any]:
    return {"gpu": f"{choice.gpu}:{spec.strategy.gpus}", "disk": f"{_disk_gb(spec)}GB..",
            "shm_size": f"{SHM_GB_PER_GPU * spec.strategy.gpus}GB"}


def _placement(spec: LaunchSpec, choice: DstackChoice) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if choice.backend:
        out["backends"] = [choice.backend]
    if choice.volume_region:
        out["regions"] = [choice.volume_region]
    return out


def dstack_task(spec: LaunchSpec, choice: DstackChoice, *, engine: str = "accelerate",
                native: NativeRun | None = None) -> dict[str, Any]:
    """dstack task: retry on interruption, spot policy, checkpoints where every restart and
    every node finds the same ones. ``native``: a framework's own run instead of train.py's."""
    hours = spec.hours or 24.0
    retry_h = max(24, math.ceil(2 * hours))
    env = [f"TUNEPLAN_CHECKPOINT_DIR={CHECKPOINT_DIR}", HF_SECRET]
    if choice.storage is Storage.LOCAL_SYNC:
        env += [SYNC_URL_ENV, *SYNC_SECRETS, f"TUNEPLAN_SYNC_EVERY_S={sync_every_s(spec)}",
                f"TUNEPLAN_SYNC_REQUIRED={1 if spec.use_spot else 0}"]
    out: dict[str, Any] = {"type": "task", "name": f"tuneplan-{spec.plan_id}",
                           "nodes": spec.strategy.nodes}
    out |= {"image": choice.image} if choice.image else {"python": "3.11"}
    setup = ["pip install -r requirements.txt"] + (
        ["pip install awscli"] if choice.storage is Storage.LOCAL_SYNC else [])
    out |= {
        "files": (["train.py", "train_config.json", "requirements.txt",
                   "accelerate_config.yaml", GUARD_SCRIPT, "data"]
                  + (["ds_config.json"] if spec.zero_stage is not None else [])
                  if native is None else [native.config_file, "requirements.txt", "data"])
                 + ([STORE_SCRIPT] if needs_store_script(choice.storage) else []),
        "env": env,
        "commands": [*setup, *launch_lines(spec, engine, choice.storage, DSTACK_ENV, native)],
        "resources": _gpu_resources(spec, choice),
        "spot_policy": "spot" if spec.use_spot else "on-demand",
        "retry": {"on_events": ["no-capacity", "interruption"], "duration": f"{retry_h}h"},
        "fleets": [fleet_name(spec)], **_placement(spec, choice)}
    if choice.storage is Storage.NETWORK_VOLUME:
        out["volumes"] = [{"name": bucket_name(spec), "path": CHECKPOINT_DIR}]
    elif choice.storage is Storage.SHARED_HOST_PATH:
        out["volumes"] = [{"instance_path": SHARED_HOST_PATH, "path": CHECKPOINT_DIR}]
    return out


def render_dstack(spec: LaunchSpec, choice: DstackChoice, *,
                  native: NativeRun | None = None) -> str:
    first = "dstack apply -f volume.dstack.yml, " if choice.storage is Storage.NETWORK_VOLUME \
        else ""
    return render_yaml(dstack_task(spec, choice, native=native), header=(
        f"dstack task for plan {spec.plan_id}: {first}dstack apply -f fleet.dstack.yml, then "
        "dstack apply -f .dstack.yml"))


def dstack_fleet(spec: LaunchSpec, choice: DstackChoice) -> dict[str, Any]:
    """The fleet the task runs on (dstack provisions runs only into fleets): the plan's node
    count, one cluster placement for several nodes (fast interconnect, one network)."""
    out: dict[str, Any] = {"type": "fleet", "name": fleet_name(spec),
                           "nodes": spec.strategy.nodes}
    if spec.strategy.nodes > 1:
        out["placement"] = "cluster"
    out |= {"resources": _gpu_resources(spec, choice),
            "spot_policy": "spot" if spec.use_spot else "on-demand",
            **_placement(spec, choice)}
    return out


def render_dstack_fleet(spec: LaunchSpec, choice: DstackChoice) -> str:
    return render_yaml(dstack_fleet(spec, choice), header=(
        f"dstack fleet for plan {spec.plan_id}: dstack apply -f fleet.dstack.yml"))


def dstack_volume(spec: LaunchSpec, choice: DstackChoice) -> dict[str, Any]:
    """The network volume the task mounts, on the offer's own backend and region (create it
    once before the task). Only for a ``NETWORK_VOLUME`` choice."""
    if choice.storage is not Storage.NETWORK_VOLUME or not choice.backend \
            or not choice.volume_region:
        raise ValueError("this dstack choice has no network volume")
    return {"type": "volume", "name": bucket_name(spec), "backend": choice.backend,
            "region": choice.volume_region, "size": f"{_disk_gb(spec)}GB"}


def render_dstack_volume(spec: LaunchSpec, choice: DstackChoice) -> str:
    shared = (f"\nAll {spec.strategy.nodes} nodes mount this one volume ({choice.backend} "
              "volumes can be mounted by several runs at once)." if spec.strategy.nodes > 1
              else "")
    return render_yaml(dstack_volume(spec, choice), header=(
        f"dstack volume for plan {spec.plan_id}'s checkpoints.{shared}"))


# ------------------------------------------------------------------------------ helper
def needs_store_script(storage: Storage) -> bool:
    return storage in (Storage.LOCAL_SYNC, Storage.SHARED_HOST_PATH)


def store_script(spec: LaunchSpec) -> str:
    """``checkpoint_store.sh pull|loop|shared RANK NODES``.

    pull: copy ``$TUNEPLAN_SYNC_URL`` (an ``s3://`` URL; any S3-compatible store with
    ``AWS_ENDPOINT_URL``) into the local checkpoint folder before training; refuses to start
    when the URL is unset and ``TUNEPLAN_SYNC_REQUIRED=1`` (a spot run whose checkpoints
    would die with the machine). loop: push the folder every ``TUNEPLAN_SYNC_EVERY_S``
    seconds until train.py's saved-on-SIGTERM flag appears or the training command has
    exited (``EXITED_FILE``), then push once more and exit; it runs with SIGTERM ignored, so
    a preemption that lands while it starts cannot kill it before its last push. A
    half-pushed checkpoint fails train.py's marker check on resume and an older one is
    used. shared: every node writes its rank under the checkpoint
    folder and waits until it sees all of them: a folder that is not shared stops the run
    before training (ranks would resume from different steps)."""
    return f"""#!/usr/bin/env bash
# Plan {spec.plan_id}: checkpoint store helper (see RUN.md, "Checkpoints and resume").
set -uo pipefail
dir="${{TUNEPLAN_CHECKPOINT_DIR:-/checkpoints}}"
url="${{{SYNC_URL_ENV}:-}}"
every="${{TUNEPLAN_SYNC_EVERY_S:-{sync_every_s(spec)}}}"
flag="{PREEMPTED_FILE}"
exited="$flag.exited"
say() {{ echo "[{STORE_SCRIPT}] $*" >&2; }}
push() {{ [ -n "$url" ] && aws s3 sync "$dir" "$url" --delete --only-show-errors; }}
case "${{1:-}}" in
  pull)
    mkdir -p "$dir"
    if [ -z "$url" ]; then
      if [ "${{TUNEPLAN_SYNC_REQUIRED:-0}}" = "1" ]; then
        say "{SYNC_URL_ENV} is not set: on a spot machine the checkpoints on its" \
            "local disk die with it. Set it to an s3:// URL (see RUN.md)."
        exit 2
      fi
      say "{SYNC_URL_ENV} not set: checkpoints stay on this machine's local disk only."
      exit 0
    fi
    aws s3 sync "$url" "$dir" --only-show-errors || {{ say "cannot read $url"; exit 2; }}
    : > "$dir/.tuneplan_pulled" ;;
  loop)
    [ -n "$url" ] || exit 0
    [ -f "$dir/.tuneplan_pulled" ] || {{ say "no successful pull: not pushing"; exit 2; }}
    # started with SIGTERM ignored (launch_lines): a preemption ends this loop through what
    # follows it, train.py's saved-on-SIGTERM flag or the training command's exit, looked
    # for once a second
    while [ ! -f "$flag" ] && [ ! -f "$exited" ]; do
      slept=0
      while [ ! -f "$flag" ] && [ ! -f "$exited" ] && [ "$slept" -lt "$every" ]; do
        sleep 1; slept=$((slept + 1))
      done
      [ ! -f "$flag" ] && [ ! -f "$exited" ] && {{ push || say "push failed (will retry)"; }}
    done
    push || say "final push failed" ;;
  shared)
    rank="${{2:?rank}}"; nodes="${{3:?nodes}}"
    mkdir -p "$dir/.tuneplan_nodes" && echo "$(hostname)" > "$dir/.tuneplan_nodes/$rank"
    for _ in $(seq 1 "${{TUNEPLAN_SHARED_WAIT_S:-120}}"); do
      [ "$(ls "$dir/.tuneplan_nodes" | wc -l)" -ge "$nodes" ] && exit 0
      sleep 1
    done
    say "$dir is not shared by all $nodes nodes (rank $rank sees" \
        "$(ls "$dir/.tuneplan_nodes" | wc -l)): every rank must resume from the same" \
        "checkpoint. Mount one filesystem that every node shares (dstack: at" \
        "{SHARED_HOST_PATH} on the hosts; your own machines: at \\$TUNEPLAN_CHECKPOINT_DIR)" \
        "(RUN.md)."
    exit 2 ;;
  *) say "usage: $0 pull|loop|shared RANK NODES"; exit 2 ;;
esac
"""
