"""What a plan risks beyond its point estimate, in numbers and words: memory headroom, the
fabric its sharding leans on, weights streamed from host RAM, spot interruptions, and the
uncertainty range of its time (and so its cost).

Each risk is a fraction of the plan's cost that a person should expect to put at stake (a
crude but stated price): ``--objective risk`` ranks by ``cost x (1 + penalty)``, and every
objective's why-lines quote the reasons. Pure: reads a fitted candidate, the node's link, the
card's usable memory and the provider's spot notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from tuneplan.core.compute.unsloth import OFFLOAD_TERM as UNSLOTH_OFFLOAD_TERM
from tuneplan.core.job.strategy import Checkpointing, Offload, Precision, Sharding
from tuneplan.units import GB

if TYPE_CHECKING:  # the search imports this module's memory_penalty
    from tuneplan.core.planner.search import Candidate

#: Below this share of usable memory a peak is comfortable: the memory estimate's held-out
#: median |error| (``HELD_OUT_MEDIAN_ERROR``), allocator fragmentation and a long sample add
#: to a peak.
MEMORY_COMFORT = 0.80
#: The memory estimate's leave-one-source-out median |error|, a fraction (5.1 %), over the
#: 96 published peaks of ``benchmarks/calibration`` (``benchmarks/accuracy.py``, run
#: 2026-12-04; benchmarks/README.md).
HELD_OUT_MEDIAN_ERROR = 0.051
#: Penalty per unit of fill above ``MEMORY_COMFORT`` (0.28 at 94 % of usable): the chance
#: that an out-of-memory error at step N costs a restart and a smaller micro-batch.
MEMORY_PENALTY_SLOPE = 2.0
#: Share of the exposed PCIe all-gather / host-streaming time counted as risk: those rates
#: are assumptions (ring bandwidth, pinned host copies), and peer-to-peer over PCIe may be
#: disabled by the driver on consumer cards; half the time they take is what may go wrong.
LINK_RISK_SHARE = 0.5
#: A spot run without a notice long enough to save a checkpoint loses the work since the
#: last one at each interruption: the expected loss is priced in, its spread is not.
NO_NOTICE_PENALTY = 0.10
#: Training in fp16 with dynamic loss scaling (a card without BF16, or a job that asks for it):
#: overflowed steps are skipped while the scale settles, and a model pretrained in bf16 can
#: overflow fp16's range (max 65,504) in its activations, giving inf/NaN losses that
#: bf16's 8-bit exponent never sees. A stated price, like the others: a tenth of the cost
#: for the chance of restarts and a diverged run.
FP16_PENALTY = 0.10

@dataclass(frozen=True, slots=True, kw_only=True)
class Risk:
    """A plan's risks: each part a fraction of its cost (``penalty`` sums them)."""

    memory_fill: float             # whole-device peak / usable memory per GPU
    memory: float
    fabric: float
    fabric_gb_per_step: float      # sharding traffic per GPU per step over PCIe or across
                                   # nodes (GB, 10^9)
    fabric_share: float            # exposed share of the step spent on it
    streaming: float
    host_gb_per_step: float        # bytes moved host<->GPU per GPU per step (GB, 10^9)
    spot: float
    precision: float               # fp16 with loss scaling instead of bf16
    # The time figure's own range (``compute.confidence.TimeBasis``: calibrated or assumed),
    # as fractions of hours (and of compute cost): one range per plan, the same the time
    # line prints. Its upper end is what is at stake.
    time_range: tuple[float, float]
    time_error_source: str
    reasons: tuple[str, ...]

    @property
    def time_error(self) -> float:
        """The part of the cost at stake from the time estimate: its range's upper end."""
        return max(0.0, self.time_range[1])

    @property
    def penalty(self) -> float:
        """The fraction of cost at stake beyond the estimate (the time range's upper end
        included)."""
        return (self.memory + self.fabric + self.streaming + self.spot + self.precision
                + self.time_error)

    def adjusted(self, cost: Decimal) -> Decimal:
        """``cost`` with the risks priced in: what ``--objective risk`` ranks by."""
        if not cost.is_finite():
            return cost
        return cost * (1 + Decimal(str(round(self.penalty, 4))))

    def hours_range(self, hours: float) -> tuple[float, float]:
        low, high = self.time_range
        return hours * (1 + low), hours * (1 + high)

    def as_dict(self) -> dict[str, object]:
        return {"penalty": round(self.penalty, 4), "memory_fill": round(self.memory_fill, 4),
                "memory": round(self.memory, 4), "fabric": round(self.fabric, 4),
                "fabric_gb_per_step": round(self.fabric_gb_per_step, 3),
                "fabric_share_of_step": round(self.fabric_share, 4),
                "streaming": round(self.streaming, 4),
                "host_gb_per_step": round(self.host_gb_per_step, 3),
                "spot": round(self.spot, 4), "precision": round(self.precision, 4),
                "time_error": self.time_error,
                "time_range_pct": [round(100 * self.time_range[0], 1),
                                   round(100 * self.time_range[1], 1)],
                "time_error_source": self.time_error_source, "reasons": list(self.reasons)}


