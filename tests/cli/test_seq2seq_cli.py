"""Encoder-decoder models (bundled T0 and mT0, a BART config file) through memory, throughput
and plan."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]


@pytest.mark.parametrize(("model", "method"), [("bigscience/T0_3B", "lora"),
                                                ("bigscience/T0_3B", "full"),
                                                ("bigscience/mt0-xxl", "qlora")])
def test_memory_estimates_a_t5(run_cli: Run, model: str, method: str) -> None:
    doc = run_cli("memory", model, "--method", method, "--seq-len", "512", "--json").ok_json()
    terms = {t["name"]: t["bytes"] for t in doc["per_gpu"]["terms"]}
    assert doc["per_gpu"]["device_total_bytes"] > 0
    assert any("encoder-decoder" in note for note in doc["notes"])
    if method == "full":   # transformers 5 ties T0's head: the step trains 2,783,959,040
        assert doc["trainable_params"] == 2_783_959_040
    assert terms.get("activations/rope", 0) == 0


def test_throughput_and_plan_a_t5(run_cli: Run) -> None:
    tp = run_cli("throughput", "bigscience/T0_3B", "--method", "lora", "--gpu", "H100",
                 "--json").ok_json()
    assert tp
    result = run_cli("plan", "bigscience/T0_3B", "--method", "lora", "--tokens", "5M")
    assert result.code == 0, result.err


def test_a_bart_config_file_is_estimated(run_cli: Run, tmp_path: Path) -> None:
    """facebook/bart-large's dimensions (BartConfig defaults: 12 + 12 blocks of 1024)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bart", "d_model": 1024, "vocab_size": 50265,
                                  "max_position_embeddings": 1024}))
    doc = run_cli("memory", str(config), "--method", "full", "--seq-len", "512",
                  "--json").ok_json()
    assert doc["total_params"] == 406_291_456 == doc["trainable_params"]
    tp = run_cli("throughput", str(config), "--method", "lora", "--gpu", "H100", "--seq-len",
                 "512", "--json").ok_json()
    assert tp["tokens_per_second"] > 0
