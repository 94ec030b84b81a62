"""axolotl and LLaMA-Factory configs of a bundle, validated against their own schemas.

Neither package installs beside this project's pins (axolotl 0.19.0 pins packaging==26.0,
0.18.0 torch<=2.12.1; llamafactory 0.9.5 pins accelerate<=1.11.0), so their option lists are
vendored with their source commit (tests/fixtures/launch/README.md): every emitted key must
be an option of the model that reads it, and every value must fit that option's annotation
(Literal choices, enums, bool/int/float/str, lists, mappings). transformers' own
``OptimizerNames`` checks the optimizer names.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.adapters.launch_drill import FIXTURES, plan_entry
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import render_bundle
from tuneplan.errors import InvalidValueError

AXOLOTL = json.loads((FIXTURES / "axolotl_0.18.0_schema.json").read_text())
LLAMAFACTORY = json.loads((FIXTURES / "llamafactory_0.9.6.dev0_schema.json").read_text())
QLORA = ("plan_llama8b_qlora_aws.json", "b9d2e2d7f4db")
FSDP = ("plan_llama70b_full_aws.json", "b53c1e65f5d9")
ZERO3 = ("plan_llama70b_full_aws.json", "f838284b7b65")
MULTINODE = ("plan_llama70b_multinode_aws.json", "da81eb4f39ff")
CASES = {  # name: (plan, strategy changes)
    "qlora": (QLORA, {}),
    "qlora-fp4-fp16-packed": (QLORA, {"quant": "fp4", "double_quant": False,
                                      "precision": "fp16-mixed", "packing": True,
                                      "optimizer": "paged-adamw8bit"}),
    "lora8bit-flash-offloaded-recompute": (QLORA, {"method": "lora8bit", "quant": "int8",
                                                   "attention": "flash",
                                                   "checkpointing": "offload"}),
    "dora-targets-modules": (QLORA, {"method": "dora", "lora_targets": ["q_proj", "v_proj"],
                                     "trainable_modules": ["embed_tokens", "lm_head"],
                                     "checkpointing": "none", "attention": "eager"}),
    "full-fsdp": (FSDP, {}),
    "full-fsdp-grad-op-offload-pure-bf16": (FSDP, {"sharding": "fsdp-grad-op",
                                                   "offload": "optimizer",
                                                   "precision": "bf16", "compile": True}),
    "full-zero3-offload": (ZERO3, {}),
    "full-zero3-multinode": (MULTINODE, {}),
}


def _files(name: str, targets: tuple[str, ...] = ("axolotl", "llamafactory")
           ) -> tuple[dict[str, Any], dict[str, str]]:
    (doc, plan_id), changes = CASES[name]
    entry = plan_entry(doc, plan_id, **changes)
    return entry["strategy"], render_bundle(saved_plan_from_entry(entry), list(targets),
                                            train_script="")


# ------------------------------------------------------------------------------ the checker
def _optimizer_names() -> set[str]:
    pytest.importorskip("transformers")
    from transformers.training_args import OptimizerNames

    return {o.value for o in OptimizerNames}


def fits(value: Any, annotation: str, enums: dict[str, list[str]]) -> bool:
    """Whether ``value`` (as YAML reads it) fits the annotation source text of one option."""
    return _fits(value, ast.parse(annotation, mode="eval").body, enums)


def _fits(value: Any, node: ast.expr, enums: dict[str, list[str]]) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _fits(value, node.left, enums) or _fits(value, node.right, enums)
    if isinstance(node, ast.Constant) and node.value is None:
        return value is None
    if isinstance(node, ast.Name):
        simple = {"str": str, "bool": bool, "dict": dict, "list": list}
        if node.id in simple:
            return isinstance(value, simple[node.id])
        if node.id == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if node.id == "float":
            return isinstance(value, int | float) and not isinstance(value, bool)
        if node.id == "Any":
            return True
        if node.id in enums:
            return value in enums[node.id]
        raise AssertionError(f"no rule for annotation {node.id}: add its values to the fixture")
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        head, inner = node.value.id, node.slice
        args = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if head == "Literal":
            return value in [ast.literal_eval(a) for a in args]
        if head == "list":
            return isinstance(value, list) and all(_fits(v, args[0], enums) for v in value)
        if head == "dict":
            return isinstance(value, dict)
        if head in ("Annotated", "Optional"):
            return _fits(value, args[0], enums) or (head == "Optional" and value is None)
    raise AssertionError(f"no rule for annotation {ast.unparse(node)}")


def _check(document: dict[str, Any], options: dict[str, str], enums: dict[str, list[str]],
           where: str) -> list[str]:
    """Keys that are no option, and values that do not fit theirs."""
    bad = [f"{where}: {key} is no option" for key in document if key not in options]
    bad += [f"{where}: {key}={value!r} does not fit {options[key]}"
            for key, value in document.items()
            if key in options and not isinstance(value, dict | list)
            and not fits(value, options[key], enums)]
    return bad


def check_axolotl(config: dict[str, Any], files: dict[str, str]) -> list[str]:
    models = AXOLOTL["models"]
    enums = {"CustomSupportedOptimizers": AXOLOTL["enums"]["CustomSupportedOptimizers"]}
    bad = _check(config, models["AxolotlInputConfig"], enums, "axolotl")
    known = _optimizer_names() | set(enums["CustomSupportedOptimizers"])
    if "optimizer" in config and config["optimizer"] not in known:  # HF's names or axolotl's
        bad.append(f"axolotl: optimizer {config['optimizer']} is no optimizer")
    for entry in config.get("datasets", []):
        bad += _check(entry, models["SFTDataset"], enums, "axolotl datasets")
    bad += _check(config.get("fsdp_config", {}), models["FSDPConfig"], enums, "fsdp_config")
    if "deepspeed" in config and config["deepspeed"] not in files:
        bad.append(f"axolotl: deepspeed {config['deepspeed']} is not in the bundle")
    return bad


def check_llamafactory(config: dict[str, Any], files: dict[str, str]) -> list[str]:
    options: dict[str, str] = dict.fromkeys(LLAMAFACTORY["hf_seq2seq_training_arguments"], "Any")
    for fields in LLAMAFACTORY["dataclasses"].values():
        options |= fields
    bad = _check(config, options, LLAMAFACTORY["enums"], "llamafactory")
    if config.get("optim") not in _optimizer_names():
        bad.append(f"llamafactory: optim {config.get('optim')} is no optimizer")
    if "deepspeed" in config and config["deepspeed"] not in files:
        bad.append(f"llamafactory: deepspeed {config['deepspeed']} is not in the bundle")
    info = json.loads(files["dataset_info.json"])
    entry = info.get(config["dataset"])
    if entry is None:
        return [*bad, f"dataset {config['dataset']} is not in dataset_info.json"]
    schema = LLAMAFACTORY["dataset_info"]
    bad += [f"dataset_info: {k} is no key" for k in entry if k not in schema["entry_keys"]]
    bad += [f"dataset_info: column {k}" for k in entry["columns"] if k not in schema["columns"]]
    if entry.get("formatting", "alpaca") not in schema["formatting"]:
        bad.append(f"dataset_info: formatting {entry['formatting']}")
    return bad


# ------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("name", list(CASES))
def test_every_emitted_option_is_one_the_framework_has(name: str) -> None:
    _, files = _files(name)
    ax = yaml.safe_load(files["axolotl.yaml"])
    lf = yaml.safe_load(files["llamafactory.yaml"])
    assert check_axolotl(ax, files) == []
    assert check_llamafactory(lf, files) == []


def test_the_checker_refuses_what_the_frameworks_would() -> None:
    """The validation is real: an unknown key, a wrong choice and a wrong type are caught."""
    _, files = _files("qlora")
    ax = yaml.safe_load(files["axolotl.yaml"])
    assert check_axolotl(ax | {"lora_rank": 8}, files) == ["axolotl: lora_rank is no option"]
    assert len(check_axolotl(ax | {"gradient_checkpointing": "sometimes"}, files)) == 1
    assert len(check_axolotl(ax | {"micro_batch_size": "2"}, files)) == 1
    assert len(check_axolotl(ax | {"optimizer": "adamw_nonesuch"}, files)) == 1
    lf = yaml.safe_load(files["llamafactory.yaml"])
    assert check_llamafactory(lf | {"finetuning_type": "qlora"}, files) != []
    assert check_llamafactory(lf | {"flash_attn": "flash"}, files) != []
    assert check_llamafactory(lf | {"lora_r": 8}, files) != []


@pytest.mark.parametrize("name", list(CASES))
def test_the_configs_say_the_plans_job(name: str) -> None:
    s, files = _files(name)
    cfg = json.loads(render_bundle(saved_plan_from_entry(plan_entry(
        *CASES[name][0], **CASES[name][1])), ["accelerate"],
        train_script="")["train_config.json"])
    ax, lf = (yaml.safe_load(files[f]) for f in ("axolotl.yaml", "llamafactory.yaml"))
    assert ax["base_model"] == lf["model_name_or_path"] == cfg["model_name_or_path"]
    assert ax["micro_batch_size"] == lf["per_device_train_batch_size"] == s["batch_size"]
    assert ax["gradient_accumulation_steps"] == lf["gradient_accumulation_steps"] == \
        s["grad_accum"]
    assert ax["sequence_len"] == lf["cutoff_len"] == s["seq_len"]
    assert ax["sample_packing"] is lf["packing"] is s["packing"]
    assert ax["num_epochs"] == lf["num_train_epochs"] == cfg["epochs"]
    assert ax["learning_rate"] == lf["learning_rate"] == cfg["learning_rate"]
    assert ax["save_steps"] == lf["save_steps"] == cfg["save_steps"]
    # AdamW as estimated: fused on the stack the bundle pins (versions.adamw_impl)
    assert ax["optimizer"] == lf["optim"] == cfg["optim"] == {
        "adamw": "adamw_torch_fused", "paged-adamw8bit": "paged_adamw_8bit"}[s["optimizer"]]
    mixed_bf16, fp16 = s["precision"] == "bf16-mixed", s["precision"] == "fp16-mixed"
    assert (ax["bf16"], ax["fp16"], ax.get("bfloat16", False)) == (
        mixed_bf16, fp16, s["precision"] == "bf16")
    assert (lf["bf16"], lf["fp16"], lf.get("pure_bf16", False)) == (
        s["precision"] in ("bf16-mixed", "bf16"), fp16, s["precision"] == "bf16")
    assert ax["gradient_checkpointing"] == {"none": False, "full": True,
                                            "offload": "offload"}[s["checkpointing"]]
    assert lf["disable_gradient_checkpointing"] is (s["checkpointing"] == "none")
    zero = s["sharding"].startswith("zero")
    assert (ax.get("deepspeed"), lf.get("deepspeed")) == (("ds_config.json",) * 2 if zero
                                                          else (None, None))
    assert ("fsdp_config" in ax) is ("fsdp" in lf) is s["sharding"].startswith("fsdp")
    if s["method"] == "full":
        assert "adapter" not in ax and lf["finetuning_type"] == "full"
        return
    assert (ax["lora_r"], ax["lora_alpha"]) == (lf["lora_rank"], lf["lora_alpha"]) == (
        s["lora_rank"], s["lora_alpha"])
    four_bit = s["method"] == "qlora"
    assert ax["adapter"] == ("qlora" if four_bit else "lora")
    assert ax.get("load_in_4bit", False) is four_bit
    assert ax.get("load_in_8bit", False) is (s["method"] == "lora8bit")
    assert lf.get("quantization_bit") == (4 if four_bit else 8 if s["method"] == "lora8bit"
                                          else None)
    assert ax.get("peft_use_dora", False) is lf.get("use_dora", False) is (
        s["method"] == "dora")


def test_sharding_and_quantisation_details() -> None:
    _, files = _files("full-fsdp-grad-op-offload-pure-bf16")
    ax, lf = (yaml.safe_load(files[f]) for f in ("axolotl.yaml", "llamafactory.yaml"))
    assert ax["fsdp_config"]["reshard_after_forward"] is False  # SHARD_GRAD_OP under FSDP2
    assert ax["fsdp_config"]["offload_params"] is True
    assert lf["fsdp"] == "shard_grad_op auto_wrap offload"
    assert ax["torch_compile"] is True and lf["torch_compile"] is True
    _, files = _files("qlora-fp4-fp16-packed")
    ax, lf = (yaml.safe_load(files[f]) for f in ("axolotl.yaml", "llamafactory.yaml"))
    assert ax["bnb_config_kwargs"] == {"bnb_4bit_quant_type": "fp4",
                                       "bnb_4bit_use_double_quant": False}
    assert (lf["quantization_type"], lf["double_quantization"]) == ("fp4", False)
    _, files = _files("dora-targets-modules")
    ax, lf = (yaml.safe_load(files[f]) for f in ("axolotl.yaml", "llamafactory.yaml"))
    assert ax["lora_target_modules"] == ["q_proj", "v_proj"] and "lora_target_linear" not in ax
    assert lf["lora_target"] == "q_proj,v_proj"
    assert ax["lora_modules_to_save"] == ["embed_tokens", "lm_head"]
    assert lf["additional_target"] == "embed_tokens,lm_head"
    assert (ax["attn_implementation"], lf["flash_attn"]) == ("eager", "disabled")


def test_what_a_framework_cannot_express_is_refused() -> None:
    (doc, plan_id), _ = CASES["qlora"]
    prefix = saved_plan_from_entry(plan_entry(doc, plan_id, method="prefix"))
    for target in ("axolotl", "llamafactory"):
        with pytest.raises(InvalidValueError, match=f"{target} cannot launch plan {plan_id}: "
                                                    "method prefix"):
            render_bundle(prefix, [target], train_script="")
    hybrid = saved_plan_from_entry(plan_entry(*FSDP, sharding="hybrid"))
    with pytest.raises(InvalidValueError, match=r"axolotl cannot launch .*hybrid sharding"):
        render_bundle(hybrid, ["axolotl"], train_script="")
    lf = yaml.safe_load(render_bundle(hybrid, ["llamafactory"],
                                      train_script="")["llamafactory.yaml"])
    assert lf["fsdp"] == "hybrid_shard auto_wrap"
    # Under all, a refused framework is left out and RUN.md says why.
    files = render_bundle(hybrid, ["all"], train_script="")
    assert "axolotl.yaml" not in files and "llamafactory.yaml" in files
    assert "axolotl: no files written: hybrid sharding needs" in files["RUN.md"]
    assert "llamafactory-cli train llamafactory.yaml" in files["RUN.md"]


def test_train_py_and_the_core_name_the_same_optimizers(tmp_path: Path) -> None:
    """train.py keeps its own copy of the optimizer names (it imports nothing from tuneplan)."""
    import importlib.util

    from tuneplan.adapters.launch_files import read_train_script
    from tuneplan.core.launch.bundle import HF_OPTIMIZERS

    (tmp_path / "train.py").write_text(read_train_script())
    spec = importlib.util.spec_from_file_location("bundle_train_optims", tmp_path / "train.py")
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    assert {k.value: v for k, v in HF_OPTIMIZERS.items()} == train.OPTIMIZERS
    assert set(HF_OPTIMIZERS.values()) | {"adamw_torch_fused"} <= _optimizer_names()


def test_a_galore_plan_reaches_train_py_with_its_arguments_and_no_framework() -> None:
    """train.py gets optim, optim_target_modules and optim_args (and galore-torch in its
    requirements); axolotl and LLaMA-Factory are refused with the reason (their resume
    cannot read the projectors), and layer-wise GaLore is refused outright."""
    entry = plan_entry("plan_llama70b_full_aws.json", "f838284b7b65", sharding="ddp",
                       offload="none", optimizer="galore-adamw8bit", galore_rank=64,
                       galore_targets=["q_proj", r".*.mlp.*"])
    files = render_bundle(saved_plan_from_entry(entry), ["all"], train_script="")
    cfg = json.loads(files["train_config.json"])
    assert cfg["optimizer"] == "galore-adamw8bit"
    assert cfg["galore"] == {"optim_target_modules": ["q_proj", r".*.mlp.*"],
                             "optim_args": "rank=64,update_proj_gap=200,scale=0.25"}
    assert "axolotl.yaml" not in files and "llamafactory.yaml" not in files
    assert "weights-only resume refuses" in files["RUN.md"]
    assert {"galore-torch==1.0", "bitsandbytes>=0.45"} <= set(files["requirements.txt"].split())
    layerwise = plan_entry("plan_llama70b_full_aws.json", "f838284b7b65", sharding="ddp",
                           offload="none", optimizer="galore-adamw", gpus=1,
                           optimizer_in_backward=True)
    with pytest.raises(InvalidValueError, match="layer-wise GaLore"):
        render_bundle(saved_plan_from_entry(layerwise), ["all"], train_script="")


@pytest.mark.parametrize("targets", [("accelerate",), ("deepspeed",), ("skypilot",),
                                     ("dstack",), ("axolotl",), ("llamafactory",), ("all",)])
def test_the_plain_optimizer_in_backward_is_refused_by_every_hf_target(
        targets: tuple[str, ...]) -> None:
    """train.py's Trainer steps after backward (a layer-wise optimizer exists only for
    GaLore/APOLLO), so a bundle would keep the full gradients the plan did not count: every
    HF target refuses it, ``all`` too (nothing would be left to run), with one line."""
    entry = plan_entry("plan_llama70b_full_aws.json", "f838284b7b65", sharding="ddp",
                       offload="none", gpus=1, grad_accum=1, optimizer_in_backward=True)
    with pytest.raises(InvalidValueError, match="--optimizer-in-backward") as got:
        render_bundle(saved_plan_from_entry(entry), list(targets), train_script="")
    assert "\n" not in str(got.value) and "full gradients" in str(got.value)
    entry["strategy"]["optimizer_in_backward"] = False
    assert "train.py" in render_bundle(saved_plan_from_entry(entry), ["accelerate"],
                                       train_script="")


def test_a_freeze_plan_is_train_pys_and_refused_where_it_cannot_be_exact() -> None:
    """train.py gets what trains (train_config ``freeze``); LLaMA-Factory's freeze would
    also train every block's layernorms (its extra modules match by substring), axolotl has
    no mapping: both refused in one line, listed in RUN.md under ``all``; under FSDP the
    plan is refused (one flat parameter per unit needs one dtype)."""
    entry = plan_entry("plan_llama70b_full_aws.json", "f838284b7b65", method="freeze",
                       sharding="ddp", offload="none", trainable_layers=4,
                       trainable_modules=["embed_tokens"])
    files = render_bundle(saved_plan_from_entry(entry), ["all"], train_script="")
    cfg = json.loads(files["train_config.json"])
    assert cfg["method"] == "freeze" and cfg["freeze"]["last_blocks"] == 4
    assert cfg["freeze"]["modules"] == ["embed_tokens"]
    assert "axolotl.yaml" not in files and "llamafactory.yaml" not in files
    assert "every block's layernorms" in files["RUN.md"]
    for tool, words in (("llamafactory", "match parameter names by substring"),
                        ("axolotl", "method freeze")):
        with pytest.raises(InvalidValueError, match=words) as got:
            render_bundle(saved_plan_from_entry(entry), [tool], train_script="")
        assert "\n" not in str(got.value)
    entry["strategy"]["sharding"] = "fsdp"
    with pytest.raises(InvalidValueError, match="freeze under FSDP"):
        render_bundle(saved_plan_from_entry(entry), ["accelerate"], train_script="")
