"""``estimate_memory``: the per-GPU peak of a training step, composed at the moment it happens.

The step is modelled as moments — end of forward (loss computed), start of backward (loss
gradients), backward through the top and bottom blocks, and the optimizer step (state created
lazily at the first step while gradients are alive). Each moment lists the tensors alive then;
the peak is the largest, and its terms are the Breakdown (total = allocated peak; reserve,
context and NCCL are further explicit terms). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, NamedTuple

from tuneplan.core.job import versions
from tuneplan.core.job.methods import (
    Method,
    Trainable,
    as_built,
    count_trainable,
    effective_quant,
    fused_qkv_note,
    outer_targets,
)
from tuneplan.core.job.recipes import PrecisionPlan, Recipe, precision_plan
from tuneplan.core.job.strategy import Checkpointing, Sharding, Strategy, Task
from tuneplan.core.job.tuners import tuner_note
from tuneplan.core.memory import activations as act
from tuneplan.core.memory import (
    encoder,
    experts,
    fsdp,
    litgpt,
    mla,
    seq2seq,
    torchtune,
    unsloth,
)
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.logits import loss_moments
from tuneplan.core.memory.overheads import device_terms, reserve_term, workspace_term
from tuneplan.core.memory.parts import Group, Item, Piece, breakdown, flatten, part, total
from tuneplan.core.memory.refusals import check_strategy
from tuneplan.core.memory.sharding import ShardPlan, shard_plan
from tuneplan.core.memory.steady import Static, block_gradients, host_terms, static_terms
from tuneplan.core.memory.weights import weight_terms
from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.core.models.provenance import structure_note
from tuneplan.explain import Breakdown


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of one training step; bytes are ints, ``breakdown`` explains them."""

    model: str
    strategy: Strategy
    assumptions: MemoryAssumptions
    breakdown: Breakdown             # all per-GPU terms; total == device_total_bytes
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    device_total_bytes: int
    peak_phase: str
    phases: Mapping[str, int]        # allocated bytes at each modelled moment
    host_ram_bytes: int
    host: Breakdown
    trainable_params: int
    total_params: int
    notes: tuple[str, ...] = field(default=())
    #: the version-dependent behaviours assumed, each with its library version
    #: (``core/job/versions.py``); the versions themselves are ``strategy.stack``
    behaviours: tuple[str, ...] = field(default=())
    #: whole-device peak while the model is loaded and prepared (QLoRA: quantised on the
    #: fly, then ``prepare_model_for_kbit_training``), before the first step; 0 where loading
    #: peaks below the step (weights only: full, LoRA) or is not modelled (sharded params)
    loading_peak_bytes: int = 0
    loading: Breakdown | None = None
    #: one resumable checkpoint, all ranks' parts together: the weights it saves (every
    #: weight, as held in training, when the base trains: HF ``save_model`` writes the fp32
    #: params of mixed precision, DeepSpeed its bf16 module weights; else the trainable
    #: tensors only, adapters and ``modules_to_save``, as PEFT saves them) and with the
    #: optimizer's state beside them (states, fp32 master copy, GaLore projectors: what
    #: ``optimizer.pt`` or DeepSpeed's optimizer shards hold), unsharded
    checkpoint_weights_bytes: int = 0
    checkpoint_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """What must fit on the card: the larger of the step's and loading's whole-device
        peaks."""
        return max(self.device_total_bytes, self.loading_peak_bytes)

    @property
    def loading_binds(self) -> bool:
        return self.loading_peak_bytes > self.device_total_bytes

    def fits(self, capacity_bytes: int) -> bool:
        return self.peak_bytes <= capacity_bytes

    def headroom(self, capacity_bytes: int) -> int:
        return capacity_bytes - self.peak_bytes


