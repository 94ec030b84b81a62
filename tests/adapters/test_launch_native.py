"""A --recipe litgpt / torchtune plan's bundle runs that framework itself, and its config is
read by the framework's own code: litgpt 0.5.13's jsonargparse CLI (``--print_config`` parses
the YAML against ``finetune/{lora,full}.py`` ``setup`` without training) and torchtune 0.6.1's
``config.validate`` plus the keys its recipe files read, with the model component built on the
meta device. A wrong key makes each check fail (asserted here)."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import launch_spec
from tuneplan.core.launch.native import (
    LITGPT_FILE,
    TORCHTUNE_FILE,
    TORCHTUNE_MODELS,
    litgpt_run,
    torchtune_run,
)
from tuneplan.core.launch.targets import Refusal
from tuneplan.errors import InvalidValueError
from tuneplan.service.launch import bundle

FIXTURE = Path(__file__).parents[1] / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"
#: What litgpt's finetune_lora on one GPU can run as planned (no activation checkpointing).
LITGPT_LORA = {"recipe": "litgpt", "method": "lora", "precision": "bf16",
               "checkpointing": "none", "lora_targets": ["q_proj", "v_proj", "o_proj"],
               "lora_rank": 8, "lora_alpha": 16, "batch_size": 2, "grad_accum": 4}
TORCHTUNE_LORA = {**LITGPT_LORA, "recipe": "torchtune", "checkpointing": "full",
                  "lora_targets": ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]}


def _entry(*, spot: bool = False, **strategy: Any) -> dict[str, Any]:
    doc = json.loads(FIXTURE.read_text())
    entry = doc["plans"][0]
    entry["strategy"] = entry["strategy"] | strategy
    entry["cost"] = entry["cost"] | {"uses_spot": spot}
    return {"job": doc["job"], **entry}


def _files(entry: dict[str, Any], to: str = "all") -> dict[str, str]:
    return bundle(saved_plan_from_entry(entry), [to])[1]


def _yaml(text: str) -> Any:
    return yaml.safe_load(text)


# ------------------------------------------------------------------------------ bundles
def test_a_litgpt_plan_runs_litgpt_in_every_task_and_never_train_py() -> None:
    files = _files(_entry(**LITGPT_LORA))
    assert LITGPT_FILE in files and "train.py" not in files
    assert not {"train_config.json", "accelerate_config.yaml", "preemptible.sh"} & set(files)
    run = "litgpt finetune_lora --config litgpt.yaml"
    assert run in _yaml(files["sky.yaml"])["run"]
    dstack = _yaml(files[".dstack.yml"])
    assert any(run in line for line in dstack["commands"])
    assert "train.py" not in json.dumps(dstack) and LITGPT_FILE in dstack["files"]
    assert files["requirements.txt"] == "litgpt[extra]==0.5.13\n"
    cfg = _yaml(files[LITGPT_FILE])
    spec = launch_spec(saved_plan_from_entry(_entry(**LITGPT_LORA)))
    assert (cfg["lora_r"], cfg["lora_alpha"], cfg["precision"]) == (8, 16, "bf16-true")
    assert (cfg["lora_query"], cfg["lora_key"], cfg["lora_value"], cfg["lora_projection"],
            cfg["lora_mlp"]) == (True, False, True, True, False)
    assert cfg["train"]["micro_batch_size"] == 2 and cfg["train"]["global_batch_size"] == 8
    assert cfg["train"]["save_interval"] == spec.save_steps
    assert cfg["out_dir"] == f"/checkpoints/{spec.plan_id}-litgpt"
    text = files["RUN.md"]
    assert "accelerate, deepspeed, axolotl, llamafactory: no files written" in text
    assert "no resume option" in text  # litgpt 0.5.13 LoRA: a restart starts over


def test_a_torchtune_plan_runs_tune_with_the_builder_of_its_model() -> None:
    files = _files(_entry(**TORCHTUNE_LORA))
    assert TORCHTUNE_FILE in files and "train.py" not in files
    cfg = _yaml(files[TORCHTUNE_FILE])
    assert cfg["model"] == {
        "_component_": "torchtune.models.llama3_1.lora_llama3_1_8b",
        "lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": True,
        "apply_lora_to_output": False, "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0}
    assert (cfg["batch_size"], cfg["gradient_accumulation_steps"], cfg["dtype"]) == (2, 4, "bf16")
    assert cfg["enable_activation_checkpointing"] is True
    run = _yaml(files["sky.yaml"])["run"]
    assert "tune run lora_finetune_single_device --config torchtune.yaml" in run
    assert "resume_from_checkpoint=${TUNEPLAN_RESUME}" in run
    assert "torchao==0.10.0" in files["requirements.txt"]


def test_the_hf_targets_are_refused_for_a_native_plan_in_one_line() -> None:
    for to in ("accelerate", "deepspeed", "axolotl", "llamafactory"):
        with pytest.raises(InvalidValueError) as err:
            _files(_entry(**LITGPT_LORA), to)
        text = str(err.value)
        assert "\n" not in text and "--recipe litgpt" in text
        assert "litgpt finetune_lora --config litgpt.yaml" in text


@pytest.mark.parametrize(("strategy", "words"), [
    ({**LITGPT_LORA, "checkpointing": "full"}, "never on one GPU"),
    ({**LITGPT_LORA, "lora_targets": ["q_proj", "up_proj"]}, "part of the MLP"),
    ({**LITGPT_LORA, "method": "dora"}, "method dora"),
    ({**LITGPT_LORA, "recipe": "torchtune", "precision": "bf16-mixed"}, "one dtype"),
    ({**TORCHTUNE_LORA, "optimizer": "lion"}, "optimizer lion"),
    ({**LITGPT_LORA, "compile": True}, "--compile is not mapped"),
])
def test_what_a_framework_cannot_run_is_refused_with_its_reason(
        strategy: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        _files(_entry(**strategy))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_spot_is_refused_where_the_run_cannot_resume_at_the_plans_cadence() -> None:
    spec = launch_spec(saved_plan_from_entry(_entry(spot=True, **LITGPT_LORA)))
    refused = litgpt_run(spec)
    assert isinstance(refused, Refusal) and "cannot resume" in refused.reason
    full = litgpt_run(launch_spec(saved_plan_from_entry(
        _entry(spot=True, **LITGPT_LORA | {"method": "full"}))))
    assert not isinstance(full, Refusal) and full.config["resume"] == "auto"
    tt = torchtune_run(launch_spec(saved_plan_from_entry(_entry(spot=True, **TORCHTUNE_LORA))),
                       None)
    assert isinstance(tt, Refusal)


def test_a_model_torchtune_has_no_builder_for_is_refused() -> None:
    from tuneplan.adapters.hub import resolve_model

    spec = launch_spec(saved_plan_from_entry(_entry(**TORCHTUNE_LORA)))
    got = torchtune_run(spec, resolve_model("Qwen/Qwen2.5-0.5B"))
    assert isinstance(got, Refusal) and "no model builder" in got.reason


# ------------------------------------------------------------------------------ LitGPT
def _litgpt_config(**strategy: Any) -> tuple[str, dict[str, Any]]:
    run = litgpt_run(launch_spec(saved_plan_from_entry(_entry(**strategy))))
    assert not isinstance(run, Refusal), run
    return run.command[1], run.config


def _litgpt_setup(command: str) -> Any:
    import litgpt.finetune.full
    import litgpt.finetune.lora

    return {"finetune_lora": litgpt.finetune.lora, "finetune_full": litgpt.finetune.full}[command]


def _keys_litgpt_takes(command: str, config: dict[str, Any]) -> list[str]:
    """Keys of ``config`` that ``setup`` (and its TrainArgs / data class) has no parameter for."""
    from dataclasses import fields

    from litgpt.args import TrainArgs
    from litgpt.data import JSON

    module = _litgpt_setup(command)
    params = inspect.signature(module.setup).parameters
    bad = [k for k in config if k not in params]
    train = {f.name for f in fields(TrainArgs)}
    bad += [f"train.{k}" for k in config.get("train", {}) if k not in train]
    data = {f.name for f in fields(JSON) if f.init}
    bad += [f"data.{k}" for k in config["data"]["init_args"] if k not in data]
    return bad


@pytest.mark.parametrize("method", ["lora", "full"])
def test_every_litgpt_key_is_a_parameter_of_its_setup(method: str) -> None:
    command, config = _litgpt_config(**LITGPT_LORA | {"method": method})
    assert _keys_litgpt_takes(command, config) == []
    wrong = config | {"lora_rnk": 8, "train": config["train"] | {"micro_batch": 2}}
    assert _keys_litgpt_takes(command, wrong) == ["lora_rnk", "train.micro_batch"]


def _litgpt_cli(tmp_path: Path, command: str, config: dict[str, Any]) -> tuple[int, str]:
    """litgpt's own CLI on the YAML with --print_config: (exit code, what it printed)."""
    from litgpt.__main__ import main

    path = tmp_path / LITGPT_FILE
    path.write_text(yaml.safe_dump(config))
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["litgpt", command, "--config", str(path), "--print_config"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("method", ["lora", "full", "qlora"])
def test_litgpt_cli_parses_the_config_and_refuses_a_wrong_key(
        tmp_path: Path, method: str) -> None:
    pytest.importorskip("jsonargparse", reason="litgpt's CLI needs jsonargparse (litgpt "
                        "installed with --no-deps)")
    from litgpt.args import EvalArgs, TrainArgs

    strategy = LITGPT_LORA | {"method": method}
    if method == "qlora":
        strategy |= {"quant": "nf4", "double_quant": True}
    command, config = _litgpt_config(**strategy)
    code, printed = _litgpt_cli(tmp_path, command, config)
    assert code == 0, printed
    parsed = yaml.safe_load(printed)
    assert parsed["train"]["save_interval"] == config["train"]["save_interval"]
    assert parsed["data"]["class_path"] == "litgpt.data.JSON"
    if method == "qlora":
        assert parsed["quantize"] == "bnb.nf4-dq"
    if method == "full":
        assert parsed["resume"] == "auto"
    # the checks setup's main runs before training (finetune/*.py validate_args)
    _litgpt_setup(command).validate_args(TrainArgs(**parsed["train"]),
                                         EvalArgs(**parsed["eval"]))
    code, printed = _litgpt_cli(tmp_path, command, config | {"lora_rnk": 8})
    assert code != 0 and "lora_rnk" in printed


# ------------------------------------------------------------------------------ torchtune
def _recipe_source(recipe: str) -> str:
    spec = importlib.util.find_spec("recipes")  # torchtune's recipe folder (not importable)
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / f"{recipe}.py").read_text()


