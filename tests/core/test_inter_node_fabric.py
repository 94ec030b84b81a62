"""The network between nodes: each offer's stated fabric (providers.csv ``multinode_fabric``),
the assumed default where none is stated, labelled so, and its effect on the step."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from tests.core.test_compute_per_gpu import MODEL
from tuneplan.adapters.bundled import load_gpu_spec, load_providers
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.catalog.providers import parse_stated_fabrics
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import NodeLinks
from tuneplan.core.compute.throughput import estimate_throughput
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.planner.plan import offer_fabric, offer_node
from tuneplan.errors import CatalogError
from tuneplan.units import GiB

A = ThroughputAssumptions()
PROVIDERS = {p.name: p for p in load_providers()}
GBPS = 1e9 / 8   # bytes/s of one Gb/s


def _offer(provider: str, instance: str, gpu: str = "H100 SXM5") -> Offer:
    return Offer(provider=provider, instance_type=instance, gpu=gpu, gpu_count=8,
                 gpu_memory_bytes=80 * GiB, vcpus=192, ram_bytes=2048 * GiB, region="us-east-1",
                 price_per_hour=Decimal("40"), interconnect="NVLink 4.0",
                 fetched_at=datetime(2026, 12, 1, tzinfo=UTC), source="test")


@pytest.mark.parametrize(("provider", "instance", "gbps", "kind"), [
    ("AWS", "p5.48xlarge", 3200, "EFA"),
    ("AWS", "p5en.48xlarge", 3200, "EFA"),
    ("AWS", "p4de.24xlarge", 400, "EFA"),
    ("Azure", "Standard_ND96isr_H100_v5", 3200, "InfiniBand"),
    ("Azure", "Standard_ND96amsr_A100_v4", 1600, "InfiniBand"),
    ("GCP", "a3-megagpu-8g", 1600, "GPUDirect-TCPXO"),
    ("Oracle (OCI)", "BM.GPU.H100.8", 3200, "RoCE"),
    ("Nebius", "gpu-h200-sxm_8gpu-128vcpu-1600gb", 3200, "InfiniBand"),
])
def test_an_offer_gets_the_fabric_its_provider_states_for_its_instance_type(
        provider: str, instance: str, gbps: int, kind: str) -> None:
    fabric = offer_fabric(_offer(provider, instance), PROVIDERS[provider])
    assert fabric is not None
    assert fabric.bytes_per_s == pytest.approx(gbps * GBPS)
    assert fabric.kind == kind
    assert f"{gbps:,} Gb/s {kind}" in fabric.describe() and provider in fabric.describe()
    # the clause naming the instance family itself, not a shorter one it begins with
    if instance == "p5en.48xlarge":
        assert fabric.scope == "p5en.48xlarge"


@pytest.mark.parametrize(("provider", "instance"), [
    ("AWS", "p5.4xlarge"),           # the 1-GPU p5 size: not the stated 48xlarge
    ("AWS", "g6e.48xlarge"),
    ("Azure", "Standard_NC80adis_H100_v5"),
    ("GCP", "a3-highgpu-8g"),
    ("Lambda", "gpu_8x_h100_sxm5"),  # 3200 Gbps is stated for 1-Click Clusters only
    ("RunPod", "8x-H100"),
])
def test_an_offer_without_a_stated_fabric_runs_on_the_assumed_default_labelled_so(
        provider: str, instance: str) -> None:
    offer = _offer(provider, instance)
    assert offer_fabric(offer, PROVIDERS[provider]) is None
    node = offer_node(offer, load_gpu_spec("H100 SXM5"), nodes=2,
                      fabric=offer_fabric(offer, PROVIDERS[provider]))
    assert node.inter_node_bytes_per_s is None and node.inter_node_fabric is None
    job = Strategy(method=Method.FULL, gpus=8, nodes=2, sharding=Sharding.FSDP)
    got = estimate_throughput(MODEL, job, load_gpu_spec("H100 SXM5"), links=NodeLinks())
    note = " ".join(got.notes)
    assert "100 Gb/s Ethernet per node, assumed" in note
    term = got.step.get("step/communication-exposed")
    assert term is not None and "assumed" in term.inputs["inter_node"]


def test_the_stated_fabric_reaches_the_step_and_its_label() -> None:
    offer = _offer("AWS", "p5.48xlarge")
    fabric = offer_fabric(offer, PROVIDERS["AWS"])
    node = offer_node(offer, load_gpu_spec("H100 SXM5"), nodes=2, fabric=fabric)
    assert node.inter_node_bytes_per_s == pytest.approx(400e9)
    assert node.inter_node_fabric == "3,200 Gb/s EFA per node, stated by AWS for p5.48xlarge"
    # one node: no fabric between nodes at all
    assert offer_node(offer, load_gpu_spec("H100 SXM5"), fabric=fabric).inter_node_fabric is None


def test_same_multi_node_job_is_faster_on_3200_gbps_than_on_100_gbps_when_comm_bound() -> None:
    gpu = load_gpu_spec("H100 SXM5")
    # full fine-tuning under ZeRO-3 on 2 x 8 H100: every micro-batch gathers all weights
    job = Strategy(method=Method.FULL, gpus=8, nodes=2, sharding=Sharding.ZERO3, batch_size=1,
                   seq_len=1024, grad_accum=4)
    slow = estimate_throughput(MODEL, job, gpu, links=NodeLinks(
        inter_node_bytes_per_s=100 * GBPS, inter_node_fabric="100 Gb/s Ethernet"))
    fast = estimate_throughput(MODEL, job, gpu, links=NodeLinks(
        inter_node_bytes_per_s=3200 * GBPS, inter_node_fabric="3,200 Gb/s EFA"))
    assert slow.bound == "communication"
    assert fast.tokens_per_second > 2 * slow.tokens_per_second
    # the rates reach the ring: per GPU, the node's rate over its 8 GPUs, at NCCL's efficiency
    ring = fast.step.get("step/communication-exposed")
    assert ring is not None
    assert ring.inputs["ring_bytes_per_s"] == pytest.approx(
        min(3200 * GBPS / 8 * A.inter_node_efficiency,
            gpu.interconnect_bytes_per_s / 2 * A.nvlink_efficiency))
    assert "3,200 Gb/s EFA" in ring.inputs["inter_node"]
    # a compute-bound job (LoRA sends only its adapters' gradients) gains nothing real
    lora = dataclasses.replace(job, method=Method.LORA, sharding=Sharding.DDP, seq_len=4096)
    lora_slow = estimate_throughput(MODEL, lora, gpu, links=NodeLinks(
        inter_node_bytes_per_s=100 * GBPS))
    lora_fast = estimate_throughput(MODEL, lora, gpu, links=NodeLinks(
        inter_node_bytes_per_s=3200 * GBPS))
    assert lora_slow.bound == "compute"
    assert lora_fast.tokens_per_second == pytest.approx(lora_slow.tokens_per_second, rel=0.05)


def test_the_fitted_multi_node_slowdown_is_named_and_spread_over_the_bounds() -> None:
    gpu = load_gpu_spec("H100 SXM5")
    lora = Strategy(method=Method.LORA, gpus=8, nodes=2, seq_len=4096)
    got = estimate_throughput(MODEL, lora, gpu)
    term = got.step.get("step/multi-node-fitted-slowdown")
    assert term is not None and term.inputs["fitted"] is True
    assert "fitted flat factor" in term.source
    assert float(term.value) == pytest.approx(
        (float(got.step.total) - float(term.value)) * (1 / A.multi_node_efficiency - 1))
    # not called communication: it scales the whole step, so the bound is the compute's
    seconds = got.bound_seconds()
    assert got.bound == "compute"
    assert sum(seconds.values()) == pytest.approx(got.step_seconds)
    # one node: no fitted factor
    one = estimate_throughput(MODEL, dataclasses.replace(lora, nodes=1), gpu)
    assert one.step.get("step/multi-node-fitted-slowdown") is None


@pytest.mark.parametrize("text", ["p5 3200 Gbps EFA", "p5 = EFA", "= 3200 Gbps EFA",
                                  "p5 = 3200 Gbps"])
def test_a_malformed_fabric_clause_is_refused(text: str) -> None:
    with pytest.raises(CatalogError, match="multinode_fabric"):
        parse_stated_fabrics("X", text)
