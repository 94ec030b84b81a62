"""Every peft tuner type is planned or refused with a reason; each planned tuner's trainable
count is peft's own on tiny Llamas (``get_peft_model`` with the config the probe and the launch
bundle build, ``tuners.peft_spec``)."""

from __future__ import annotations

import pytest

from tuneplan.core.job.methods import _RANKED, ESTIMATED_METHODS, Method, count_trainable
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.job.tuners import PEFT_TYPES, RANK_FIELD, TUNER_METHODS, peft_spec
from tuneplan.core.models import parse_model_config
from tuneplan.errors import UnsupportedError

SMALL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1024,
         "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}
GQA = {**SMALL, "num_key_value_heads": 2, "intermediate_size": 704}
TUNERS = sorted(TUNER_METHODS, key=str)


def test_rank_field_and_method_agree() -> None:
    assert frozenset(RANK_FIELD) == _RANKED
    assert all(m.uses_rank for m in RANK_FIELD)
    assert not Method.OFT.uses_rank and Method.LORA.uses_rank


def test_every_installed_peft_type_is_planned_or_refused() -> None:
    peft = pytest.importorskip("peft")
    installed = {t.value for t in peft.PeftType}
    assert installed <= set(PEFT_TYPES), installed - set(PEFT_TYPES)
    for name, answer in PEFT_TYPES.items():
        assert (isinstance(answer, str) and answer) or answer in ESTIMATED_METHODS, name


def _peft_count(config: dict[str, object], strategy: Strategy) -> int:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from tuneplan.adapters.probe.build import make_config

    spec = peft_spec(parse_model_config(config, name="tiny"), strategy)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(config, strategy.task))
    wrapped = peft.get_peft_model(model, getattr(peft, spec.config_class)(**spec.kwargs))
    for name, p in wrapped.named_parameters():
        if any(f".{f}." in name for f in spec.freeze):
            p.requires_grad_(False)
    trainable, _ = wrapped.get_nb_trainable_parameters()
    return int(trainable)


@pytest.mark.parametrize("method", TUNERS, ids=str)
@pytest.mark.parametrize("arch", ["small", "gqa"])
def test_trainable_count_is_peft_s(method: Method, arch: str) -> None:
    config = SMALL if arch == "small" else GQA
    strategy = Strategy(method=method, lora_rank=16, num_virtual_tokens=12)
    spec = parse_model_config(config, name="tiny")
    try:
        ours = count_trainable(spec, strategy).total
    except UnsupportedError as exc:
        assert arch == "gqa" and method is Method.C3A, exc  # 128-wide k/v: block 256
        return
    assert ours == _peft_count(config, strategy)


@pytest.mark.parametrize("method", [Method.HRA, Method.LOKR, Method.MISS, Method.VERA],
                         ids=str)
def test_rank_changes_the_count_as_in_peft(method: Method) -> None:
    strategy = Strategy(method=method, lora_rank=4, lora_targets=("q_proj", "down_proj"))
    ours = count_trainable(parse_model_config(SMALL, name="tiny"), strategy).total
    assert ours == _peft_count(SMALL, strategy)


def _launch_cfg(strategy: Strategy) -> dict[str, object]:
    """train_config.json of the bundled 8B plan fixture with ``strategy`` as its job."""
    import json
    from pathlib import Path

    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec, train_config

    root = Path(__file__).parents[2]
    data = json.loads((root / "tests" / "fixtures" / "launch" /
                       "plan_llama8b_qlora_aws.json").read_text())
    entry = {**data["plans"][0], "job": data["job"], "strategy": strategy.as_dict()}
    entry = json.loads(json.dumps(entry, default=str))
    return train_config(launch_spec(saved_plan_from_entry(entry)))


def _train_module() -> object:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "src" / "tuneplan" / "data" / "launch" / "train.py"
    spec = importlib.util.spec_from_file_location("tuneplan_train_tuners", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", [m for m in TUNERS if m is not Method.ADALORA], ids=str)
def test_launch_bundle_builds_the_estimated_tuner(method: Method) -> None:
    """train.py builds, from the bundle's train_config.json, the model the estimate counted."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from tuneplan.adapters.probe.build import make_config

    strategy = Strategy(method=method, lora_rank=16, num_virtual_tokens=12,
                        lora_targets=("q_proj", "v_proj", "down_proj"))
    cfg = _launch_cfg(strategy)
    assert cfg["method"] == method.value and cfg["peft"] is not None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(SMALL, strategy.task))
    built = _train_module().add_adapters(model, cfg)  # type: ignore[attr-defined]
    trainable, _ = built.get_nb_trainable_parameters()
    assert trainable == count_trainable(parse_model_config(SMALL, name="tiny"), strategy).total


def test_launch_refuses_adalora_with_its_reason() -> None:
    from tuneplan.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="update_and_allocate"):
        _launch_cfg(Strategy(method=Method.ADALORA))


def test_lora_rank_is_refused_where_the_tuner_has_no_rank() -> None:
    from tuneplan.service.jobflags import JobFlagError, job_from_values

    with pytest.raises(JobFlagError, match="--lora-rank applies only to"):
        job_from_values("m", {"method": "oft", "lora-rank": 8}, command="memory")
    job = job_from_values("m", {"method": "vera", "lora-rank": 8}, command="memory")
    assert job.strategy.lora_rank == 8
