"""One trainable-parameter count for every bundled model and method: the memory model, the speed
model (optimizer step, gradient traffic, adapter FLOPs), the checkpoint size and the launch
bundle's train_config all agree, because they all read ``core.job.methods`` (PEFT 0.21 targets,
MoE routers and fused experts included). No torch: specs parsed once from the bundled configs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest.mock import patch

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.adapters.hub import bundled_models, load_bundled_config
from tuneplan.core.compute.step import STATE_BYTES, trainable_params
from tuneplan.core.compute.throughput import (
    ModelShape,
    adapted_linears,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.job.methods import (
    ESTIMATED_METHODS,
    PEFT_MOE_CONVERTED,
    Method,
    count_trainable,
)
from tuneplan.core.job.strategy import Attention, Strategy
from tuneplan.core.job.tuners import TUNER_METHODS
from tuneplan.core.launch.bundle import launch_spec, train_config
from tuneplan.core.memory import estimate_memory
from tuneplan.core.memory.refusals import SOFTCAP_MODEL_TYPES
from tuneplan.core.models import LinearRole, ModelSpec, parse_model_config
from tuneplan.errors import UnsupportedError

ROOT = Path(__file__).parents[2]
PLAN_FIXTURE = ROOT / "tests" / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"
TRAIN_SCRIPT = ROOT / "src" / "tuneplan" / "data" / "launch" / "train.py"
GPU = "H100 SXM5"
#: Short sequences so that the 1024-position models (GPT-2) are not refused for their context:
#: the trainable count does not depend on the sequence length.
BASE = Strategy(seq_len=512)

#: (model, variant) pairs the memory model refuses, with the start of its reason. Anything else
#: refused, or any of these accepted, fails the test: nothing is skipped silently.
EXPECTED_SKIPS: dict[str, str] = {
    # every case here trains a causal LM; BERT is held to its seq-cls path in
    # tests/core/memory/test_simulation_encoder.py and the calibration rows
    "google-bert/bert-large-uncased": "google-bert/bert-large-uncased is an encoder-only bert "
                                      "model: only --task seq-cls is modelled",
}
#: Models with more than one kind of block: ``freeze`` is not estimated for them.
FREEZE_REFUSED = "freeze is estimated only for models with one kind of block"
LISA_REFUSED = "lisa is estimated only for models with one kind of block"
#: all-linear DoRA on a MoE type peft converts: peft's ParamWrapper refuses use_dora.
DORA_MOE_REFUSED = "DoRA cannot wrap"


@cache
def specs() -> dict[str, ModelSpec]:
    return {m.hf_id: parse_model_config(load_bundled_config(m), name=m.hf_id)
            for m in bundled_models()}


@cache
def shape(name: str) -> ModelShape:
    return model_shape_from_spec(specs()[name])


@cache
def train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tuneplan_train_entry", TRAIN_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def explicit_targets(spec: ModelSpec) -> tuple[str, ...]:
    """``q_proj,v_proj`` where the model has them, else its first two attention linears."""
    names = [_short(lin.name) for layer in spec.layers for lin in layer.linears
             if lin.role is LinearRole.ATTENTION]
    if {"q_proj", "v_proj"} <= set(names):
        return ("q_proj", "v_proj")
    return tuple(dict.fromkeys(names))[:2]


def variants(spec: ModelSpec) -> dict[str, Strategy]:
    """Every method the memory model estimates, LoRA with its default (all-linear) and with
    explicit targets, and with the head trained in full (modules_to_save)."""
    explicit = explicit_targets(spec)
    # Soft-capping models (Gemma-2) are refused on SDPA: they train with eager attention.
    base = (replace(BASE, attention=Attention.EAGER) if spec.model_type in SOFTCAP_MODEL_TYPES
            else BASE)
    out = {
        "full": replace(base, method=Method.FULL),
        "freeze-2": replace(base, method=Method.FREEZE, trainable_layers=2),
        "lisa-2": replace(base, method=Method.LISA),  # --lisa-layers 2, the default
        "lora": replace(base, method=Method.LORA),
        "lora-" + ",".join(explicit): replace(base, method=Method.LORA, lora_targets=explicit,
                                              lora_rank=8),
        "lora+lm_head": replace(base, method=Method.LORA, trainable_modules=("lm_head",)),
        "dora": replace(base, method=Method.DORA),
        "qlora": replace(base, method=Method.QLORA, lora_rank=64),
        "lora8bit": replace(base, method=Method.LORA8BIT),
        "prefix": replace(base, method=Method.PREFIX),
        "prompt": replace(base, method=Method.PROMPT, num_virtual_tokens=32),
        "ia3": replace(base, method=Method.IA3),
        "ia3-" + ",".join(explicit): replace(base, method=Method.IA3, lora_targets=explicit),
    }
    # PEFT's other tuners are held to peft itself in tests/core/test_tuners.py
    assert {s.method for s in out.values()} == ESTIMATED_METHODS - TUNER_METHODS
    return out


def expected_skip(name: str, variant: str) -> str | None:
    if name in EXPECTED_SKIPS:
        return EXPECTED_SKIPS[name]
    spec = specs()[name]
    if variant.startswith("freeze") and len(spec.layers) > 1:
        return FREEZE_REFUSED
    if variant.startswith("lisa") and len(spec.layers) > 1:
        return LISA_REFUSED
    if variant == "dora" and spec.model_type in PEFT_MOE_CONVERTED and spec.is_moe:
        return DORA_MOE_REFUSED
    return None


def peft_kwargs(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The keyword arguments train.py's ``add_adapters`` gives ``peft.LoraConfig`` for ``cfg``
    (None: no adapters, full fine-tuning); a stand-in ``peft`` records them. SystemExit where
    train.py refuses the method."""
    captured: dict[str, Any] = {}
    fake = SimpleNamespace(
        LoraConfig=lambda **kw: captured.update(kw) or kw,
        get_peft_model=lambda model, config: model,
        prepare_model_for_kbit_training=lambda model, **kw: model)
    # freeze sets requires_grad on a real model (held to the estimate in test_launch_trl);
    # here only the selection it is given is read back (launch_count)
    freeze = patch.object(train_module(), "apply_freeze", lambda model, *a, **kw: model)
    with patch.dict(sys.modules, {"peft": fake}), freeze:
        train_module().add_adapters("model", cfg)
    return captured or None


