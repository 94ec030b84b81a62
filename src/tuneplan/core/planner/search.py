"""The planner's strategy search on one kind of node: which settings fit, and how fast they run.

``StrategySearch`` enumerates, for a GPU type, GPUs per node and node count, the methods,
checkpointing, sharding and offload, finds the largest micro-batch that fits by bisection, and
keeps the fastest strategy per method (under ``--objective risk`` the fastest once its memory
risk is priced in, half the largest micro-batch tried too). Where the job's own settings fit
nothing, the lean settings an engineer reaches for are tried in turn (``lean_settings``:
chunked loss, 8-bit AdamW, the same paged, activation offload), then optimizer/parameter
offload. A paged optimizer's state may wait in host RAM when the peak passes the card
(``pageable_bytes``): such a candidate keeps the card at its limit and pays for the paging
in its step time (``with_paging``). A field the
person fixed (``fixed``: micro-batch, sharding, offload, checkpointing, precision, loss,
optimizer) is not searched: every candidate keeps its value, so a plan never silently changes
what was asked for. Memory estimates are cached by (strategy, GPU generation) so offers that
share a GPU share the work. Pure: no catalog, prices or I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import NodeLinks
from tuneplan.core.compute.throughput import (
    ModelShape,
    Throughput,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
from tuneplan.core.memory.overheads import reserve_term, workspace_term
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.caveats import card_problem, precision_on
from tuneplan.core.planner.risk import PAGED_TERM, memory_penalty
from tuneplan.errors import TuneplanError
from tuneplan.explain import Breakdown, Term

AUTO_METHODS = (Method.FULL, Method.LORA, Method.QLORA)
#: Sharding tried on several GPUs, cheapest communication first (ties keep the earlier one).
MULTI_GPU_SHARDING = (Sharding.DDP, Sharding.ZERO2, Sharding.FSDP, Sharding.ZERO3)


def _ddp_twin(family: Strategy) -> Strategy:
    if family.sharding is Sharding.DDP and family.world_size > 1 and (
            family.offload is Offload.NONE and family.checkpointing is not Checkpointing.OFFLOAD):
        return replace(family, gpus=2, nodes=1)
    return family


def host_ram(est: MemoryEstimate, strategy: Strategy) -> int:
    """Host RAM per node of ``strategy`` from an estimate made for its DDP twin: under DDP
    every host term is per local rank (``core.memory.steady.host_terms``)."""
    if est.strategy.gpus == strategy.gpus:
        return est.host_ram_bytes
    return est.host_ram_bytes * strategy.gpus // est.strategy.gpus


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """Largest n in [low, high] with ``fits(n)``, assuming fits is monotone (true then false);
    ``low - 1`` when even ``low`` does not fit. Bisection: about log2(high - low) calls."""
    if not fits(low):
        return low - 1
    good, bad = low, high + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a strategy, node or offer has no candidate: a typed result (the search tries
    thousands of settings and most refusals are expected, so they are values, not raised)."""

    reason: str
    # What refused it: ``estimate`` (the model or strategy cannot be estimated), ``memory``
    # (nothing fits the card), ``hardware`` (the card or node cannot run the job as asked),
    # ``host-ram`` (offloading needs more host RAM than the instance has), ``gpu-spec``.
    kind: str = "estimate"


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """The hardware a strategy runs on: GPU type, GPUs per node, nodes, links."""

    gpu: GpuSpec
    gpus_per_node: int
    capacity_bytes: int
    intra_link: str = "auto"                 # "auto", "nvlink" or "pcie" (compute's words)
    nodes: int = 1
    inter_node_bytes_per_s: float | None = None
    host_vcpus: int | None = None            # per node, as the offer states (CPU optimizer)
    inter_node_fabric: str | None = None     # the stated fabric in words (None: assumed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One strategy that fits a node, with its memory and speed."""

    strategy: Strategy
    memory: MemoryEstimate           # generation-neutral unless ``exact`` (see device_total);
                                     # made for a DDP twin when not exact (see at_batch)
    device_total_bytes: int          # per GPU on this node's GPU generation
    host_ram_bytes: int              # per node, for this strategy's GPUs per node
    throughput: Throughput
    exact: bool = False
    # per GPU: the paged optimizer state that does not fit beside the rest at the peak and
    # lives in host RAM (``paged_spill``); 0 unless the optimizer is a paged one
    paged_out_bytes: int = 0


