"""Bytes each GPU sends per optimizer step under DDP / ZeRO-1/2/3 / FSDP, and the link speed.

Ring collectives over n ranks: all-reduce moves 2(n-1)/n x bytes per rank, all-gather and
reduce-scatter (n-1)/n x bytes each. Pure; does not decide overlap with compute
(``core.compute.throughput`` does). Bandwidth is the slowest hop of the ring: NVLink/NVSwitch or
PCIe
inside a node, the node fabric divided among its GPUs between nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.errors import UnsupportedError
from tuneplan.explain import Breakdown, Term

#: parameters sharded at rest and all-gathered per micro-batch; FSDP SHARD_GRAD_OP gathers once,
#: before the forward, and frees after the backward (torch FSDP1 ``_should_free_in_backward``:
#: SHARD_GRAD_OP is in ``NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``), ``gathering_passes``
SHARDED_PARAMS = frozenset({"zero3", "fsdp", "hybrid", "fsdp-grad-op"})
PER_MICROBATCH_GRADS = frozenset({"zero2", "fsdp-grad-op", "zero3", "fsdp", "hybrid"})
KNOWN_SHARDING = frozenset({"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hybrid"})


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLinks:
    """Hardware facts of the node a job runs on that the GPU's spec does not hold: ``intra``
    forces the link between its GPUs (``auto``, ``nvlink`` or ``pcie``), and the fabric
    between nodes in bytes/s (None: ``ThroughputAssumptions.inter_node_bytes_per_s``) and its
    latency per ring step, and the vCPUs of one node's host where the offer states them (CPU
    Adam under offload)."""

    intra: str = "auto"
    inter_node_bytes_per_s: float | None = None
    host_vcpus: int | None = None
    #: one ring step's latency across the nodes' network, where the offer states it (None:
    #: NCCL's own model, ``ThroughputAssumptions.nccl_hop_latency_s``)
    inter_node_latency_s: float | None = None
    #: what ``inter_node_bytes_per_s`` is, in words, where an offer states it (its kind, rate
    #: and who stated it for which instances: ``StatedFabric.describe``)
    inter_node_fabric: str | None = None

    def inter_node_basis(self, a: ThroughputAssumptions) -> str:
        """The network between nodes and where its figure comes from: stated or assumed."""
        if self.inter_node_bytes_per_s is None:
            return (f"{a.inter_node_bytes_per_s * 8 / 1e9:,.0f} Gb/s Ethernet per node, "
                    "assumed (no fabric stated for this offer)")
        return self.inter_node_fabric or (
            f"{self.inter_node_bytes_per_s * 8 / 1e9:,.0f} Gb/s per node, as given")

    def __post_init__(self) -> None:
        if self.intra not in ("auto", "nvlink", "pcie"):
            raise UnsupportedError(f"unknown link inside a node {self.intra!r}: "
                                   "use auto, nvlink or pcie")
        if self.host_vcpus is not None and self.host_vcpus < 1:
            raise UnsupportedError(f"host vCPUs must be at least 1, got {self.host_vcpus}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """The links a job's GPUs talk over: ``intra`` is ``nvlink`` or ``pcie``."""

    intra: str
    intra_bytes_per_s: float
    inter_node_bytes_per_s: float
    gpus_per_node: int
    nodes: int
    intra_hop_latency_s: float = 0.0
    net_hop_latency_s: float = 0.0
    base_latency_s: float = 0.0

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    def ring_latency_s(self, *, all_reduce: bool) -> float:
        """Latency of one ring collective over all ranks, as NCCL models it: a base plus one
        hop per ring step, the steps that cross nodes at the network's hop latency."""
        ranks, nodes = self.ranks, self.nodes
        if ranks <= 1:
            return 0.0
        if all_reduce:
            steps, inter = 2 * (ranks - 1), (2 * nodes if nodes > 1 else 0)
        else:
            steps, inter = ranks - 1, nodes - 1
        return (self.base_latency_s + (steps - inter) * self.intra_hop_latency_s
                + inter * self.net_hop_latency_s)

    def ring_bytes_per_s(self) -> float:
        """Bus bandwidth of a ring over all ranks: the slowest hop."""
        if self.nodes <= 1:
            return self.intra_bytes_per_s
        per_gpu_inter = self.inter_node_bytes_per_s / self.gpus_per_node
        return min(self.intra_bytes_per_s, per_gpu_inter)