def launch_count(spec: ModelSpec, strategy: Strategy, memory: Any) -> tuple[int, Any]:
    """(trainable params of the adapters train.py builds from the bundle's train_config.json,
    the LaunchSpec) for a plan entry carrying ``strategy`` and ``memory``."""
    data = json.loads(PLAN_FIXTURE.read_text())
    plan = {**data["plans"][0], "job": {**data["job"], "model": spec.name}}
    plan["strategy"] = strategy.as_dict()
    plan["memory"] = {**plan["memory"], "trainable_params": memory.trainable_params,
                      "total_params": memory.total_params,
                      "checkpoint_bytes": memory.checkpoint_bytes}
    from tuneplan.adapters.plans import saved_plan_from_entry

    plan = json.loads(json.dumps(plan, default=str))  # as the saved plan file holds it
    launch = launch_spec(saved_plan_from_entry(plan))
    cfg = train_config(launch)
    kw = peft_kwargs(cfg)
    if cfg["method"] == Method.FREEZE.value:  # train.py's apply_freeze reads these
        built = Strategy(method=Method.FREEZE, trainable_layers=cfg["freeze"]["last_blocks"],
                         trainable_modules=tuple(cfg["freeze"]["modules"]))
    elif kw is None:
        built = Strategy(method=Method(cfg["method"]))
    else:
        targets = kw["target_modules"]
        assert targets == "all-linear" or isinstance(targets, list)
        method = Method.DORA if kw["use_dora"] else Method(cfg["method"])
        built = Strategy(method=method, lora_rank=kw["r"], lora_alpha=kw["lora_alpha"],
                         lora_targets=("all-linear",) if targets == "all-linear"
                         else tuple(targets),
                         trainable_modules=tuple(kw["modules_to_save"] or ()))
    return count_trainable(spec, built).total, launch


