"""`tuneplan plan` and `tuneplan fit` end to end on the bundled catalog (offline)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