def node_fabric(*, interconnect: str | None, interconnect_bytes_per_s: float | None,
                pcie_gen: int | None, gpus_per_node: int, nodes: int, intra: str = "auto",
                inter_node_bytes_per_s: float | None = None,
                inter_node_latency_s: float | None = None,
                assumptions: ThroughputAssumptions) -> Fabric:
    """The fabric of a node of these GPUs; ``intra`` forces ``nvlink`` or ``pcie``.

    ``auto`` uses NVLink when the GPU has a switched NVLink (SXM/OAM: not a 2-GPU bridge) or
    when only 2 GPUs share a bridge; PCIe otherwise. NVLink datasheet figures count both
    directions, so one direction is half.
    """
    a = assumptions
    bridge_only = interconnect is not None and "bridge" in interconnect.lower()
    has_link = interconnect is not None and interconnect_bytes_per_s is not None
    if intra == "auto":
        intra = "nvlink" if has_link and (not bridge_only or gpus_per_node <= 2) else "pcie"
    pcie = a.pcie_bytes_per_s(pcie_gen) * a.pcie_efficiency
    if intra == "nvlink" and interconnect_bytes_per_s:
        link = interconnect_bytes_per_s / 2 * a.nvlink_efficiency
    else:
        intra, link = "pcie", pcie
    inter = (inter_node_bytes_per_s or a.inter_node_bytes_per_s) * a.inter_node_efficiency
    hops = dict(a.nccl_hop_latency_s)
    return Fabric(intra=intra, intra_bytes_per_s=max(link, pcie), inter_node_bytes_per_s=inter,
                  gpus_per_node=gpus_per_node, nodes=nodes, intra_hop_latency_s=hops[intra],
                  net_hop_latency_s=(inter_node_latency_s if inter_node_latency_s is not None
                                     else hops["net"]),
                  base_latency_s=a.nccl_base_latency_s)


def communication_per_step(*, sharding: str, ranks: int, grad_accum: int,
                           param_bytes: int, grad_bytes: int, passes_gathering: int = 2
                           ) -> Breakdown:
    """Bytes one rank sends per optimizer step (unit ``B``), term by term.

    ``param_bytes`` are all parameters in their compute dtype (gathered under ZeRO-3/FSDP),
    ``grad_bytes`` the trainable parameters' gradients as communicated. One rank: no traffic.
    """
    if ranks <= 1:
        return Breakdown("B", ())
    share = (ranks - 1) / ranks
    per_mb = grad_accum if sharding in PER_MICROBATCH_GRADS else 1
    terms: list[Term] = []
    if sharding in SHARDED_PARAMS:
        terms.append(Term(
            path="all-gather/params", value=passes_gathering * grad_accum * share * param_bytes,
            unit="B", formula="passes x grad_accum x (n-1)/n x param_bytes",
            inputs={"passes": passes_gathering, "grad_accum": grad_accum, "n": ranks,
                    "param_bytes": param_bytes},
            source="ZeRO-3/FSDP gather each layer's parameters in forward and in backward "
                   "(FSDP SHARD_GRAD_OP: once, before the forward)"))
    if sharding in ("ddp",):
        terms.append(Term(
            path="all-reduce/grads", value=2 * share * grad_bytes, unit="B",
            formula="2 x (n-1)/n x grad_bytes", inputs={"n": ranks, "grad_bytes": grad_bytes},
            source="ring all-reduce once per step (no_sync during accumulation)"))
    else:
        terms.append(Term(
            path="reduce-scatter/grads", value=per_mb * share * grad_bytes, unit="B",
            formula="reductions x (n-1)/n x grad_bytes",
            inputs={"reductions": per_mb, "n": ranks, "grad_bytes": grad_bytes},
            source="ZeRO-2/3 and FSDP reduce gradients every micro-batch; ZeRO-1 once a step"))
    if sharding in ("zero1", "zero2"):
        terms.append(Term(
            path="all-gather/updated-params", value=share * grad_bytes, unit="B",
            formula="(n-1)/n x trainable bytes", inputs={"n": ranks},
            source="each rank updates its shard, then the updated parameters are gathered"))
    return Breakdown("B", tuple(terms))


def collectives_per_step(*, sharding: str, ranks: int, grad_accum: int, num_layers: int,
                         passes_gathering: int = 2) -> int:
    """How many collectives one step launches (each pays a fixed latency)."""
    if ranks <= 1:
        return 0
    if sharding in SHARDED_PARAMS:
        return grad_accum * num_layers * (passes_gathering + 1)
    if sharding in PER_MICROBATCH_GRADS:
        return grad_accum * num_layers + num_layers
    return max(1, num_layers // 4)  # DDP: 25 MB buckets, about one per few blocks
