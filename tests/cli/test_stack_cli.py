"""`--stack`: the library versions a job runs, stated in `memory --json` and `explain`, and
refused in one line (exit 2) when the estimate does not model them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]


def test_memory_json_states_the_default_stack(run_cli: Run) -> None:
    doc = run_cli("memory", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--json").ok_json()
    stack = doc["stack"]
    assert stack["versions"]["transformers"] == "5.24"
    assert stack["stated"] == {}
    assert "transformers 5.24 (pip default 2026-12)" in stack["assumed"]
    assert stack["behaviours"][0] == ("bitsandbytes 0.50.2: MatMul4Bit keeps no input for "
                                      "backward (0.43.2 and later)")
    assert doc["strategy"]["stack"] == stack["versions"]


def test_a_stated_stack_changes_the_estimate_and_says_which_behaviour(run_cli: Run) -> None:
    args = ("memory", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--no-gradient-checkpointing",
            "--seq-len", "1024", "--json")
    new = run_cli(*args).ok_json()
    old = run_cli(*args, "--stack", "bitsandbytes=0.43.1").ok_json()
    assert old["stack"]["stated"] == {"bitsandbytes": "0.43.1"}
    assert "bitsandbytes 0.43.1 (stated)" in old["stack"]["assumed"]
    assert old["stack"]["behaviours"][0].startswith("bitsandbytes 0.43.1: MatMul4Bit keeps "
                                                    "every 4-bit matmul's input")
    # 32 blocks x T x (5·H + I) x 2 B: see tests/core/memory/test_stack.py
    gained = old["per_gpu"]["phases_allocated_bytes"]["backward-start"] - \
        new["per_gpu"]["phases_allocated_bytes"]["backward-start"]
    assert gained == 32 * 1024 * (5 * 4096 + 14336) * 2


def test_explain_lists_the_stack_and_the_behaviours(run_cli: Run) -> None:
    res = run_cli("explain", "meta-llama/Llama-3.1-8B", "--method", "lora",
                  "--stack", "transformers=4.48,peft=0.8")
    assert res.code == 0, res.stderr
    assert ("assumed: transformers 4.48 (stated), peft 0.8 (stated), bitsandbytes 0.50.2 "
            "(pip default 2026-12)") in res.stdout
    assert ("behaviour: peft 0.8: LoRA adapters kept in the base dtype (cast to the base "
            "weight's dtype, 0.6 to 0.11)") in res.stdout
    assert "behaviour: transformers 4.48 with torch 2.13: Trainer optim adamw_torch -> " \
        "AdamW 'foreach' step temporaries" in res.stdout


@pytest.mark.parametrize(("value", "reason"), [
    ("vllm=0.6", "unknown library 'vllm'"),
    ("transformers=four", "'four' is not a version"),
    ("bitsandbytes=0.30", "bitsandbytes 0.30 is outside the versions the estimate models"),
])
def test_a_bad_stack_is_one_line_naming_the_flag_exit_2(run_cli: Run, value: str,
                                                        reason: str) -> None:
    res = run_cli("memory", "meta-llama/Llama-3.1-8B", "--stack", value)
    assert res.code == 2
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("error: --stack: ") and reason in line
