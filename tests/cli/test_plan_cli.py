"""`tuneplan plan` and `tuneplan fit` end to end on the bundled catalog (offline)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]


def test_plan_json_has_the_cli_md_keys_and_is_saved_for_launch(run_cli: Run) -> None:
    from tuneplan.adapters.plans import find_saved_plan

    result = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "50M",
                     "--top", "5", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert {"job", "catalog", "plans", "rejected"} <= set(doc)
    assert doc["catalog"]["fetched_at"] and doc["catalog"]["sources"]
    assert len(doc["plans"]) == 5
    first = doc["plans"][0]
    assert {"id", "offer", "strategy", "memory", "throughput", "cost", "why",
            "warnings"} <= set(first)
    assert first["strategy"]["method"] == "qlora" and first["offer"]["gpu_count"] == 1
    assert first["memory"]["device_total_bytes"] <= 0.95 * first["memory"]["capacity_bytes"]
    costs = [float(p["cost"]["ranked_usd"]) for p in doc["plans"]]
    assert costs == sorted(costs)
    assert all(r["reason"] for r in doc["rejected"])
    # every plan's speed states its MFU, its bound and its basis; the document the constants
    for p in doc["plans"]:
        speed = p["throughput"]
        assert 0 < speed["mfu"] < 1
        assert speed["bound"] in ("compute", "memory", "communication", "host")
        assert speed["bound"] == max(speed["bound_seconds"], key=speed["bound_seconds"].get)
        assert sum(speed["bound_seconds"].values()) == pytest.approx(speed["step_seconds"])
        assert speed["time_basis"]["basis"] in ("calibrated", "assumed")
    why = doc["throughput_assumptions"]["multi_node_efficiency"]["why"]
    assert "ONE FITTED FLAT FACTOR" in why
    saved = find_saved_plan(first["id"])
    assert saved.offer.id == first["offer"]["id"] and saved.job.model == doc["model"]
    assert saved.strategy.as_dict() == {k: v for k, v in first["strategy"].items()
                                        if k != "link"}


def test_no_spot_removes_spot_prices(run_cli: Run) -> None:
    result = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "lora", "--tokens", "20M",
                     "--no-spot", "--top", "20", "--json")
    assert result.code == 0, result.stderr
    plans = result.json()["plans"]
    assert plans and all(p["cost"]["spot"] is None for p in plans)
    assert all(p["offer"]["spot_price_per_hour"] is None for p in plans)


def test_an_impossible_job_exits_2_naming_memory_and_the_fit_solvers_changes(
        run_cli: Run) -> None:
    args = ("plan", "meta-llama/Llama-3.1-405B", "--method", "full", "--gpu", "RTX 4090",
            "--max-gpus", "1", "--no-multi-node", "--tokens", "1M")
    result = run_cli(*args)
    assert result.code == 2
    line = result.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: no plan: binding: memory")
    assert "binding memory: nothing fits in GPU memory" in result.stdout
    # 405B weights alone are 810 GB in bf16: even QLoRA's 4-bit base misses a 24 GB card.
    assert "QLoRA" in result.stdout and "still too big" in result.stdout
    doc = run_cli(*args, "--json")
    assert doc.code == 2
    body = doc.json()
    assert body["feasible"] is False and body["plans"] == []
    assert [b["constraint"] for b in body["binding"]] == ["memory"]
    qlora = next(r for r in body["relaxations"] if "--method qlora" in r["change"])
    assert qlora["unit"] == "bytes" and qlora["amount"] > 24 * 2**30 and qlora["plan"] is None


def test_job_file_with_flags_overriding_it(run_cli: Run, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("method: lora\ntokens: 10M\nbudget: 0.01\nobjective: time\n", "utf-8")
    result = run_cli("plan", "Qwen/Qwen2.5-0.5B", "--job", str(job), "--budget", "50",
                     "--method", "qlora", "--top", "3", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["job"]["budget_usd"] == "50" and doc["objective"] == "time"
    assert doc["plans"][0]["strategy"]["method"] == "qlora"
    hours = [p["cost"]["hours"] for p in doc["plans"]]
    assert hours == sorted(hours)


def test_plan_table_shows_front_catalog_and_why(run_cli: Run) -> None:
    result = run_cli("plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--tokens", "10M",
                     "--top", "3")
    assert result.code == 0, result.stderr
    assert "Pareto front" in result.stdout and "catalog:" in result.stdout
    assert "why:" in result.stdout


def test_fit_json_per_method_and_suggestions(run_cli: Run) -> None:
    result = run_cli("fit", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4090", "--method", "full",
                     "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["gpu"] == "RTX 4090" and doc["fits"] is False
    methods = {m["method"]: m for m in doc["methods"]}
    assert methods["full"]["largest_batch_size"] == 0
    assert methods["qlora"]["largest_batch_size"] >= 1
    assert methods["qlora"]["largest_seq_len"] >= 2048
    assert doc["suggestions"] and all(s["peak_bytes"] <= doc["limit_bytes"]
                                      for s in doc["suggestions"])


def test_fit_needs_a_gpu(run_cli: Run) -> None:
    result = run_cli("fit", "meta-llama/Llama-3.1-8B")
    assert result.code == 2 and "--gpu" in result.stderr


def _table_usable_bytes(gpu: str) -> int:
    """The usable (CUDA-visible) bytes of ``gpu`` read straight from gpu_memory_totals.csv:
    torch's reported GiB to whole MiB, else the reported nvidia-smi total less the driver
    reserve the data README states (900 MiB HBM, 600 MiB GDDR)."""
    import csv
    import io
    from decimal import ROUND_FLOOR, Decimal

    from tuneplan.adapters.bundled import read_data_text

    rows = {r["gpu"]: r for r in csv.DictReader(io.StringIO(
        read_data_text("gpu_memory_totals.csv")))}
    specs = {r["gpu"]: r for name in ("gpu_specs.csv", "gpu_specs_extra.csv")
             for r in csv.DictReader(io.StringIO(read_data_text(name)))}
    row = rows[gpu]
    if row["cuda_total_gib"]:
        mib = int((Decimal(row["cuda_total_gib"]) * 1024).to_integral_value(ROUND_FLOOR))
    else:
        assert row["driver_total_mib"], f"{gpu}: only the rule; pick a sourced GPU"
        hbm = specs[gpu]["memory_type"].upper().startswith("HBM")
        mib = int(row["driver_total_mib"]) - (900 if hbm else 600)
    return mib * 2**20


def test_8b_qlora_top_plans_fit_the_cards_usable_memory_not_the_nominal(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "10M",
                     "--top", "10", "--json")
    assert result.code == 0, result.stderr
    plans = result.json()["plans"]
    assert len(plans) == 10
    gpus = set()
    for p in plans:
        gpu, memory = p["offer"]["gpu"], p["memory"]
        gpus.add(gpu)
        usable = _table_usable_bytes(gpu)
        assert memory["capacity_bytes"] == usable < memory["nominal_bytes"]
        assert memory["margin"] == 0.95 and memory["limit_bytes"] == int(usable * 0.95)
        assert memory["device_total_bytes"] <= int(usable * 0.95), (gpu, memory)
        assert memory["usable_basis"] in ("reported", "derived")
    assert "L40S" in gpus  # the card whose nominal 48 GiB hid 3.6 GiB it does not have
    monkeypatch.setenv("COLUMNS", "250")
    table = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "10M",
                    "--top", "10")
    assert table.code == 0, table.stderr
    assert "/44.4 " in table.stdout and "/48 " not in table.stdout
    assert "a plan fits at peak <= usable x 95%" in table.stdout


def test_fit_states_usable_of_nominal_and_the_limit(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = run_cli("fit", "meta-llama/Llama-3.1-8B", "--gpu", "L40S", "--method", "qlora",
                  "--json").json()
    assert doc["capacity_bytes"] == 45_486 * 2**20 and doc["nominal_bytes"] == 48 * 2**30
    assert doc["limit_bytes"] == int(45_486 * 2**20 * 0.95) and doc["margin"] == 0.95
    assert doc["usable_basis"] == "reported" and "github.com" in doc["usable_source"]
    monkeypatch.setenv("COLUMNS", "250")
    text = run_cli("fit", "meta-llama/Llama-3.1-8B", "--gpu", "L40S", "--method", "qlora").stdout
    assert "L40S: 44.4 GiB usable of 48 GiB (reported); a peak fits at <= 42.2 GiB" in text


IMPOSSIBLE = ("plan", "meta-llama/Llama-3.1-70B", "--method", "full", "--tokens", "50M",
              "--budget", "60", "--deadline", "2h")


def test_an_impossible_budget_and_deadline_name_what_binds_with_a_relaxation(
        run_cli: Run) -> None:
    result = run_cli(*IMPOSSIBLE, "--json")
    assert result.code == 2
    doc = result.json()   # always one JSON document, even with no plan
    assert doc["feasible"] is False and doc["plans"] == [] and doc["feasible_plans"] == 0
    binding = [b["constraint"] for b in doc["binding"]]
    assert binding[:2] == ["budget", "deadline"]
    relax = {r["constraint"]: r for r in doc["relaxations"]}
    money, time = relax["budget"], relax["deadline"]
    assert money["unit"] == "USD" and float(money["amount"]) > 0
    assert time["unit"] == "h" and time["amount"] > 0
    # The relaxation is real: the raised budget, same deadline, plans what it named.
    raised = money["plan"]["cost_usd"]
    assert Decimal(raised) == Decimal(money["amount"]) + 60
    again = run_cli(*IMPOSSIBLE[:6], "--budget", raised, "--deadline", "2h",
                    "--json", "--top", "1000").ok_json()
    # the plan it named, or one tied with it (same instance type and cost in another region:
    # the relaxation and the plan search may break that tie differently)
    named = money["plan"]
    assert named["id"] in {p["id"] for p in again["plans"]} or (
        named["instance_type"], named["cost_usd"]) in {
        (p["offer"]["instance_type"], p["cost"]["ranked_usd"]) for p in again["plans"]}
    assert min(Decimal(p["cost"]["ranked_usd"]) for p in again["plans"]) == Decimal(raised)
    # Within budget, the deadline relaxation's plan takes what it says.
    assert float(time["plan"]["cost_usd"]) <= 60
    assert time["plan"]["hours"] > 2 and time["plan"]["hours"] <= 2 + time["amount"]
    text = run_cli(*IMPOSSIBLE)
    assert text.code == 2
    assert f"binding budget: the cheapest plan within the deadline costs ${raised}" in text.stdout
    assert "binding deadline:" in text.stdout
    assert f"relax budget: budget +${money['amount']}" in text.stdout
    assert text.stderr.startswith("error: no plan: binding: budget, deadline")
    assert text.stderr.count("\n") == 1


def test_batch_size_given_is_kept_in_every_plan_and_marked_fixed(run_cli: Run) -> None:
    base = ("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "50M", "--top", "25")
    free = run_cli(*base, "--json").ok_json()
    assert {p["strategy"]["batch_size"] for p in free["plans"]} != {2}  # the search moves it
    assert free["fixed"] == {}
    doc = run_cli(*base, "--batch-size", "2", "--json").ok_json()
    assert doc["plans"] and {p["strategy"]["batch_size"] for p in doc["plans"]} == {2}
    assert doc["fixed"] == {"batch_size": 2}
    assert all(p["fixed"] == ["batch_size"] for p in doc["plans"])
    assert all("micro-batch 2 [fixed]" in p["why"][1] for p in doc["plans"])
    text = run_cli(*base, "--batch-size", "2")
    assert text.code == 0 and "fixed by you" in text.stdout and "batch-size 2" in text.stdout


def test_gpus_1_never_gives_a_multi_gpu_plan(run_cli: Run) -> None:
    doc = run_cli("plan", "llama-3.1-8b", "--method", "lora", "--tokens", "200M", "--gpus", "1",
                  "--top", "50", "--json").ok_json()
    plans = doc["plans"]
    assert plans and all(p["strategy"]["gpus"] == 1 and p["strategy"]["nodes"] == 1
                         and p["offer"]["gpu_count"] == 1 for p in plans)
    # Without it the same job's fastest plans use several GPUs.
    free = run_cli("plan", "llama-3.1-8b", "--method", "lora", "--tokens", "200M",
                   "--objective", "time", "--top", "5", "--json").ok_json()
    assert any(p["strategy"]["gpus"] > 1 for p in free["plans"])


def test_a_fixed_gpu_count_that_cannot_work_binds_with_its_relaxation(run_cli: Run) -> None:
    result = run_cli("plan", "meta-llama/Llama-3.1-70B", "--method", "full", "--tokens", "50M",
                     "--gpus", "1", "--json")
    assert result.code == 2
    doc = result.json()
    assert doc["fixed"] == {"gpus": 1}
    binding = [b["constraint"] for b in doc["binding"]]
    assert binding[0] == "memory" and "flag:gpus" in binding
    gpus = next(r for r in doc["relaxations"] if r["constraint"] == "flag:gpus")
    assert gpus["plan"]["gpus_per_node"] > 1
    free = run_cli("plan", "meta-llama/Llama-3.1-70B", "--method", "full", "--tokens", "50M",
                   "--top", "1", "--json").ok_json()
    assert gpus["plan"]["id"] == free["plans"][0]["id"]


def _row_spot(stdout: str, plan_id: str) -> str:
    line = next(line for line in stdout.splitlines() if plan_id in line and "│" in line)
    found = re.search(r"\$([\d,]+\.\d\d) / \$", line)
    assert found, line
    return found.group(1)


def test_spot_table_order_column_and_words_quote_the_ranked_figure(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # why-lines (risks and ranges too) unwrapped, every column shown
    monkeypatch.setenv("COLUMNS", "1000")
    args = ("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "200M", "--spot",
            "--top", "10")
    doc = run_cli(*args, "--json").ok_json()
    plans = doc["plans"]
    ranked = [Decimal(p["cost"]["ranked_usd"]) for p in plans]
    assert ranked == sorted(ranked)
    assert any(p["cost"]["uses_spot"] for p in plans)
    text = run_cli(*args)
    assert text.code == 0
    for p in plans:
        c = p["cost"]
        figure = c["spot"]["expected_usd"] if c["uses_spot"] else c["on_demand_usd"]
        assert c["ranked_usd"] == figure
        if c["spot"] is None:  # no spot price for this offer: ranked on-demand
            continue
        assert _row_spot(text.stdout, p["id"]) == f"{Decimal(c['spot']['expected_usd']):,.2f}"
        assert f"spot expected ${Decimal(c['spot']['expected_usd']):,.2f}" in p["why"][-1]
        why = next(line for line in text.stdout.splitlines() if line.startswith("#") and
                   p["id"] in line and "why:" in line)
        assert f"spot expected ${Decimal(c['spot']['expected_usd']):,.2f}" in why
    # The table lists the plans in the JSON's ranked order.
    rows = [line for line in text.stdout.splitlines() if re.match(r"│\s+\d+ │ [0-9a-f]{12}", line)]
    assert [re.search(r"[0-9a-f]{12}", r).group(0) for r in rows] == [p["id"] for p in plans]


def test_fit_on_a_t4_says_fp16_mixed_and_answers_with_one_card_first(run_cli: Run) -> None:
    args = ("fit", "meta-llama/Llama-3.1-8B", "--gpu", "T4", "--method", "full")
    doc = run_cli(*args, "--json").ok_json()
    assert doc["strategy"]["precision"] == "fp16-mixed"
    assert doc["precision"]["requested"] == "bf16-mixed"
    assert doc["precision"]["chosen"] == "fp16-mixed"
    assert doc["precision"]["why"].startswith(
        "T4 has no BF16 (Turing TU104): plans FP16 mixed precision with dynamic loss scaling")
    assert doc["precision"]["layout"].startswith("fp32 trainable weights (the optimizer's "
                                                 "masters) with fp16 autocast copies")
    assert doc["node_gpus"] == 8 and doc["node_gpus_basis"].startswith("catalog: largest T4")
    scopes = [(s["scope"], s["gpus"], s["nodes"]) for s in doc["suggestions"]]
    # 4 nodes: ZeRO-3 keeps up to stage3_max_live_parameters prefetched, + the head, gathered
    assert scopes == [("one GPU", 1, 1), ("multi-GPU: one node of 2 T4", 2, 1),
                      ("multi-node: 4 nodes x 8 T4", 32, 4)]
    assert all(s["strategy"]["gpus"] <= 8 for s in doc["suggestions"])
    text = " ".join(run_cli(*args).stdout.split())
    assert ("precision: fp16-mixed (asked bf16-mixed): T4 has no BF16 (Turing TU104): plans "
            "FP16 mixed precision with dynamic loss scaling") in text
    assert ("fits (one GPU): together: QLoRA (--method qlora) + chunked cross-entropy "
            "(--loss chunked) -> peak 12.2 GiB") in text
    assert ("fits (multi-node: 4 nodes x 8 T4): ZeRO-3 over 32 GPUs (--gpus 8 --nodes 4 "
            "--sharding zero3)") in text
    assert text.index("fits (one GPU)") < text.index("fits (multi-")


def test_gemma2_is_planned_with_eager_attention_unless_sdpa_is_asked_for(run_cli: Run) -> None:
    args = ("plan", "google/gemma-2-2b", "--method", "lora", "--tokens", "10M", "--top", "3")
    doc = run_cli(*args, "--json").ok_json()
    assert {p["strategy"]["attention"] for p in doc["plans"]} == {"eager"}
    assert doc["notes"] == ["gemma2 caps its attention logits (soft-capping), which SDPA cannot "
                            "do: planned with eager attention (--attention flash also works "
                            "with flash-attn 2.6+)"]
    asked = run_cli(*args, "--attention", "sdpa", "--json")
    assert asked.code == 2 and asked.json()["binding"][0]["constraint"] == "estimate"
    plain = run_cli("plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--tokens", "10M",
                    "--top", "1", "--json").ok_json()
    assert plain["notes"] == [] and plain["plans"][0]["strategy"]["attention"] == "sdpa"


def test_objective_risk_ranks_by_the_risk_priced_cost_and_says_each_risk(run_cli: Run) -> None:
    doc = run_cli("plan", "llama-3.1-8b", "--method", "qlora", "--tokens", "50M",
                  "--objective", "risk", "--top", "20", "--json").ok_json()
    assert doc["objective"] == "risk"
    priced = [Decimal(p["risk"]["risk_priced_usd"]) for p in doc["plans"]]
    assert priced == sorted(priced)
    for p in doc["plans"]:
        r = p["risk"]
        ranked = Decimal(p["cost"]["ranked_usd"])
        assert Decimal(r["risk_priced_usd"]) == ranked * (1 + Decimal(str(r["penalty"])))
        assert r["penalty"] == pytest.approx(r["memory"] + r["fabric"] + r["streaming"]
                                             + r["spot"] + r["precision"] + r["time_error"],
                                             abs=1e-3)
        low, high = r["hours_range"]
        assert low < p["cost"]["hours"] <= high or p["cost"]["uses_spot"]
        # one range per plan: the risk's is the time figure's own (calibrated or assumed)
        assert r["time_range_pct"] == p["throughput"]["time_basis"]["error_range_pct"]
        assert r["time_error"] == pytest.approx(r["time_range_pct"][1] / 100)
        assert any(line.startswith("risks: ") for line in p["why"])
        assert any(line.startswith("range: ") for line in p["why"])
    assert doc["plans"][0]["why"][0].startswith("#1 lowest cost with its risks priced in")


def test_a_relaxations_plan_is_saved_for_cost_and_launch(run_cli: Run, tmp_path: Path) -> None:
    # A budget of one cent and a one-minute deadline: nothing meets both, and the relaxations
    # quote whole plans (budget raised, deadline moved) that `cost` and `launch` then find.
    args = ("plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--tokens", "20M",
            "--budget", "0.01", "--deadline", "1m")
    doc = run_cli(*args, "--json")
    assert doc.code == 2
    body = doc.json()
    assert body["feasible"] is False and body["plans"] == []
    quoted = [r for r in body["relaxations"] if r["plan"] is not None]
    assert quoted and {r["constraint"] for r in quoted} >= {"budget"}
    saved = {p["id"]: p for p in body["relaxation_plans"]}
    assert {r["plan"]["id"] for r in quoted} <= set(saved)
    first = quoted[0]
    entry = saved[first["plan"]["id"]]
    assert entry["relaxation"] == first["change"]
    # the job it meets is the person's with the budget and deadline moved to this plan
    assert Decimal(entry["job"]["budget_usd"]) >= Decimal(first["plan"]["cost_usd"])
    assert entry["job"]["deadline_s"] >= first["plan"]["hours"] * 3600
    # The table run prints the ids and saves them too.
    shown = run_cli(*args)
    assert shown.code == 2 and first["plan"]["id"] in shown.stdout
    assert f"tuneplan cost {body['relaxation_plans'][0]['id']}" in shown.stdout
    cost = run_cli("cost", first["plan"]["id"], "--json")
    assert cost.code == 0, cost.stderr
    priced = cost.json()
    assert priced["plan_id"] == first["plan"]["id"]
    assert priced["cost"] == entry["cost"]["on_demand_usd"]
    out = tmp_path / "bundle"
    launched = run_cli("launch", first["plan"]["id"], "--to", "accelerate", "--out", str(out),
                       "--json")
    assert launched.code == 0, launched.stderr
    assert launched.json()["plan_id"] == first["plan"]["id"]
    config = json.loads((out / "train_config.json").read_text())
    assert config["model_name_or_path"] == "Qwen/Qwen2.5-0.5B"
