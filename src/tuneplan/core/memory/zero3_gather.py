"""ZeRO-3's gathered parameters: DeepSpeed's fetch / prefetch / release rules replayed on the
submodule trace of one training step (deepspeed 0.19.8).

DeepSpeed 0.19.8 ``runtime/zero/partitioned_param_coordinator.py``
(``PartitionedParameterCoordinator``), driven by the module hooks of ``parameter_offload.py``
(``_register_deepspeed_module``: a pre-forward / post-forward hook on every module, a
pre-backward / post-backward function on its outputs / inputs):

- ``fetch_sub_module``: the submodule's *own* parameters (``iter_params(module,
  recurse=False)``: an ``nn.Linear``'s weight; transformers 5's fused experts module holds the
  3-D ``gate_up_proj`` and ``down_proj`` of all its experts) are all-gathered, then, once the
  first step has recorded the trace, parameters are popped off the trace queue and gathered
  ahead while fewer than ``min(max_live_parameters - n_available_params,
  prefetch_bucket_size)`` elements have been (the one popped last may overshoot; nothing is
  prefetched while more than ``max_live_parameters`` are gathered).
- ``release_sub_module`` / ``__params_to_release``: after the module's forward (or backward),
  its parameters are partitioned again unless they are persistent (``ds_persist``: at most
  ``param_persistence_threshold`` elements, ``parameter_offload.mark_persistent_parameters``;
  gathered once, never released), the prefetcher has already scanned past a later use, or they
  are used again by a module within the next ``max_reuse_distance`` elements of the trace.
- Under activation checkpointing, frozen parameters fetched by the recompute inside backward
  are attributed to the block whose backward is running (``update_recompute_parameters``):
  they stay gathered until that block's backward ends, so a LoRA block's frozen weights are
  gathered all at once during its backward.

The largest set gathered at any moment of the step (the trace of the second step onward,
when prefetch and the reuse rule apply) is the term. Persistent parameters are not in it
(``zero/persistent_params``' set, resident). Submodules are the ``nn.Module`` s a
transformers decoder under PEFT holds parameters in: embedding, each linear (PEFT LoRA: base
layer, ``lora_A``, ``lora_B``), the fused experts module, the final head; norms are taken as
persistent (one norm's H elements are under HF's "auto" threshold 10·H). What is not
modelled: the order in which autograd runs sibling modules' backward (gate and up
projections), the first block's frozen linears whose outputs need no gradient (fetched in
backward here), and routed experts as separate modules (transformers 4.x) are traced as if
every expert ran; methods other than full fine-tuning and LoRA are traced with their base
weights frozen and without their (small) adapters.

Held to DeepSpeed's own engine on simulated ranks (``tests/core/memory/
test_simulation_deepspeed.py``, the coordinator's gathered elements recorded by
``adapters/probe/deepspeed_step.py``): LoRA with and without checkpointing match to the
element; full fine-tuning matches with a prefetch bucket above the largest linear, while with
a bucket below it DeepSpeed was seen holding one module more in forward than the replay (a
tiny LLaMA: 229,376 elements against 196,608; with checkpointing 262,144 against 196,608),
a cause not found: an under-count of up to about one linear for full fine-tuning.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from tuneplan.core.job.methods import Method, lora_rank_of, targeted_linears
from tuneplan.core.job.strategy import Checkpointing, Strategy
from tuneplan.core.job.versions import experts_are_linear
from tuneplan.core.models import LinearRole, ModelSpec

SOURCE = ("deepspeed 0.19.8 runtime/zero/partitioned_param_coordinator.py fetch_sub_module / "
          "release_sub_module / __params_to_release / update_recompute_parameters; "
          "parameter_offload.py mark_persistent_parameters")


@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    """The ``zero_optimization`` values the coordinator reads (elements)."""

    prefetch_bucket_size: int
    max_live_parameters: int = 1_000_000_000     # deepspeed 0.19.8 zero/config.py default
    max_reuse_distance: int = 1_000_000_000      # deepspeed 0.19.8 zero/config.py default
    param_persistence_threshold: int = 100_000

    @classmethod
    def hf_auto(cls, hidden_size: int) -> Knobs:
        """tuneplan's emitted JSON (core/launch/engines.py): prefetch bucket and persistence
        threshold "auto", which transformers fills as 0.9·H² and 10·H
        (integrations/deepspeed.py ``trainer_config_finalize``); max live parameters and
        reuse distance left at DeepSpeed's 1e9."""
        return cls(prefetch_bucket_size=int(0.9 * hidden_size * hidden_size),
                   param_persistence_threshold=10 * hidden_size)


