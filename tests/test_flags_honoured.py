"""Every job flag is honoured or refused by every command that takes it (docs/ARCHITECTURE.md,
"One job vocabulary").

Driven by the registry: for each flag of ``service.jobflags.FLAGS`` and each command of
``COMMAND_GROUPS`` that takes it, the flag is set to a non-default value on a small bundled
model and the command's result must change in the field the flag drives, stay equal where the
flag legitimately has no effect on that command (with the reason written here), or be refused
with a one-line error naming the flag. A flag added to the registry without a case here fails
``test_every_flag_has_a_case``. Runs through the service layer (the CLI's and the web's path),
with hand-made offers instead of the catalog, so it is fast and needs no network. `probe`
runs torch steps: there each flag must be refused by its harness naming the flag, or be read
by the probe's code (its measurements are tests/core/memory/test_simulation.py's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tuneplan.core.catalog.offers import Offer
from tuneplan.errors import TuneplanError
from tuneplan.service.jobflags import (
    APPLIES_TO,
    BY_NAME,
    COMMAND_GROUPS,
    FLAGS,
    NAMES,
    Group,
    flags_for,
)
from tuneplan.service.jobs import JobRequest

MODEL = "Qwen/Qwen2.5-0.5B"
GPU = "H100 SXM5"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LONG = "2B"  # training tokens for cost and plan: long enough that cents see small speed-ups
#: Where block activations, not the 151k-vocabulary logits, make the peak.
BLOCKS = {"gradient-checkpointing": False, "loss": "chunked", "batch-size": "2"}
ROOT = Path(__file__).parents[1]
PLAN_FIXTURE = ROOT / "tests" / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"


def _offer(provider: str, gpu: str, count: int, price: str, region: str, *,
           spot: str | None = None, link: str | None = None) -> Offer:
    return Offer(provider=provider, instance_type=f"{gpu}-x{count}".replace(" ", "-"), gpu=gpu,
                 gpu_count=count, gpu_memory_bytes=80 * 10**9, vcpus=32, ram_bytes=512 * 2**30,
                 region=region, price_per_hour=Decimal(price),
                 spot_price_per_hour=Decimal(spot) if spot else None, interconnect=link,
                 fetched_at=NOW, source="test")


#: The catalog `plan` sees here: a fast dear card, a slow cheap one, a PCIe pair.
OFFERS = (
    _offer("AWS", "H100 SXM5", 1, "6.00", "us-east-1", spot="1.00"),
    _offer("Lambda", "A100 80GB SXM4", 1, "1.20", "us-west-1"),
    _offer("RunPod", "A100 80GB PCIe", 2, "2.60", "eu-west-1", link="pcie"),
)
COST_OFFER = _offer("AWS", "H100 SXM5", 2, "12.00", "us-east-1", link="nvswitch")


# --- what each command answers, without the echo of the job it was given -------------------

def _memory(command: str, values: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.service.memory_report import memory_document, run_memory

    est, spec, gpu = run_memory(JobRequest(model=MODEL, command=command, values=values))
    doc = memory_document(est, spec, gpu)
    per_gpu = doc["per_gpu"]
    return {"peak": per_gpu["device_total_bytes"], "phases": per_gpu["phases_allocated_bytes"],
            "terms": {t["name"]: t["bytes"] for t in per_gpu["terms"]},
            "host": doc["host_ram_bytes"], "trainable": doc["trainable_params"],
            "fits": doc["headroom_bytes"], "notes": doc["notes"]}


def _throughput(values: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.service.speed import throughput_for

    values = {"gpu": GPU, **values}
    if "dataset-rows" not in values:
        values.setdefault("tokens", "10M")
    job = JobRequest(model=MODEL, command="throughput", values=values).job()
    doc = throughput_for(job).as_dict()
    return {"tok_s": doc["tokens_per_second"], "hours": doc["hours"],
            "step": doc["step_seconds"], "notes": doc["notes"]}


def _cost(values: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.service.costing import cost_on_offer

    values = dict(values)
    if "dataset-rows" not in values:
        values.setdefault("tokens", LONG)
    job = JobRequest(model=MODEL, command="cost", values=values).job(
        defaults={"gpus": COST_OFFER.gpu_count})  # as `tuneplan cost --offer` does
    doc = cost_on_offer(job, COST_OFFER)
    return {"cost": doc["cost"], "hours": doc["hours"],
            "tok_s": doc["throughput"]["tokens_per_second"],
            "notes": doc["throughput"]["notes"], "peak": doc["memory"]["device_total_bytes"],
            "host": doc["memory"]["host_ram_bytes"]}


def _fit(values: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.service.planning import fit_job

    model = values.pop("__model", MODEL)
    values = {"gpu": GPU, **values}
    report = fit_job(JobRequest(model=model, command="fit", values=values).job(),
                     resolve_model(model)).as_dict()
    return {"gpu": report["gpu"], "methods": report["methods"],
            "suggestions": [(s["change"], s["peak_bytes"]) for s in report["suggestions"]]}


def _plan(values: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.adapters.bundled import load_gpu_specs, load_providers
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.planner.plan import plan_offers

    model = values.pop("__model", MODEL)
    values = dict(values)
    if "dataset-rows" not in values:
        values.setdefault("tokens", LONG)
    job = JobRequest(model=model, command="plan", values=values).job()
    result = plan_offers(resolve_model(model), job, OFFERS,
                         {g.name: g for g in load_gpu_specs()},
                         {p.name: p for p in load_providers()}, now=NOW)
    plans = [{"offer": (p.offer.provider, p.offer.gpu), "nodes": p.strategy.nodes,
              "batch": p.strategy.batch_size, "sharding": p.strategy.sharding.value,
              "checkpointing": p.strategy.checkpointing.value,
              "peak": p.candidate.device_total_bytes,
              "tok_s": round(p.candidate.throughput.tokens_per_second, 3),
              "cost": p.cost_usd, "spot": p.spot_usd, "ranked": p.best_cost}
             for p in result.plans]
    top = result.plans[0].strategy.as_dict() if result.plans else None
    return {"plans": plans, "top_strategy": top,
            "rejected": sorted({r.reason for r in result.rejected})}


def run(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """The command's result for these flag values, or {"refused": message}."""
    try:
        return _cached(command, json.dumps(values, sort_keys=True))
    except TuneplanError as exc:
        return {"refused": str(exc)}