@dataclass(slots=True)
class SearchOutcome:
    """Per method: the fastest fitting candidate, or the smallest need seen when none fits."""

    best: dict[Method, Candidate] = field(default_factory=dict)
    smallest_need_bytes: int | None = None
    refusals: list[str] = field(default_factory=list)


#: Share of a card's usable memory (its CUDA-visible total, ``GpuSpec.usable_memory_bytes``,
#: not the nominal size) a plan may fill with its whole-device peak: 5 % stays free for
#: allocator fragmentation and transient spikes the estimate does not see. The planner's
#: ``PlanAssumptions.memory_margin``, ``tuneplan fit`` and ``memory --gpu`` start from it.
DEFAULT_MEMORY_MARGIN = 0.95


def memory_limit(capacity_bytes: int, margin: float = DEFAULT_MEMORY_MARGIN) -> int:
    """What a whole-device peak may reach on a card whose usable (CUDA-visible) total is
    ``capacity_bytes``: capacity x margin, rounded down. The planner, ``fit``, ``memory --gpu``
    and the plan JSON all compare with this one number."""
    return int(capacity_bytes * margin)


def pageable_bytes(est: MemoryEstimate) -> int:
    """Bytes of ``est``'s device total that may leave the card instead of running out of
    memory: a bitsandbytes paged optimizer's state. bitsandbytes (0.50,
    ``optim/optimizer.py`` ``get_state_buffer``; ``functional.py`` ``get_paged``) allocates
    the state of every tensor of 1e5 elements or more with ``cudaMallocManaged`` (CUDA unified
    memory, outside torch's allocator: ``core.memory.steady`` counts it outside the
    allocator) and prefetches each one back to the GPU (``cudaMemPrefetchAsync``) just before
    its update; under memory pressure the CUDA driver evicts those pages to host RAM rather
    than failing an allocation. The smaller tensors' state and the rest of the step stay on
    the card: the memory model keeps the two apart (``optimizer/paged_states`` outside the
    allocator, ``optimizer/states`` the small tensors' resident state), and only the first
    may leave."""
    if not est.strategy.optimizer.is_paged:
        return 0
    term = est.breakdown.get("optimizer/paged_states")
    return int(term.value) if term is not None else 0


def paged_spill(device_total: int, pageable: int, limit: int) -> int:
    """Bytes per GPU of paged optimizer state living in host RAM when the step's peak
    (``device_total``, the paged state included) passes ``limit``: what does not fit, at most
    the pageable state (more would not fit at all)."""
    return min(pageable, max(0, device_total - limit))


def on_card_bytes(est: MemoryEstimate, limit: int, total: int | None = None) -> int:
    """What of ``est``'s whole-device peak (``total``, default its own) stays on the card
    under ``limit``: all of it, less a paged optimizer's state that waits in host RAM
    (``paged_spill``). The job fits exactly when this is within the limit; the planner and
    ``tuneplan fit`` both compare it. Where loading peaks higher (``est.loading_peak_bytes``),
    that peak instead."""
    total = est.device_total_bytes if total is None else total
    step = total - paged_spill(total, pageable_bytes(est), limit)
    if not est.loading_peak_bytes:
        return step
    # loading (a QLoRA model quantised and prepared before the first step) must fit too; on
    # another GPU generation it moves by what the step's total moved (the CUDA context; the
    # cuBLAS workspace it does not hold is within a few MiB of reserve)
    return max(step, est.loading_peak_bytes + total - est.device_total_bytes)


