"""Encoder-decoder models (bundled T0 and mT0) through memory, throughput and plan."""

from __future__ import annotations

from collections.abc import Callable

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
