"""core.launch: reading a plan, checkpoint cadence and retention, YAML text, bundle contents."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuneplan.adapters.importers.snapshot import load_sky_catalog
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.cost.spot import young_daly_interval_s
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.launch.bundle import (
    MIN_KEPT,
    LaunchSpec,
    Target,
    expand_targets,
    launch_spec,
    render_bundle,
    train_config,
)
from tuneplan.core.launch.yamltext import render_yaml
from tuneplan.core.planner.record import SavedPlan
from tuneplan.errors import InvalidValueError
from tuneplan.units import GB

FIXTURES = Path(__file__).parent.parent / "fixtures" / "launch"


def _plan(doc: str, index: int = 0) -> dict[str, Any]:
    data = json.loads((FIXTURES / doc).read_text())
    return {"job": data["job"], "model": data.get("model"), **data["plans"][index]}


def _saved(entry: dict[str, Any]) -> SavedPlan:
    """A fixture entry read back typed, as ``tuneplan launch`` reads a saved plan."""
    return saved_plan_from_entry(entry)


def _spec(entry: dict[str, Any]) -> LaunchSpec:
    return launch_spec(_saved(entry))


def test_targets_expand_all_and_refuse_unknown_words() -> None:
    assert expand_targets(["all"]) == (Target.ACCELERATE, Target.DEEPSPEED, Target.SKYPILOT,
                                       Target.DSTACK, Target.AXOLOTL, Target.LLAMAFACTORY)
    assert expand_targets(["llamafactory,axolotl"]) == (Target.AXOLOTL, Target.LLAMAFACTORY)
    assert expand_targets(["dstack,skypilot"]) == (Target.SKYPILOT, Target.DSTACK)
    with pytest.raises(InvalidValueError, match="slurm"):
        expand_targets(["slurm"])


def test_save_steps_are_the_plans_young_daly_interval_over_step_time() -> None:
    plan = _plan("plan_llama8b_qlora_aws.json")
    spec = _spec(plan)
    interval_s = plan["cost"]["spot"]["checkpoint_interval_minutes"] * 60
    assert spec.checkpoint_interval_s == pytest.approx(interval_s)
    assert spec.save_steps == round(interval_s / plan["throughput"]["step_seconds"])
    assert spec.save_steps > 1
    assert "spot cost model" in spec.interval_source


def test_without_a_spot_interval_young_daly_is_computed_from_the_checkpoint_size() -> None:
    plan = _plan("plan_llama8b_qlora_aws.json")
    plan["cost"] = {**plan["cost"], "spot": None}
    spec = _spec(plan)
    # QLoRA: fp32 adapters (4 B) + AdamW state (8 B) per trainable parameter (the fixture
    # predates memory.checkpoint_bytes: the rule of thumb); 1 GB/s writes, MTBF 10 h
    # (CostAssumptions' stated defaults).
    ckpt = plan["memory"]["trainable_params"] * 12
    assert spec.checkpoint_bytes == ckpt
    assert spec.checkpoint_interval_s == pytest.approx(young_daly_interval_s(ckpt / 1e9, 36_000))


def test_retention_follows_the_disk_budget() -> None:
    plan = _plan("plan_llama70b_full_aws.json", 1)
    assert _spec(plan).save_total_limit == MIN_KEPT  # disk unknown: what cost priced
    spec = _spec(plan)
    roomy = plan | {"offer": plan["offer"] | {
        "disk_bytes": spec.total_params * 2 + 100 * GB + 4 * spec.checkpoint_bytes}}
    assert _spec(roomy).save_total_limit == 4


def test_every_missing_field_is_reported_at_once() -> None:
    plan = _plan("plan_llama8b_qlora_aws.json")
    del plan["throughput"]
    plan["strategy"] = plan["strategy"] | {"method": "magic"}
    with pytest.raises(InvalidValueError) as err:
        _saved(plan)
    assert "throughput.step_seconds is missing" in str(err.value)
    plan = _plan("plan_llama8b_qlora_aws.json")
    plan["strategy"] = plan["strategy"] | {"method": "magic", "lora_rnak": 8}
    with pytest.raises(InvalidValueError) as err:
        _saved(plan)
    assert "strategy.method='magic'" in str(err.value)
    assert "unknown key strategy.lora_rnak" in str(err.value)


def test_the_spec_holds_the_plans_strategy_and_offer() -> None:
    plan = _plan("plan_llama70b_full_aws.json", 1)
    spec = _spec(plan)
    assert spec.strategy.method is Method.FULL and spec.strategy.sharding is Sharding.ZERO3
    got, saved = spec.strategy.as_dict(), {k: v for k, v in plan["strategy"].items()
                                           if k != "link"}
    assert {k: got[k] for k in saved} == saved
    # fields newer than the saved plan (GaLore's, LISA's) read back as their defaults
    assert {k: v for k, v in got.items() if k not in saved} == {
        k: v for k, v in Strategy().as_dict().items() if k not in saved}
    assert spec.offer.id == plan["offer"]["id"] and spec.gpu_name == plan["offer"]["gpu"]
    assert spec.model_id == "meta-llama/Llama-3.1-70B"
    assert spec.zero_stage == 3 and spec.world_size == plan["strategy"]["gpus"]


@pytest.mark.parametrize("value", [
    "no", "1e3", "yes: really", "#hash", "multi\nline\n  indented", "a\nb\n", "a\n\nb\n\n",
    " lead\nx", "tail \nx", "${{ dstack.node_rank }}",
    'quote " and \\ backslash', "", "  lead", "ünïcode", 143, 2.5, True, None, [], {},
    2e-05, 1e20, -3e-7,  # YAML 1.1 reads an exponent without a dot as text
])
def test_yaml_text_reads_back_as_the_same_value(value: Any) -> None:
    doc = {"key": value, "list": [value, {"inner": value}], "nested": {"x": value}}
    assert yaml.safe_load(render_yaml(doc, header="a\nb")) == doc


def test_bundle_files_follow_targets_and_sharding() -> None:
    single = _plan("plan_llama8b_qlora_aws.json")
    files = render_bundle(_saved(single), ["skypilot"], train_script="# train",
                          sky_catalog=load_sky_catalog())
    assert set(files) == {"train.py", "train_config.json", "requirements.txt",
                          "accelerate_config.yaml", "preemptible.sh", "sky.yaml", "RUN.md"}
    assert "bitsandbytes" in files["requirements.txt"]
    assert "deepspeed" not in files["requirements.txt"]
    zero3 = render_bundle(_saved(_plan("plan_llama70b_full_aws.json", 1)), ["dstack"],
                          train_script="")
    assert "ds_config.json" in zero3  # ZeRO plans always carry their DeepSpeed JSON
    assert "deepspeed" in zero3["requirements.txt"]
    assert "bitsandbytes" not in zero3["requirements.txt"]  # full fine-tuning, plain AdamW
    assert json.loads(zero3["ds_config.json"])["zero_optimization"]["stage"] == 3


def test_train_config_carries_the_plan_choices() -> None:
    plan = _plan("plan_llama8b_qlora_aws.json")
    cfg = train_config(_spec(plan))
    s = plan["strategy"]
    assert (cfg["method"], cfg["lora_rank"], cfg["quant"]) == ("qlora", s["lora_rank"], "nf4")
    assert (cfg["batch_size"], cfg["seq_len"]) == (s["batch_size"], s["seq_len"])
    assert cfg["output_dir"] == f"/checkpoints/{plan['id']}"
    assert cfg["save_total_limit"] >= 2


def test_run_md_says_cadence_cost_and_how_to_launch() -> None:
    plan = _plan("plan_llama70b_multinode_aws.json")
    files = render_bundle(_saved(plan), ["all"], train_script="", sky_catalog=load_sky_catalog())
    text = files["RUN.md"]
    spec = _spec(plan)
    assert f"Every **{spec.save_steps} steps**" in text
    assert plan["cost"]["on_demand_usd"] in text
    assert "sky jobs launch sky.yaml" in text and "dstack apply -f .dstack.yml" in text
    assert all(w in text for w in plan["warnings"])
    assert spec.planned_steps == math.ceil(2_000_000_000 / (1 * 8192 * 1 * 4))


def _with_strategy(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return entry | {"strategy": entry["strategy"] | changes}


def test_offloaded_optimizer_is_one_deepspeed_accepts() -> None:
    """ZeRO-Offload: AdamW is named in the JSON (DeepSpeed builds its CPU Adam, the rate the
    plan's step time assumes); any other optimizer stays the Trainer's, with DeepSpeed's
    client-optimizer refusal switched off; without offload neither key is there."""
    from tuneplan.core.launch.engines import deepspeed_config

    entry = _plan("plan_llama70b_full_aws.json", 1)
    assert entry["strategy"]["offload"] == "optimizer"
    adam = deepspeed_config(_spec(entry))
    assert adam["optimizer"] == {"type": "AdamW", "params": {
        "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
    assert "zero_force_ds_cpu_optimizer" not in adam
    sgd = deepspeed_config(_spec(_with_strategy(entry, optimizer="sgd")))
    assert sgd["zero_force_ds_cpu_optimizer"] is False and "optimizer" not in sgd
    on_gpu = deepspeed_config(_spec(_with_strategy(entry, offload="none")))
    assert "optimizer" not in on_gpu and "zero_force_ds_cpu_optimizer" not in on_gpu
    assert "offload_optimizer" not in on_gpu["zero_optimization"]
    text = render_bundle(_saved(_with_strategy(entry, optimizer="sgd")), ["all"],
                         train_script="")["RUN.md"]
    assert "sgd runs there as the Trainer's own optimizer" in text


def test_every_launch_line_goes_through_the_preemption_guard() -> None:
    from tuneplan.core.cost.estimate import CostAssumptions
    from tuneplan.core.launch.engines import GRACE_BASE_S, shutdown_grace_s

    entry = _plan("plan_llama70b_multinode_aws.json")
    files = render_bundle(_saved(entry), ["all"], train_script="",
                          sky_catalog=load_sky_catalog())
    sky = yaml.safe_load(files["sky.yaml"])
    dstack = yaml.safe_load(files[".dstack.yml"])
    lines = [sky["run"].strip().splitlines()[-1], dstack["commands"][-1],
             files["launch_accelerate.sh"].strip().splitlines()[-1],
             files["launch_torchrun.sh"].strip().splitlines()[-1]]
    assert all(line.startswith("exec bash preemptible.sh ") for line in lines), lines
    assert "preemptible.sh" in dstack["files"]
    assert sky["resources"]["job_recovery"]["recover_on_exit_codes"] == [143]
    spec = _spec(entry)
    write_s = spec.checkpoint_bytes / CostAssumptions().checkpoint_write_bytes_per_s
    grace = shutdown_grace_s(spec)
    assert grace == GRACE_BASE_S + math.ceil(2 * write_s) and grace > 30
    assert f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-{grace}" in files["preemptible.sh"]