@dataclass(frozen=True, slots=True)
class _Sub:
    params: tuple[int, ...]     # parameter ids
    block: int                  # -1 outside the checkpointed blocks


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherPeak:
    """The most gathered at once: bytes (each parameter at its width), elements, the largest
    submodule's non-persistent elements, and the part of the step it happens in."""

    bytes: int
    elements: int
    largest_submodule: int      # elements
    where: str


class _Model:
    def __init__(self) -> None:
        self.numel: list[int] = []
        self.width: list[int] = []
        self.frozen: list[bool] = []
        self.subs: list[_Sub] = []

    def param(self, numel: int, width: int, frozen: bool) -> int:
        self.numel.append(numel)
        self.width.append(width)
        self.frozen.append(frozen)
        return len(self.numel) - 1

    def sub(self, ids: list[int], block: int = -1) -> None:
        if ids:
            self.subs.append(_Sub(tuple(ids), block))


def _build(model: ModelSpec, s: Strategy, base_width: int, adapter_width: int) -> _Model:
    m = _Model()
    full = s.method is Method.FULL
    lora = s.method.is_lora
    fused = not experts_are_linear(model, s)
    embed = m.param(model.embedding_params, base_width, not full)
    m.sub([embed])
    block = 0
    for layer in model.layers:
        targets = {id(t) for t in targeted_linears(model, s, layer)} if lora else set()
        for _ in range(layer.count):
            experts: list[int] = []
            last = max((i for i, lin in enumerate(layer.linears)
                        if lin.role is LinearRole.EXPERT), default=-1)
            for i, lin in enumerate(layer.linears):
                per = lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0)
                stacked = lin.role is LinearRole.EXPERT and lin.copies > 1 and fused
                if stacked:
                    experts.append(m.param(per * lin.copies, base_width, not full))
                else:
                    for _ in range(lin.copies):
                        m.sub([m.param(per, base_width, not full)], block)
                if id(lin) in targets:
                    r = lora_rank_of(lin, s)
                    m.sub([m.param(r * lin.in_features * lin.copies, adapter_width, False)],
                          block)
                    m.sub([m.param(lin.out_features * r * lin.copies, adapter_width, False)],
                          block)
                if stacked and i == last:   # one module holds every stacked expert weight
                    m.sub(experts, block)
            block += 1
    if not model.tie_word_embeddings:
        head = m.param(model.vocab_size * (model.head_in_features or model.hidden_size),
                       base_width, not full)
        m.sub([head])
    else:
        m.sub([embed])
    return m


@dataclass(frozen=True, slots=True)
class _Event:
    sub: _Sub | None            # None: a block's own (parameterless) module
    forward: bool
    recompute: bool
    block: int


def _trace(m: _Model, s: Strategy) -> list[_Event]:
    ckpt = s.checkpointing is not Checkpointing.NONE
    out = [_Event(sub, True, False, sub.block) for sub in m.subs]
    blocks: dict[int, list[_Sub]] = {}
    outside_top: list[_Sub] = []
    for sub in m.subs:
        if sub.block >= 0:
            blocks.setdefault(sub.block, []).append(sub)
        elif blocks:
            outside_top.append(sub)
    out += [_Event(sub, False, False, -1) for sub in reversed(outside_top)]
    for b in sorted(blocks, reverse=True):
        if ckpt:
            out.append(_Event(None, False, False, b))           # the block's pre-backward
            out += [_Event(sub, True, True, b) for sub in blocks[b]]
        out += [_Event(sub, False, False, b) for sub in reversed(blocks[b])]
        if ckpt:
            out.append(_Event(None, False, False, -2 - b))      # the block's post-backward
    bottom = m.subs[0]
    if not m.frozen[bottom.params[0]] or ckpt:   # its output needs a gradient
        out.append(_Event(bottom, False, False, -1))
    return out


#: Replays by (model shape, strategy without its sizes, knobs, widths): the planner asks for
#: the same one at every micro-batch and offer.
_CACHE: dict[tuple[object, ...], GatherPeak] = {}
_CACHE_SIZE = 4096


