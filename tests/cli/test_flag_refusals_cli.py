"""A refused job flag, end to end: exit 2 and one line on stderr naming the flag
(tests/test_flags_honoured.py holds every flag x command through the service layer)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]
MODEL = "Qwen/Qwen2.5-0.5B"


@pytest.mark.parametrize(("args", "flag"), [
    (("plan", MODEL, "--method", "full", "--lora-rank", "8"), "--lora-rank"),
    (("memory", MODEL, "--method", "full", "--lora-rank", "8"), "--lora-rank"),
    (("memory", MODEL, "--quant", "fp4"), "--quant"),
    (("memory", MODEL, "--lora-targets", "q_proj,v_prj"), "--lora-targets"),
    (("memory", MODEL, "--sharding", "fsdp"), "--sharding"),
    (("throughput", MODEL, "--gpu", "H100 SXM5", "--seq-len", "40000"), "--seq-len"),
    (("throughput", MODEL, "--gpu", "H100 SXM5", "--tokens", "1M", "--dataset-rows", "10",
      "--avg-tokens", "100"), "--dataset-rows"),
    (("fit", MODEL, "--gpu", "H100 SXM5", "--tokens", "1M"), "--tokens"),
])
def test_refused_flags_exit_2_with_one_line_naming_them(run_cli: Run, args: tuple[str, ...],
                                                        flag: str) -> None:
    result = run_cli(*args)
    assert result.code == 2, (result.stdout, result.stderr)
    assert flag in result.stderr
    if args[0] != "fit":  # fit's is the parser's own "No such option" box
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_lm_head_in_lora_targets_changes_the_trainable_count(run_cli: Run) -> None:
    plain = run_cli("memory", MODEL, "--lora-targets", "q_proj,v_proj", "--json").ok_json()
    head = run_cli("memory", MODEL, "--lora-targets", "q_proj,v_proj,lm_head",
                   "--json").ok_json()
    # PEFT lora.Linear on lm_head: A r x H, B V x r (Qwen2.5-0.5B: H 896, V 151936, r 16)
    assert head["trainable_params"] - plain["trainable_params"] == 16 * (896 + 151_936)