def estimate_memory(model: ModelSpec, strategy: Strategy,
                    assumptions: MemoryAssumptions | None = None, *,
                    generation: str | None = None) -> MemoryEstimate:
    """Per-GPU allocated / reserved / device peaks of one step of ``strategy`` on ``model``.

    ``generation`` (``"ampere"``, ``"hopper"``…) picks the CUDA-context size. Raises
    UnsupportedError for strategies the estimate cannot honour.
    """
    a = assumptions or _DEFAULT_ASSUMPTIONS
    if len(_DONE) >= _DONE_LIMIT:
        _DONE.clear()
    # One lookup asks and, if need be, reserves the entry filled below: a key tuple does not
    # keep its hash, and hashing the strategy twice (a get, then a store) is a cost per estimate.
    done = _DONE.setdefault((id(model), id(a), strategy, generation), [])
    if done and done[0][0] is model and done[0][1].assumptions is a:
        # The same question again: the same answer (a fresh object for the strategy passed
        # in, and a phases dict of its own, so no caller shares mutable state).
        est, phases = done[0][1], done[0][2]
        return MemoryEstimate(
            model=est.model, strategy=strategy, assumptions=a, breakdown=est.breakdown,
            allocated_peak_bytes=est.allocated_peak_bytes,
            reserved_peak_bytes=est.reserved_peak_bytes,
            device_total_bytes=est.device_total_bytes, peak_phase=est.peak_phase,
            phases=dict(phases), host_ram_bytes=est.host_ram_bytes, host=est.host,
            trainable_params=est.trainable_params, total_params=est.total_params,
            notes=est.notes, behaviours=est.behaviours,
            loading_peak_bytes=est.loading_peak_bytes, loading=est.loading,
            checkpoint_weights_bytes=est.checkpoint_weights_bytes,
            checkpoint_bytes=est.checkpoint_bytes)
    fixed = _fixed(model, strategy, a)
    model, plan, static = fixed.model, fixed.plan, fixed.static
    moments = _moments(model, strategy, plan, static, a, fixed)
    phases = {k: total(v) for k, v in moments.items()}
    phase = max(phases, key=phases.__getitem__)   # the first of equal peaks
    overheads = fixed.overheads.get(generation)
    if overheads is None:   # batch-independent: once per GPU generation
        overheads = fixed.overheads[generation] = (
            workspace_term(generation, a),
            device_terms(generation, strategy, a, _gathered_unit(model, strategy, fixed, a)),
            _loading(model, strategy, fixed, a, generation))
    workspace, loading = overheads[0], overheads[2]
    allocated = phases[phase] + workspace.value
    reserve = reserve_term(allocated, a)
    device = [reserve, *overheads[1], *static.outside]
    # The peak's groups are expanded, and Terms (with their formulas and sources) made, when
    # a breakdown is first read.
    explained = breakdown([*moments[phase], workspace, *device])
    host = fixed.host if fixed.host is not None else breakdown(   # (not ``or``: that
        host_terms(model, strategy, static, fixed.shards))       # would build its terms)
    est = MemoryEstimate(
        model=model.name, strategy=strategy, assumptions=a, breakdown=explained,
        allocated_peak_bytes=allocated, reserved_peak_bytes=allocated + int(reserve.value),
        device_total_bytes=int(explained.total), peak_phase=phase,
        phases=phases, host_ram_bytes=int(host.total),
        host=host, trainable_params=fixed.trainable.total, total_params=static.total_params,
        notes=fixed.notes, behaviours=fixed.behaviours,
        loading_peak_bytes=0 if loading is None else int(loading.total), loading=loading,
        checkpoint_weights_bytes=static.checkpoint_weights_bytes,
        checkpoint_bytes=static.checkpoint_weights_bytes + static.checkpoint_state_bytes)
    # the entry keeps its own copy of the phases: the caller may do what it likes with its own
    done[:] = [(fixed.source, est, dict(phases))]
    return est


def _loading(model: ModelSpec, s: Strategy, fixed: _Fixed, a: MemoryAssumptions,
             generation: str | None) -> Breakdown | None:
    """The whole-device peak of loading a bitsandbytes-quantised model (QLoRA), or None.

    transformers 5.x ``core_model_loading.convert_and_load_state_dict_in_model``: with
    on-the-fly quantisation no thread pool runs ahead, so one checkpoint tensor at a time is
    materialised on the GPU in its stored dtype and ``Bnb4bitQuantize`` / ``Params4bit``
    packs it there (the largest linear in bf16 beside the packed weights so far). Then peft
    ``prepare_model_for_kbit_training`` (utils/other.py) casts every non-quantised parameter
    to fp32 with ``param.data = param.data.to(float32)``: the bf16 source lives while its
    fp32 copy is made, so with the others already fp32 the largest (embedding or head,
    vocab · hidden) adds its bf16 bytes. The larger moment is the loading peak: the weights
    as trained (adapters included) plus that transient, the allocator reserve and the CUDA
    context (NCCL starts later, at the first collective). Not modelled (None): sharded
    parameters (FSDP/ZeRO-3 load through their own paths), and jobs without on-the-fly
    quantisation, whose loading holds the weights alone (below the step's peak)."""
    quant = effective_quant(s)
    if quant is None or fixed.shards.params_div > 1 or not fixed.plan.kbit_upcast:
        return None
    st = fixed.static
    stored = fixed.plan.frozen_weight_bytes
    width = model.head_in_features or model.hidden_size
    largest_plain = model.vocab_size * width
    weights = st.weights_bytes
    unquantized = _unquantized_params(st)
    quantize = part("loading/quantize_source", st.largest_linear * stored,
                    "one checkpoint weight in its stored dtype on the GPU while it is packed: "
                    "largest linear · stored bytes",
                    "transformers 5.x core_model_loading (no thread pool when quantising on "
                    "the fly), integrations/bitsandbytes.py Bnb4bitQuantize",
                    params=st.largest_linear, bytes_per_param=stored, confidence="medium")
    cast = part("loading/kbit_cast_source", largest_plain * stored,
                "the bf16 source of the largest unquantised tensor (vocab · hidden) alive "
                "while prepare_model_for_kbit_training makes its fp32 copy",
                "peft utils/other.py prepare_model_for_kbit_training", params=largest_plain,
                bytes_per_param=stored, confidence="medium")
    # while packing, the unquantised tensors are still in their stored dtype (not yet fp32)
    early = part("loading/weights", weights - max(0, unquantized) * (4 - stored),
                 "weights while loading: packed linears + unquantised tensors in their "
                 "stored dtype + adapters", "see weights/*")
    late = part("loading/weights", weights, "weights as trained (see weights/*)")
    moment = [early, quantize] if early.value + quantize.value > late.value + cast.value \
        else [late, cast]
    allocated = total(moment)
    terms = [*moment, reserve_term(allocated, a),
             part("overheads/cuda_context", a.context_bytes(generation),
                  "CUDA context (as in the step)")]
    return breakdown(terms)