def gather_peak(model: ModelSpec, s: Strategy, knobs: Knobs, base_width: int,
                adapter_width: int) -> GatherPeak:
    """Replays one steady-state step's fetches and releases; the most bytes gathered at once
    (non-persistent parameters, in flight or available)."""
    shape = (model.name, model.model_type, model.embedding_params, model.tie_word_embeddings,
             model.vocab_size, model.head_in_features, model.hidden_size,
             tuple((layer.count, layer.linears) for layer in model.layers))
    key = (shape, replace(s, batch_size=1, seq_len=1, grad_accum=1, gpus=1, nodes=1), knobs,
           base_width, adapter_width)
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        found = _CACHE[key] = _replay(model, s, knobs, base_width, adapter_width)
    return found


def _replay(model: ModelSpec, s: Strategy, knobs: Knobs, base_width: int,
            adapter_width: int) -> GatherPeak:
    m = _build(model, s, base_width, adapter_width)
    persist = [n <= knobs.param_persistence_threshold for n in m.numel]
    events = _trace(m, s)
    fetches = [e.sub for e in events if e.sub is not None]
    queue = deque((p, step) for step, sub in enumerate(fetches) for p in sorted(sub.params))
    numels = [sum(m.numel[p] for p in sub.params) for sub in fetches]
    scanned = [-10**10] * len(m.numel)    # __most_recent_step_id_param_fetched_for
    gathered = [False] * len(m.numel)
    active: list[set[int]] = [set() for _ in m.numel]
    owned: dict[int, set[int]] = {}       # block -> recompute-attributed params
    n_available = 0
    live = peak = live_n = peak_n = 0
    where = ""
    step = 0

    def gather(p: int) -> None:
        nonlocal n_available, live, live_n
        if not gathered[p] and not persist[p]:
            gathered[p] = True
            n_available += m.numel[p]
            live_n += m.numel[p]
            live += m.numel[p] * m.width[p]

    def release(p: int) -> None:
        nonlocal n_available, live, live_n
        if gathered[p] and not active[p]:
            gathered[p] = False
            n_available -= m.numel[p]
            live_n -= m.numel[p]
            live -= m.numel[p] * m.width[p]

    for e in events:
        if e.sub is None:
            if e.block <= -2:                                   # block's backward ends
                for p in owned.pop(-2 - e.block, set()):
                    active[p].discard(_owner(-2 - e.block))
                    release(p)
            continue
        ids = e.sub.params
        for p in ids:
            gather(p)
            active[p].add(step)
            if e.recompute and m.frozen[p] and not persist[p]:
                active[p].add(_owner(e.block))
                owned.setdefault(e.block, set()).add(p)
        # pop this module's own params off the queue, then prefetch
        own = {p for p in ids if scanned[p] < step}
        popped: set[int] = set()
        while queue and len(popped) < len(own):
            p, used = queue.popleft()
            scanned[p] = used
            popped.add(p)
        budget = min(knobs.max_live_parameters - n_available, knobs.prefetch_bucket_size)
        taken = 0
        chosen: set[int] = set()
        while queue and taken < budget:
            p, used = queue.popleft()
            scanned[p] = max(scanned[p], used)
            if not gathered[p] and not persist[p] and p not in chosen:
                chosen.add(p)
                taken += m.numel[p]
        for p in chosen:
            gather(p)
        step += 1
        if live > peak:
            peak, peak_n, where = live, live_n, ("recompute" if e.recompute else
                                 "forward" if e.forward else "backward")
        # release (post-forward / post-backward)
        keep = {p for p in ids if scanned[p] > step}
        traversed = 0
        for i in range(step, len(fetches)):
            if traversed >= knobs.max_reuse_distance:
                break
            keep.update(fetches[i].params)
            traversed += numels[i]
        for p in ids:
            active[p].discard(step - 1)
            if p not in keep:
                release(p)
    largest = max((sum(m.numel[p] for p in sub.params if not persist[p]) for sub in m.subs),
                  default=0)
    return GatherPeak(bytes=peak, elements=peak_n, largest_submodule=largest, where=where)


def _owner(block: int) -> int:
    """An id for a block's module in the params' active sets (steps are >= 0)."""
    return -1 - block
