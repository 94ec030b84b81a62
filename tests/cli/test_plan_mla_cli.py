"""DeepSeek-V3 (multi-head latent attention, 256 routed + 1 shared expert) planned end to end
on the bundled catalog: several nodes with --multi-node, and a plain shortfall without."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]
GiB = 2**30
ARGS = ("plan", "deepseek-ai/DeepSeek-V3", "--method", "lora", "--tokens", "5M")


def test_deepseek_v3_lora_gets_multi_node_plans_beside_one_node_ones(run_cli: Run) -> None:
    """One 8-GPU node of 180-288 GB cards holds it; with --multi-node, plans over several
    nodes are ranked beside those (here: where one node would stream weights from host RAM)."""
    result = run_cli(*ARGS, "--multi-node", "--top", "40", "--json")
    assert result.code == 0, result.stderr
    plans = result.json()["plans"]
    assert any(p["strategy"]["nodes"] > 1 for p in plans)
    assert any(p["strategy"]["nodes"] == 1 for p in plans)


def _check_breakdown(plan: dict[str, Any]) -> None:
    memory = plan["memory"]
    assert memory["device_total_bytes"] <= memory["limit_bytes"]
    terms = memory["terms"]
    assert terms is not None and memory["exact_for_gpu"]
    assert sum(t["bytes"] for t in terms) == memory["device_total_bytes"]
    assert {"weights", "activations"} <= {t["name"].split("/")[0] for t in terms}
    if plan["strategy"]["offload"] != "optimizer+params":   # else streamed from host RAM
        gpus = plan["strategy"]["gpus"] * plan["strategy"]["nodes"]
        assert memory["device_total_bytes"] * gpus > 1_342_052_838_400   # 671B in bf16


def test_deepseek_v3_lora_default_plan_ranks_multi_node_plans_for_offers_one_node_cannot_hold(
        run_cli: Run) -> None:
    """Without --multi-node (and without --no-multi-node), a whole 8-GPU node that cannot
    hold the job (RunPod's: 752 GiB of host RAM to stream the weights from) is tried on 2, 4,
    8, 16 nodes: its multi-node plan is ranked beside the one-node ones (the nodes with the
    host RAM to stream the weights), with the per-GPU breakdown."""
    result = run_cli(*ARGS, "--gpu", "H100", "--top", "20", "--json")
    assert result.code == 0, result.stderr
    plans = result.json()["plans"]
    multi = [p for p in plans if p["strategy"]["nodes"] > 1]
    assert multi and any(p["strategy"]["nodes"] == 1 for p in plans)
    assert {p["offer"]["provider"] for p in multi} == {"RunPod"}
    assert all(p["strategy"]["nodes"] in (2, 4, 8, 16) for p in multi)
    for plan in multi:   # among the first plans: each has its exact estimate and breakdown
        _check_breakdown(plan)
    # the whole catalog: multi-node plans are ranked too (below the one-node B200/H200 ones)
    every = run_cli(*ARGS, "--top", "500", "--json")
    assert every.code == 0, every.stderr
    assert any(p["strategy"]["nodes"] > 1 for p in every.json()["plans"])


def test_deepseek_v3_lora_on_h100_nodes_gives_multi_node_plans_with_the_per_gpu_breakdown(
        run_cli: Run) -> None:
    result = run_cli(*ARGS, "--gpu", "H100", "--provider", "runpod", "--multi-node", "--top",
                     "3", "--json")
    assert result.code == 0, result.stderr
    plans = result.json()["plans"]
    assert plans   # RunPod's H100 offers, one node of which cannot hold it (752 GiB host RAM)
    for plan in plans:
        assert plan["strategy"]["nodes"] > 1
        memory = plan["memory"]
        assert memory["device_total_bytes"] <= memory["limit_bytes"]
        terms = memory["terms"]
        assert terms is not None and memory["exact_for_gpu"]
        assert sum(t["bytes"] for t in terms) == memory["device_total_bytes"]
        names = {t["name"].split("/")[0] for t in terms}
        assert {"weights", "activations"} <= names
        # 671B parameters in bf16 (1.34 TB) spread over every GPU of every node
        gpus = plan["strategy"]["gpus"] * plan["strategy"]["nodes"]
        # transformers' own parameter count (test_mla_models.py); the 58 x 256 router
        # e_score_correction_bias elements are buffers there, not counted
        assert plan["memory"]["total_params"] == 671_026_404_352
        assert plan["memory"]["device_total_bytes"] * gpus > 1_342_052_838_400


def test_deepseek_v3_lora_on_one_h100_node_says_what_is_missing(run_cli: Run) -> None:
    # RunPod: one node would stream the weights from host RAM it has not got (752 GiB)
    result = run_cli(*ARGS, "--gpu", "H100", "--provider", "runpod", "--no-multi-node",
                     "--json")
    assert result.code == 2
    body = result.json()
    memory = next(b for b in body["binding"] if b["constraint"] == "memory")
    assert "one node cannot hold it: short by" in memory["detail"]
    assert "GiB per GPU" in memory["detail"] and "over its 8 GPUs" in memory["detail"]
    assert any(b["constraint"] == "flag:multi-node" for b in body["binding"])
    assert any(r["change"].startswith("--multi-node") and r["plan"] is not None
               for r in body["relaxations"])
    text = run_cli(*ARGS, "--gpu", "H100", "--provider", "runpod", "--no-multi-node")
    assert text.code == 2 and "one node cannot hold it" in text.stdout