def _unquantized_params(st: Static) -> int:
    """Parameters bitsandbytes leaves unpacked (the ``weights/unquantized`` term's)."""
    for piece in st.resident:
        if piece.path == "weights/unquantized":
            return int(piece.inputs.get("params", 0))
    return 0


def _gathered_unit(model: ModelSpec, s: Strategy, fixed: _Fixed, a: MemoryAssumptions) -> int:
    """One FSDP block unit's unsharded bytes where FSDP all-gathers units on a side stream
    (FULL_SHARD / HYBRID_SHARD; SHARD_GRAD_OP keeps parameters gathered), else 0."""
    if not fsdp.applies(s) or s.sharding is Sharding.FSDP_GRAD_OP:
        return 0
    return fsdp.units(model, s, fixed.plan, fixed.trainable, a.fsdp_version).block


_DEFAULT_ASSUMPTIONS = MemoryAssumptions()
#: Every Strategy field but the micro-batch: what the batch-independent work depends on.
_FIXED_FIELDS = attrgetter(*(f for f in Strategy.__dataclass_fields__ if f != "batch_size"))
_FIXED_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class _Fixed:
    """What one estimate shares with every other micro-batch of the same strategy (the
    checks, trainable counts, precision and shard plans, the batch-independent terms)."""

    source: ModelSpec            # the model passed in (the cache's identity check)
    assumptions: MemoryAssumptions
    model: ModelSpec             # the model estimated (a seq-cls head replaced)
    trainable: Trainable
    plan: PrecisionPlan
    shards: ShardPlan
    static: Static
    widths: act.Widths
    head_trains: bool
    dequant: list[Piece]
    resident: Group                             # static.resident, summed once
    layer_inputs: tuple[act.LayerInputs, ...]   # per kind of block in ``model.layers``
    layers: int                                 # blocks in all
    forward_per_token: dict[str, int]           # act.forward_transient at one token
    live_per_token: dict[str, int]              # act.forward_live at one token
    experts_adapted: bool                       # LoRA wraps some block's routed experts
    #: all blocks' saved bytes by component as (key, per batch, fixed): affine in the batch
    #: for a fixed sequence (checked at three batches), or None (then summed per estimate)
    saved_line: _Line | None
    #: ``saved_line`` divided by the blocks (one block's saved bytes), where every per-batch
    #: and fixed size divides exactly (always for one kind of block), else None
    one_line: _Line | None
    rope: Piece                                 # RoPE cos/sin (the sequence's, not the batch's)
    host: Breakdown | None                      # host RAM, unless it grows with the batch
    #: per GPU generation: the cuBLAS workspace and the device overheads outside the allocator
    overheads: dict[str | None, tuple[Piece, list[Piece], Breakdown | None]]
    notes: tuple[str, ...]                      # what the estimate assumed, in words
    behaviours: tuple[str, ...]                 # version-dependent behaviours assumed
    own: dict[str, Piece]       # the running block's gradients, by where its backward peaks
    #: gradients alive through forward and backward: a later micro-batch's accumulation, or
    #: every step's where zero_grad() keeps them (torch before 2.0)
    grads_held: bool
    embedding_lora: bool        # a LoRA wraps the input embedding (its A lookup is saved)
    dora: dict[str, int]        # act.dora_transients: DoRA's weight-norm temporaries by place


_FIXED: dict[tuple[object, ...], _Fixed] = {}
#: Whole estimates per (model, assumptions, strategy, generation): asked again (a planner
#: re-run, the web app's repeated plans) they are answered from here. Bounded like _FIXED. An
#: entry is a list of at most one (model, estimate, phases); empty while (or if) the estimate
#: it was made for is being computed (or raised).
_DONE: dict[tuple[object, ...], list[tuple[ModelSpec, MemoryEstimate, dict[str, int]]]] = {}
_DONE_LIMIT = 4096


def clear_cache() -> None:
    """Forget earlier estimates and their batch-independent work (benchmarks time cold
    runs)."""
    _FIXED.clear()
    _DONE.clear()