@cache
def _cached(command: str, key: str) -> dict[str, Any]:
    values = json.loads(key)
    if command in ("memory", "explain"):  # `explain --json` prints the memory document
        return _memory(command, values)
    return {"throughput": _throughput, "cost": _cost, "fit": _fit, "plan": _plan}[command](values)


# --- the cases: one per flag ----------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """``value`` set on top of ``context``; ``memory`` / ``speed``: the memory and throughput
    result keys it drives (None: none, and ``why`` says why equal is right); ``refused``: the
    commands that must refuse it; ``drives``: explicit result keys per command (the flags
    outside the strategy)."""

    value: Any
    context: dict[str, Any] = field(default_factory=dict)
    memory: str | None = None
    speed: str | None = None
    why: str = ""
    refused: frozenset[str] = frozenset()
    drives: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)   # per command, instead of value
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)  # per command


#: Flags the probe neither refuses nor reads, and why that is right.
PROBE_NEED_NOT_READ = {
    "allow-long-context": "a permission for the estimates: the probe runs any --seq-len",
}
PROBE_SOURCES = ROOT / "src" / "tuneplan" / "adapters" / "probe"


def _probe_honours_or_refuses(name: str) -> None:
    """`tuneplan probe` runs the step itself (torch; tests/core/memory/test_simulation.py and
    tests/adapters/probe/ measure it): here, each of its flags is refused by the harness with
    the flag named (``refuse_unrunnable``) or its field is read by the probe's code."""
    import re

    pytest.importorskip("torch")
    from tuneplan.adapters.probe.harness import refuse_unrunnable
    from tuneplan.service.jobflags import job_from_values

    def runnable(values: dict[str, Any]) -> bool:
        try:
            refuse_unrunnable(job_from_values(MODEL, values, command="probe").strategy)
        except TuneplanError:
            return False
        return True

    case = CASES[name]  # its context, less what the probe refuses on its own
    context = {k: v for k, v in _context(case, "probe").items() if runnable({k: v})}
    try:
        strategy = job_from_values(MODEL, {**context, name: case.value},
                                   command="probe").strategy
        refuse_unrunnable(strategy)
    except TuneplanError as exc:
        if f"--{name}" in str(exc) or (name in ("gpus", "nodes") and "--gpus/--nodes" in str(
                exc)) or (name == "trainable-layers" and "--method freeze" in str(exc)):
            return
        raise
    field_name = BY_NAME[name].field
    code = " ".join(p.read_text() for p in PROBE_SOURCES.glob("*.py"))
    read = re.search(rf"\.{field_name}\b", code) is not None
    assert read or name in PROBE_NEED_NOT_READ, f"--{name}: the probe neither refuses nor reads it"