def memory_penalty(fill: float) -> float:
    """The memory part of a plan's risk at ``fill`` = whole-device peak / usable memory."""
    return max(0.0, fill - MEMORY_COMFORT) * MEMORY_PENALTY_SLOPE


#: The step model's term for weights streamed from host RAM (``compute.step.offload_term``):
#: its value is the copy time not hidden behind compute, its ``bytes`` input what it moves.
PARAM_OFFLOAD_TERM = "micro-batch/param-offload-exposed"
#: The planner's term for a paged optimizer's paging (``search.with_paging``).
PAGED_TERM = "step/paged-optimizer"


def checkpoint_offload(c: Candidate) -> tuple[float, float]:
    """(bytes, copy seconds) per GPU per optimizer step of Unsloth's offloaded activation
    checkpoints over the host link, as the step model's term counts them (``compute.unsloth.
    offload_term``: each offloaded layer input down and back up per micro-batch; its
    ``bytes`` input is one micro-batch's); (0, 0) without them."""
    term = c.throughput.step.get(UNSLOTH_OFFLOAD_TERM)
    if term is None:
        return 0.0, 0.0
    inputs = term.inputs
    accum = float(inputs.get("grad_accum", 1))
    copies = 2 * float(inputs.get("offloaded_layers", 0))
    return (float(inputs.get("bytes", 0.0)) * accum,
            copies * float(inputs.get("copy_s_per_layer", 0.0)) * accum)


def offload_bytes_per_step(c: Candidate) -> float:
    """Bytes per GPU per optimizer step of the offloaded training state: the weights streamed
    each pass under ``--offload optimizer+params`` (the step model's own term), under
    optimizer offload bf16 gradients down and updated bf16 weights up once per step, or a
    paged optimizer's paged-out state in and out."""
    s = c.strategy
    if s.offload is Offload.OPTIMIZER_PARAMS:
        term = c.throughput.step.get(PARAM_OFFLOAD_TERM)
        if term is not None:
            inputs = term.inputs
            return float(inputs.get("bytes", 0.0)) * float(inputs.get("grad_accum", 1))
    if s.offload is not Offload.NONE:
        return 2.0 * 2 * c.memory.trainable_params / s.world_size
    # a paged optimizer's paged-out state: back in for the update, out again (``search.
    # with_paging``)
    return 2.0 * c.paged_out_bytes