def _fixed(model: ModelSpec, strategy: Strategy, a: MemoryAssumptions) -> _Fixed:
    """The batch-independent part of an estimate, cached per (model, assumptions, strategy
    but its micro-batch): the planner's bisection over batch sizes does it once. Model and
    assumptions are keyed by identity (both are immutable; the entry keeps them alive)."""
    key = (id(model), id(a), _FIXED_FIELDS(strategy))
    found = _FIXED.get(key)
    if found is not None and found.source is model and found.assumptions is a:
        return found
    check_strategy(model, strategy)
    source = model
    model = as_built(model, strategy)   # a T5 head tied under transformers 5
    if strategy.task is Task.SEQ_CLS:
        # *ForSequenceClassification has no vocabulary head: a H×labels ``score`` instead
        # (tiny, counted with the logits); the embedding stays.
        model = replace(model, tie_word_embeddings=True, head_bias=False)
        if model.is_encoder_only:   # the pooler + classifier replace the MLM head
            model = replace(model, head_extra_params=encoder.seq_cls_head_params(
                model, strategy.num_labels))
    trainable = count_trainable(model, strategy)
    plan = precision_plan(strategy)
    sp = shard_plan(strategy)
    static = static_terms(model, strategy, plan, trainable, sp, a)
    w = act.widths(strategy, plan, a.dropout_mask_bytes)
    layer_inputs = tuple(act.layer_inputs(model, layer, strategy, w) for layer in model.layers)
    layers = sum(layer.count for layer in model.layers)
    line = _saved_line(model, strategy, w, layer_inputs)
    found = _Fixed(
        notes=tuple(n for n in (structure_note(model), fused_qkv_note(model, strategy),
                                seq2seq.forced_tie_note(source, strategy),
                                seq2seq.length_note(model, strategy),
                                _recipe_note(strategy, plan, model),
                                tuner_note(strategy),
                                _qlora_experts_note(model, strategy, trainable, plan, a)) if n),
        behaviours=tuple(versions.behaviours(model, strategy, a.adamw_impl)),
        source=source, assumptions=a, model=model, trainable=trainable, plan=plan, shards=sp,
        static=static, widths=w,
        layer_inputs=layer_inputs, saved_line=line, one_line=_divided(line, layers),
        rope=_rope(model, w, _shape(strategy, 1)), overheads={}, own={},
        # offloaded checkpoints are the only host bytes that grow with the micro-batch
        host=None if strategy.checkpointing is Checkpointing.OFFLOAD else breakdown(
            host_terms(model, strategy, static, sp)),
        layers=layers,
        experts_adapted=any(experts.experts_adapted(model, layer, strategy)
                            for layer in model.layers),
        forward_per_token=act.forward_transient(model, strategy, w,
                                                act.Shape(batch=1, seq_q=1, seq_kv=1)),
        live_per_token=act.forward_live(model, strategy, w,
                                        act.Shape(batch=1, seq_q=1, seq_kv=1), layer_inputs),
        head_trains=strategy.method in (Method.FULL, Method.LISA) or any(
            m in ("lm_head", "score", "embed_out") for m in strategy.trainable_modules),
        dequant=_dequant_term(strategy, static),
        dora=act.dora_transients(model, strategy, w),
        grads_held=strategy.grad_accum > 1 or versions.grads_kept_between_steps(strategy),
        embedding_lora=any(lin.role is LinearRole.EMBEDDING
                           for lin in outer_targets(model, strategy)),
        resident=Group(total(static.resident), lambda: static.resident))
    if len(_FIXED) >= _FIXED_LIMIT:
        _FIXED.clear()
    _FIXED[key] = found
    return found


def _qlora_experts_note(model: ModelSpec, strategy: Strategy, trainable: Any,
                        plan: PrecisionPlan, a: MemoryAssumptions) -> str | None:
    """``experts.qlora_experts_note`` with this job's weights and the same job's as LoRA."""
    if not model.num_experts or effective_quant(strategy) is None or \
            versions.experts_are_linear(model, strategy) or not plan.kbit_upcast:
        return None
    lora = replace(strategy, method=Method.LORA)
    ours = total(weight_terms(model, strategy, plan, trainable, a))
    theirs = total(weight_terms(model, lora, precision_plan(lora), count_trainable(model, lora),
                                a))
    return experts.qlora_experts_note(model, strategy, ours, theirs)


def _recipe_note(strategy: Strategy, plan: PrecisionPlan,
                 strategy_model: ModelSpec | None = None) -> str | None:
    """Recipes change only dtypes and the loss default (``core.job.recipes``): say so where
    ``--recipe`` gives this job the hf recipe's layout, so the same estimate is no surprise."""
    if strategy.recipe is Recipe.HF:
        return None
    if strategy.recipe is Recipe.LITGPT:
        why = litgpt.uncovered(strategy_model, strategy) if strategy_model else None
        if why is None:
            return ("--recipe litgpt: LitGPT's own layout (litgpt 0.5.13 fit loop: fused qkv, "
                    "fp32 RMSNorm, fp32 logits kept by the loop, chunked loss)")
        return (f"--recipe litgpt: LitGPT's layout is modelled for llama-style full and LoRA "
                f"jobs, not {why}: the hf layout with litgpt's dtypes stands in")
    if strategy.recipe is Recipe.TORCHTUNE and strategy_model is not None:
        why = torchtune.uncovered(strategy_model, strategy)
        if why is None:
            return ("--recipe torchtune: torchtune's own layout (torchtune 0.6.1 single-device "
                    "recipe: one dtype, fp32 RMSNorm and RoPE cache, GQA k/v copied to every "
                    "head, 8 logits chunks with fp32 log-softmax)" + (
                        "; --compile: each layer saves what torch 2.13 inductor's min-cut "
                        "partitioner keeps (held to the simulation), the compiled loss its "
                        "input logits, not their fp32 log-softmax; transients inside compiled "
                        "kernels assumed fused (not simulated)"
                        if strategy.compile else ""))
        return (f"--recipe torchtune: torchtune's layout is modelled for llama-3-style full "
                f"and LoRA jobs, not {why}: the hf layout with torchtune's dtypes stands in")
    if strategy.recipe is Recipe.UNSLOTH and strategy_model is not None:
        why = unsloth.uncovered(strategy_model, strategy)
        if why is None:
            return (f"--recipe unsloth: Unsloth's own layout ({unsloth.VERSION} fast LoRA "
                    "kernels, Fast_RMS_Layernorm, in-place RoPE, fused chunked loss, "
                    "offloaded checkpoints), modelled from source, not simulated")
        return (f"--recipe unsloth: Unsloth's layout is modelled for llama-style LoRA/QLoRA "
                f"jobs on every projection, not {why}: the hf layout with unsloth's dtypes "
                "and fused loss stands in")
    hf = precision_plan(replace(strategy, recipe=Recipe.HF))
    if replace(plan, why="") != replace(hf, why=""):
        return None
    return (f"--recipe {strategy.recipe.value} keeps the hf recipe's dtypes and loss for this "
            "job (recipes change only tensor dtypes and the loss default): same estimate as hf")


