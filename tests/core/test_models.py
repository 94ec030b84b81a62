"""ModelSpec parsing and exact parameter counts against the bundled configs and INDEX.csv.

Golden totals come from ``src/tuneplan/data/models/INDEX.csv`` (published learnable counts) and
its README (figures for the rows without a published integer). Validation tests feed
malformed and hostile configs, including random ones from hypothesis.
"""

from __future__ import annotations

import copy
import csv
import json
from importlib import resources
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuneplan.core.models import (
    SUPPORTED_MODEL_TYPES,
    ModelSpec,
    count_parameters,
    parse_model_config,
)
from tuneplan.errors import ModelConfigError

MODELS_DIR = resources.files("tuneplan.data") / "models"
INDEX = list(csv.DictReader((MODELS_DIR / "INDEX.csv").read_text().splitlines()))


def _config(file: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS_DIR / file).read_text())
    return loaded


def _spec(file: str) -> ModelSpec:
    return parse_model_config(_config(file), name=file.removesuffix(".json"))


PUBLISHED = [(r["file"], int(r["published_params"])) for r in INDEX if r["published_params"]]

# Rows without a published integer: the README's computed figures ("Check performed") and, for
# the six configs added later, the count transformers gives on the meta device (INDEX notes).
COMPUTED = {
    "facebook__opt-6.7b.json": 6_658_473_984,
    "bigscience__mt0-xxl.json": 12_921_057_280,
    "tiiuae__falcon-7b.json": 6_921_720_704,
    "01-ai__Yi-34B.json": 34_388_917_248,
    "microsoft__phi-1_5.json": 1_418_270_720,
    "openai-community__gpt2-large.json": 774_030_080,
    "openai-community__gpt2-xl.json": 1_557_611_200,
    "stabilityai__stablelm-base-alpha-3b.json": 3_637_321_728,
    "tiiuae__falcon-40b.json": 41_303_293_952,
    # added with the remote-code families and newer releases (INDEX notes; equal to
    # transformers on the meta device where it can build the type)
    "Qwen__Qwen-1_8B.json": 1_836_828_672,
    "baichuan-inc__Baichuan2-7B-Base.json": 7_505_973_248,
    "bigcode__starcoder2-7b.json": 7_173_923_840,
    "bigcode__gpt_bigcode-santacoder.json": 1_124_886_528,
    "allenai__OLMo-2-1124-13B.json": 13_716_198_400,
    "allenai__OLMo-2-0325-32B.json": 32_234_279_936,
    "mistralai__Mistral-Small-24B-Base-2501.json": 23_572_403_200,
    "Qwen__Qwen3-1.7B.json": 1_720_574_976,
    "codellama__CodeLlama-7b-hf.json": 6_738_546_688,
    "tiiuae__Falcon3-7B-Instruct.json": 7_455_550_464,
    # BertForMaskedLM on the meta device; the published 335_141_888 is BertModel (INDEX notes)
    "google-bert__bert-large-uncased.json": 335_174_458,
}


@pytest.mark.parametrize(("file", "published"), PUBLISHED, ids=[f for f, _ in PUBLISHED])
def test_total_equals_published_count(file: str, published: int) -> None:
    # Gemma 3 multimodal rows include the SigLIP tower + projector, which tuneplan counts too.
    assert count_parameters(_spec(file)).total == published


@pytest.mark.parametrize(("file", "expected"), sorted(COMPUTED.items()))
def test_total_equals_index_computed_count(file: str, expected: int) -> None:
    assert count_parameters(_spec(file)).total == expected


def test_deepseek_v3_total_and_score_bias_buffer() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.json")
    counts = count_parameters(spec)
    # README: 671026419200 with the router's e_score_correction_bias (58 MoE layers x 256),
    # which transformers registers as a buffer; tuneplan counts learnable parameters only.
    assert spec.extra["e_score_correction_bias_elements"] == 58 * 256
    assert counts.total + 58 * 256 == 671_026_419_200
    assert 37_000_000_000 < counts.active_per_token < 38_000_000_000   # "37B activated"


def test_gemma3_language_model_part_matches_readme() -> None:
    for file, text_params in (("google__gemma-3-4b-pt.json", 3_880_263_168),
                              ("google__gemma-3-27b-pt.json", 27_009_346_304)):
        spec = _spec(file)
        assert count_parameters(spec).total - spec.vision_params == text_params


def test_every_bundled_config_is_indexed_and_parses() -> None:
    files = {p.name for p in MODELS_DIR.iterdir() if p.name.endswith(".json")}
    assert files == {r["file"] for r in INDEX}
    assert {r["file"] for r in INDEX if not r["published_params"]} == {
        *COMPUTED, "deepseek-ai__DeepSeek-V3.json"}
    for row in INDEX:
        spec = _spec(row["file"])
        assert spec.model_type == row["model_type"]


