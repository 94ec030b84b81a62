"""The cloud side of a launch bundle: a SkyPilot task (managed-job recovery, bucket mount for
checkpoints) and a dstack task + volume (spot policy, retry on interruption).

Provider and GPU names are mapped to each tool's words here; a provider a tool does not know
leaves the choice of cloud to the tool. Pure text; schemas and models check it in the tests.
"""

from __future__ import annotations

import math
from typing import Any

from tuneplan.core.launch.bundle import CHECKPOINT_DIR, LaunchSpec
from tuneplan.core.launch.engines import (
    DSTACK_ENV,
    EXIT_PREEMPTED,
    GUARD_SCRIPT,
    SKYPILOT_ENV,
    guarded_argv,
    shell_line,
)
from tuneplan.core.launch.yamltext import render_yaml
from tuneplan.units import GB

#: Provider names (lower case, no spaces or dots) -> SkyPilot cloud names (sky 0.14 registry).
SKYPILOT_CLOUDS = {
    "aws": "aws", "gcp": "gcp", "googlecloud": "gcp", "azure": "azure", "lambda": "lambda",
    "lambdalabs": "lambda", "runpod": "runpod", "vastai": "vast", "vast": "vast",
    "nebius": "nebius", "cudo": "cudo", "cudocompute": "cudo", "fluidstack": "fluidstack",
    "paperspace": "paperspace", "digitalocean": "do", "hyperbolic": "hyperbolic",
    "primeintellect": "primeintellect", "seeweb": "seeweb", "shadeform": "shadeform",
    "oci": "oci", "oracle": "oci", "verda": "verda", "datacrunch": "verda", "mithril": "mithril",
    "yotta": "yotta", "ibm": "ibm"}
#: Provider names -> dstack backend names (dstack 0.22 BackendType values).
DSTACK_BACKENDS = {
    "aws": "aws", "gcp": "gcp", "googlecloud": "gcp", "azure": "azure", "lambda": "lambda",
    "lambdalabs": "lambda", "runpod": "runpod", "vastai": "vastai", "vast": "vastai",
    "nebius": "nebius", "cudo": "cudo", "cudocompute": "cudo", "oci": "oci", "oracle": "oci",
    "datacrunch": "datacrunch", "verda": "verda", "vultr": "vultr", "hotaisle": "hotaisle",
    "cloudrift": "cloudrift", "tensordock": "tensordock"}


def _key(provider: str) -> str:
    return "".join(ch for ch in provider.lower() if ch.isalnum())


def accelerator_name(gpu: str) -> str:
    """SkyPilot/dstack GPU word: the catalog name's first word (``H100 SXM`` -> ``H100``);
    A100 80GB variants are ``A100-80GB``."""
    first = gpu.split()[0] if gpu.split() else gpu
    return "A100-80GB" if first == "A100" and "80" in gpu else first


def bucket_name(spec: LaunchSpec) -> str:
    return f"tuneplan-ckpt-{spec.plan_id}"


def _disk_gb(spec: LaunchSpec) -> int:
    return max(100, math.ceil(spec.disk_bytes / GB))


def _run_script(spec: LaunchSpec, engine: str, env: Any) -> str:
    return ("set -euo pipefail\n"
            "# train.py resumes from the newest complete checkpoint under the mount.\n"
            f"{shell_line(guarded_argv(spec, engine, env))}\n")