@cache
def launched_methods() -> frozenset[Method]:
    """The estimated methods train.py trains (``add_adapters`` exits on the others)."""
    out = set()
    for method in ESTIMATED_METHODS - TUNER_METHODS:
        cfg = {"method": method.value, "gradient_checkpointing": True, "lora_targets":
               ["all-linear"], "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0,
               "trainable_modules": [], "precision": "fp32",
               "freeze": {"last_blocks": 1, "final_norm": [], "modules": []}}
        try:
            peft_kwargs(cfg)
        except SystemExit:
            continue
        out.add(method)
    return frozenset(out)


def check(name: str, variant: str, strategy: Strategy) -> str | None:
    """Assert every consumer agrees for one case; the memory model's refusal, if any."""
    spec, view = specs()[name], shape(name)
    try:
        memory = estimate_memory(spec, strategy)
    except UnsupportedError as exc:
        # where the estimate is refused (activations) but not the count, the speed model
        # still counts what count_trainable counts; where the count is refused, so is speed
        try:
            counted = count_trainable(spec, strategy).total
        except UnsupportedError:
            with pytest.raises(UnsupportedError):
                trainable_params(view, strategy)
        else:
            assert trainable_params(view, strategy) == counted
        return str(exc)
    expected = memory.trainable_params
    assert expected == count_trainable(spec, strategy).total

    # speed model: its own count, the optimizer step and gradient traffic read it
    assert trainable_params(view, strategy) == expected
    result = estimate_throughput(view, strategy, load_gpu_spec(GPU))
    optimizer = result.step.get("step/optimizer")
    assert optimizer is not None and optimizer.inputs["params_per_rank"] == expected

    # adapter FLOPs: the adapted linears' parameters are the trainable adapter matrices
    trainable = count_trainable(spec, strategy)
    adapters = result.flops_per_token.get("adapters")
    if strategy.method.is_lora:
        assert adapters is not None
        stored = adapters.inputs["adapter_params"]
        dora = strategy.method is Method.DORA
        magnitudes = sum(a.out_features * a.stored for a in adapted_linears(view, strategy)
                         if dora and a.role is not LinearRole.EXPERT)
        assert stored + magnitudes == trainable.adapter_params
        assert stored + magnitudes + trainable.base_params == expected
    else:
        assert adapters is None

    # checkpoint size: the memory estimate's own count, from the same trainable parameters.
    # PEFT saves the trainable tensors only, at their training width (2 or 4 B); the base
    # trained saves every weight; AdamW-type states are at least 2 B (8-bit) per trainable
    # parameter, at most 8 B, plus a fp32 master copy (4 B) where DeepSpeed keeps one.
    # The launch spec carries the same figure through the saved plan file.
    with_opt, without = memory.checkpoint_bytes, memory.checkpoint_weights_bytes
    if strategy.method.trains_base:
        assert 2 * memory.total_params <= without <= 4 * memory.total_params
    else:
        assert 2 * expected <= without <= 4 * expected
    state = with_opt - without
    if STATE_BYTES[strategy.optimizer] >= 8 and not strategy.optimizer.is_galore:
        # two moments of 2 B (pure bf16) to 4 B each, and a 4 B master copy at most
        assert 4 * expected <= state <= 12 * expected

    # launch: the bundle's train_config builds the same adapters
    if strategy.method in launched_methods():
        launched, launch = launch_count(spec, strategy, memory)
        assert launched == expected
        assert launch.trainable_params == expected and launch.checkpoint_bytes == with_opt
    return None


