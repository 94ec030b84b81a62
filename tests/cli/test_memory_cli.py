"""`tuneplan memory` / `explain`: JSON contract, terms summing to the peaks, refusals."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]


def test_qlora_json_terms_sum_to_peaks(run_cli: Run) -> None:
    doc = run_cli("memory", "meta-llama/Llama-3.1-8B", "--method", "qlora",
                  "--batch-size", "2", "--seq-len", "2048", "--json").ok_json()
    per_gpu = doc["per_gpu"]
    terms = {t["name"]: t["bytes"] for t in per_gpu["terms"]}
    outside = ("overheads/allocator_reserve", "overheads/cuda_context", "overheads/nccl")
    allocated = sum(v for k, v in terms.items() if k not in outside)
    assert allocated == per_gpu["allocated_peak_bytes"]
    assert per_gpu["reserved_peak_bytes"] == allocated + terms["overheads/allocator_reserve"]
    assert sum(terms.values()) == per_gpu["device_total_bytes"]
    assert doc["total_params"] == 8_030_261_248
    assert doc["trainable_params"] == 41_943_040   # r16 all-linear on 32 blocks
    assert doc["host_ram_bytes"] > 0 and doc["fits"] is None
    assert terms["weights/quantized"] == 6_979_321_856 // 2


def test_gpu_flag_adds_fit(run_cli: Run) -> None:
    doc = run_cli("memory", "llama-3.1-8b", "--method", "full", "--gpu", "H100",
                  "--json").ok_json()
    assert list(doc["fits"].values()) == [False]   # 16 B/param > 80 GB


def test_gpu_l40s_states_usable_of_nominal_and_the_comparison(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = run_cli("memory", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "L40S",
                  "--json").ok_json()
    gpu = doc["gpu"]
    usable = 45_486 * 2**20     # torch's 44.42 GiB total capacity on an L40S, whole MiB
    assert gpu["usable_bytes"] == usable == 47_695_527_936
    assert gpu["nominal_bytes"] == 48 * 2**30 and gpu["driver_total_bytes"] == 45_776 * 2**20
    assert gpu["usable_basis"] == "reported" and gpu["usable_confidence"] == "high"
    assert gpu["limit_bytes"] == int(usable * 0.95) and gpu["margin"] == 0.95
    assert "whole-device peak" in gpu["compared"]
    peak = doc["per_gpu"]["device_total_bytes"]
    assert doc["headroom_bytes"] == {"L40S": int(usable * 0.95) - peak}
    assert doc["fits"] == {"L40S": True}
    monkeypatch.setenv("COLUMNS", "200")
    text = run_cli("memory", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu",
                   "L40S").stdout
    assert "44.4 GiB usable of 48 GiB (CUDA-visible total, reported)" in text
    assert "limit (usable x 95%)" in text and "42.20 GiB" in text
    explain = run_cli("explain", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu",
                      "L40S").stdout
    assert "L40S: 44.4 GiB usable of 48 GiB" in explain and "= usable x 95%: fits" in explain


def test_gpu_without_architecture_uses_default_generation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU row with an empty architecture column used to crash with IndexError.
    from tuneplan.adapters import bundled
    from tuneplan.service.memory_report import run_memory

    real = bundled.resolve_gpu_spec
    monkeypatch.setattr(bundled, "resolve_gpu_spec",
                        lambda name: dataclasses.replace(real(name), architecture=""))
    from tuneplan.service.jobs import JobRequest

    est, _, gpu = run_memory(JobRequest(model="llama-3.1-8b", command="memory",
                                        values={"gpu": "H100"}))
    assert gpu is not None and gpu.architecture == ""
    context = est.breakdown.get("overheads/cuda_context")
    assert context is not None and context.inputs["generation"] == "default"


def test_explain_prints_formulas(run_cli: Run) -> None:
    result = run_cli("explain", "llama-3.1-8b", "--method", "lora")
    assert result.code == 0, result.stderr
    assert "log-softmax" in result.stdout and "source:" in result.stdout


@pytest.mark.parametrize("args", [
    ["--method", "lora", "--lora-rank", "0"],
    ["--seq-len", "1000000"],
    ["--method", "adapter"],  # not a peft type: refused with the methods that are estimated
    ["--compile"],
])
def test_refusals_exit_2_with_one_line(run_cli: Run, args: list[str]) -> None:
    result = run_cli("memory", "llama-3.1-8b", *args, "--json")
    assert (result.code, result.stdout) == (2, "")
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_job_file_with_flag_override(run_cli: Run, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("method: lora\nlora_rank: 8\nbatch_size: 4\nseq_len: 1024\n")
    strategy = run_cli("memory", "llama-3.1-8b", "--job", str(job), "--lora-rank", "32",
                       "--json").ok_json()["strategy"]
    assert (strategy["lora_rank"], strategy["batch_size"], strategy["seq_len"]) == (32, 4, 1024)


def test_unknown_flag_is_bad_input(run_cli: Run) -> None:
    result = run_cli("memory", "llama-3.1-8b", "--no-such-flag", "--json")
    assert result.code == 2 and "--no-such-flag" in result.stderr


def test_several_gpus_default_to_zero3_and_unsloth_offloads(run_cli: Run) -> None:
    doc = run_cli("memory", "llama-3.1-8b", "--gpus", "4", "--json").ok_json()
    assert doc["strategy"]["sharding"] == "zero3"
    doc = run_cli("memory", "llama-3.1-8b", "--recipe", "unsloth", "--json").ok_json()
    assert doc["strategy"]["checkpointing"] == "offload"


def test_a_misspelt_job_flag_is_named_with_the_closest_valid_one(run_cli: Run) -> None:
    result = run_cli("memory", "llama-3.1-8b", "--lora-rnk", "8")
    assert result.code == 2
    assert result.stderr.count("\n") == 1
    assert "--lora-rnk" in result.stderr and "did you mean --lora-rank?" in result.stderr
    assert result.stdout == ""


def test_a_bad_job_value_is_one_line_exit_2(run_cli: Run) -> None:
    result = run_cli("memory", "llama-3.1-8b", "--batch-size", "9" * 400)
    assert result.code == 2 and result.stderr.startswith("error: --batch-size:")
    assert result.stderr.count("\n") == 1


def test_help_lists_job_flags_with_their_defaults(run_cli: Run,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # wide enough that Rich does not clip names
    result = run_cli("memory", "--help")
    assert result.code == 0
    assert "--lora-rank" in result.stdout and "--offload-activations" in result.stdout
    assert "[default: (16)]" in result.stdout  # Strategy's own lora_rank default
    assert "--budget" not in result.stdout   # a planner flag memory could not honour


def test_memory_json_and_explain_carry_the_mapping_note(run_cli: Run) -> None:
    doc = run_cli("memory", "tiiuae/falcon-7b", "--lora-targets", "q_proj,v_proj",
                  "--json").ok_json()
    assert any("query_key_value" in note for note in doc["notes"])
    assert run_cli("memory", "llama-3.1-8b", "--json").ok_json()["notes"] == []
    words = run_cli("explain", "tiiuae/falcon-7b", "--lora-targets", "q_proj").stdout
    assert "note:" in words and "query_key_value" in words


def test_unsloth_recipe_names_its_source_modelled_terms(run_cli: Run) -> None:
    table = run_cli("memory", "llama-3.1-8b", "--recipe", "unsloth", "--seq-len", "4096")
    assert table.code == 0
    assert "logits/fused_chunk" in table.stdout and "logits/fused_grad_inputs" in table.stdout
    assert "modelled from source, not simulated" in " ".join(table.stdout.split())
    doc = run_cli("memory", "llama-3.1-8b", "--recipe", "unsloth", "--seq-len", "4096",
                  "--json").ok_json()
    terms = {t["name"]: t for t in doc["per_gpu"]["terms"]}
    assert terms["logits/fused_chunk"]["bytes"] == 4096 * 128256 * 10
    assert "not simulated" in terms["logits/fused_chunk"]["source"]
    assert terms["logits/fused_chunk"]["inputs"]["confidence"] == "low"
    host = {t["name"]: t["bytes"] for t in doc["host_terms"]}
    # unsloth's 200 pinned CPU buffers: the 32 layer inputs (T·H bf16) and 168 of 128 Ki
    assert host["host/offloaded_checkpoints"] == (32 * 4096 * 4096 + 168 * 128 * 1024) * 2


def test_fit_reports_a_qlora_job_bound_by_loading(run_cli: Run) -> None:
    # Qwen2.5-72B QLoRA sequence classification, q/v rank 4, one 128-token sequence: the step
    # (no head, tiny adapters) peaks at about 41.5 GiB on an L40S (limit 44.42 x 0.95 = 42.2
    # GiB) but casting the 152064 x 8192 embedding to fp32 adds its 2.3 GiB bf16 source
    doc = run_cli("fit", "Qwen/Qwen2.5-72B", "--gpu", "L40S", "--method", "qlora",
                  "--task", "seq-cls", "--num-labels", "2", "--lora-rank", "4",
                  "--lora-targets", "q_proj,v_proj", "--batch-size", "1", "--seq-len", "128",
                  "--json").ok_json()
    qlora = next(m for m in doc["methods"] if m["method"] == "qlora")
    assert qlora["fits"] is False
    assert qlora["step_peak_bytes"] is not None
    assert qlora["step_peak_bytes"] <= doc["limit_bytes"] < qlora["peak_bytes"]
    assert qlora["peak_bytes"] - qlora["step_peak_bytes"] > 152064 * 8192 * 2 // 2
    memory = run_cli("memory", "Qwen/Qwen2.5-72B", "--gpu", "L40S", "--method", "qlora",
                     "--task", "seq-cls", "--num-labels", "2", "--lora-rank", "4",
                     "--lora-targets", "q_proj,v_proj", "--batch-size", "1", "--seq-len", "128",
                     "--json").ok_json()
    loading = memory["per_gpu"]["loading"]
    assert loading["binds"] is True and memory["fits"] == {"L40S": False}
    assert {t["name"]: t["bytes"] for t in loading["terms"]}[
        "loading/kbit_cast_source"] == 152064 * 8192 * 2
    assert loading["peak_bytes"] == sum(t["bytes"] for t in loading["terms"])