@pytest.mark.parametrize("file", [r["file"] for r in INDEX])
def test_components_sum_to_total_and_active(file: str) -> None:
    spec = _spec(file)
    counts = count_parameters(spec)
    assert sum(counts.by_component.values()) == counts.total
    assert all(v > 0 for k, v in counts.by_component.items() if k != "lm_head")
    if spec.is_moe:
        assert 0 < counts.active_per_token < counts.total
        assert counts.by_component["layers/experts"] > 0
    else:
        assert counts.active_per_token == counts.total


def test_moe_active_per_token_by_hand() -> None:
    # Mixtral-8x7B: 32 layers, 6 idle experts of 3 x 4096 x 14336 each per token.
    counts = count_parameters(_spec("mistralai__Mixtral-8x7B-v0.1.json"))
    assert counts.active_per_token == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336
    # Qwen3-30B-A3B: 48 layers, 120 idle experts of 3 x 2048 x 768.
    counts = count_parameters(_spec("Qwen__Qwen3-30B-A3B.json"))
    assert counts.active_per_token == 30_532_122_624 - 48 * 120 * 3 * 2048 * 768


def test_tied_embedding_counted_once_and_biases_visible() -> None:
    qwen = count_parameters(_spec("Qwen__Qwen2.5-0.5B.json"))
    assert qwen.by_component["lm_head"] == 0
    assert qwen.by_component["embeddings"] == 151_936 * 896
    # implicit Q/K/V biases: 24 layers x (896 + 2 x 128)
    assert qwen.bias_params == 24 * (896 + 2 * 128)
    phi2 = count_parameters(_spec("microsoft__phi-2.json"))
    assert phi2.by_component["lm_head"] == 51_200 * 2560 + 51_200   # untied, with bias


@pytest.mark.parametrize(("file", "expected"), [
    ("meta-llama__Llama-2-7b-hf.json", "head_dim=128 (hidden_size // num_attention_heads)"),
    ("meta-llama__Llama-2-7b-hf.json", "attention_bias=False (llama default)"),
    ("google__gemma-2b.json", "tie_word_embeddings=True (gemma default)"),
    ("openai-community__gpt2.json", "n_inner=3072 (gpt2: null means 4 x n_embd)"),
    ("Qwen__Qwen2.5-7B.json", "q_proj/k_proj/v_proj bias=True (Qwen2 always has Q/K/V biases)"),
    ("google__gemma-3-4b-pt.json", "text_config.vocab_size=262208 (gemma3_text default)"),
    ("google__gemma-3-4b-pt.json", "text_config.num_key_value_heads=4 (gemma3_text default)"),
])
def test_defaults_are_recorded(file: str, expected: str) -> None:
    assert expected in _spec(file).defaults_applied


def test_dims_and_linears_use_hf_names() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3.json")
    assert (spec.num_layers, spec.num_experts, spec.num_experts_per_token,
            spec.num_shared_experts, spec.head_dim) == (61, 256, 8, 1, 192)
    dense, moe = spec.layers
    assert (dense.count, moe.count) == (3, 58)
    assert {lin.name for lin in moe.linears} >= {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                                  "kv_b_proj", "o_proj", "gate", "gate_up_proj"}
    t5 = _spec("bigscience__T0_3B.json")
    assert {lin.name for lin in t5.layers[0].linears} == {"q", "k", "v", "o", "wi_0", "wi_1",
                                                           "wo"}
    assert t5.is_encoder_decoder and t5.num_decoder_layers == 24


@pytest.mark.parametrize(("file", "dims"), [
    # (layers, hidden, heads, kv heads, head_dim, intermediate, vocab, tied)
    ("tiiuae__falcon-7b.json", (32, 4544, 71, 1, 64, 18176, 65024, True)),      # multi-query
    ("tiiuae__falcon-40b.json", (60, 8192, 128, 8, 64, 32768, 65024, True)),    # new decoder
    ("google__gemma-7b.json", (28, 3072, 16, 16, 256, 24576, 256000, True)),    # head_dim key
    ("google__gemma-3-27b-pt.json", (62, 5376, 32, 16, 128, 21504, 262208, True)),
    ("openai-community__gpt2.json", (12, 768, 12, 12, 64, 3072, 50257, True)),
    ("mistralai__Mixtral-8x7B-v0.1.json", (32, 4096, 32, 8, 128, 14336, 32000, False)),
])
def test_house_dimensions(file: str, dims: tuple[int | bool, ...]) -> None:
    s = _spec(file)
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim,
            s.intermediate_size, s.vocab_size, s.tie_word_embeddings) == dims


# --- validation -------------------------------------------------------------------------

def _llama(**over: Any) -> dict[str, Any]:
    cfg = _config("meta-llama__Llama-3.1-8B.json")
    for key, value in over.items():
        if value is _DELETE:
            cfg.pop(key)
        else:
            cfg[key] = value
    return cfg


_DELETE = object()


def _problems(config: Any) -> tuple[str, ...]:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(config, name="bad")
    assert str(info.value).startswith("bad: ")
    return info.value.problems