def _recipe_keys(recipe: str) -> tuple[set[str], set[str]]:
    """(keys the recipe reads as ``cfg.KEY``: required, keys it reads with ``cfg.get``)."""
    src = _recipe_source(recipe)
    required = set(re.findall(r"\bcfg\.([a-z_]+)\b(?!\()", src)) - {"get", "profiler"}
    optional = set(re.findall(r"\bcfg\.get\(\s*\"([a-z_]+)\"", src)) | {"profiler"}
    return required, optional


def _torchtune(**strategy: Any) -> tuple[str, dict[str, Any]]:
    from tuneplan.adapters.hub import resolve_model

    entry = _entry(**strategy)
    run = torchtune_run(launch_spec(saved_plan_from_entry(entry)),
                        resolve_model(entry["job"]["model"]))
    assert not isinstance(run, Refusal), run
    return run.command[run.command.index("--config") - 1], run.config


def _unread(recipe: str, config: dict[str, Any]) -> tuple[set[str], set[str]]:
    required, optional = _recipe_keys(recipe)
    return set(config) - required - optional, required - set(config)


@pytest.mark.parametrize(("strategy", "recipe"), [
    (TORCHTUNE_LORA, "lora_finetune_single_device"),
    (TORCHTUNE_LORA | {"method": "full"}, "full_finetune_single_device"),
    (TORCHTUNE_LORA | {"gpus": 4, "sharding": "fsdp"}, "lora_finetune_distributed"),
    (TORCHTUNE_LORA | {"method": "full", "gpus": 4, "sharding": "fsdp"},
     "full_finetune_distributed"),
])
def test_torchtune_config_keys_are_the_ones_its_recipe_reads(
        strategy: dict[str, Any], recipe: str) -> None:
    got, config = _torchtune(**strategy)
    assert got == recipe
    assert _unread(recipe, config) == (set(), set())
    assert _unread(recipe, config | {"batch_sise": 2}) == ({"batch_sise"}, set())