def _cases() -> list[tuple[str, str, Strategy]]:
    return [(name, variant, strategy) for name, spec in specs().items()
            for variant, strategy in variants(spec).items()]


@pytest.mark.parametrize("name", sorted(specs()))
def test_every_consumer_counts_the_same_trainable_params(name: str) -> None:
    for variant, strategy in variants(specs()[name]).items():
        refused = check(name, variant, strategy)
        skip = expected_skip(name, variant)
        if skip is None:
            assert refused is None, f"{name} {variant}: memory model refused: {refused}"
        else:
            assert refused is not None and refused.startswith(skip), (name, variant, refused)


def test_coverage_and_the_counted_skips() -> None:
    cases = _cases()
    skipped = [(n, v) for n, v, _ in cases if expected_skip(n, v)]
    freeze = [n for n, v in skipped if v.startswith("freeze") and n not in EXPECTED_SKIPS]
    lisa = [n for n, v in skipped if v.startswith("lisa") and n not in EXPECTED_SKIPS]
    dora = sorted(n for n, v in skipped if v == "dora" and n not in EXPECTED_SKIPS)
    assert len(specs()) == 81 and len(cases) == 81 * 13
    assert len(skipped) == len(EXPECTED_SKIPS) * 13 + len(freeze) + len(lisa) + len(dora)
    assert lisa == freeze  # one kind of block, as freeze
    assert sorted(freeze) == sorted(n for n, s in specs().items()
                                    if len(s.layers) > 1 and n not in EXPECTED_SKIPS)
    assert dora == ["Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3",
                    "mistralai/Mixtral-8x22B-v0.1", "mistralai/Mixtral-8x7B-v0.1"]
    # T0 and mT0 estimated (freeze and lisa refused); lisa wherever freeze is
    assert len(cases) - len(skipped) == 953 + len(specs()) - len(EXPECTED_SKIPS) - len(freeze)
    # lisa: the whole model, its blocks frozen by train.py's switch (test_launch_trl)
    # freeze: the blocks, norm and modules train.py's apply_freeze trains (test_launch_trl)
    assert launched_methods() == {Method.FULL, Method.FREEZE, Method.LISA, Method.LORA,
                                  Method.DORA, Method.QLORA, Method.LORA8BIT}


@pytest.mark.parametrize(("name", "published"), [
    ("Qwen/Qwen3-30B-A3B", 996_507_648),
    ("mistralai/Mixtral-8x7B-v0.1", None),
])
def test_moe_all_linear_lora_trains_routers_and_experts(name: str, published: int | None) -> None:
    """PEFT 0.21 converts these MoE types: all-linear LoRA wraps the router and the fused
    experts. The speed model (and so ``tuneplan cost``'s checkpoint size) counted 13,369,344
    for Qwen3-30B-A3B before it shared the memory model's rule."""
    strategy = Strategy(method=Method.LORA)
    view = shape(name)
    memory = estimate_memory(specs()[name], strategy).trainable_params
    speed = trainable_params(view, strategy)
    assert speed == memory
    if published is not None:
        assert speed == published
    else:  # Mixtral-8x7B: 359.7M (attention + routers + 8 experts x 3 at rank 16)
        assert round(speed / 1e5) == 3597
    flops = estimate_throughput(view, strategy, load_gpu_spec(GPU)).flops_per_token
    adapters = flops.get("adapters")
    assert adapters is not None and adapters.inputs["adapter_params"] == memory
    # a token passes through experts_per_token of the experts only (their adapters too)
    spec = specs()[name]
    experts = sum(a.rank * (a.in_features + a.out_features) * a.stored
                  for a in adapted_linears(view, strategy) if a.role is LinearRole.EXPERT)
    assert experts > memory // 2
    assert adapters.inputs["adapter_params_per_token"] == (
        memory - experts + experts * spec.num_experts_per_token // spec.num_experts)