ESTIMATE_ONLY = {"memory", "explain", "fit", "cost", "plan"}
#: GaLore is a full fine-tune on one replica; cost prices COST_OFFER's 2 GPUs (zero3 unless
#: told otherwise, which GaLore refuses).
GALORE = {"method": "full", "optimizer": "galore-adamw", "seq-len": "512"}
GALORE_COST = {**GALORE, "sharding": "ddp"}
CASES: dict[str, Case] = {
    "method": Case("full", memory="trainable", speed="tok_s"),
    "recipe": Case("unsloth", memory="host", speed="notes",
                   contexts={"cost": {"gpus": "1"}}),  # unsloth trains on one GPU
    "precision": Case("bf16", memory="phases", speed="tok_s"),
    "optimizer": Case("adamw8bit", memory="terms", speed="tok_s"),
    "optimizer-in-backward": Case(True, {"method": "full", "seq-len": "256"}, memory="peak",
                                  why="same FLOPs: the step is only moved into backward",
                                  contexts={"cost": {"method": "full", "gpus": "1"}}),
    "lisa-layers": Case("4", {"method": "lisa", "gpus": "1"}, memory="trainable", speed="tok_s",
                        contexts={"cost": {"method": "lisa", "gpus": "1"}}),
    "lisa-interval": Case("5", {"method": "lisa", "gpus": "1"},
                          contexts={"cost": {"method": "lisa", "gpus": "1"}},
                          why="how often the trained blocks switch: at every moment K blocks "
                              "train, whichever they are (train.py's switch reads it: "
                              "test_launch_trl)"),
    "galore-rank": Case("32", GALORE, memory="terms", speed="tok_s",
                        contexts={"cost": GALORE_COST}),
    "galore-update-proj-gap": Case(
        "50", GALORE, speed="tok_s", contexts={"cost": GALORE_COST},
        why="how often the projector's SVD runs: the same tensors (the refresh's temporaries "
            "are counted, as the first step has one)"),
    "galore-scale": Case("0.5", GALORE, contexts={"cost": GALORE_COST},
                         why="a scale of the projected-back update: no tensor, no FLOP "
                             "(launch: test_galore_flags_reach_the_trainer_arguments)"),
    "galore-targets": Case("q_proj,.*.mlp.*", GALORE, memory="terms", speed="tok_s",
                           contexts={"cost": GALORE_COST}),
    "lora-rank": Case("64", memory="trainable", speed="tok_s"),
    "lora-alpha": Case("64", why="a scale of the update: no tensor, no FLOP (launch: "
                                 "test_launch_only_flags_reach_the_train_config)"),
    "lora-dropout": Case("0.1", BLOCKS, memory="terms",
                         why="the dropout itself is elementwise: not timed"),
    "lora-targets": Case("q_proj,v_proj,lm_head", memory="trainable", speed="tok_s"),
    "trainable-modules": Case("embed_tokens,lm_head", memory="trainable", speed="tok_s"),
    "trainable-layers": Case("4", {"method": "freeze", "trainable-layers": "2"},
                             memory="trainable", speed="tok_s"),
    "num-virtual-tokens": Case("64", {"method": "prompt"}, memory="trainable", speed="tok_s"),
    "quant": Case("int8", {"method": "qlora"}, memory="terms", speed="tok_s"),
    # bitsandbytes 0.43.1 MatMul4Bit keeps each 4-bit matmul's input for backward
    "stack": Case("bitsandbytes=0.43.1", {"method": "qlora", "gradient-checkpointing": False},
                  memory="terms", why="the speed model times no library version"),
    # the absmax constants are bytes the dequantize kernel reads each pass
    "double-quant": Case(False, {"method": "qlora"}, memory="terms", speed="tok_s"),
    "batch-size": Case("4", memory="peak", speed="tok_s"),
    "grad-accum": Case("4", memory="phases", speed="tok_s"),
    "seq-len": Case("1024", memory="peak", speed="tok_s"),
    "packing": Case(True, {"avg-tokens": "300"}, speed="tok_s", drives={"plan": ""},
                    why="padded micro-batches reach --seq-len and packed ones fill it: the "
                        "same tensors; plan packs samples shorter than --seq-len unless told "
                        "--no-packing (tests/core/test_planner_scenarios.py)"),
    "gradient-checkpointing": Case(False, memory="peak", speed="tok_s"),
    "offload-activations": Case(True, memory="host", speed="notes"),
    "attention": Case("eager", BLOCKS, memory="peak", speed="tok_s"),
    "compile": Case(True, speed="tok_s", refused=frozenset(ESTIMATE_ONLY)),
    "task": Case("seq-cls", memory="peak", speed="tok_s"),
    "loss": Case("chunked", memory="peak", speed="tok_s"),
    "num-labels": Case("50", {"task": "seq-cls"}, memory="phases", drives={"fit": ""},
                       why="the H x labels score head's FLOPs are not modelled (< 0.01 %); "
                           "its T x labels x 4 scores never reach a peak, so fit is equal"),
    "gpus": Case("2", memory="host", speed="tok_s", values={"cost": "1"}),
    "nodes": Case("2", memory="host", speed="tok_s"),
    "sharding": Case("zero2", {"gpus": "2"}, memory="terms", speed="tok_s"),
    "offload": Case("optimizer", {"gpus": "2"}, memory="host", speed="tok_s"),
    "allow-long-context": Case(True, {"seq-len": "33000", "loss": "chunked"}, memory="peak",
                               speed="tok_s"),
    "gpu": Case("A100 80GB SXM4", drives={"memory": "fits", "explain": "fits",
                                          "throughput": "tok_s", "fit": "gpu",
                                          "plan": "plans"}),
    "tokens": Case("20M", drives={"throughput": "hours", "cost": "cost", "plan": "plans"}),
    "dataset-rows": Case("100000", {"avg-tokens": "300"},
                         drives={"throughput": "hours", "cost": "cost", "plan": "plans"}),
    "avg-tokens": Case("300", drives={"throughput": "tok_s", "cost": "cost", "plan": ""},
                       why="plan packs samples shorter than --seq-len into full sequences, so "
                           "their length changes nothing there unless --no-packing is given"),
    "epochs": Case("3", drives={"throughput": "hours", "cost": "cost", "plan": "plans"}),
    "max-gpus": Case("1", drives={"fit": "suggestions", "plan": "plans"},
                     context={"__model": "Qwen/Qwen2.5-7B", "method": "full"}),
    "budget": Case("$0.01", drives={"plan": "plans"}),
    "deadline": Case("1m", drives={"plan": "plans"}),
    "provider": Case("AWS,RunPod", drives={"plan": "plans"}),
    "region": Case("eu-,us-east", drives={"plan": "plans"}),
    "spot": Case(True, drives={"plan": "plans"}),
    # fp32 AdamW (given) for 7B full fits no single card here; with the optimizer free, the
    # paged 8-bit AdamW fits one card and a second node is no cheaper per GPU
    "multi-node": Case(True, {"__model": "Qwen/Qwen2.5-7B", "method": "full",
                              "optimizer": "adamw"}, drives={"plan": "plans"}),
    "min-interconnect": Case("nvswitch", drives={"plan": "plans"}),  # the pair is NVLink
    "objective": Case("time", drives={"plan": "plans"}),
}