def skypilot_task(spec: LaunchSpec, *, engine: str = "accelerate") -> dict[str, Any]:
    """SkyPilot task: ``sky jobs launch sky.yaml`` gives managed-job recovery on preemption."""
    cloud = SKYPILOT_CLOUDS.get(_key(spec.offer.provider))
    resources: dict[str, Any] = {}
    if cloud:
        resources["infra"] = f"{cloud}/{spec.offer.region}" if spec.offer.region else cloud
        resources["instance_type"] = spec.offer.instance_type
    resources |= {
        "accelerators": f"{accelerator_name(spec.gpu_name)}:{spec.strategy.gpus}",
        "use_spot": spec.use_spot, "disk_size": _disk_gb(spec),
        "job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3,
                         "recover_on_exit_codes": [EXIT_PREEMPTED]}}
    return {
        "name": f"tuneplan-{spec.plan_id}", "num_nodes": spec.strategy.nodes, "workdir": ".",
        "resources": resources,
        "file_mounts": {CHECKPOINT_DIR: {"name": bucket_name(spec), "mode": "MOUNT"}},
        "envs": {"TUNEPLAN_CHECKPOINT_DIR": CHECKPOINT_DIR},
        "setup": "set -euo pipefail\npip install -r requirements.txt\n",
        "run": _run_script(spec, engine, SKYPILOT_ENV)}


def render_skypilot(spec: LaunchSpec) -> str:
    cloud = SKYPILOT_CLOUDS.get(_key(spec.offer.provider))
    note = "" if cloud else f"\nSkyPilot has no cloud for {spec.offer.provider!r}: it picks one."
    return render_yaml(skypilot_task(spec), header=(
        f"SkyPilot task for plan {spec.plan_id}: sky jobs launch sky.yaml "
        f"(managed job, recovers from preemption).{note}"))


def dstack_task(spec: LaunchSpec, *, engine: str = "accelerate") -> dict[str, Any]:
    """dstack task: retry on interruption, spot policy, checkpoints on a network volume (one
    per node on multi-node runs: a network volume attaches to one instance)."""
    backend = DSTACK_BACKENDS.get(_key(spec.offer.provider))
    hours = spec.hours or 24.0
    retry_h = max(24, math.ceil(2 * hours))
    volume = bucket_name(spec) + ("-${{ dstack.node_rank }}" if spec.strategy.nodes > 1 else "")
    out: dict[str, Any] = {
        "type": "task", "name": f"tuneplan-{spec.plan_id}", "nodes": spec.strategy.nodes,
        "python": "3.11",
        "files": ["train.py", "train_config.json", "requirements.txt",
                  "accelerate_config.yaml", GUARD_SCRIPT, "data"]
                 + (["ds_config.json"] if spec.zero_stage is not None else []),
        "env": [f"TUNEPLAN_CHECKPOINT_DIR={CHECKPOINT_DIR}"],
        "commands": ["pip install -r requirements.txt",
                     shell_line(guarded_argv(spec, engine, DSTACK_ENV))],
        "resources": {"gpu": f"{accelerator_name(spec.gpu_name)}:{spec.strategy.gpus}",
                      "disk": f"{_disk_gb(spec)}GB.."},
        "spot_policy": "spot" if spec.use_spot else "on-demand",
        "retry": {"on_events": ["no-capacity", "interruption"], "duration": f"{retry_h}h"},
        "volumes": [{"name": volume, "path": CHECKPOINT_DIR}]}
    if backend:
        out["backends"] = [backend]
        out["regions"] = [spec.offer.region]
        out["instance_types"] = [spec.offer.instance_type]
    return out


def render_dstack(spec: LaunchSpec) -> str:
    return render_yaml(dstack_task(spec), header=(
        f"dstack task for plan {spec.plan_id}: dstack apply -f volume.dstack.yml, then "
        "dstack apply -f .dstack.yml"))


def dstack_volume(spec: LaunchSpec) -> dict[str, Any]:
    """The network volume the task mounts (create it once before the task)."""
    backend = DSTACK_BACKENDS.get(_key(spec.offer.provider), "aws")
    return {"type": "volume", "name": bucket_name(spec), "backend": backend,
            "region": spec.offer.region, "size": f"{_disk_gb(spec)}GB"}


def render_dstack_volume(spec: LaunchSpec) -> str:
    extra = ("\nMulti-node: create one per node, named with the suffix -0, -1, ..."
             if spec.strategy.nodes > 1 else "")
    return render_yaml(dstack_volume(spec), header=(
        f"dstack volume for plan {spec.plan_id}'s checkpoints.{extra}"))
