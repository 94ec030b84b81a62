"""Every file of a launch bundle is read by the library that consumes it, and must pass.

accelerate's config loader and its launch path (up to torch's launcher, stubbed), torchrun's
parser, DeepSpeed's config class, transformers' TrainingArguments built by the bundle's own
train.py, dstack's configuration models, SkyPilot's JSON schemas (vendored from 0.14.1) and
SkyPilot 0.14.1 itself, run from its own venv (it pins click<8.2 and uvicorn<0.36, so it is
not installable beside this project: tests/adapters/skypilot_venv.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuneplan.adapters.importers.snapshot import load_sky_catalog
from tuneplan.adapters.launch_files import read_train_script
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import render_bundle

FIXTURES = Path(__file__).parent.parent / "fixtures" / "launch"
DOCS = ("plan_llama8b_qlora_aws.json", "plan_llama70b_full_aws.json",
        "plan_llama70b_multinode_aws.json")


def _plans() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in DOCS:
        doc = json.loads((FIXTURES / name).read_text())
        out += [(p["id"], {"job": doc["job"], "model": doc.get("model"), **p})
                for p in doc["plans"]]
    return out


PLANS = _plans()
IDS = [pid for pid, _ in PLANS]


def _two_nodes_of_eight(plan: dict[str, Any]) -> dict[str, Any]:
    """The 70B ZeRO-3 plan on p5.48xlarge stretched to 2 nodes x 8 GPUs (derived here)."""
    out = json.loads(json.dumps(plan))
    out["strategy"] |= {"gpus": 8, "nodes": 2}
    out["id"] = "derived2x8"
    return out


MULTI_NODE = [p for _, p in PLANS if p["strategy"]["nodes"] > 1]
MULTI_NODE.append(_two_nodes_of_eight(next(p for pid, p in PLANS if pid == "f838284b7b65")))
#: Every plan that starts several processes: the multi-node ones and 8-GPU single nodes.
MULTI_PROCESS = MULTI_NODE + [p for _, p in PLANS
                              if p["strategy"]["nodes"] == 1 and p["strategy"]["gpus"] > 1]


def _write(plan: dict[str, Any], folder: Path) -> dict[str, str]:
    files = render_bundle(saved_plan_from_entry(plan), ["all"], train_script=read_train_script(),
                          sky_catalog=load_sky_catalog())
    for rel, text in files.items():
        (folder / rel).write_text(text)
    return files


def test_fixtures_cover_every_sharding_kind() -> None:
    shardings = {p["strategy"]["sharding"] for _, p in PLANS}
    assert {"ddp", "zero3", "fsdp"} <= shardings
    assert MULTI_NODE and all(p["strategy"]["nodes"] > 1 for p in MULTI_NODE)


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_accelerate_loads_the_config(plan: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    _write(plan, tmp_path)
    config = load_config_from_file(str(tmp_path / "accelerate_config.yaml"))
    s = plan["strategy"]
    expected = {"zero3": DistributedType.DEEPSPEED, "fsdp": DistributedType.FSDP,
                "ddp": DistributedType.NO if s["gpus"] * s["nodes"] == 1
                else DistributedType.MULTI_GPU}[s["sharding"]]
    assert config.distributed_type == expected
    assert config.num_processes == s["gpus"] * s["nodes"]
    assert config.num_machines == s["nodes"]
    if expected is DistributedType.FSDP:
        assert config.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    if expected is DistributedType.DEEPSPEED:
        assert config.deepspeed_config["deepspeed_config_file"] == "ds_config.json"


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_deepspeed_accepts_the_json(plan: dict[str, Any], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config

    files = _write(plan, tmp_path)
    s = plan["strategy"]
    world = s["gpus"] * s["nodes"]
    # DeepSpeedConfig asks the process group for the world size; stand in for it.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: world)
    parsed = ds_config.DeepSpeedConfig(json.loads(files["ds_config.json"]))
    assert parsed.train_batch_size == s["batch_size"] * s["grad_accum"] * world
    expected_stage = {"zero3": 3, "fsdp": 3, "ddp": 0}[s["sharding"]]
    assert parsed.zero_optimization_stage == expected_stage
    assert parsed.bfloat16_config.enabled is (s["precision"] in ("bf16-mixed", "bf16"))
    # The same class refuses a batch size that does not multiply out (the check is real).
    bad = json.loads(files["ds_config.json"]) | {"train_batch_size": world * 1000 + 1}
    with pytest.raises(AssertionError):
        ds_config.DeepSpeedConfig(bad)


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_ds_config_agrees_with_the_trainer_arguments(plan: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' own DeepSpeed bridge finds no value that differs from TrainingArguments
    (it would refuse to train), at the plan's world size."""
    pytest.importorskip("transformers")
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    files, train, cfg = _bundle_train(plan, tmp_path)
    args = train.training_arguments(cfg)
    s = plan["strategy"]
    for world, clean in ((s["gpus"] * s["nodes"], True), (s["gpus"] * s["nodes"] + 1, False)):
        monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self, w=world: w))
        bridge = HfTrainerDeepSpeedConfig(json.loads(files["ds_config.json"]))
        bridge.trainer_config_process(args)
        assert (bridge.mismatches == []) is clean, bridge.mismatches