def test_every_flag_has_a_case() -> None:
    assert set(CASES) == {f.name for f in FLAGS}
    for name, case in CASES.items():
        if BY_NAME[name].group is Group.STRATEGY and not (case.memory and case.speed):
            assert case.why or case.refused, f"--{name}: say why it may leave a result equal"


def _pairs() -> list[tuple[str, str]]:
    return [(command, f.name) for command in sorted(COMMAND_GROUPS)
            for f in flags_for(command)]


def _context(case: Case, command: str) -> dict[str, Any]:
    """The case's context, keeping only what ``command`` takes (``__model`` where it can)."""
    taken = {f.name for f in flags_for(command)}
    base = case.contexts.get(command, case.context)
    return {k: v for k, v in base.items()
            if k in taken or (k == "__model" and command in ("fit", "plan"))}


def _assert_refused(result: dict[str, Any], name: str) -> None:
    if "refused" in result:
        message = result["refused"]
    elif "methods" in result:  # fit: every method refused for it
        reasons = [m["refusal"] for m in result["methods"]]
        assert all(reasons), reasons
        message = " ".join(reasons)
    else:  # plan: every offer rejected for it
        assert not result.get("plans"), result
        message = " ".join(result["rejected"])
    assert f"--{name}" in message and "\n" not in message, message