def test_a_compiled_torchtune_plan_sets_the_recipes_compile_key() -> None:
    """--compile reaches torchtune's own ``compile`` key (the recipes' compile_model and
    compile_loss), which the memory estimate models; off, it stays False."""
    assert _torchtune(**TORCHTUNE_LORA | {"compile": True})[1]["compile"] is True
    assert _torchtune(**TORCHTUNE_LORA)[1]["compile"] is False


def test_torchtune_validates_the_config_and_builds_the_plans_model() -> None:
    """torchtune's ``config.validate`` binds every component's keys to its signature (it
    needs ``torchtune.training``, which imports only with the torchao the bundle pins); the
    model component is built on the meta device and holds the plan's parameter count."""
    torch = pytest.importorskip("torch")
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    _, cfg = _torchtune(**TORCHTUNE_LORA)
    with torch.device("meta"):
        model = tt_config.instantiate(OmegaConf.create(cfg)["model"])
    base = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    assert base == json.loads(FIXTURE.read_text())["plans"][0]["memory"]["total_params"]
    try:
        import torchtune.training  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"torchtune 0.6.1's training package does not import here: {exc}")
    tt_config.validate(OmegaConf.create(cfg))
    wrong = cfg | {"model": cfg["model"] | {"lora_rnk": 8}}
    with pytest.raises(Exception, match="lora_rnk"):
        tt_config.validate(OmegaConf.create(wrong))


