"""Launch files name the modules PEFT wraps: ``--lora-targets q_proj,v_proj`` on a fused
``query_key_value`` model (Falcon, GPT-NeoX, BLOOM) is written as ``query_key_value`` in
train_config.json, the axolotl and the LLaMA-Factory configs (PEFT matches by suffix, so the
split names would find nothing there); an encoder-decoder plan is refused with its reason."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from tests.adapters.launch_drill import plan_entry
from tuneplan.adapters.hub import resolve_model
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import bundle_files, expand_targets, launch_spec
from tuneplan.core.planner.record import SavedPlan
from tuneplan.errors import InvalidValueError

QLORA = ("plan_llama8b_qlora_aws.json", "b9d2e2d7f4db")


def _plan(model: str) -> SavedPlan:
    entry = plan_entry(*QLORA, method="lora", lora_targets=["q_proj", "v_proj"])
    return dataclasses.replace(saved_plan_from_entry(entry), model_id=model)


@pytest.mark.parametrize("model", ["tiiuae/falcon-7b", "EleutherAI/pythia-1b",
                                   "bigscience/bloomz-7b1"])
def test_fused_models_launch_with_the_real_module_name(model: str) -> None:
    spec = launch_spec(_plan(model), resolve_model(model))
    files = bundle_files(spec, expand_targets(["accelerate", "axolotl", "llamafactory"]),
                         train_script="")
    assert json.loads(files["train_config.json"])["lora_targets"] == ["query_key_value"]
    axolotl = yaml.safe_load(next(v for k, v in files.items() if "axolotl" in k))
    assert axolotl["lora_target_modules"] == ["query_key_value"]
    factory = yaml.safe_load(next(v for k, v in files.items() if "llamafactory" in k
                                  and k.endswith((".yaml", ".yml"))))
    assert factory["lora_target"] == "query_key_value"
    assert "q_proj,v_proj (PEFT wraps query_key_value)" in files["RUN.md"]


def test_split_models_keep_their_targets_and_t5_is_refused() -> None:
    spec = launch_spec(_plan("meta-llama/Llama-3.1-8B"),
                       resolve_model("meta-llama/Llama-3.1-8B"))
    assert spec.lora_targets == ("q_proj", "v_proj")
    with pytest.raises(InvalidValueError, match="encoder-decoder"):
        launch_spec(_plan("bigscience/T0_3B"), resolve_model("bigscience/T0_3B"))