@pytest.mark.parametrize(("command", "name"), _pairs())
def test_the_flag_is_honoured_or_refused(command: str, name: str) -> None:
    if command == "probe":
        _probe_honours_or_refuses(name)
        return
    flag, case = BY_NAME[name], CASES[name]
    context = _context(case, command)
    value = case.values.get(command, case.value)
    if name == "allow-long-context":  # a permission: without it the context is refused
        _assert_refused(run(command, context), "seq-len")
    else:
        base = run(command, context)
        assert "refused" not in base, (command, name, base)
    flagged = run(command, {**context, name: value})
    if command in case.refused:
        _assert_refused(flagged, name)
        return
    assert "refused" not in flagged, (command, name, flagged)
    if name == "allow-long-context":
        return
    key = case.drives.get(command)
    if flag.group is Group.STRATEGY:
        key = {"memory": case.memory, "explain": case.memory, "throughput": case.speed,
               "cost": case.speed and ("notes" if case.speed == "notes" else "cost")
               }.get(command, key)
        if command == "cost" and not key and case.memory:
            key = "peak" if _peak_moves(name, case, value, "cost") else None
        if command == "cost" and case.memory and _peak_moves(name, case, value, "cost"):
            # it prices the strategy and says whether it fits: its peak follows memory's
            assert run(command, {**context, name: value})["peak"] != run(command, context)[
                "peak"], (command, name)
        if command == "fit":  # fit reads the memory estimate, at many batches and lengths
            key = "methods" if case.memory else None
        if command == "plan":
            top = flagged["top_strategy"]
            assert top is not None, flagged
            field_value = BY_NAME[name].kind.convert(value)
            if flag.apply is None:  # carried to the launch bundle as given
                shown = top[flag.field]
                as_json = (list(field_value) if isinstance(field_value, tuple) else
                           field_value.as_dict() if hasattr(field_value, "as_dict")
                           else field_value)
                assert shown == as_json, (name, shown)
            # the planner reads the peak (to fit and pick the batch) and the speed
            key = "plans" if _peak_moves(name, case, value) or _speed_moves(
                name, case, value) else None
    if command in case.drives and not case.drives[command]:
        key = None  # legitimately equal there: case.why
    if key is None:
        assert {k: v for k, v in flagged.items() if k != "top_strategy"} == {
            k: v for k, v in base.items() if k != "top_strategy"}, (command, name, case.why)
    else:
        assert flagged[key] != base[key], (command, name, key, base[key])


@pytest.mark.parametrize("name", sorted(APPLIES_TO))
def test_a_flag_outside_its_methods_is_refused_there(name: str) -> None:
    """Flags that mean something for some methods or tasks only are refused elsewhere (where
    every estimate would be equal with or without them), naming the flag."""
    from tuneplan.service.jobflags import JobFlagError, job_from_values

    case, applies = CASES[name], APPLIES_TO[name][0]
    tried = 0
    for method in ("full", "freeze", "lora", "qlora", "ia3", "prompt", "auto"):
        for task in ("causal-lm", "seq-cls"):
            values = {"method": method, "task": task}
            if method == "freeze" and name != "trainable-layers":
                values["trainable-layers"] = "1"
            job = job_from_values(MODEL, values, command="memory")
            flagged = {**values, name: case.value}
            if applies(job.strategy):
                job_from_values(MODEL, flagged, command="memory")
                continue
            tried += 1
            with pytest.raises(JobFlagError, match=f"--{name} applies only to") as caught:
                job_from_values(MODEL, flagged, command="memory")
            assert caught.value.flag == name and "\n" not in str(caught.value)
    assert tried, f"--{name}: no method or task where it does not apply"