def _shape(s: Strategy, batch: int) -> act.Shape:
    prompt = s.num_virtual_tokens if s.method.adds_virtual_tokens else 0
    prefix = s.num_virtual_tokens if s.method is Method.PREFIX else 0
    return act.Shape(batch=batch, seq_q=s.seq_len + prompt, seq_kv=s.seq_len + prompt + prefix)


def _saved(model: ModelSpec, s: Strategy, w: act.Widths, shape: act.Shape,
           layer_inputs: tuple[act.LayerInputs, ...]) -> dict[str, int]:
    """All blocks' saved bytes by component (``act.block_saved`` times each kind's count;
    encoder-decoder models: ``seq2seq.saved``)."""
    if model.is_encoder_decoder:
        return seq2seq.saved(model, s, w, shape)
    per_block: dict[str, int] = {}
    for layer, inputs in zip(model.layers, layer_inputs, strict=True):
        for key, value in act.block_saved(model, layer, s, w, shape, inputs).items():
            per_block[key] = per_block.get(key, 0) + value * layer.count
    return per_block


_Line = tuple[tuple[str, int, int], ...]


def _saved_line(model: ModelSpec, s: Strategy, w: act.Widths,
                layer_inputs: tuple[act.LayerInputs, ...]) -> _Line | None:
    """``_saved`` as exact integer (key, per batch, fixed) triples: every saved size is the
    batch times a size, plus batch-independent bytes (merged expert weights). Checked at a
    third batch; anything not affine returns None and is summed per estimate instead."""
    at = [_saved(model, replace(s, batch_size=b), w, _shape(s, b), layer_inputs)
          for b in (1, 2, 3)]
    line = tuple((k, at[1][k] - v, 2 * v - at[1][k]) for k, v in at[0].items())
    if list(at[1]) != list(at[0]) or list(at[2]) != list(at[0]) or any(
            at[2][k] != 3 * per + fixed for k, per, fixed in line):
        return None
    return line