def test_torchtune_model_table_is_the_builders_own() -> None:
    """Each entry of TORCHTUNE_MODELS built with torchtune's own builder on the meta device:
    its vocabulary, layers, heads, kv heads, width, MLP width, max positions and tied head."""
    torch = pytest.importorskip("torch")
    import importlib

    for key, family in TORCHTUNE_MODELS.items():
        builder = getattr(importlib.import_module(f"torchtune.models.{family.package}"),
                          f"{family.package}_{family.size}")
        with torch.device("meta"):
            model = builder()
        attn, mlp = model.layers[0].attn, model.layers[0].mlp
        got = (model.tok_embeddings.num_embeddings, len(model.layers), attn.num_heads,
               attn.num_kv_heads, attn.embed_dim, mlp.w1.out_features, model.max_seq_len,
               int(type(model.output).__name__ == "TiedLinear"))
        assert got == key, family


@pytest.mark.parametrize("strategy", [LITGPT_LORA, TORCHTUNE_LORA], ids=["litgpt", "torchtune"])
def test_the_native_tasks_are_ones_skypilot_and_dstack_accept(strategy: dict[str, Any]) -> None:
    """The same checks as train.py's tasks: SkyPilot 0.14.1's task schema, dstack's own
    models, and bash's parser on the run script."""
    import subprocess

    jsonschema = pytest.importorskip("jsonschema")
    files = _files(_entry(**strategy))
    schemas = json.loads((FIXTURE.parent / "skypilot_0.14.1_schemas.json").read_text())
    task = _yaml(files["sky.yaml"])
    jsonschema.validate(task, schemas["task"])
    jsonschema.validate(task["resources"], schemas["resources"])
    checked = subprocess.run(["bash", "-n"], input=task["run"], text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    pytest.importorskip("dstack")
    from dstack._internal.core.models.configurations import (
        TaskConfiguration,
        parse_run_configuration,
    )

    dstack = parse_run_configuration(_yaml(files[".dstack.yml"]))
    assert isinstance(dstack, TaskConfiguration)
    checked = subprocess.run(["bash", "-n"], input="\n".join(dstack.commands), text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stderr
