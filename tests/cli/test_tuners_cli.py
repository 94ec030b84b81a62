"""`tuneplan memory` and `tuneplan throughput` answer for every PEFT tuner on a small Llama."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cli.conftest import CliResult
from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method, count_trainable
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.job.tuners import PEFT_TYPES

Run = Callable[..., CliResult]
MODEL = "meta-llama/Llama-3.2-1B"
PLANNED = sorted({m for m in PEFT_TYPES.values() if isinstance(m, Method)}, key=str)


@pytest.mark.parametrize("method", PLANNED, ids=str)
def test_memory_and_throughput_answer_for_every_planned_peft_type(run_cli: Run,
                                                                  method: Method) -> None:
    memory = run_cli("memory", MODEL, "--method", method.value, "--seq-len", "1024",
                     "--json").ok_json()
    expected = count_trainable(resolve_model(MODEL), Strategy(method=method)).total
    assert memory["trainable_params"] == expected > 0
    assert memory["per_gpu"]["device_total_bytes"] > 0
    speed = run_cli("throughput", MODEL, "--method", method.value, "--gpu", "H100 SXM",
                    "--seq-len", "1024", "--json").ok_json()
    assert speed["tokens_per_second"] > 0


def test_an_unplanned_tuner_is_refused_in_one_line(run_cli: Run) -> None:
    result = run_cli("memory", MODEL, "--method", "adapter")
    assert result.code != 0 and "not estimated" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