def _divided(line: _Line | None, layers: int) -> _Line | None:
    """``line`` over ``layers`` blocks, exact: (b·p + r) // L is b·(p/L) + r/L where L divides
    both p and r; None where some size does not divide (then divided per estimate)."""
    if line is None or any(per % layers or rest % layers for _, per, rest in line):
        return None
    return tuple((k, per // layers, rest // layers) for k, per, rest in line)


def _moments(model: ModelSpec, s: Strategy, plan: PrecisionPlan, st: Static,
             a: MemoryAssumptions, fixed: _Fixed) -> dict[str, list[Item]]:
    if s.recipe is Recipe.LITGPT and litgpt.uncovered(model, s) is None:
        return litgpt.moments(model, s, [fixed.resident], [*st.grads], [*st.step],
                              a.dropout_mask_bytes, [*fixed.dequant])
    if s.recipe is Recipe.TORCHTUNE and torchtune.uncovered(model, s) is None:
        return torchtune.moments(model, s, [fixed.resident], [*st.grads], [*st.step],
                                 [*st.grads_top])
    if s.recipe is Recipe.UNSLOTH and unsloth.uncovered(model, s) is None:
        return unsloth.moments(model, s, [fixed.resident], [*st.grads], [*st.step],
                               [*fixed.dequant])
    w = fixed.widths
    shape = _shape(s, s.batch_size)
    blocks = _block_terms(model, s, w, shape, a, fixed)
    loss = loss_moments(model, s, plan, w, shape, fixed.head_trains, a.loss_chunks)
    grads_fb = st.grads if fixed.grads_held else []
    dq = fixed.dequant
    # what every moment holds (weights, states, inputs), summed once
    held: list[Item] = [fixed.resident, *_inputs(model, s, w, shape, fixed.embedding_lora)]
    base = Group(total(held), lambda: flatten(held))
    own = fixed.own.get(blocks.when)
    if own is None:
        own = fixed.own[blocks.when] = part(
            "gradients/current_block", st.block_grads[blocks.when],
            f"the running block's gradients already made ({blocks.when} backward)")
    cast = st.autocast_copies
    if model.is_encoder_only:   # the embeddings' saved tensors, alive until backward ends
        held = [*held, *encoder.embedding_terms(model, s, w, shape)]
        base = Group(total(held), lambda: flatten(held))
        opt_base: Item = Group(total(held[:-1]), lambda: flatten(held[:-1]))
    else:
        opt_base = base
    moments = {
        "forward": [base, *grads_fb, *blocks.kept, *cast["forward"], *loss.kept,
                    *loss.forward_only, *dq],
        "backward-start": [base, *grads_fb, *blocks.kept, *cast["backward-start"], *loss.kept,
                           *loss.backward_only, *dq],
        "backward-top-block": [base, *(grads_fb or [*st.grads_top, own]), *blocks.top,
                               *cast["top"], *dq],
        "backward-bottom-block": [base, *(grads_fb or [*st.grads_bottom, own]), *blocks.bottom,
                                  *cast["bottom"], *dq],
        "forward-last-block": [base, *grads_fb, *blocks.forward_last, *cast["forward"], *dq],
    }
    if loss.head:  # a LoRA on the output head adds its update before the loss runs
        moments["forward-head"] = [base, *grads_fb, *blocks.kept, *cast["forward"], *loss.head,
                                   *dq]
    if blocks.recompute:
        moments["backward-recompute"] = [base, *(grads_fb or st.grads_top), *blocks.recompute,
                                         *cast["bottom"], *dq]
    if not s.optimizer_in_backward:
        moments["optimizer"] = [opt_base, *st.grads, *st.step]
    embedding = _embedding_backward(model, s, plan, shape)
    if embedding:
        moments["backward-embedding"] = [base, *st.grads, *embedding, *dq]
    if fsdp.applies(s):
        fsdp.adjust(moments, model, s, plan, fixed.trainable, st.grads, a.fsdp_version,
                    a.fsdp_sync_each_batch,
                    running=fsdp.Running(items=[*blocks.running, own],
                                         grads=block_gradients(
                                             model, s, plan, 1, a.fsdp_version == 1)[
                                             blocks.when],
                                         tokens=shape.tokens))
    return moments


def _embedding_backward(model: ModelSpec, s: Strategy, plan: PrecisionPlan,
                        shape: act.Shape) -> list[Piece]:
    """The input embedding's backward, the last op of a full fine-tuning step on one GPU (or
    DDP): every other gradient exists, the embedding output's gradient is alive, and for a
    weight tied to the head ``embedding_dense_backward`` makes a gradient of its own that
    ``AccumulateGrad`` then adds into the head's ``.grad`` (an untied embedding's is stolen
    into ``.grad``: counted in the gradients). Measured on an H200: a tied Llama-3.2-3B
    bf16-mixed step peaked there (benchmarks/calibration/device/h200-2026-12-04)."""
    if (s.method is not Method.FULL or model.is_encoder_only or model.is_encoder_decoder
            or s.optimizer_in_backward or s.sharding is not Sharding.DDP):
        return []
    width = plan.trainable_weight_bytes
    out = [part("gradients/embedding_output", shape.tokens * model.hidden_size * width,
                "the embedding output's gradient T·hidden·grad bytes",
                "torch autograd: embedding backward's input", tokens=shape.tokens)]
    if model.tie_word_embeddings:
        out.append(part("gradients/embedding_backward",
                        model.vocab_size * model.hidden_size * width,
                        "vocab·hidden·grad bytes: embedding_dense_backward's weight gradient, "
                        "added into the tied head's .grad",
                        "torch embedding_dense_backward (a new tensor), AccumulateGrad"))
    return out


def _inputs(model: ModelSpec, s: Strategy, w: act.Widths, shape: act.Shape,
            embedding_lora: bool) -> list[Piece]:
    inputs = [part("activations/inputs", 2 * shape.tokens * 8,
                   "input ids + labels: 2·T·8 (int64)", tokens=shape.tokens)]
    if s.method.adds_virtual_tokens and s.checkpointing is not Checkpointing.NONE:
        # enable_input_require_grads (PEFT + checkpointing) turns the frozen embedding's output
        # into a leaf that requires grad; torch.cat's graph holds it until backward ends.
        inputs.append(part("activations/embedding_output", s.batch_size * s.seq_len *
                           model.hidden_size * w.residual, "embedding output before the "
                           "virtual tokens are prepended B·S·H·bytes, held by the graph",
                           "transformers enable_input_require_grads; peft prompt tuning"))
    if model.is_encoder_decoder and s.checkpointing is not Checkpointing.NONE:
        inputs.append(part("activations/checkpoint_inputs",
                           seq2seq.checkpoint_inputs(model, s, w, shape),
                           "inputs every checkpointed T5 block keeps: position biases, "
                           "encoder output, causal mask", "transformers T5Stack.forward",
                           tokens=shape.tokens))
    if embedding_lora:
        # peft lora.Embedding: after_A = embedding(x, A.T) (T·r) is saved by the matmul with B
        inner = w.compute if w.autocast else w.adapter
        inputs.append(part("activations/embedding_lora", shape.tokens * s.lora_rank * inner,
                           "LoRA on the embedding: A's lookup T·r·bytes, saved for B",
                           "peft lora.Embedding.forward", tokens=shape.tokens,
                           rank=s.lora_rank))
    return inputs


def _group(prefix: str, values: dict[str, int], formula: str,
           special: Mapping[str, str] | None = None, **inputs: Any) -> Group:
    """One piece per entry of ``values`` (path ``prefix + key``, formula ``formula`` with
    ``{k}`` the key, or ``special[key]``), made only if the moment holding them is the peak."""
    other = special or {}
    return Group(sum(values.values()), lambda: [
        part(prefix + k, v, other.get(k) or formula.format(k=k), **inputs)
        for k, v in values.items()])


class _Blocks(NamedTuple):   # a tuple: made once per estimate, cheaply
    kept: list[Item]
    top: list[Item]
    bottom: list[Item]
    forward_last: list[Item]   # all blocks' saved tensors while the last one runs forward
    recompute: list[Item]      # checkpointing: the top block being recomputed
    running: list[Item]        # in ``top`` and ``bottom``: the running block's own tensors
    when: str          # "mlp" or "attention": where the running block's backward peaks


def _block_terms(model: ModelSpec, s: Strategy, w: act.Widths, shape: act.Shape,
                 a: MemoryAssumptions, fixed: _Fixed) -> _Blocks:
    layers = fixed.layers
    line, batch = fixed.saved_line, shape.batch
    checkpointed = s.checkpointing is not Checkpointing.NONE
    per_block: dict[str, int] = {}   # all blocks' saved bytes: not needed when checkpointed
    if not checkpointed or fixed.one_line is None or model.is_encoder_decoder:
        per_block = {k: batch * per + rest for k, per, rest in line} if line is not None else (
            _saved(model, s, w, shape, fixed.layer_inputs))
    if model.is_encoder_decoder:
        one = seq2seq.top_block(model, s, w, shape, per_block)
    else:
        one = {k: batch * per + rest for k, per, rest in fixed.one_line} if (
            fixed.one_line is not None) else {k: v // layers for k, v in per_block.items()}
    if checkpointed and model.is_encoder_only:
        # post-LN: the recomputed block's q/k/v save the checkpointed input tensor itself
        one = dict(one, linear_inputs_attn=one["linear_inputs_attn"] - (
            act.input_shared_with_linears(model, w, shape, fixed.layer_inputs[0].shared)))
    current, transient, when = _current_block(model, s, w, shape, one, checkpointed,
                                              fixed.experts_adapted)
    cos_sin = fixed.rope
    fwd_parts, fwd = _forward_moment(model, s, w, shape, one, fixed)
    if not checkpointed:
        per_block["norms"] -= act.first_norm_without_grad(model, s, w, shape)
        saved = _group("activations/blocks/", per_block, f"{layers} blocks · saved {{k}}",
                       tokens=shape.tokens)
        others = _group("activations/blocks/", {k: v - one[k] for k, v in per_block.items()},
                        f"{layers - 1} blocks · saved {{k}}")
        return _Blocks(kept=[saved, cos_sin], top=[others, current, cos_sin, transient],
                       bottom=[current, cos_sin, transient], when=when,
                       forward_last=[others, fwd_parts, cos_sin, fwd], recompute=[],
                       running=[current, transient])
    inp = act.block_input_bytes(model, w, shape)
    on_device = min(layers, a.offload_blocks_on_device) if (
        s.checkpointing is Checkpointing.OFFLOAD) else layers
    kept: list[Item] = [part("activations/checkpoints", inp * on_device,
                 "block inputs kept by checkpointing: blocks on device · T·H·bytes",
                 "torch.utils.checkpoint (non-reentrant)", blocks=on_device, tokens=shape.tokens),
            cos_sin]
    bottom_kept = [part("activations/checkpoints", inp, "the last block input still kept"),
                   cos_sin]
    flowing = part("activations/output_grad", shape.tokens * model.hidden_size * w.compute,
                   "gradient arriving at the recomputed block T·H·bytes")
    return _Blocks(kept=kept, top=[*kept, current, transient],
                   bottom=[*bottom_kept, current, transient], when=when,
                   forward_last=[*kept, fwd], recompute=[*kept, fwd_parts, fwd, flowing],
                   running=[current, transient])


def _forward_moment(model: ModelSpec, s: Strategy, w: act.Widths, shape: act.Shape,
                    one: dict[str, int], fixed: _Fixed) -> tuple[Group, Piece]:
    """The block running forward (or being recomputed) at its MLP: what it has saved so far
    and the temporaries of its gate/up or down projection, whichever moment is larger."""
    # forward_transient is tokens · a per-token size (made once, at one token, per strategy)
    # and so is forward_live (a max over blocks of sums of T·size terms): both made at T = 1
    t = shape.tokens
    temps, live, dora = fixed.forward_per_token, fixed.live_per_token, fixed.dora
    at_gate = dict(one, mlp=0, mlp_tail=0, linear_inputs_down=0, adapters_mlp=0,
                   held=t * live["mlp_in"])
    at_down = dict(one, held=t * live["down_in"])
    candidates = [(at_gate, t * temps["mlp_in"] + dora["gate/up"], "gate/up"),
                  (at_down, t * temps["down_in"] + dora["down"], "down")]
    if dora["attention"]:
        # DoRA's norm of an attention projection: the block's MLP not yet run (its saved
        # inputs absent; attention's own saved tensors kept, as at o_proj), the input and
        # norm output held, the projection's T·H base output beside the norm temporaries
        at_attention = dict(at_gate, linear_inputs_mlp=0)
        candidates.append((at_attention, t * model.hidden_size * w.compute + dora["attention"],
                           "attention"))
    parts, temp, when = max(candidates, key=lambda c: sum(c[0].values()) + c[1])
    tuner, _ = act.tuner_transients(model, s, w, shape.tokens)  # its update being made
    temp += tuner
    # BERT under autocast: the attention's fp32 dropout output, held to the block's end
    temp += act.encoder_attention_forward(model, s, w, shape)
    temp += act.encoder_forward_held(model, w, shape, fixed.layer_inputs[0].shared)
    saved, held, temporaries = _FORWARD_TEXT[when]
    return (_group("activations/running_block/", parts, saved, held),
            part("activations/forward_transient", temp, temporaries, "peft lora.Linear.forward"))


#: The running block's formulas at each projection (written once, not per estimate).
_FORWARD_TEXT = {when: (
    f"block at its {when} projection · saved {{k}}",
    {"held": f"block at its {when} projection · held unsaved: residual sum, norm output, MLP "
             "product"},
    f"{when} projection temporaries: PEFT input cast + base output + scaled update (T·out "
    "each), or its T·out output (BERT under autocast: + the attention's fp32 dropout output "
    "B·heads·S·S·4); DoRA: + its column norm of W + s·BA (eye(in), BA and its casts, the "
    "scaled sum: peft DoraLinearLayer.forward)") for when in ("gate/up", "down", "attention")}


def _current_block(model: ModelSpec, s: Strategy, w: act.Widths, shape: act.Shape,
                   one: dict[str, int], recomputed: bool,
                   experts_adapted: bool = True) -> tuple[Group, Piece, str]:
    """The block running backward: at its MLP (all saved) or, if larger, at eager attention
    (its MLP and second norm already freed, the fp32 softmax gradients alive)."""
    mlp_t, attn_t = act.backward_transients(model, s, w, shape)
    if recomputed:  # the recomputed first norm saves the checkpointed input tensor itself
        one = dict(one, norms=one["norms"] - act.input_shared_with_norm(model, w, shape))
    # down_proj's input (and a MoE's down outputs) are freed once their backward ran; IA3's
    # input scaling of down_proj peaks while that input is still held (its grad is x·grad).
    at_mlp = dict(one, mlp_tail=0, linear_inputs_down=(
        one["linear_inputs_down"] if s.method is Method.IA3 else 0))
    # At attention backward the block's MLP side (second norm, MLP, their linear inputs and
    # adapters) is freed, and so is eager attention's compute-dtype softmax copy.
    at_attention = dict(one, mlp=0, mlp_tail=0, norms=one["norms"] // 2, linear_inputs_mlp=0,
                        linear_inputs_down=0, adapters_mlp=0,
                        attention=one["attention"] - act.eager_cast_bytes(model, s, w, shape))
    candidates = [(at_mlp, mlp_t, "mlp"), (at_attention, attn_t, "attention")]
    combine = experts.moe_combine_transient(model, w, shape)
    if combine is not None:
        candidates.append((one, combine, "mlp"))
    adapted = experts.adapted_expert_moments(model, s, w, shape) if experts_adapted else []
    for freed, merged, transient in adapted:
        rest = dict(one, mlp_tail=0, mlp=one["mlp"] + one["mlp_tail"] - freed,
                    adapters_mlp=one["adapters_mlp"] - merged)
        candidates.append((rest, transient, "mlp"))
    parts, transient, when = max(candidates, key=lambda c: c[1].value + sum(c[0].values()))
    return _group("activations/current_block/", parts, _BACKWARD_TEXT[when]), transient, when


#: The block running backward's formula at each place (written once, not per estimate).
_BACKWARD_TEXT = {when: f"block in {when} backward · saved {{k}}" for when in ("mlp", "attention")}


def _rope(model: ModelSpec, w: act.Widths, shape: act.Shape) -> Piece:
    if model.is_encoder_decoder:   # T5: relative position bias (counted in its blocks)
        return part("activations/rope", 0, "no rotary positions (relative position bias)")
    if model.is_encoder_only:      # BERT/RoBERTa: learned absolute position embeddings
        return part("activations/rope", 0, "no rotary positions (absolute position "
                    "embeddings, saved with activations/embeddings)")
    return part("activations/rope", 2 * shape.seq_kv * mla.rope_dim(model) * w.compute,
                "RoPE cos and sin 2·S·head_dim·bytes (shared by all blocks; MLA: its "
                "qk_rope_head_dim)")


def _dequant_term(s: Strategy, st: Static) -> list[Piece]:
    if effective_quant(s) is None:
        return []
    size = st.largest_linear * s.precision.compute_bytes
    return [part("activations/dequant_buffer", size,
                 "one dequantized weight at a time: largest linear · compute bytes",
                 "bitsandbytes matmul_4bit / int8 dequantize", params=st.largest_linear)]
