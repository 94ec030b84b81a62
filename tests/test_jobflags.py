"""service/jobflags.py: one vocabulary for a job, whatever face it comes through."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer.main

from tuneplan.cli.app import app
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import Checkpointing, Job, Sharding, Strategy
from tuneplan.errors import InvalidValueError, UnsupportedError
from tuneplan.service import jobflags
from tuneplan.service.jobflags import (
    COMMAND_GROUPS,
    FLAGS,
    JobFlagError,
    flags_for,
    job_from_values,
    job_values,
    load_job_file,
)


def test_every_flag_sets_a_real_field_and_every_field_has_a_flag() -> None:
    for flag in FLAGS:
        assert flag.field in {f.name for f in dataclasses.fields(flag.owner)}, flag.name
    covered = {(f.owner, f.field) for f in FLAGS}
    strategy_fields = {(Strategy, f.name) for f in dataclasses.fields(Strategy)}
    # ``fixed`` is not a flag: it records which strategy flags were given.
    job_fields = {(Job, f.name) for f in dataclasses.fields(Job)} - {
        (Job, "model"), (Job, "strategy"), (Job, "fixed")}
    assert strategy_fields - covered == set()
    assert job_fields - covered == set()


def test_defaults_are_the_dataclasses_own() -> None:
    assert jobflags.BY_NAME["lora-rank"].default == Strategy().lora_rank
    assert jobflags.BY_NAME["seq-len"].default == Strategy().seq_len
    assert jobflags.BY_NAME["epochs"].default == 1.0
    # switches that set Strategy.checkpointing read their state in its default (FULL)
    assert jobflags.BY_NAME["gradient-checkpointing"].default is True
    assert jobflags.BY_NAME["offload-activations"].default is False


def _options(command: str) -> set[str]:
    click_app = typer.main.get_command(app)
    cmd = click_app.commands[command]  # type: ignore[attr-defined]
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("command", sorted(COMMAND_GROUPS))
def test_the_cli_knows_exactly_the_commands_job_flags(command: str) -> None:
    options = _options(command)
    for flag in flags_for(command):
        assert f"--{flag.name}" in options, (command, flag.name)
        if flag.kind.switch:
            assert f"--no-{flag.name}" in options
    taken = {f.name for f in flags_for(command)}
    for flag in FLAGS:
        if flag.name not in taken and flag.name not in ("gpu", "spot"):
            assert f"--{flag.name}" not in options, (command, flag.name)
    assert "--job" in options


def test_cli_file_and_form_values_give_the_same_job(tmp_path: Path) -> None:
    cli = {"method": "qlora", "lora-rank": "8", "seq-len": "4096", "packing": True,
           "gpus": "2", "gradient-checkpointing": False, "tokens": "50M", "budget": "$100"}
    form = {"method": Method.QLORA, "lora-rank": 8, "seq-len": 4096, "packing": True,
            "gpus": 2, "gradient-checkpointing": False, "tokens": 50_000_000, "budget": 100}
    path = tmp_path / "job.yaml"
    path.write_text("method: qlora\nlora_rank: 8\nseq-len: 4096\npacking: true\ngpus: 2\n"
                    "gradient_checkpointing: false\ntokens: 50M\nbudget: 100\n")
    # `plan` chooses --gpus and checkpointing itself (refused as flags there), so the flags
    # and the form go to `cost`, which takes them (its --budget, a planner flag, from a file)
    budget = {"budget": cli.pop("budget")}
    form.pop("budget")
    a = job_from_values("m", cli, command="cost", file_values=budget)
    b = job_from_values("m", form, command="cost", file_values=budget)
    c = job_from_values("m", {}, command="plan", file_values=load_job_file(path))
    assert a == b == c
    assert a.strategy.lora_rank == 8 and a.strategy.checkpointing is Checkpointing.NONE
    assert a.strategy.sharding is Sharding.ZERO3  # derived: several GPUs
    assert a.tokens == 50_000_000
    # What was given is fixed for the planner; the derived sharding and the defaults are not.
    assert a.fixed == ("checkpointing", "gpus", "lora_rank", "method", "packing", "seq_len")
    # A job's own values rebuild it (what a job file written from it would hold).
    assert job_from_values("m", {}, command="plan", file_values=job_values(a)) == a


def test_flags_override_the_file_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"lora_rank": 4, "gpus": 8}))
    job = job_from_values("m", {"lora-rank": "32"}, command="memory",
                          file_values=load_job_file(path), defaults={"gpus": 1})
    assert job.strategy.lora_rank == 32 and job.strategy.gpus == 8


def test_derived_defaults() -> None:
    assert job_from_values("m", {}, command="memory").strategy.sharding is Sharding.DDP
    unsloth = job_from_values("m", {"recipe": "unsloth"}, command="memory").strategy
    assert unsloth.checkpointing is Checkpointing.OFFLOAD
    told = job_from_values("m", {"recipe": "unsloth", "gradient-checkpointing": True},
                           command="memory").strategy
    assert told.checkpointing is Checkpointing.FULL
    with pytest.raises(UnsupportedError):
        job_from_values("m", {"method": "lora8bit", "quant": "nf4"}, command="memory")
    assert job_from_values("m", {"method": "lora8bit", "quant": Quant.INT8},
                           command="memory").strategy.quant is Quant.INT8


@pytest.mark.parametrize(("flag", "value"), [
    ("lora-rank", "0"), ("lora-rank", str(2**63)), ("batch-size", "9" * 5000),
    ("lora-dropout", "nan"), ("lora-dropout", "1"), ("epochs", "0"), ("method", "lorra"),
    ("tokens", "lots"), ("seq-len", "2.5"), ("lora-targets", "[/x]"), ("deadline", "-3h"),
    ("packing", "maybe"), ("budget", "1e400x"), ("stack", "vllm=0.6"), ("stack", "peft=x"),
    ("stack", "bitsandbytes=0.30"),
])
def test_bad_values_name_their_flag(flag: str, value: str) -> None:
    with pytest.raises(JobFlagError) as caught:
        job_from_values("m", {flag: value}, command="plan")
    assert caught.value.flag == flag
    assert f"--{flag}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_misspelt_enum_value_gets_the_closest_choice() -> None:
    with pytest.raises(JobFlagError, match="did you mean lora"):
        job_from_values("m", {"method": "lorra"}, command="memory")


def test_a_flag_the_command_cannot_honour_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidValueError, match="takes no flag --budget"):
        job_from_values("m", {"budget": "100"}, command="memory")
    with pytest.raises(InvalidValueError, match="takes no flag --tokens"):
        job_from_values("m", {"tokens": "50M"}, command="fit")  # fit answers in bytes
    for name in jobflags.PLANNER_SEARCHES:  # plan keeps them fixed when given (Job.fixed)
        value = {"batch-size": "2", "gpus": "2", "nodes": "2", "sharding": "zero2",
                 "offload": "optimizer", "precision": "fp16-mixed", "loss": "chunked",
                 "optimizer": "adamw8bit"}.get(name, True)
        job = job_from_values("m", {name: value}, command="plan")
        assert job.fixed == (jobflags.BY_NAME[name].field,), name
    with pytest.raises(InvalidValueError, match="unknown job flag"):
        job_from_values("m", {"lora-rnk": "8"}, command="memory")


def test_job_files_name_unknown_keys_with_the_closest_flag(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("lora_rnk: 8\n")
    with pytest.raises(InvalidValueError, match="did you mean --lora-rank"):
        load_job_file(path)
    path.write_text("- not a mapping\n")
    with pytest.raises(InvalidValueError, match="mapping"):
        load_job_file(path)
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(InvalidValueError, match="not valid"):
        load_job_file(path)
    with pytest.raises(InvalidValueError, match="cannot read"):
        load_job_file(tmp_path / "absent.yaml")


def test_stack_from_flags_files_and_forms_gives_the_same_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("stack:\n  transformers: '4.30'\n  bitsandbytes: '0.39'\n")
    a = job_from_values("m", {"stack": "transformers=4.30,bitsandbytes=0.39"}, command="memory")
    b = job_from_values("m", {}, command="memory", file_values=load_job_file(path))
    assert a == b
    assert a.strategy.stack.transformers == (4, 30) and a.strategy.stack.peft == (0, 21, 2)
    # a job file written from a job holds the stack as text, and rebuilds it
    values = job_values(a)
    assert values["stack"].startswith("transformers=4.30,peft=0.21.2,bitsandbytes=0.39,")
    assert job_from_values("m", {}, command="plan", file_values=values) == a
    # the default a form shows is the text --stack takes
    assert str(jobflags.BY_NAME["stack"].default) == str(Strategy().stack)


@pytest.mark.parametrize(("value", "reason"), [
    ("[", "is not a regular expression"),
    ("a{9999999999999}", "is not a regular expression"),
    ("(a+)+", "a repeated group is not taken"),
    ("q proj", "is not a module-name pattern"),
])
def test_galore_targets_refuse_what_re_cannot_match_safely(value: str, reason: str) -> None:
    from tuneplan.service.jobflags import JobFlagError, job_from_values

    with pytest.raises(JobFlagError, match=reason) as caught:
        job_from_values("Qwen/Qwen2.5-0.5B", {"method": "full", "optimizer": "galore-adamw",
                                              "galore-targets": value}, command="memory")
    assert caught.value.flag == "galore-targets"
    ok = job_from_values("Qwen/Qwen2.5-0.5B", {"method": "full", "optimizer": "galore-adamw",
                                               "galore-targets": r"q_proj, .*.mlp.*"},
                         command="memory")
    assert ok.strategy.galore_targets == ("q_proj", ".*.mlp.*")
