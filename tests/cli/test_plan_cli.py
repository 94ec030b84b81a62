"""`tuneplan plan` and `tuneplan fit` end to end on the bundled catalog (offline)."""

from __future__ import annotations

from collections.abc import Callable
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


def test_an_impossible_job_exits_2_with_the_fit_solvers_changes(run_cli: Run) -> None:
    result = run_cli("plan", "meta-llama/Llama-3.1-405B", "--method", "full", "--gpu",
                     "RTX 4090", "--max-gpus", "1", "--no-multi-node", "--tokens", "1M")
    assert result.code == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: no plan")
    assert "Changes on RTX 4090" in line and "QLoRA" in line and "GiB" in line


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
    assert scopes == [("one GPU", 1, 1), ("multi-GPU: one node of 2 T4", 2, 1),
                      ("multi-node: 2 nodes x 8 T4", 16, 2)]
    assert all(s["strategy"]["gpus"] <= 8 for s in doc["suggestions"])
    text = " ".join(run_cli(*args).stdout.split())
    assert ("precision: fp16-mixed (asked bf16-mixed): T4 has no BF16 (Turing TU104): plans "
            "FP16 mixed precision with dynamic loss scaling") in text
    assert ("fits (one GPU): together: QLoRA (--method qlora) + chunked cross-entropy "
            "(--loss chunked) -> peak 12.2 GiB") in text
    assert ("fits (multi-node: 2 nodes x 8 T4): ZeRO-3 over 16 GPUs (--gpus 8 --nodes 2 "
            "--sharding zero3)") in text
    assert text.index("fits (one GPU)") < text.index("fits (multi-")
