"""The engine side of a launch bundle: accelerate config (FSDP settings or DeepSpeed plugin),
DeepSpeed JSON, and the ``accelerate launch`` / ``torchrun`` command lines over nodes.

Node rank, node count and the first node's address are shell expressions of the scheduler's
own variables (``NodeEnv``), so one command line serves every node. Pure text; the consuming
libraries' parsers check it in the tests.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from tuneplan.core.job.strategy import Loss, Offload, Optimizer, Precision, Sharding
from tuneplan.core.launch.bundle import LaunchSpec, checkpoint_write_s
from tuneplan.core.launch.yamltext import render_yaml

MAIN_PORT = 29500


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEnv:
    """Shell expressions for this node's rank, the node count, GPUs per node and node 0's
    address and port, as a scheduler provides them."""

    name: str
    node_rank: str
    num_nodes: str
    gpus_per_node: str
    main_addr: str
    main_port: str = str(MAIN_PORT)


SKYPILOT_ENV = NodeEnv(
    name="skypilot", node_rank="${SKYPILOT_NODE_RANK}", num_nodes="${SKYPILOT_NUM_NODES}",
    gpus_per_node="${SKYPILOT_NUM_GPUS_PER_NODE}",
    # SKYPILOT_NODE_IPS holds one address per line, node 0 first.
    main_addr='$(echo "${SKYPILOT_NODE_IPS}" | head -n1)')
DSTACK_ENV = NodeEnv(
    name="dstack", node_rank="${DSTACK_NODE_RANK}", num_nodes="${DSTACK_NODES_NUM}",
    gpus_per_node="${DSTACK_GPUS_PER_NODE}", main_addr="${DSTACK_MASTER_NODE_IP}")


def manual_env(spec: LaunchSpec) -> NodeEnv:
    """Variables a person sets on each node by hand (defaults: the plan's counts, one node)."""
    return NodeEnv(name="manual", node_rank="${NODE_RANK:-0}",
                   num_nodes=f"${{NUM_NODES:-{spec.strategy.nodes}}}",
                   gpus_per_node=f"${{GPUS_PER_NODE:-{spec.strategy.gpus}}}",
                   main_addr="${MASTER_ADDR:-127.0.0.1}",
                   main_port=f"${{MASTER_PORT:-{MAIN_PORT}}}")


def _mixed_precision(spec: LaunchSpec) -> str:
    if spec.strategy.precision is Precision.FP16_MIXED:
        return "fp16"
    return "no" if spec.strategy.precision is Precision.FP32 else "bf16"


_FSDP_STRATEGY = {Sharding.FSDP: "FULL_SHARD", Sharding.FSDP_GRAD_OP: "SHARD_GRAD_OP",
                  Sharding.HYBRID: "HYBRID_SHARD"}


def accelerate_config(spec: LaunchSpec) -> dict[str, Any]:
    """accelerate's ClusterConfig keys for this plan (``accelerate launch --config_file``).

    ZeRO plans use the DeepSpeed plugin pointing at ``ds_config.json``; FSDP plans FSDP with
    sharded state dicts (each rank saves its shard: fast checkpoints); else DDP or one GPU."""
    out: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False,
        "distributed_type": "MULTI_GPU" if spec.world_size > 1 else "NO",
        "downcast_bf16": "no", "machine_rank": 0, "main_training_function": "main",
        "mixed_precision": _mixed_precision(spec), "num_machines": spec.strategy.nodes,
        "num_processes": spec.world_size, "rdzv_backend": "static", "same_network": True,
        "use_cpu": False}
    if spec.strategy.nodes > 1:
        out |= {"main_process_ip": "127.0.0.1", "main_process_port": MAIN_PORT}
    if spec.zero_stage is not None:
        out["distributed_type"] = "DEEPSPEED"
        out["deepspeed_config"] = {
            "deepspeed_config_file": "ds_config.json",
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": spec.zero_stage == 3}
        out.pop("mixed_precision")  # taken from ds_config.json; accelerate refuses both
    elif spec.is_fsdp:
        out["distributed_type"] = "FSDP"
        out["fsdp_config"] = {
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_forward_prefetch": False,
            "fsdp_offload_params": spec.strategy.offload is not Offload.NONE,
            "fsdp_sharding_strategy": _FSDP_STRATEGY[spec.strategy.sharding],
            "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_sync_module_states": True,
            "fsdp_use_orig_params": True, "fsdp_version": 1}
    return out


def render_accelerate_config(spec: LaunchSpec) -> str:
    return render_yaml(accelerate_config(spec), header=(
        f"accelerate config for plan {spec.plan_id} ({spec.strategy.sharding.value}, "
        f"{spec.strategy.gpus} GPU(s) x {spec.strategy.nodes} node(s)).\n"
        "machine_rank / main_process_ip are overridden per node on the command line."))


def _zero_stage_for_deepspeed(spec: LaunchSpec) -> int:
    """The plan's ZeRO stage; FSDP maps to its DeepSpeed twin (full shard = 3, grad+optimizer
    shard = 2); DDP on several GPUs = 0 (plain data parallel)."""
    if spec.zero_stage is not None:
        return spec.zero_stage
    return {Sharding.FSDP: 3, Sharding.HYBRID: 3, Sharding.FSDP_GRAD_OP: 2}.get(
        spec.strategy.sharding, 0)


def deepspeed_config(spec: LaunchSpec) -> dict[str, Any]:
    """DeepSpeed JSON: batch sizes (train_batch_size = micro x accumulation x world size, which
    DeepSpeed and the HF Trainer both check), precision, ZeRO stage and offload."""
    stage = _zero_stage_for_deepspeed(spec)
    zero: dict[str, Any] = {"stage": stage}
    if stage:
        # Bucket sizes the HF Trainer fills from the model ("auto": reduce bucket H², ZeRO-3
        # prefetch 0.9 H² and persistence threshold 10 H; transformers
        # integrations/deepspeed.py trainer_config_finalize), which the memory model's
        # sharding/zero_buckets term assumes; left out, DeepSpeed's own default of 5e8
        # elements would hold 1 GB (ZeRO-3, all run) or 2 GB (ZeRO-1/2 with overlap_comm,
        # during backward) per rank (deepspeed 0.19 stage3.py, stage_1_and_2.py).
        zero |= {"overlap_comm": True, "contiguous_gradients": True,
                 "reduce_bucket_size": "auto"}
    offloaded = bool(stage) and spec.strategy.offload is not Offload.NONE
    if offloaded:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero |= {"stage3_gather_16bit_weights_on_model_save": True,
                 "stage3_prefetch_bucket_size": "auto",
                 "stage3_param_persistence_threshold": "auto"}
        if spec.strategy.offload is Offload.OPTIMIZER_PARAMS:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    out: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": spec.strategy.batch_size,
        "gradient_accumulation_steps": spec.strategy.grad_accum,
        "train_batch_size": spec.strategy.batch_size * spec.strategy.grad_accum * spec.world_size,
        "gradient_clipping": 1.0, "zero_optimization": zero, "steps_per_print": 100,
        "wall_clock_breakdown": False}
    if spec.strategy.precision is Precision.FP16_MIXED:
        out["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif spec.strategy.precision is not Precision.FP32:
        out["bf16"] = {"enabled": True}
    if offloaded:
        out |= _offloaded_optimizer(spec)
    return out


def _offloaded_optimizer(spec: LaunchSpec) -> dict[str, Any]:
    """What lets DeepSpeed start with the optimizer offloaded to the host.

    ``deepspeed.initialize`` (deepspeed 0.19 ``runtime/engine.py`` ``_configure_optimizer``)
    raises ZeRORuntimeException for a client optimizer under offload unless it is DeepSpeed's
    CPUAdam or ``zero_force_ds_cpu_optimizer`` is false. AdamW is named in the JSON: DeepSpeed
    builds its CPUAdam (the host update rate the plan's step time assumes) and the HF Trainer
    fills the ``auto`` values from its arguments. Any other optimizer is the Trainer's own,
    run on the host with the check switched off (else accelerate would swap it for CPUAdam
    without a word: accelerate 1.x ``map_pytorch_optim_to_deepspeed``)."""
    if spec.strategy.optimizer is Optimizer.ADAMW:
        return {"optimizer": {"type": "AdamW", "params": {
            "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}}
    return {"zero_force_ds_cpu_optimizer": False}


#: The bundle's wrapper around the launcher (``guard_script``).
GUARD_SCRIPT = "preemptible.sh"
#: Exit code of a run that saved on SIGTERM and wants to be restarted (128 + SIGTERM); the
#: clouds' recovery rules match it.
EXIT_PREEMPTED = 143
#: Fixed part of the launcher's grace period after SIGTERM: start-up of the save, the
#: marker, the collectives (stated, not measured).
GRACE_BASE_S = 60


def shutdown_grace_s(spec: LaunchSpec) -> int:
    """Seconds the launcher waits for its workers after SIGTERM before SIGKILL: the base plus
    twice the checkpoint's write time at the cost model's rate (write it, then read it back
    for its content hashes). torch's own default is 30 s (torch 2.x
    ``distributed/launcher/api.py``, ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``), too short for a
    large checkpoint, and a save cut by SIGKILL is a lost one."""
    return GRACE_BASE_S + math.ceil(2 * checkpoint_write_s(spec.checkpoint_bytes))


#: train.py's saved-on-SIGTERM flag (shell text): the guard exports it, the checkpoint store
#: script reads it.
PREEMPTED_FILE = "${TUNEPLAN_PREEMPTED_FILE:-$PWD/.tuneplan_preempted}"


def guard_script(spec: LaunchSpec) -> str:
    """``preemptible.sh LAUNCHER ARGS...``: runs the launcher and exits 143 when train.py
    saved on SIGTERM. ``accelerate launch`` and ``torchrun`` exit 1 whatever their workers
    returned (torch 2.x ``distributed/launcher/api.py``: a failed worker becomes
    ChildFailedError, a signal to the launcher SignalException, both uncaught), so train.py's
    own 143 never reaches the scheduler; train.py leaves a flag file instead, removed here
    before each start. The launcher runs in its own session, so a signal to this script's
    process group reaches it once, forwarded here."""
    grace = shutdown_grace_s(spec)
    note = f"launcher exited $rc after train.py saved on SIGTERM: exit {EXIT_PREEMPTED}"
    return f"""#!/usr/bin/env bash
# Plan {spec.plan_id}: bash {GUARD_SCRIPT} <launcher> <args...>
# Exit {EXIT_PREEMPTED} = train.py saved on SIGTERM (restart me); else the launcher's code.
set -uo pipefail
export TUNEPLAN_PREEMPTED_FILE="{PREEMPTED_FILE}"
# Seconds the launcher gives train.py to finish its SIGTERM save before SIGKILL (see RUN.md).
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${{TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-{grace}}}"
rm -f "$TUNEPLAN_PREEMPTED_FILE"
if command -v setsid >/dev/null 2>&1; then setsid "$@" & else "$@" & fi
child=$!
trap 'trap "" TERM INT HUP; kill -TERM "$child" 2>/dev/null' TERM INT HUP
rc=0
wait "$child" || rc=$?
while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
if [ "$rc" -ne 0 ] && [ -f "$TUNEPLAN_PREEMPTED_FILE" ]; then
  echo "[{GUARD_SCRIPT}] {note}" >&2
  exit {EXIT_PREEMPTED}
fi
exit "$rc"
"""


def guarded_argv(spec: LaunchSpec, engine: str, env: NodeEnv) -> list[str]:
    """``launch_argv`` behind ``preemptible.sh``: what the bundle's scripts and tasks run.
    ``exec``: the guard replaces the calling shell, so the scheduler's SIGTERM reaches it
    (a shell waiting on a child would die of it, and the launch with it, unsaved)."""
    return ["exec", "bash", GUARD_SCRIPT, *launch_argv(spec, engine, env)]


def launch_argv(spec: LaunchSpec, engine: str, env: NodeEnv) -> list[str]:
    """The launcher's argv (words may hold shell expansions of ``env``), then train.py's."""
    nodes, gpus = env.num_nodes, env.gpus_per_node
    if engine == "accelerate":
        head = ["accelerate", "launch", "--config_file", "accelerate_config.yaml",
                "--num_machines", nodes, "--num_processes", f"$(({nodes} * {gpus}))",
                "--machine_rank", env.node_rank, "--main_process_ip", env.main_addr,
                "--main_process_port", env.main_port]
        return [*head, "train.py", "--config", "train_config.json"]
    if engine == "torchrun":
        head = ["torchrun", "--nnodes", nodes, "--nproc_per_node", gpus,
                "--node_rank", env.node_rank, "--master_addr", env.main_addr,
                "--master_port", env.main_port]
        return [*head, "train.py", "--config", "train_config.json",
                "--deepspeed", "ds_config.json"]
    raise ValueError(f"unknown engine {engine!r}")


def shell_line(argv: list[str]) -> str:
    """argv as one shell line, each word one argument: words with expansions double-quoted
    as written (expanded once, never split; a ``$(...)`` in them keeps its own quoting),
    arithmetic ``$((...))`` as it is, every other word quoted where the shell would split or
    read it (``shlex.quote``: ``sh -c 'a; b'`` stays one command for sh, not two for this
    shell)."""
    words = []
    for word in argv:
        if "$" in word:
            words.append(word if word.startswith("$((") else f'"{word}"')
        else:
            words.append(shlex.quote(word))
    return " ".join(words)


def requirements(spec: LaunchSpec, *, deepspeed: bool) -> str:
    """pip requirements of the bundle's train.py (CUDA torch comes from the machine image):
    bitsandbytes for quantised bases and 8-bit/paged optimizers, DeepSpeed when the bundle
    carries a DeepSpeed JSON."""
    # trl pinned: train.py reads SFTConfig/SFTTrainer as trl 1.16 has them; it brings
    # datasets and pyarrow (the memory-mapped rows).
    lines = ["transformers>=4.56.2", "accelerate>=1.10.1", "peft>=0.13", "safetensors",
             "trl==1.16.0", "datasets>=4.7.0", "pyarrow"]
    quantised = spec.strategy.method.value in ("qlora", "lora8bit")
    if quantised or spec.strategy.optimizer.is_8bit or spec.strategy.optimizer.is_paged or \
            spec.strategy.optimizer.is_galore:  # galore_torch imports bitsandbytes on import
        lines.append("bitsandbytes>=0.45")
    if spec.strategy.optimizer.is_galore:
        # the GaLore optimizers the Trainer builds (optim galore_*): the version estimated
        lines.append("galore-torch==1.0")
    if deepspeed:
        lines.append("deepspeed>=0.15")
    if spec.strategy.loss is Loss.CHUNKED:
        # train.py sets use_liger_kernel: Liger's fused linear cross-entropy computes the
        # logits chunk by chunk and never holds them whole (Triton: CUDA or ROCm)
        lines.append("liger-kernel>=0.5")
    return "\n".join(lines) + "\n"
