"""`tuneplan cost PLAN_ID` prices exactly what `tuneplan plan` printed for that plan (one
cost-input builder, the planner's own candidate), and a plan made from an alias launches
with the resolved hub id."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]

SCENARIOS = {
    "8b-qlora": ("llama-3.1-8b", "--method", "qlora", "--tokens", "50M"),
    "8b-lora-spot": ("llama-3.1-8b", "--method", "lora", "--tokens", "50M", "--spot"),
    # Nothing fits one L40S node: the planner goes to 4 and 8 nodes (ZeRO-3 over the fabric).
    "70b-full-multi-node": ("llama-3.1-70b", "--method", "full", "--seq-len", "8192",
                            "--tokens", "2B", "--multi-node", "--max-gpus", "32",
                            "--provider", "aws", "--gpu", "L40S"),
}


def _same(plan: dict[str, Any], cost: dict[str, Any]) -> None:
    c = plan["cost"]
    assert cost["plan_id"] == plan["id"]
    assert cost["offer"]["id"] == plan["offer"]["id"]
    assert cost["nodes"] == plan["strategy"]["nodes"]
    assert cost["strategy"] == {k: v for k, v in plan["strategy"].items() if k != "link"}
    assert cost["hours"] == c["hours"]
    assert cost["throughput"]["training_hours"] == plan["throughput"]["training_hours"]
    assert (cost["cost"], cost["compute_cost"], cost["storage_cost"], cost["egress_cost"]) == (
        c["on_demand_usd"], c["compute_usd"], c["storage_usd"], c["egress_usd"])
    assert cost["billing"] == c["billing"]
    if c["spot"] is None:
        assert cost["spot"] is None
        return
    s, spot = c["spot"], cost["spot"]
    assert (spot["expected_cost"], spot["p50_cost"], spot["p90_cost"]) == (
        s["expected_usd"], s["p50_usd"], s["p90_usd"])
    assert spot["expected_hours"] == s["expected_hours"]
    assert spot["p90_hours"] == s["p90_hours"]
    assert spot["checkpoint_interval_minutes"] == s["checkpoint_interval_minutes"]
    assert spot["interruptions_expected"] == s["interruptions_expected"]
    assert spot["interruptions_per_hour"] == s["interruptions_per_hour"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_cost_of_a_plan_id_is_what_plan_printed(run_cli: Run, name: str) -> None:
    doc = run_cli("plan", *SCENARIOS[name], "--top", "3", "--json").ok_json()
    plans = doc["plans"]
    assert len(plans) == 3
    if name == "70b-full-multi-node":
        assert any(p["strategy"]["nodes"] > 1 for p in plans)
    if name == "8b-lora-spot":
        assert any(p["cost"]["spot"] and p["cost"]["uses_spot"] for p in plans)
    for plan in plans:
        _same(plan, run_cli("cost", plan["id"], "--json").ok_json())


def test_cost_on_the_plans_offer_with_its_flags_agrees_with_the_plan(run_cli: Run) -> None:
    doc = run_cli("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "50M", "--top", "1",
                  "--json").ok_json()
    plan = doc["plans"][0]
    s = plan["strategy"]
    flags = ["--method", s["method"], "--batch-size", str(s["batch_size"]),
             "--seq-len", str(s["seq_len"]),
             "--gradient-checkpointing" if s["checkpointing"] == "full"
             else "--no-gradient-checkpointing",
             "--gpus", str(s["gpus"]), "--sharding", s["sharding"], "--precision",
             s["precision"], "--tokens", "50M"]
    by_offer = run_cli("cost", "meta-llama/Llama-3.1-8B", "--offer", plan["offer"]["id"],
                       *flags, "--json").ok_json()
    assert by_offer["strategy"] == {k: v for k, v in s.items() if k != "link"}
    assert by_offer["cost"] == plan["cost"]["on_demand_usd"]
    assert by_offer["hours"] == plan["cost"]["hours"]
    assert by_offer["spot"] is None  # spot only with --spot on this path


def test_cost_plan_id_refuses_job_flags_and_unknown_ids(run_cli: Run) -> None:
    doc = run_cli("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "50M", "--top", "1",
                  "--json").ok_json()
    flagged = run_cli("cost", doc["plans"][0]["id"], "--batch-size", "4")
    assert flagged.code == 2 and "--batch-size" in flagged.stderr
    missing = run_cli("cost", "ffffffffffff", "--json")
    assert missing.code == 2 and "ffffffffffff" in missing.stderr
    neither = run_cli("cost", "llama-3.1-8b")
    assert neither.code == 2 and "--offer" in neither.stderr


def test_a_plan_made_from_an_alias_launches_the_hub_id(run_cli: Run, tmp_path: Path) -> None:
    doc = run_cli("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "50M", "--top", "1",
                  "--json").ok_json()
    assert doc["model"] == doc["job"]["model"] == "meta-llama/Llama-3.1-8B"
    out = tmp_path / "bundle"
    run_cli("launch", doc["plans"][0]["id"], "--to", "accelerate", "--out", str(out),
            "--json").ok_json()
    config = json.loads((out / "train_config.json").read_text())
    assert config["model_name_or_path"] == "meta-llama/Llama-3.1-8B"
