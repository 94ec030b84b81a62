"""DeepSeek-V3 (multi-head latent attention, 256 routed + 1 shared expert) planned end to end
on the bundled catalog: several nodes with --multi-node, and a plain shortfall without."""

from __future__ import annotations

import re
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
    doc = result.json()
    plans = doc["plans"]
    assert any(p["strategy"]["nodes"] == 1 for p in plans)
    # several-node plans rank below the first 40 (one node is cheaper): the best of each
    # node count comes with its rank
    ranked = plans + doc["best_of_other_node_counts"]
    assert any(p["strategy"]["nodes"] > 1 for p in ranked)


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
    8, 16 nodes: its multi-node plans are ranked beside the one-node ones (the nodes with the
    host RAM to stream the weights). They rank below the first ten, so the best plan of each
    node count the table lacks comes with its rank and per-GPU breakdown."""
    result = run_cli(*ARGS, "--gpu", "H100", "--json")
    assert result.code == 0, result.stderr
    body = result.json()
    assert all(p["strategy"]["nodes"] == 1 for p in body["plans"])
    multi = body["best_of_other_node_counts"]
    assert multi and {p["offer"]["provider"] for p in multi} == {"RunPod"}
    assert sorted(p["strategy"]["nodes"] for p in multi) == sorted(
        {p["strategy"]["nodes"] for p in multi})   # one per node count
    assert all(p["strategy"]["nodes"] in (2, 4, 8, 16) and p["rank"] > 10 for p in multi)
    for plan in multi:   # each has its exact estimate and breakdown
        _check_breakdown(plan)
    # the whole catalog, the default command: multi-node plans with their breakdown too
    every = run_cli(*ARGS, "--json")
    assert every.code == 0, every.stderr
    multi = every.json()["best_of_other_node_counts"]
    assert any(p["strategy"]["nodes"] > 1 for p in multi)
    for plan in multi:
        _check_breakdown(plan)
    text = run_cli(*ARGS)
    assert text.code == 0 and "best on 2 nodes: #" in text.stdout
    assert "sharding/gathered_params" in text.stdout


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
    # RunPod: one node would stream the weights from host RAM it has not got (752 GiB);
    # its GPUs hold the rest (ZeRO-3 gathers one block at a time), so host RAM is short
    result = run_cli(*ARGS, "--gpu", "H100", "--provider", "runpod", "--no-multi-node",
                     "--json")
    assert result.code == 2
    body = result.json()
    memory = next(b for b in body["binding"] if b["constraint"] == "memory")
    detail = memory["detail"]
    assert "the largest node tried (8x H100 NVL) holds it only by offloading" in detail
    short = re.search(r"one node cannot hold it: short by ([\d,]+) GiB of host RAM "
                      r"\(([\d,]+) GiB needed over its 8 GPUs' offloaded state, ([\d,]+) GiB "
                      r"installed\)", detail)
    assert short is not None, detail
    missing, need, have = (int(g.replace(",", "")) for g in short.groups())
    assert have == 752 and need > 671 * 2 and abs(need - have - missing) <= 1
    assert any(b["constraint"] == "flag:multi-node" for b in body["binding"])
    assert any(r["change"].startswith("--multi-node") and r["plan"] is not None
               for r in body["relaxations"])
    text = run_cli(*ARGS, "--gpu", "H100", "--provider", "runpod", "--no-multi-node")
    assert text.code == 2 and "one node cannot hold it" in text.stdout
