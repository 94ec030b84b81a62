"""RUN.md of a launch bundle: what was chosen and why, expected time and cost, checkpoint
cadence with its reason, and how to launch each way. Text only."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuneplan.core.job.strategy import Offload, Optimizer
from tuneplan.core.launch.bundle import LaunchSpec, Target
from tuneplan.core.launch.clouds import (
    HF_SECRET,
    SHARED_HOST_PATH,
    STORE_SCRIPT,
    SYNC_SECRETS,
    SYNC_URL_ENV,
    bucket_name,
    sync_every_s,
)
from tuneplan.core.launch.engines import EXIT_PREEMPTED, GUARD_SCRIPT, shutdown_grace_s
from tuneplan.core.launch.frameworks import (
    AXOLOTL,
    AXOLOTL_FILE,
    AXOLOTL_VERSION,
    DATASET_INFO_FILE,
    LLAMAFACTORY,
    LLAMAFACTORY_FILE,
    LLAMAFACTORY_VERSION,
    output_dir,
)
from tuneplan.core.launch.native import NativeRun
from tuneplan.core.launch.targets import DstackChoice, Refusal, SkyChoice, Storage
from tuneplan.units import GB, format_duration


def _md(text: str) -> str:
    """Catalog text as literal Markdown: specials backslash-escaped, controls dropped."""
    shown = "".join(ch for ch in text if ch.isprintable())
    return "".join("\\" + ch if ch in "\\`*_[]<>#|!()" else ch for ch in shown)


def _code(text: str) -> str:
    """Catalog text inside a Markdown code span: no backtick can close it, controls dropped."""
    return "".join(ch for ch in text if ch.isprintable()).replace("`", "'")


def _chosen(spec: LaunchSpec) -> list[str]:
    s, offer = spec.strategy, spec.offer
    given = ",".join(s.lora_targets)
    wrapped = ",".join(spec.lora_targets)
    named = given if wrapped == given else f"{given} (PEFT wraps {wrapped})"
    lora = (f", rank {s.lora_rank}, alpha {s.lora_alpha}, targets {named}"
            if s.method.is_lora else "")
    quant = f", base in {s.quant.value}" if s.method.value in ("qlora", "lora8bit") else ""
    return [
        f"- Model `{spec.model_id}`, method **{s.method.value}**{lora}{quant}.",
        f"- {s.gpus} x {spec.gpu_name} x {s.nodes} node(s) on {_md(offer.provider)} "
        f"`{_code(offer.instance_type)}` in {_md(offer.region)}, "
        f"{'spot' if spec.use_spot else 'on-demand'}.",
        f"- {s.precision.value}, optimizer {s.optimizer.value}, micro-batch "
        f"{s.batch_size} x accumulation {s.grad_accum}, sequence {s.seq_len}, "
        f"packing {'on' if s.packing else 'off'}, activation checkpointing "
        f"{s.checkpointing.value}, sharding {s.sharding.value}, offload "
        f"{s.offload.value}.",
    ]


def _expectations(spec: LaunchSpec) -> list[str]:
    out = [f"- Step time about {spec.step_s:.2f} s"
           + (f", about {spec.planned_steps} optimizer steps" if spec.planned_steps else "")
           + (f", {spec.hours:.1f} h in all" if spec.hours else "") + "."]
    s = spec.strategy
    if s.offload is not Offload.NONE and spec.zero_stage is not None:
        out.append(
            "- Optimizer state on the host: DeepSpeed's CPU Adam updates it (named in "
            "`ds_config.json`; DeepSpeed compiles it on the first start)."
            if s.optimizer is Optimizer.ADAMW else
            f"- Optimizer state on the host: {s.optimizer.value} runs there as the Trainer's "
            "own optimizer (`zero_force_ds_cpu_optimizer: false`), slower than the DeepSpeed "
            "CPU Adam rate the step time assumes.")
    if spec.on_demand_usd or spec.spot_usd:
        out.append(f"- Cost: on-demand {spec.on_demand_usd or '-'} USD, spot expected "
                   f"{spec.spot_usd or '-'} USD.")
    return out


def _checkpoints(spec: LaunchSpec) -> list[str]:
    interval = format_duration(spec.checkpoint_interval_s) \
        if math.isfinite(spec.checkpoint_interval_s) else "1h (no interruption expected)"
    return [
        f"- Every **{spec.save_steps} steps** (interval {interval} from {spec.interval_source},"
        f" / {spec.step_s:.2f} s per step). One checkpoint is about "
        f"{spec.checkpoint_bytes / GB:.1f} GB; the newest {spec.save_total_limit} are kept "
        f"(disk asked for: {spec.disk_bytes / GB:.0f} GB).",
        "- A checkpoint counts only once `TUNEPLAN_COMPLETE.json` (written last, listing every "
        "file with its size and SHA-256) is present and matches; train.py resumes from the "
        "newest such one whose files still hash as saved (a damaged one is refused, with its "
        "file names, and an older one used): weights or adapter, optimizer, scheduler, RNG and "
        "the position in the data.",
        "- On SIGTERM (spot notice, `sky jobs cancel`, `dstack stop`) train.py saves at once "
        "(single process: mid-step, the unfinished step is redone on resume; several processes:"
        " at the end of the current step, all ranks agreeing). `accelerate launch` and "
        "`torchrun` exit 1 whatever train.py returned, so every launch goes through "
        f"`{GUARD_SCRIPT}`: it exits **{EXIT_PREEMPTED}** (what the recovery rules match) when "
        "train.py left its saved-on-SIGTERM flag, and gives the launcher "
        f"{shutdown_grace_s(spec)} s (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`; torch's default is 30 s)"
        " to let the save finish before SIGKILL.",
        "- The final model goes to `final/` whole, loadable with `from_pretrained` (under FSDP"
        " the final save switches to a full state dict; interval checkpoints stay sharded).",
        "- Resuming a ZeRO/FSDP checkpoint with a different number of GPUs prints a warning: "
        "convert it first (DeepSpeed `ds_to_universal.py`).",
    ]


def _sync_text(spec: LaunchSpec, where: str) -> str:
    every = format_duration(sync_every_s(spec))
    return (f"checkpoints go to the machine's local disk (`/checkpoints`); `{STORE_SCRIPT}` "
            f"pulls them from `${SYNC_URL_ENV}` (an `s3://` URL; any S3-compatible store with "
            f"`AWS_ENDPOINT_URL`) before training, pushes them there every {every} and once "
            f"more after a SIGTERM save (`aws s3 sync`). Without `{SYNC_URL_ENV}` a lost "
            f"machine loses its checkpoints; a spot run refuses to start without it ({where}).")


def _storage(spec: LaunchSpec, sky: SkyChoice | None, dstack: DstackChoice | None) -> list[str]:
    out: list[str] = []
    nodes = spec.strategy.nodes
    if nodes > 1:
        out.append(f"- {nodes} nodes share one checkpoint folder: train.py's process 0 picks "
                   "the newest complete checkpoint and broadcasts its path, then every rank "
                   "loads its own shard from that path, so every node must see the same "
                   "files (no per-node disks or volumes).")
    if sky is not None:
        cloud = sky.cloud.name
        if sky.storage is Storage.BUCKET_MOUNT:
            store = f"store `{sky.cloud.store}`" if sky.cloud.store else \
                "the store SkyPilot picks from your enabled storage clouds"
            out.append(f"- SkyPilot: checkpoints are written straight into the bucket "
                       f"`{bucket_name(spec)}` ({store}, `mode: MOUNT` at `/checkpoints` on "
                       "every node): a recovered job and every rank read the same files.")
        else:
            out.append(f"- SkyPilot cannot mount a bucket on {cloud} (its "
                       f"STORAGE_MOUNTING feature is unsupported there): "
                       + _sync_text(spec, "`TUNEPLAN_SYNC_REQUIRED=1` in sky.yaml"))
    if dstack is not None:
        if dstack.storage is Storage.NETWORK_VOLUME:
            shared = " All nodes mount this one volume." if nodes > 1 else ""
            out.append(f"- dstack: checkpoints on the network volume `{bucket_name(spec)}` "
                       f"({dstack.backend}, region {_code(dstack.volume_region or '')}); the "
                       "fleet and the run are pinned to that backend and region, because a "
                       f"volume is bound to them.{shared}")
        elif dstack.storage is Storage.SHARED_HOST_PATH:
            out.append(f"- dstack: checkpoints on the instance path `{SHARED_HOST_PATH}` "
                       "(an instance volume), which must be ONE filesystem shared by every "
                       "node (EFS/FSx on AWS, Filestore on GCP, a Nebius shared filesystem, "
                       f"NFS on an SSH fleet). `{STORE_SCRIPT} shared` stops the run before "
                       "training when the nodes do not see each other's files.")
        else:
            why = (f"dstack has no network volumes on {dstack.backend}" if dstack.backend
                   else "the provider is no dstack backend")
            out.append(f"- dstack ({why}): " + _sync_text(spec, "`TUNEPLAN_SYNC_REQUIRED=1` "
                                                              "in .dstack.yml"))
    return out


def _pinning(spec: LaunchSpec, sky: SkyChoice | None, dstack: DstackChoice | None) -> list[str]:
    out: list[str] = []
    offer = spec.offer
    if sky is not None:
        listed = ("both listed in SkyPilot's catalog" if sky.instance_listed and
                  sky.region_listed else "not both listed in SkyPilot's bundled catalog")
        out.append(f"- SkyPilot: only the cloud is pinned (`infra: {sky.cloud.name}`, "
                   f"`accelerators: {sky.accelerator}:{spec.strategy.gpus}`, SkyPilot's own "
                   f"name for {offer.gpu}). The plan priced `{_code(offer.instance_type)}` in "
                   f"{_md(offer.region)} ({listed}); a launch or recovery "
                   "(`EAGER_NEXT_REGION`) may fail over to another region or instance type "
                   "with the same GPUs, at its own price. To pin, write "
                   f"`infra: {sky.cloud.name}/<region>` and `instance_type:`."
                   + (" Multi-node: `network_tier: best` asks for the cloud's fast "
                      "interconnect." if sky.network_best else ""))
    if dstack is not None:
        backend = f"backend `{dstack.backend}`" if dstack.backend else "no backend (dstack " \
            "picks one: the provider is not a dstack backend)"
        out.append(f"- dstack: {backend}, GPU `{dstack.gpu}` (gpuhunt's name)"
                   + (f", image `{dstack.image}` (ROCm for an AMD GPU)" if dstack.image else "")
                   + "; regions and instance types are left to dstack unless a volume pins "
                   "the region.")
    return out


def _how(spec: LaunchSpec, files: Sequence[str], targets: Sequence[Target],
         sky: SkyChoice | None, dstack: DstackChoice | None,
         refused: Sequence[Refusal]) -> list[str]:
    out = ["Put your data in `data/train.jsonl` (one JSON object per line with a `text` field;"
           " SkyPilot uploads this folder, dstack the files its task lists), or change "
           "`dataset` in `train_config.json`. Run the commands below from this folder. "
           f"`{HF_SECRET}` (for gated models) is passed as a secret, never written here."]
    sync_flags = (f" --env {SYNC_URL_ENV}=s3://<bucket>/<prefix> "
                  + " ".join(f"--secret {name}" for name in SYNC_SECRETS))
    if sky is not None:
        extra = sync_flags if sky.storage is Storage.LOCAL_SYNC else ""
        out += ["", "SkyPilot (managed job: restarts on preemption, resumes from the "
                "checkpoint store):", "",
                f"    sky jobs launch sky.yaml --secret {HF_SECRET}{extra}"]
    if dstack is not None:
        names = f"{HF_SECRET}" + (f", {SYNC_URL_ENV}, " + ", ".join(SYNC_SECRETS)
                                  if dstack.storage is Storage.LOCAL_SYNC else "")
        out += ["", f"dstack (retries on interruption; export {names} in your shell first: "
                "dstack takes the values of the names its task lists without one):", ""]
        if "volume.dstack.yml" in files:
            out.append("    dstack apply -f volume.dstack.yml")
        out += ["    dstack apply -f fleet.dstack.yml", "    dstack apply -f .dstack.yml"]
    for refusal in refused:
        out += ["", f"{TOOL_NAMES.get(refusal.tool, refusal.tool)}: no files "
                f"written: {_md(refusal.reason)}."]
    out += _frameworks(spec, files)
    for engine in ("accelerate", "torchrun"):
        if f"launch_{engine}.sh" in files:
            shared = (" TUNEPLAN_CHECKPOINT_DIR=/shared/ckpt" if spec.strategy.nodes > 1
                      else "")
            out += ["", f"Your own machines with {engine} (run on every node):", "",
                    f"    NODE_RANK=0 MASTER_ADDR=<node 0 address>{shared} "
                    f"bash launch_{engine}.sh"]
            if spec.strategy.nodes > 1:
                out += ["", f"With {spec.strategy.nodes} nodes, `TUNEPLAN_CHECKPOINT_DIR` must "
                        "name one folder every node shares (NFS, EFS, Filestore, a cluster "
                        "filesystem): the script refuses to start without it, and "
                        f"`{STORE_SCRIPT} shared` stops the run before training when the "
                        "nodes do not see each other's files there, since every rank must "
                        "resume from the same checkpoint."]
    out += ["", "train.py trains with TRL's SFTTrainer. Text is tokenised (and packed, when the "
            "plan packs) once into a memory-mapped Arrow file under `data/tokenised/` that "
            "SFTTrainer reads as it is (memory does not grow with the data set)."]
    if "launch_torchrun.sh" in files:
        out += ["", "`launch_torchrun.sh` trains through the HF Trainer's DeepSpeed integration "
                "(`--deepspeed ds_config.json`): an FSDP plan maps to ZeRO-3 (full shard) or "
                "ZeRO-2 (gradient+optimizer shard) there, a DDP plan to ZeRO stage 0."]
    return out


TOOL_NAMES = {"skypilot": "SkyPilot", "dstack": "dstack", AXOLOTL: "axolotl",
              LLAMAFACTORY: "LLaMA-Factory", "litgpt": "LitGPT", "torchtune": "torchtune"}


def _native_checkpoints(spec: LaunchSpec, native: NativeRun) -> list[str]:
    every = (f"every **{spec.save_steps} steps** (`train.save_interval`)"
             if native.tool == "litgpt" else "at the end of each epoch (torchtune "
             f"{native.version}'s recipes have no mid-epoch checkpoints; the plan's cadence "
             f"would be every {spec.save_steps} steps)")
    return [f"- {native.tool} {native.version} saves into `{native.output_dir}` {every}.",
            f"- Resume: {native.resume}.",
            f"- These are {native.tool}'s own checkpoints: train.py's spot guard (SIGTERM "
            "save, content-hashed markers) is not part of this run."]


def _native_how(spec: LaunchSpec, files: Sequence[str], sky: SkyChoice | None,
                dstack: DstackChoice | None, refused: Sequence[Refusal],
                native: NativeRun) -> list[str]:
    from tuneplan.core.launch.engines import shell_line

    tool = TOOL_NAMES[native.tool]
    out = [f"The plan was made with `--recipe {native.tool}`: its memory and time are "
           f"{tool}'s own layout, so the bundle runs {tool} itself (`{native.config_file}`, "
           f"{native.tool} {native.version}'s options), never train.py. Data: "
           f"{native.data}. `{HF_SECRET}` (for gated models) is passed as a secret, never "
           "written here."]
    if sky is not None:
        extra = (f" --env {SYNC_URL_ENV}=s3://<bucket>/<prefix> "
                 + " ".join(f"--secret {name}" for name in SYNC_SECRETS)
                 if sky.storage is Storage.LOCAL_SYNC else "")
        out += ["", "SkyPilot (managed job: restarts on preemption):", "",
                f"    sky jobs launch sky.yaml --secret {HF_SECRET}{extra}"]
    if dstack is not None:
        names = f"{HF_SECRET}" + (f", {SYNC_URL_ENV}, " + ", ".join(SYNC_SECRETS)
                                  if dstack.storage is Storage.LOCAL_SYNC else "")
        out += ["", f"dstack (retries on interruption; export {names} in your shell first):",
                ""]
        if "volume.dstack.yml" in files:
            out.append("    dstack apply -f volume.dstack.yml")
        out += ["    dstack apply -f fleet.dstack.yml", "    dstack apply -f .dstack.yml"]
    out += ["", "Your own machine (`pip install -r requirements.txt`, then from this "
            f"folder; it writes to `{native.output_dir}`, set in `{native.config_file}`):", "",
            *[f"    {line}" for line in native.prelude],
            f"    {shell_line(list(native.command))}"]
    for refusal in refused:
        out += ["", f"{TOOL_NAMES.get(refusal.tool, refusal.tool)}: no files "
                f"written: {_md(refusal.reason)}."]
    return out


def _frameworks(spec: LaunchSpec, files: Sequence[str]) -> list[str]:
    """How to run the same job with axolotl or LLaMA-Factory, and what differs from train.py."""
    out: list[str] = []
    nodes = spec.strategy.nodes
    guard = ("Their own trainers run it: train.py's spot guard (SIGTERM save, exit "
             f"{EXIT_PREEMPTED}, content-hashed checkpoint markers) is not part of it; each "
             "resumes from the newest `checkpoint-N` in its output folder, unverified.")
    if AXOLOTL_FILE in files:
        multi = (f" On {nodes} nodes run it on each with accelerate's machine rank and main "
                 "address set (axolotl launches through `accelerate launch`)." if nodes > 1
                 else "")
        out += ["", f"axolotl ({AXOLOTL_VERSION}'s options; `pip install axolotl`):", "",
                f"    axolotl train {AXOLOTL_FILE}", "",
                "Data: `type: completion` over the `text` field; axolotl splits a text "
                "longer than `sequence_len` into several rows (train.py cuts it), and "
                "`sample_packing` bin-packs whole rows (train.py joins texts and cuts rows of "
                f"`sequence_len`). Checkpoints: `{output_dir(spec, AXOLOTL)}`. {guard}{multi}"]
    if LLAMAFACTORY_FILE in files:
        env = ("FORCE_TORCHRUN=1 NNODES=<nodes> NODE_RANK=<rank> MASTER_ADDR=<node 0> "
               if nodes > 1 else ("FORCE_TORCHRUN=1 " if spec.world_size > 1 else ""))
        out += ["", f"LLaMA-Factory ({LLAMAFACTORY_VERSION}'s options; `pip install "
                "llamafactory`):", "", f"    {env}llamafactory-cli train {LLAMAFACTORY_FILE}",
                "", f"Data: `{DATASET_INFO_FILE}` names `data/train.jsonl` as the pre-training "
                "set (`stage: pt`, every token a label, as train.py trains); packing joins "
                "texts and cuts rows of `cutoff_len` as train.py does. Checkpoints: "
                f"`{output_dir(spec, LLAMAFACTORY)}`. {guard}"]
    return out


def render_run_md(spec: LaunchSpec, files: Sequence[str], targets: Sequence[Target], *,
                  sky: SkyChoice | None = None, dstack: DstackChoice | None = None,
                  refused: Sequence[Refusal] = (), native: NativeRun | None = None) -> str:
    why = [f"- {line}" for line in spec.why] or ["- (the plan gave no reasons)"]
    warn = [f"- {line}" for line in spec.warnings] or ["- none"]
    storage = _storage(spec, sky, dstack)
    pinning = _pinning(spec, sky, dstack)
    lines = [f"# Launch bundle for plan {spec.plan_id}", "", "## What was chosen", "",
             *_chosen(spec), "", "## Why", "", *why, "", "## Warnings", "", *warn, "",
             "## Expected time and cost", "", *_expectations(spec), "",
             "## Checkpoints and resume", "",
             *(_checkpoints(spec) if native is None else _native_checkpoints(spec, native)),
             *storage, ""]
    if pinning:
        lines += ["## Where it runs", "", *pinning, ""]
    how = (_how(spec, files, targets, sky, dstack, refused) if native is None
           else _native_how(spec, files, sky, dstack, refused, native))
    lines += ["## How to launch", "", *how, "",
              "## Files", "", *[f"- `{f}`" for f in files], ""]
    return "\n".join(lines)