def paging_seconds(spill: int, a: ThroughputAssumptions) -> float:
    """Seconds per optimizer step that ``spill`` bytes of paged state cost: paged back in for
    the update and evicted again when forward and backward need the room, twice over the
    GPU's host link (``ThroughputAssumptions.host_link_bytes_per_s``, the rate offloaded
    states move at). Driver-driven eviction can be slower than this bulk copy: low
    confidence."""
    return 2 * spill / a.host_link_bytes_per_s


def with_paging(t: Throughput, spill: int, a: ThroughputAssumptions) -> Throughput:
    """``t`` with the paging of ``spill`` bytes per GPU added to every optimizer step (a step
    term of its own, ``step/paged-optimizer``); time-derived figures follow."""
    extra = paging_seconds(spill, a)
    if extra <= 0:
        return t
    step_s = t.step_seconds + extra
    scale = t.step_seconds / step_s
    term = Term(path=PAGED_TERM, value=extra, unit="s",
                formula="2 x paged-out optimizer state / host link",
                inputs={"paged_out_bytes": spill,
                        "host_link_bytes_per_s": a.host_link_bytes_per_s},
                source="bitsandbytes paged optimizer: CUDA managed memory evicted to host "
                       "under pressure, prefetched back before each update (low confidence)")
    return replace(t, step_seconds=step_s, tokens_per_second=t.tokens_per_second * scale,
                   tokens_per_second_per_gpu=t.tokens_per_second_per_gpu * scale,
                   mfu=t.mfu * scale, hours=None if t.hours is None else t.hours / scale,
                   step=Breakdown(t.step.unit, (*t.step.terms, term)),
                   notes=(*t.notes, f"paged optimizer: {spill / 1e9:.1f} GB per GPU of its "
                                    "state lives in host RAM at the peak"))