def _list_pairs() -> list[tuple[str, str]]:
    return [(command, name) for command, name in _pairs()
            if BY_NAME[name].kind is NAMES and command != "probe"]


@pytest.mark.parametrize(("command", "name"), _list_pairs())
def test_every_name_in_a_list_flag_counts(command: str, name: str) -> None:
    """A list flag is honoured name by name: leaving out any one of the case's names changes
    the result (``--lora-targets q_proj,v_proj,lm_head`` once counted as q_proj,v_proj)."""
    case = CASES[name]
    context = _context(case, command)
    names = BY_NAME[name].kind.convert(case.value)
    assert len(names) > 1, f"--{name}: give the case several names"
    whole = run(command, {**context, name: case.value})
    for left_out in names:
        rest = ",".join(n for n in names if n != left_out)
        fewer = run(command, {**context, name: rest})
        assert "refused" not in fewer and "refused" not in whole, (fewer, whole)
        assert {k: v for k, v in fewer.items() if k != "top_strategy"} != {
            k: v for k, v in whole.items() if k != "top_strategy"}, (command, name, left_out)


def _peak_moves(name: str, case: Case, value: Any, command: str = "fit") -> bool:
    """Whether the flag moves `memory`'s peak in ``command``'s context (where it may move
    only a moment that is not the peak, as --num-labels does)."""
    context = _context(case, command)
    if "__model" in context:
        return True
    memory = {f.name for f in flags_for("memory")}
    context = {k: v for k, v in context.items() if k in memory}
    if command == "cost":  # priced on COST_OFFER's GPUs, as `tuneplan cost --offer` does
        context = {"gpus": str(COST_OFFER.gpu_count), **context}
    before, after = run("memory", context), run("memory", {**context, name: value})
    return "refused" in after or before["peak"] != after["peak"]


def _speed_moves(name: str, case: Case, value: Any) -> bool:
    context = _context(case, "plan")
    context = {k: v for k, v in context.items() if k != "__model"}
    before = run("throughput", context)
    after = run("throughput", {**context, name: value})
    return "refused" in after or before["tok_s"] != after["tok_s"]


@pytest.mark.parametrize("name", ["lora-alpha", "lora-dropout", "lora-rank", "lora-targets"])
def test_launch_only_flags_reach_the_train_config(name: str) -> None:
    """What changes no estimate still reaches the training script: the bundle's train config
    carries it (a plan entry with the job's strategy, as `tuneplan launch` reads it)."""
    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec, train_config
    from tuneplan.service.jobflags import job_from_values

    case = CASES[name]
    strategy = job_from_values(MODEL, {**case.context, name: case.value},
                               command="memory").strategy
    data = json.loads(PLAN_FIXTURE.read_text())
    entry = {**data["plans"][0], "job": {**data["job"], "model": MODEL},
             "strategy": strategy.as_dict()}
    entry = json.loads(json.dumps(entry, default=str))
    config = train_config(launch_spec(saved_plan_from_entry(entry)))
    key = BY_NAME[name].field
    expected = getattr(strategy, key)
    assert config[key] == (list(expected) if isinstance(expected, tuple) else expected)
    assert config[key] != (list(d) if isinstance(d := BY_NAME[name].default, tuple) else d)