def _bundle_train(plan: dict[str, Any], folder: Path
                  ) -> tuple[dict[str, str], Any, dict[str, Any]]:
    """(bundle files written to ``folder``, its train.py as a module, its train config with
    a local output dir and no DeepSpeed)."""
    files = _write(plan, folder)
    cfg = json.loads(files["train_config.json"]) | {"output_dir": str(folder / "out"),
                                                    "deepspeed": None}
    return files, _load_train_module(folder), cfg


def _load_train_module(folder: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bundle_train", folder / "train.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_training_arguments_accept_the_settings(plan: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _, train, cfg = _bundle_train(plan, tmp_path)
    args = train.training_arguments(cfg)
    s = plan["strategy"]
    assert args.per_device_train_batch_size == s["batch_size"]
    assert args.gradient_accumulation_steps == s["grad_accum"]
    assert args.save_steps == cfg["save_steps"] and args.save_strategy == "steps"
    assert args.save_total_limit >= 2
    assert args.bf16 is (s["precision"] in ("bf16-mixed", "bf16"))
    recompute = getattr(args, "activation_checkpointing", args.gradient_checkpointing)
    assert recompute is (s["checkpointing"] != "none")
    # AdamW as estimated (versions.adamw_impl): fused on the stack the bundle pins
    assert args.optim.value == cfg["optim"] == (
        "adamw_torch_fused" if s["optimizer"] == "adamw" and s.get("recipe", "hf") == "hf"
        else train.OPTIMIZERS[s["optimizer"]])
    if s["method"] == "qlora":
        import torch

        q = train._quantization(cfg, torch.bfloat16)  # BitsAndBytesConfig validates itself
        assert q.load_in_4bit and q.bnb_4bit_quant_type == s["quant"]


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_dstack_models_accept_task_and_volume(plan: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("dstack")
    from dstack._internal.core.models.configurations import (
        TaskConfiguration,
        parse_apply_configuration,
        parse_run_configuration,
    )

    files = _write(plan, tmp_path)
    task = parse_run_configuration(yaml.safe_load(files[".dstack.yml"]))
    assert isinstance(task, TaskConfiguration)
    assert task.nodes == plan["strategy"]["nodes"]
    assert [e.value for e in task.retry.on_events] == ["no-capacity", "interruption"]
    assert task.spot_policy.value == ("spot" if plan["cost"]["uses_spot"] else "on-demand")
    assert task.resources.gpu.count.min == plan["strategy"]["gpus"]
    fleet = parse_apply_configuration(yaml.safe_load(files["fleet.dstack.yml"]))
    assert fleet.type == "fleet" and fleet.nodes.min == plan["strategy"]["nodes"]
    assert [f.name for f in task.fleets or []] == [fleet.name]
    if plan["strategy"]["nodes"] == 1:  # one AWS node: an EBS network volume in its region
        volume = parse_apply_configuration(yaml.safe_load(files["volume.dstack.yml"]))
        assert volume.type == "volume" and volume.name == f"tuneplan-ckpt-{plan['id']}"
        assert (volume.backend.value, volume.region) == ("aws", plan["offer"]["region"])
    else:  # several nodes: one shared instance path, never a volume per node
        assert "volume.dstack.yml" not in files
        assert [v.instance_path for v in task.volumes] == ["/mnt/tuneplan-checkpoints"]


def _sky_validator() -> Callable[[str, Any], None]:
    jsonschema = pytest.importorskip("jsonschema")
    schemas = json.loads((FIXTURES / "skypilot_0.14.1_schemas.json").read_text())

    def check(kind: str, value: Any) -> None:
        jsonschema.validate(value, schemas[kind])

    return check


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_skypilot_schemas_accept_the_task(plan: dict[str, Any], tmp_path: Path) -> None:
    check = _sky_validator()
    files = _write(plan, tmp_path)
    task = yaml.safe_load(files["sky.yaml"])
    check("task", task)
    check("resources", task["resources"])
    for mount in task["file_mounts"].values():
        check("storage", mount)
    assert task["num_nodes"] == plan["strategy"]["nodes"]
    assert task["resources"]["use_spot"] is plan["cost"]["uses_spot"]
    assert 143 in task["resources"]["job_recovery"]["recover_on_exit_codes"]
    # The schema is strict enough to refuse a misspelt field.
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        check("resources", task["resources"] | {"use_spots": True})


@pytest.fixture(scope="module")
def skypilot_read(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What SkyPilot itself (its own venv, tests/adapters/skypilot_venv.py) made of every
    fixture plan's sky.yaml, in one process; the catalog is the bundled snapshot."""
    from tests.adapters.skypilot_venv import need_skypilot, run_skypilot, sky_home

    need_skypilot()
    root = tmp_path_factory.mktemp("sky")
    paths = {}
    for pid, plan in PLANS:
        (root / pid).mkdir()
        _write(plan, root / pid)
        paths[pid] = root / pid / "sky.yaml"
    cases: dict[str, dict[str, Any]] = run_skypilot(sky_home(root / "home"), paths)["cases"]
    return cases


@pytest.mark.parametrize("plan", [p for _, p in PLANS], ids=IDS)
def test_skypilot_itself_loads_the_task(plan: dict[str, Any], tmp_path: Path,
                                        skypilot_read: dict[str, dict[str, Any]]) -> None:
    """SkyPilot's Task.from_yaml, its feature check on AWS (every fixture plan is on AWS) and
    its catalog's instance types for the accelerators."""
    got = skypilot_read[plan["id"]]
    assert "error" not in got, got.get("error")
    files = _write(plan, tmp_path)
    nodes, gpus = plan["strategy"]["nodes"], plan["strategy"]["gpus"]
    assert got["num_nodes"] == nodes and got["cloud"] == "aws"
    # Only the cloud is pinned: the accelerator is SkyPilot's own name, no instance type.
    assert got["instance_type"] is None
    name = yaml.safe_load(files["sky.yaml"])["resources"]["accelerators"].split(":")[0]
    assert got["accelerators"] == {name: gpus}
    assert got["use_spot"] is plan["cost"]["uses_spot"]
    assert got["unsupported"] is None
    assert ("multi-node" in got["features"]) is (nodes > 1)
    assert "storage_mounting" in got["features"]  # the S3 bucket every node mounts
    assert plan["offer"]["instance_type"] in got["feasible"]
    assert 143 in got["job_recovery"]["recover_on_exit_codes"]


# ------------------------------------------------------------------ multi-node launch lines
_ECHO = "import json, sys; print(json.dumps({name}sys.argv[1:]))"


def _stub_launchers(folder: Path) -> str:
    """A folder of stand-ins for accelerate and torchrun that print the argv they got (as
    programs, so preemptible.sh runs them as it runs the real ones); returns it."""
    stubs = folder / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, prefix in (("accelerate", '["accelerate"] + '), ("torchrun", "")):
        path = stubs / name
        path.write_text(f"#!{sys.executable}\n" + _ECHO.format(name=prefix) + "\n")
        path.chmod(0o755)
    return str(stubs)


def _expand(line: str, env: dict[str, str], cwd: Path) -> list[str]:
    """The argv a node's shell really passes to the launcher, through preemptible.sh
    (launchers stubbed by echo)."""
    path = f"{_stub_launchers(cwd)}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", line], env={**os.environ, **env, "PATH": path},
                          cwd=cwd, capture_output=True, text=True, check=True)
    argv: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return argv


def _node_envs(nodes: int, gpus: int) -> dict[str, Callable[[int], dict[str, str]]]:
    ips = [f"10.0.0.{i + 1}" for i in range(nodes)]
    return {
        "skypilot": lambda r: {"SKYPILOT_NODE_RANK": str(r), "SKYPILOT_NUM_NODES": str(nodes),
                               "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
                               "SKYPILOT_NODE_IPS": "\n".join(ips)},
        "dstack": lambda r: {"DSTACK_NODE_RANK": str(r), "DSTACK_NODES_NUM": str(nodes),
                             "DSTACK_GPUS_PER_NODE": str(gpus), "DSTACK_MASTER_NODE_IP": ips[0]},
        "manual": lambda r: {"NODE_RANK": str(r), "MASTER_ADDR": ips[0]},
    }


def _lines(files: dict[str, str]) -> dict[tuple[str, str], str]:
    sky_run = yaml.safe_load(files["sky.yaml"])["run"].strip().splitlines()[-1]
    dstack_run = yaml.safe_load(files[".dstack.yml"])["commands"][-1]
    return {("skypilot", "accelerate"): sky_run, ("dstack", "accelerate"): dstack_run,
            ("manual", "accelerate"): files["launch_accelerate.sh"].strip().splitlines()[-1],
            ("manual", "torchrun"): files["launch_torchrun.sh"].strip().splitlines()[-1]}


def _accelerate_to_torchrun(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run accelerate's own launch path on argv; return the torchrun args it hands over."""
    import torch.distributed.run as distrib_run
    from accelerate.commands.launch import launch_command, launch_command_parser

    captured: list[Any] = []
    monkeypatch.setattr(distrib_run, "run", lambda a: captured.append((a, dict(os.environ))))
    launch_command(launch_command_parser().parse_args(argv[2:]))
    assert len(captured) == 1
    return captured[0]


def _assert_engine_env(sharding: str, env: dict[str, str]) -> None:
    """What accelerate's launcher made of the config for the training processes."""
    if sharding.startswith("zero"):
        assert env.get("ACCELERATE_USE_DEEPSPEED") == "true"
        assert env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") == "ds_config.json"
    elif sharding == "fsdp":
        assert env.get("ACCELERATE_USE_FSDP") == "true"
        assert env.get("FSDP_SHARDING_STRATEGY") == "FULL_SHARD"
        assert env.get("FSDP_STATE_DICT_TYPE") == "SHARDED_STATE_DICT"
        assert env.get("FSDP_USE_ORIG_PARAMS") == "true"  # PEFT needs the original params
    if not sharding.startswith("zero"):  # with a DeepSpeed JSON, precision comes from it
        assert env.get("ACCELERATE_MIXED_PRECISION") == "bf16"


@pytest.mark.parametrize("plan", MULTI_PROCESS, ids=[p["id"] for p in MULTI_PROCESS])
def test_every_node_launches_with_its_rank_and_node0_address(
        plan: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")
    import torch.distributed.run as distrib_run

    files = _write(plan, tmp_path)
    monkeypatch.chdir(tmp_path)
    nodes, gpus = plan["strategy"]["nodes"], plan["strategy"]["gpus"]
    envs = _node_envs(nodes, gpus)
    for (where, engine), line in _lines(files).items():
        for rank in range(nodes):
            argv = _expand(line, envs[where](rank), tmp_path)
            if engine == "accelerate":
                args, env = _accelerate_to_torchrun(argv, monkeypatch)
                _assert_engine_env(plan["strategy"]["sharding"], env)
            else:
                args = distrib_run.get_args_parser().parse_args(argv)
            config, _, script_args = distrib_run.config_from_args(args)
            assert args.node_rank == rank, (where, engine)
            # One node talks to itself (accelerate then ignores the address); several
            # meet at node 0's address.
            meet = {"10.0.0.1:29500"} if nodes > 1 else {"10.0.0.1:29500", "127.0.0.1:29500"}
            assert config.rdzv_endpoint in meet, (where, engine)
            assert (config.min_nodes, config.max_nodes) == (nodes, nodes)
            assert config.nproc_per_node == gpus
            assert script_args[-2:] == ["--config", "train_config.json"] or \
                script_args[-2:] == ["--deepspeed", "ds_config.json"]