@dataclass(slots=True)
class StrategySearch:
    """Cached search over strategies for one model and job (shared across all offers)."""

    model: ModelSpec
    base: Strategy
    tokens: int | None
    epochs: float
    avg_tokens: int | None = None
    margin: float = DEFAULT_MEMORY_MARGIN
    max_micro_batch_log2: int = 6
    memory_assumptions: MemoryAssumptions = field(default_factory=MemoryAssumptions)
    throughput_assumptions: ThroughputAssumptions = field(default_factory=ThroughputAssumptions)
    fixed: frozenset[str] = frozenset()   # Strategy fields kept as ``base`` has them
    # --objective risk: a micro-batch below the largest that fits is tried too, and the kept
    # candidate trades speed against memory headroom (``_merit``)
    headroom: bool = False
    _memory: dict[tuple[Strategy, str | None], MemoryEstimate | Refused] = field(
        default_factory=dict)
    _batches: dict[tuple[Strategy, int], MemoryEstimate | Refused] = field(default_factory=dict)
    _speed: dict[tuple[object, ...], Throughput | Refused] = field(default_factory=dict)
    _nodes: dict[Node, SearchOutcome] = field(default_factory=dict)
    _twins: dict[Strategy, Strategy] = field(default_factory=dict)
    _workspace: dict[str | None, int] = field(default_factory=dict)
    memory_calls: int = 0
    _shape: ModelShape | None = None

    def __post_init__(self) -> None:
        self._shape = model_shape_from_spec(self.model)

    def methods(self) -> tuple[Method, ...]:
        return AUTO_METHODS if self.base.method is Method.AUTO else (self.base.method,)

    def memory(self, strategy: Strategy, generation: str | None) -> MemoryEstimate | Refused:
        """Cached estimate, or why it is refused."""
        key = (strategy, generation)
        found = self._memory.get(key)
        if found is None:
            self.memory_calls += 1
            try:
                found = estimate_memory(self.model, strategy, self.memory_assumptions,
                                        generation=generation)
            except TuneplanError as exc:
                found = Refused(str(exc))
            self._memory[key] = found
        return found

    def at_batch(self, family: Strategy, batch: int) -> MemoryEstimate | Refused:
        """The generation-neutral estimate of ``family`` at micro-batch ``batch`` (cached).

        DDP replicates everything, so its per-GPU memory is the same on 2 or 16 GPUs: all
        DDP families share the 2-GPU estimate (host RAM, which grows with the ranks of a
        node, is rescaled by ``host_ram``)."""
        twin = self._twins.get(family)
        if twin is None:
            twin = self._twins[family] = _ddp_twin(family)
        key = (twin, batch)
        found = self._batches.get(key)
        if found is None:
            found = self.memory(replace(key[0], batch_size=batch), None)
            self._batches[key] = found
        return found

    def device_total(self, est: MemoryEstimate, generation: str) -> int:
        """``est.device_total_bytes`` as it would be on ``generation``, without re-estimating:
        only the cuBLAS workspace (inside the allocated peak, so the reserve follows) and the
        CUDA context depend on the GPU generation (``core.memory.overheads``)."""
        a = self.memory_assumptions
        allocated = (est.allocated_peak_bytes - self._workspace_bytes(None)
                     + self._workspace_bytes(generation))
        reserved = allocated + int(reserve_term(allocated, a).value)
        context = a.context_bytes(generation) - a.context_bytes(None)
        return est.device_total_bytes - est.reserved_peak_bytes + reserved + context

    def _workspace_bytes(self, generation: str | None) -> int:
        found = self._workspace.get(generation)
        if found is None:
            found = self._workspace[generation] = int(
                workspace_term(generation, self.memory_assumptions).value)
        return found

    def speed(self, strategy: Strategy, node: Node) -> Throughput | Refused:
        key = (strategy, node.gpu.name, node.intra_link, node.inter_node_bytes_per_s,
               node.inter_node_fabric,
               node.host_vcpus if strategy.offload is not Offload.NONE else None)
        found = self._speed.get(key)
        if found is None:
            try:
                links = NodeLinks(intra=node.intra_link,
                                  inter_node_bytes_per_s=node.inter_node_bytes_per_s,
                                  inter_node_fabric=node.inter_node_fabric,
                                  host_vcpus=node.host_vcpus)
                assert self._shape is not None
                found = estimate_throughput(self._shape, strategy, node.gpu,
                                            avg_tokens=self.avg_tokens, links=links,
                                            assumptions=self.throughput_assumptions,
                                            tokens=self.tokens, epochs=self.epochs)
            except TuneplanError as exc:
                found = Refused(str(exc))
            self._speed[key] = found
        return found

    def search(self, node: Node) -> SearchOutcome:
        """The fastest fitting strategy per method on ``node`` (cached per node)."""
        found = self._nodes.get(node)
        if found is None:
            found = self._search(node)
            self._nodes[node] = found
        return found

    def _search(self, node: Node) -> SearchOutcome:
        out = SearchOutcome()
        limit = memory_limit(node.capacity_bytes, self.margin)
        generation = node.gpu.generation
        for method in self.methods():
            if method is Method.QLORA and Method.LORA in out.best:
                continue  # where LoRA fits it is faster, hence cheaper: QLoRA cannot win
            fitted: list[Candidate] = []
            leans = self.lean_settings(method, node.gpu)
            for lean in leans:
                more = self._fit_method(method, node, limit, generation, out, offload=False,
                                        lean=lean)
                if more and "batch_size" in self.fixed:
                    fitted += more
                    break
                if fitted:
                    fitted += more
                    if lean.get("optimizer") is Optimizer.PAGED_ADAMW8BIT or (
                            node.nodes > 1 and self._comm_bound(fitted, node)):
                        continue  # the 8-bit step's paged twin, or still starved: go on
                    break
                fitted = more
                # A fit only at micro-batch 1 is tight: the next lean step is tried too, as
                # it may fit a larger, faster micro-batch (the faster of them is kept).
                if fitted and max(c.strategy.batch_size for c in fitted) > 1 and not (
                        node.nodes > 1 and self._comm_bound(fitted, node)):
                    break
            starved = bool(fitted) and node.nodes > 1 and self._comm_bound(fitted, node)
            if (not fitted or starved) and node.gpus_per_node * node.nodes > 1 and (
                    "offload" not in self.fixed):
                # DeepSpeed's CPU Adam replaces the optimizer: offload keeps the job's own
                # optimizer and checkpoints; the chunked loss is tried when it alone fails.
                # Across nodes, a fit still bound by its collectives tries it too (the
                # memory it frees is a larger micro-batch); the faster is kept.
                chunked = {k: v for k, v in leans[-1].items() if k == "loss"}
                for lean in ({}, chunked) if chunked else ({},):
                    more = self._fit_method(method, node, limit, generation, out,
                                            offload=True, lean=lean)
                    fitted += more
                    if more:
                        break
            if fitted:
                out.best[method] = max(fitted, key=lambda c: self._merit(c, node))
        return out

    def _comm_bound(self, fitted: list[Candidate], node: Node) -> bool:
        """The best of ``fitted`` leaves collectives exposed: across nodes, ZeRO-3/FSDP
        gathers the weights once per micro-batch, a fixed number of bytes, so the memory a
        lean step frees (a larger micro-batch, more compute to hide them behind) is what
        amortises them; the lean steps go on (the faster fit is kept)."""
        best = max(fitted, key=lambda c: self._merit(c, node)).throughput
        exposed = best.step.get("step/communication-exposed")
        return exposed is not None and float(exposed.value) > 0

    def _merit(self, c: Candidate, node: Node) -> float:
        """What picks the candidate kept per method: tokens/s; with ``headroom`` (``--objective
        risk``), tokens/s discounted by the memory risk (``risk.memory_penalty``)."""
        speed = c.throughput.tokens_per_second
        if not self.headroom:
            return speed
        return speed / (1 + memory_penalty(c.device_total_bytes / node.capacity_bytes))

    def lean_settings(self, method: Method, gpu: GpuSpec) -> list[dict[str, object]]:
        """The settings an engineer reaches for, in turn, when the job's own do not fit,
        each step keeping the ones before: a chunked loss (same numerics, the logits never
        whole), an 8-bit AdamW for full fine-tuning (where bitsandbytes runs on the card),
        the same 8-bit AdamW paged (``pageable_bytes``; not where ``--offload none`` is fixed:
        its paged-out state would sit in host RAM), activation checkpoints in host RAM. Only
        fields left free (``fixed``) change; the first entry is the job's own settings."""
        base, fixed = self.base, self.fixed
        out: list[dict[str, object]] = [{}]
        step: dict[str, object] = {}
        if ("loss" not in fixed and base.loss is not Loss.CHUNKED
                and base.task is Task.CAUSAL_LM and base.recipe is Recipe.HF):
            step = {**step, "loss": Loss.CHUNKED}
            out.append(step)
        if (method is Method.FULL and "optimizer" not in fixed
                and base.optimizer is Optimizer.ADAMW):
            probe = replace(base, method=method, optimizer=Optimizer.ADAMW8BIT)
            if card_problem(probe, gpu) is None:
                step = {**step, "optimizer": Optimizer.ADAMW8BIT}
                out.append(step)
                # the same state, paged: what does not fit at the peak waits in host RAM
                # (``pageable_bytes``) at a paging cost per step; a step of its own, not
                # carried into the next (offloaded checkpoints keep the plain 8-bit AdamW);
                # a fixed ``--offload none`` keeps the optimizer state on the card
                if not ("offload" in fixed and base.offload is Offload.NONE):
                    out.append({**step, "optimizer": Optimizer.PAGED_ADAMW8BIT})
        if "checkpointing" not in fixed and base.checkpointing is Checkpointing.FULL:
            out.append({**step, "checkpointing": Checkpointing.OFFLOAD})
        return out

    def exact(self, candidate: Candidate, gpu: GpuSpec) -> Candidate:
        """The candidate with its memory estimated for ``gpu``'s generation."""
        if candidate.exact:
            return candidate
        found = self.memory(candidate.strategy, gpu.generation)
        if isinstance(found, Refused):
            return candidate
        if candidate.paged_out_bytes:
            # what is on the card stays at the limit; the paged-out state takes the difference
            spill = max(0, found.device_total_bytes - candidate.device_total_bytes)
            per_node = spill * candidate.strategy.gpus
            return replace(candidate, memory=found, paged_out_bytes=spill, exact=True,
                           host_ram_bytes=host_ram(found, candidate.strategy) + per_node)
        return replace(candidate, memory=found, device_total_bytes=found.peak_bytes,
                       host_ram_bytes=found.host_ram_bytes, exact=True)

    def _fit_method(self, method: Method, node: Node, limit: int, generation: str,
                    out: SearchOutcome, *, offload: bool,
                    lean: Mapping[str, object] | None = None) -> list[Candidate]:
        """Fitting candidates over sharding x offload x checkpointing, pruned where a choice
        cannot win: heavier sharding once a lighter one reaches the largest micro-batch (more
        traffic, no larger batch); ZeRO-3 unless FSDP is refused (same traffic, more memory);
        parameter offload where optimizer offload fits. Running without checkpointing is always
        tried when checkpointing fits: a smaller micro-batch without recompute is often faster."""
        fitted: list[Candidate] = []
        top = 2**self.max_micro_batch_log2
        fsdp_refused = False
        free_sharding = "sharding" not in self.fixed
        for family in self.families(method, node, offload=offload, lean=lean):
            if (free_sharding and family.sharding is Sharding.ZERO3 and not offload
                    and not fsdp_refused):
                continue  # ZeRO-3 needs more memory than FSDP for the same traffic
            if offload and fitted and family.offload is Offload.OPTIMIZER_PARAMS:
                break
            got = self._fit_family(family, node, limit, generation, out)
            if family.sharding is Sharding.FSDP:
                fsdp_refused = isinstance(self.at_batch(family, 1), Refused)
            if not got:
                continue
            fitted += got
            if "checkpointing" not in self.fixed and family.checkpointing is not (
                    Checkpointing.NONE):
                fitted += self._fit_family(replace(family, checkpointing=Checkpointing.NONE),
                                           node, limit, generation, out)
            if got[0].strategy.batch_size >= top and "batch_size" not in self.fixed:
                break
        return fitted

    def families(self, method: Method, node: Node, *, offload: bool,
                 lean: Mapping[str, object] | None = None) -> Iterable[Strategy]:
        """Strategies at micro-batch 1 (the fixed one, when given) with checkpointing (the
        fixed setting, when given), for every sharding / offload left free; ``lean`` (one of
        ``lean_settings``) overrides free fields of the job's strategy."""
        world = node.gpus_per_node * node.nodes
        base, fixed = self.base, self.fixed
        if lean:
            base = replace(base, **lean)  # type: ignore[arg-type]
        if "offload" in fixed and base.offload is not Offload.NONE:
            # Offloading needs a ZeRO or FSDP sharding, on one GPU too (core.memory.refusals).
            shardings: tuple[Sharding, ...] = (Sharding.ZERO2, Sharding.FSDP, Sharding.ZERO3)
        else:
            shardings = MULTI_GPU_SHARDING if world > 1 else (Sharding.DDP,)
        if "sharding" in fixed:
            shardings = (base.sharding,)
        if "offload" in fixed:
            choices = [(s, base.offload) for s in shardings]
        elif offload:
            on = (base.sharding,) if "sharding" in fixed else (Sharding.ZERO3,)
            choices = [(s, off) for off in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS)
                       for s in on]
        else:
            choices = [(s, Offload.NONE) for s in shardings]
        batch = base.batch_size if "batch_size" in fixed else 1
        # offloaded checkpoints (the unsloth recipe's own, or a job file's) stay offloaded
        checkpointing = base.checkpointing if "checkpointing" in fixed or (
            base.checkpointing is Checkpointing.OFFLOAD) else Checkpointing.FULL
        for sharding, off in choices:
            yield replace(base, method=method, batch_size=batch, gpus=node.gpus_per_node,
                          nodes=node.nodes, sharding=sharding, offload=off,
                          checkpointing=checkpointing)

    def _precision_for(self, strategy: Strategy, gpu: GpuSpec) -> Strategy:
        """The precision ``gpu`` trains in (``caveats.precision_on``: no BF16 -> fp16 with loss
        scaling; same bytes, so the memory search done in bf16 holds). A fixed precision is
        kept (the planner refuses such a card)."""
        if "precision" in self.fixed:
            return strategy
        chosen = precision_on(gpu, strategy.precision).chosen
        return strategy if chosen is strategy.precision else replace(strategy, precision=chosen)

    def _fit_family(self, family: Strategy, node: Node, limit: int, generation: str,
                    out: SearchOutcome) -> list[Candidate]:
        def fits(log2: int) -> bool:
            est = self.at_batch(family, 2**log2)
            return not isinstance(est, Refused) and on_card_bytes(
                est, limit, self.device_total(est, generation)) <= limit

        # A fixed micro-batch is the only one tried; else 1, 2, 4 ... by bisection.
        fixed_batch = "batch_size" in self.fixed
        first = self.at_batch(family, family.batch_size if fixed_batch else 1)
        if isinstance(first, Refused):
            out.refusals.append(first.reason)
            return []
        # a paged optimizer's state may wait in host RAM: only the rest must fit
        need = self.device_total(first, generation) - pageable_bytes(first)
        if need > limit:
            if out.smallest_need_bytes is None or need < out.smallest_need_bytes:
                out.smallest_need_bytes = need
            return []
        batch = family.batch_size if fixed_batch else 2**largest_fitting(
            fits, 0, self.max_micro_batch_log2)
        batches = [batch] + ([batch // 2] if self.headroom and batch > 1 else [])
        kept: list[Candidate] = []
        for size in batches:
            est = self.at_batch(family, size)
            assert not isinstance(est, Refused)
            strategy = self._precision_for(replace(family, batch_size=size), node.gpu)
            found = evaluate_strategy(self, node, strategy, memory=est)
            if isinstance(found, Refused):
                out.refusals.append(found.reason)
                return kept
            kept.append(found)
        return kept


def evaluate_strategy(search: StrategySearch, node: Node, strategy: Strategy, *,
                      memory: MemoryEstimate | None = None) -> Candidate | Refused:
    """``strategy`` as a Candidate on ``node``: its generation-neutral memory (``at_batch``,
    unless ``memory`` is given), per-GPU total on the node's GPU, host RAM and speed; or the
    one-line reason it is refused. Does not check that it fits: the search does that, and
    ``tuneplan cost`` prices a given strategy with this same function, so a plan and its
    re-pricing are equal by construction."""
    est = memory if memory is not None else search.at_batch(
        replace(strategy, batch_size=1), strategy.batch_size)
    if isinstance(est, Refused):
        return est
    speed = search.speed(strategy, node)
    if isinstance(speed, Refused):
        return speed
    total = search.device_total(est, node.gpu.generation)
    limit = memory_limit(node.capacity_bytes, search.margin)
    spill = paged_spill(total, pageable_bytes(est), limit)
    # the binding peak on the card: the step's less its paged spill, or loading's if higher
    return Candidate(strategy=strategy, memory=est, paged_out_bytes=spill,
                     throughput=with_paging(speed, spill, search.throughput_assumptions),
                     device_total_bytes=on_card_bytes(est, limit, total),
                     host_ram_bytes=host_ram(est, strategy) + spill * strategy.gpus)
