"""`tuneplan throughput` and `tuneplan cost` print docs/CLI.md's keys with their assumptions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from tuneplan.cli.app import app
from tuneplan.core.catalog.providers import parse_fabric_rate as fabric_bytes_per_s
from tuneplan.errors import InvalidValueError

runner = CliRunner()


def test_throughput_json_keys() -> None:
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.1-8B", "--gpu", "H100 SXM",
                                 "--method", "lora", "--tokens", "50M", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for key in ("tokens_per_second", "tokens_per_second_per_gpu", "step_seconds", "mfu",
                "comm_seconds_per_step", "hours", "assumptions"):
        assert key in document
    assert document["hours"] == 50e6 / document["tokens_per_second"] / 3600
    assert document["comm_seconds_per_step"] == 0  # one GPU talks to no one
    assert "why" in document["assumptions"]["causal_attention_factor"]
    assert document["bound"] in ("compute", "memory", "communication", "host")
    assert 0 < document["mfu"] < 1


def test_throughput_across_nodes_names_the_assumed_network_and_the_fitted_factor() -> None:
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.1-8B", "--gpu", "H100 SXM",
                                 "--method", "full", "--gpus", "8", "--nodes", "2", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert any("100 Gb/s Ethernet per node, assumed" in n for n in document["notes"])
    paths = [t["name"] for t in document["step"]["terms"]]
    assert "step/multi-node-fitted-slowdown" in paths
    assert document["bound"] in ("compute", "memory", "communication", "host")


def test_throughput_with_eight_gpus_reports_communication() -> None:
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.1-8B", "--gpu", "H100 SXM",
                                 "--method", "full", "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["comm_seconds_per_step"] > 0
    assert document["hours"] is None
    assert document["tokens_per_second"] == document["tokens_per_second_per_gpu"] * 8


def test_bad_flag_exits_2() -> None:
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.1-8B", "--gpu", "H100 SXM",
                                 "--precision", "fp7"])
    assert isinstance(result.exception, InvalidValueError)
    assert InvalidValueError.exit_code == 2


def test_cost_json_keys_on_a_spot_offer() -> None:
    from tuneplan.adapters.store import CatalogStore
    from tuneplan.core.catalog.offers import OfferFilter

    with CatalogStore.open() as store:
        offers = store.offers(OfferFilter(gpu="H100", gpu_count=1, spot=True))
    offer = next(o for o in offers if o.price_per_hour is not None)
    result = runner.invoke(app, ["cost", "meta-llama/Llama-3.1-8B", "--offer", offer.id,
                                 "--tokens", "20M", "--spot", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for key in ("hours", "cost", "spot", "storage_cost", "egress_cost", "billing", "assumptions"):
        assert key in document
    for key in ("expected_cost", "p50_cost", "p90_cost", "expected_hours",
                "checkpoint_interval_minutes", "interruptions_expected"):
        assert key in document["spot"]
    assert document["offer"]["id"] == offer.id


def test_cost_needs_tokens() -> None:
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open() as store:
        offer = next(o for o in store.offers() if o.gpu == "A100 80GB SXM4" and o.price_per_hour)
    result = runner.invoke(app, ["cost", "meta-llama/Llama-3.2-1B", "--offer", offer.id])
    assert isinstance(result.exception, InvalidValueError)
    assert "--tokens" in str(result.exception)


def test_fabric_rate_from_provider_text() -> None:
    assert fabric_bytes_per_s("EFA: p4d 400 Gbps; p5 3200 Gbps per node") == 3200e9 / 8
    assert fabric_bytes_per_s("A3 Ultra / A4 3.2 Tbps RDMA per VM") == 3.2e12 / 8
    assert fabric_bytes_per_s("none") is None


def test_throughput_reads_a_job_file_like_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"method": "full", "gpu": "A100 80GB SXM4", "tokens": "1M",
                               "seq_len": 1024, "epochs": 2}))
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.2-1B", "--job", str(job),
                                 "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["tokens_per_step"] == 4 * 1024
    assert document["hours"] == 2 * 10**6 / document["tokens_per_second"] / 3600


def test_throughput_without_gpu_is_bad_input() -> None:
    result = runner.invoke(app, ["throughput", "meta-llama/Llama-3.2-1B"])
    assert isinstance(result.exception, InvalidValueError)


def _cost_on_8_h100(model: str, method: str) -> dict[str, Any]:
    """``tuneplan cost --json`` of 20M tokens of ``method`` on the first priced 8 x H100
    offer of the bundled catalog."""
    from tuneplan.adapters.store import CatalogStore
    from tuneplan.core.catalog.offers import OfferFilter

    with CatalogStore.open() as store:
        offers = store.offers(OfferFilter(gpu="H100", gpu_count=8))
    offer = next(o for o in offers if o.price_per_hour is not None)
    result = runner.invoke(app, ["cost", model, "--offer", offer.id, "--method", method,
                                 "--tokens", "20M", "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_cost_sizes_moe_lora_checkpoints_from_the_memory_models_count() -> None:
    """Qwen3-30B-A3B all-linear LoRA trains 996,507,648 parameters (routers and fused experts
    as PEFT 0.21 wraps them): on 8 x H100 under ZeRO-3 the checkpoint holds them as the bf16
    module holds them (2 B), DeepSpeed's fp32 master copy (4 B) and AdamW's two fp32 moments
    (8 B), as ``tuneplan plan`` sizes it; the speed model's adapter FLOPs read the same
    targets."""
    trainable = 996_507_648
    doc = _cost_on_8_h100("Qwen/Qwen3-30B-A3B", "lora")
    assert doc["strategy"]["sharding"] == "zero3"
    assert doc["checkpoint"]["bytes_with_optimizer"] == trainable * (2 + 4 + 8)
    speed = runner.invoke(app, ["throughput", "Qwen/Qwen3-30B-A3B", "--gpu", "H100 SXM",
                                "--method", "lora", "--json"])
    assert speed.exit_code == 0, speed.output
    terms = {t["name"]: t for t in json.loads(speed.stdout)["flops_per_token"]["terms"]}
    assert terms["adapters"]["inputs"]["adapter_params"] == trainable


@pytest.mark.parametrize("gpu", ["RTX A5000", "RTX 4000 Ada", "A800", "MI355X", "RTX PRO 6000"])
def test_throughput_on_cards_whose_rates_were_filled_in(gpu: str) -> None:
    result = runner.invoke(app, ["throughput", "llama-3.1-8b", "--gpu", gpu, "--method", "lora",
                                 "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["tokens_per_second"] > 0 and 0 < document["mfu"] < 1


def test_cost_sizes_a_zero3_full_fine_tuning_checkpoint_as_deepspeed_writes_it() -> None:
    """Full fine-tuning of Llama-3.1-8B on 8 x H100 (ZeRO-3, bf16): DeepSpeed saves the bf16
    module weights (2 B), its fp32 master copy (4 B) and AdamW's two fp32 moments (8 B) per
    parameter (the HF Trainer's own 12 B without DeepSpeed, fp32 params and moments, is
    pinned in ``tests/core/memory/test_checkpoint_size.py``)."""
    doc = _cost_on_8_h100("meta-llama/Llama-3.1-8B", "full")
    assert doc["strategy"]["sharding"] == "zero3"
    assert doc["checkpoint"]["bytes_with_optimizer"] == 8_030_261_248 * 14
    assert doc["checkpoint"]["bytes_without_optimizer"] == 8_030_261_248 * 2