def test_all_problems_reported_at_once() -> None:
    problems = _problems(_llama(hidden_size=True, num_hidden_layers=-3, vocab_size="32000",
                                intermediate_size=14336.0, num_attention_heads=_DELETE))
    assert len(problems) == 5
    text = " | ".join(problems)
    for fragment in ("hidden_size: must be an integer, got True",
                     "num_hidden_layers: must be between 1 and 10,000, got -3",
                     "vocab_size: must be an integer, got the string '32000'",
                     "intermediate_size: must be an integer, got 14336.0",
                     "num_attention_heads: missing required key"):
        assert fragment in text


@pytest.mark.parametrize(("over", "fragment"), [
    ({"hidden_size": 1_000_001}, "hidden_size: must be between 1 and 1,000,000"),
    ({"num_hidden_layers": 10_001}, "num_hidden_layers: must be between 1 and 10,000"),
    ({"vocab_size": 10_000_001}, "vocab_size: must be between 1 and 10,000,000"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=32"),
    ({"hidden_size": 4100}, "hidden_size=4100 is not divisible by num_attention_heads=32"),
    ({"num_attention_heads": [32]}, "num_attention_heads: must be an integer, got a list"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings: must be true or false"),
    ({"num_hidden_layers": 10_000, "hidden_size": 1_000_000, "intermediate_size": 1_000_000},
     "exceed 100,000,000,000,000"),
])
def test_bad_values(over: dict[str, Any], fragment: str) -> None:
    assert any(fragment in p for p in _problems(_llama(**over)))


def test_moe_and_nested_problems() -> None:
    mixtral = _config("mistralai__Mixtral-8x7B-v0.1.json")
    mixtral["num_experts_per_tok"] = 9
    assert any("num_experts_per_tok=9 exceeds the number of experts 8" in p
               for p in _problems(mixtral))
    gemma3 = _config("google__gemma-3-4b-pt.json")
    gemma3["text_config"]["hidden_size"] = 0
    gemma3["vision_config"] = [1, 2]
    problems = _problems(gemma3)
    assert any(p.startswith("text_config.hidden_size: must be between") for p in problems)
    assert any(p.startswith("vision_config: must be an object") for p in problems)


def test_gemma3_absent_nested_configs_take_their_defaults() -> None:
    gemma3 = _config("google__gemma-3-4b-pt.json")
    del gemma3["vision_config"]
    defaults = parse_model_config(gemma3, name="g").defaults_applied
    assert "vision_config={} (SiglipVisionConfig defaults)" in defaults
    assert "vision_config.hidden_size=768 (siglip_vision_model default)" in defaults
    assert not any(d.startswith("text_config={}") for d in defaults)   # present: no default
    assert "text_config={} (Gemma3TextConfig defaults)" in parse_model_config(
        {"model_type": "gemma3"}, name="g").defaults_applied


def test_deeply_nested_value_is_described_not_recursed() -> None:
    nested: Any = 1
    for _ in range(100_000):
        nested = [nested]
    assert _problems(_llama(hidden_size=nested)) == (
        "hidden_size: must be an integer, got a list of 1 items",)


@pytest.mark.parametrize("config", [None, [], "llama", 3, True, {"hidden_size": 4096},
                                    {"model_type": "llama_9000"}, {"model_type": 7}])
def test_not_a_model_config(config: Any) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(config, name="x")
    if isinstance(config, dict):
        assert "supported: " in str(info.value) and "deepseek_v3" in str(info.value)


# --- property-based: only ModelConfigError or a spec whose parts sum up ----------------------

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2, max_value=2**40)
            | st.sampled_from([0, 1, 2, 3, 64, 10_000, 10**6, 10**7, 2**63])
            | st.floats(allow_nan=True) | st.text(max_size=8))
JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
FILES = [r["file"] for r in INDEX]
KEYS = sorted({k for f in FILES for k in _config(f)} | {"text_config", "vision_config"})


def _check(config: Any) -> None:
    try:
        spec = parse_model_config(config, name="prop")
    except ModelConfigError as exc:
        assert exc.problems
        return
    counts = count_parameters(spec)
    assert sum(counts.by_component.values()) == counts.total <= 10**14
    assert 0 < counts.active_per_token <= counts.total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_random_json_never_crashes(value: Any) -> None:
    _check(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FILES), st.sampled_from(SUPPORTED_MODEL_TYPES),
       st.lists(st.tuples(st.sampled_from(KEYS), JSON | _SCALARS), max_size=4),
       st.booleans())
def test_mutated_real_configs_never_crash(file: str, model_type: str,
                                          edits: list[tuple[str, Any]], swap_type: bool) -> None:
    config = copy.deepcopy(_config(file))
    if swap_type:   # another family's parser reads keys it does not expect
        config["model_type"] = model_type
    nested = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    for i, (key, value) in enumerate(edits):
        target = nested if nested is not None and i % 2 else config
        if value is None and i % 3 == 0:
            target.pop(key, None)
        else:
            target[key] = value
    _check(config)