def assess(c: Candidate, *, link: str, capacity_bytes: int, on_spot: bool,
           spot_extra: float, spot_notice: bool) -> Risk:
    """The risks of candidate ``c`` on a node whose GPUs talk over ``link`` (``costing.
    node_link``'s words), with ``capacity_bytes`` usable per card; ``spot_extra`` is spot's
    expected wall time over on-demand's, as a fraction (0 when the plan runs on-demand)."""
    s, t = c.strategy, c.throughput
    reasons: list[str] = []
    fill = c.device_total_bytes / capacity_bytes if capacity_bytes else 1.0
    memory = memory_penalty(fill)
    if memory > 0:
        reasons.append(f"memory at {fill:.0%} of usable: little headroom for fragmentation "
                       "or a longer sample (the estimate's held-out median error is "
                       f"{HELD_OUT_MEDIAN_ERROR * 100:.1f} %)")
    step_s = t.step_seconds or 1.0
    fabric = gb = share = 0.0
    over = "PCIe" if link == "pcie" else "the inter-node fabric" if s.nodes > 1 else None
    if over and s.world_size > 1 and s.sharding in (
            Sharding.ZERO3, Sharding.FSDP, Sharding.HYBRID):
        exposed = t.step.get("step/communication-exposed")
        exposed_s = float(exposed.value) if exposed is not None else t.comm_seconds_per_step
        gb = t.comm_bytes_per_step_per_gpu / GB
        share = exposed_s / step_s
        fabric = share * LINK_RISK_SHARE
        hidden = ("all of it hidden behind compute in the estimate" if exposed_s < 0.05
                  else f"{exposed_s:.1f} s of the {step_s:.1f} s step not hidden ({share:.0%})")
        reasons.append(f"{s.sharding.value} all-gathers {gb:,.1f} GB per GPU per step over "
                       f"{over}: {t.comm_seconds_per_step:.1f} s of traffic, {hidden}")
    ckpt_bytes, ckpt_s = checkpoint_offload(c)
    offload = offload_bytes_per_step(c)
    streaming = 0.0
    paging = t.step.get(PAGED_TERM)
    if offload and paging is not None:
        paged_s = float(paging.value)
        streaming = min(1.0, paged_s / step_s) * LINK_RISK_SHARE
        reasons.append(f"paged optimizer state to and from host RAM: {offload / GB:,.1f} GB "
                       f"per GPU per step, {paged_s:.1f} s of the {step_s:.1f} s step (the "
                       "driver's eviction rate is an assumption; a spike pages more out "
                       "instead of running out of memory)")
    elif offload:
        term = t.step.get(PARAM_OFFLOAD_TERM)
        moved_s = float(term.value) if term is not None else 0.0  # the part not hidden
        # At stake is the whole copy time, not only the part the estimate leaves exposed:
        # the prefetch overlap it assumes is what fails first (pinned host memory, PCIe
        # shared by the node's GPUs), so the penalty follows the traffic's share of the step.
        copy_s = float(term.inputs.get("copy_s", moved_s)) if term is not None else 0.0
        streaming = min(1.0, copy_s / step_s) * LINK_RISK_SHARE
        what = ("weights streamed from host RAM every forward and backward pass"
                if s.offload is Offload.OPTIMIZER_PARAMS
                else "gradients to host and updated weights back (optimizer on the CPU)")
        reasons.append(f"{what}: {offload / GB:,.1f} GB per GPU per step over PCIe"
                       + (f", {moved_s:.1f} s of the {step_s:.1f} s step" if moved_s else ""))
    if ckpt_bytes:
        # as for streamed weights, the whole copy time is at stake: the side-stream overlap
        # the estimate assumes is what fails first (pinned buffers, a shared PCIe switch)
        streaming += min(1.0, ckpt_s / step_s) * LINK_RISK_SHARE
        exposed = t.step.get(UNSLOTH_OFFLOAD_TERM)
        shown = float(exposed.value) if exposed is not None else 0.0
        reasons.append(f"activation checkpoints offloaded to host RAM (Unsloth): "
                       f"{ckpt_bytes / GB:,.1f} GB per GPU per step over PCIe, {ckpt_s:.1f} s "
                       f"of copies in the {step_s:.1f} s step, {shown:.1f} s of them not "
                       "hidden by its side stream")
    elif s.checkpointing is Checkpointing.OFFLOAD:
        reasons.append("activation checkpoints kept in host RAM: their copies are assumed "
                       "hidden behind compute")
    spot = 0.0
    if on_spot:
        spot = max(0.0, spot_extra) * LINK_RISK_SHARE + (0.0 if spot_notice
                                                          else NO_NOTICE_PENALTY)
        reasons.append(f"spot: interruptions add {spot_extra:.0%} wall time in expectation"
                       + ("" if spot_notice else
                          "; no notice long enough to write a checkpoint, so each one "
                          "loses the work since the last"))
    precision = 0.0
    if s.precision is Precision.FP16_MIXED:
        precision = FP16_PENALTY
        reasons.append("fp16 with dynamic loss scaling, not bf16: steps skipped on overflow, "
                       "and a bf16-pretrained model may overflow fp16 activations")
    basis = t.time_basis
    return Risk(memory_fill=fill, memory=memory, fabric=fabric, fabric_gb_per_step=gb,
                fabric_share=share, streaming=streaming,
                host_gb_per_step=(offload + ckpt_bytes) / GB, spot=spot,
                precision=precision, time_range=basis.error_range,
                time_error_source=f"{basis.basis}: {basis.source}",
                reasons=tuple(reasons))