#: Choices of one flag that give the same memory or speed answer, and why that is right.
SAME_CHOICES: dict[tuple[str, str], dict[frozenset[str], str]] = {
    ("memory", "precision"): {frozenset({"bf16-mixed", "fp16-mixed"}):
                              "the same byte widths (fp16 adds a scalar loss scale)"},
    ("throughput", "precision"): {frozenset({"bf16-mixed", "fp16-mixed"}):
                                  "the same tensor-core rate on a card with both"},
    ("memory", "optimizer"): {frozenset({"sgd", "lion"}): "one state per parameter each"},
    ("throughput", "optimizer"): {
        frozenset({"adamw", "paged-adamw32bit"}): "paging moves state only under pressure",
        frozenset({"adamw8bit", "paged-adamw8bit"}): "paging moves state only under pressure"},
    ("memory", "quant"): {frozenset({"nf4", "fp4"}):
                          "the same 4-bit blocks of 64 with fp32 absmax (bitsandbytes)"},
    ("throughput", "quant"): {frozenset({"nf4", "fp4"}): "the same bytes dequantized"},
    ("throughput", "offload"): {frozenset({"optimizer", "optimizer+params"}):
                                "this small job's parameter copies from the host hide behind "
                                "its compute (prefetched, as DeepSpeed and FSDP do); only the "
                                "excess would show (tests/core/test_compute_per_gpu.py)"},
    ("memory", "attention"): {frozenset({"sdpa", "flash"}):
                              "SDPA runs the flash kernel here: q, k, v, out, logsumexp"},
    ("throughput", "attention"): {frozenset({"sdpa", "flash"}): "the same flash kernel"},
    ("memory", "sharding"): {frozenset({"fsdp", "hybrid"}):
                             "hybrid shards inside a node: on one node it is fsdp"},
    ("throughput", "sharding"): {
        frozenset({"zero1", "zero2"}):
            "states (and gradients) sharded: one reduce-scatter + all-gather of gradients",
        frozenset({"zero3", "fsdp", "hybrid", "fsdp-grad-op"}):
            "parameters sharded too (hybrid on one node is fsdp): SHARD_GRAD_OP gathers once "
            "per micro-batch instead of twice, which this small job hides behind compute "
            "(bytes: tests/core/test_compute_per_gpu.py)"},
}


def _choice_flags() -> list[tuple[str, str]]:
    return [(command, f.name) for command in ("memory", "throughput") for f in FLAGS
            if f.kind.choices and f.group is Group.STRATEGY]


@pytest.mark.parametrize(("command", "name"), _choice_flags())
def test_every_choice_of_a_flag_is_told_apart(command: str, name: str) -> None:
    """Each value of an enum flag answers differently from the others (or, in
    SAME_CHOICES, equally for the reason given), or is refused naming it."""
    flag, context = BY_NAME[name], _context(CASES[name], command)
    groups: dict[str, set[str]] = {}
    for choice in flag.kind.choices:
        result = run(command, {**context, name: choice})
        if "refused" in result:
            assert choice in result["refused"] or f"--{name}" in result["refused"], result
            continue
        groups.setdefault(repr(result), set()).add(choice)
    same = {frozenset(g) for g in groups.values() if len(g) > 1}
    assert same == set(SAME_CHOICES.get((command, name), {})), (command, name, same)


def test_galore_flags_reach_the_trainer_arguments() -> None:
    """The GaLore flags reach the bundle's train config as transformers' optim_target_modules
    and optim_args (what the Trainer reads), and a LoRA job is refused --optimizer galore-*."""
    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec, train_config
    from tuneplan.service.jobflags import job_from_values

    values = {**GALORE, "galore-rank": "32", "galore-update-proj-gap": "50",
              "galore-scale": "0.5", "galore-targets": "q_proj,.*.mlp.*"}
    strategy = job_from_values(MODEL, values, command="memory").strategy
    data = json.loads(PLAN_FIXTURE.read_text())
    entry = {**data["plans"][0], "job": {**data["job"], "model": MODEL},
             "strategy": strategy.as_dict()}
    entry = json.loads(json.dumps(entry, default=str))
    config = train_config(launch_spec(saved_plan_from_entry(entry)))
    assert config["optimizer"] == "galore-adamw"
    assert config["galore"] == {"optim_target_modules": ["q_proj", ".*.mlp.*"],
                                "optim_args": "rank=32,update_proj_gap=50,scale=0.5"}
    refused = run("memory", {"method": "lora", "optimizer": "galore-adamw"})
    assert "full fine-tuning optimizer" in refused["refused"], refused
