"""Tensors whose size does not depend on the batch: weights, gradients, optimizer state, master
weights, buffers of the sharding scheme — per GPU after sharding and offload — and host RAM.

Gradients are listed for the moments of backward (head only at the top block, all but the
embedding at the bottom) so the step's timeline can compose them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.galore import galore_matrices
from tuneplan.core.job.methods import (
    Method,
    Trainable,
    effective_quant,
    expert_adapter_params,
    lora_rank_of,
    outer_adapter_params,
    outer_targets,
    targeted_linears,
)
from tuneplan.core.job.recipes import PrecisionPlan, Recipe
from tuneplan.core.job.strategy import Checkpointing, Sharding, Strategy, Task
from tuneplan.core.job.tuners import WEIGHT_TUNERS, linear_matrices
from tuneplan.core.memory import unsloth
from tuneplan.core.memory.activations import linear_group
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.optimizer import (
    PAGED_MIN_ELEMENTS,
    optimizer_bytes,
    paged_state_bytes,
)
from tuneplan.core.memory.parts import Piece, part, total
from tuneplan.core.memory.sharding import ShardPlan, shard
from tuneplan.core.memory.weights import head_quantized, split_params, weight_terms
from tuneplan.core.memory.zero import offload_host_extras
from tuneplan.core.memory.zero3_gather import SOURCE, gather_peak
from tuneplan.core.memory.zero3_gather import Knobs as Zero3Knobs
from tuneplan.core.models import Linear, LinearRole, ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Static:
    resident: list[Piece]         # weights + states + master + buffers on the GPU all step
    grads: list[Piece]            # all gradients (after backward)
    grads_top: list[Piece]        # gradients alive while the top block runs backward
    grads_bottom: list[Piece]     # gradients alive while the bottom block runs backward
    block_grads: dict[str, int]  # the running block's own gradients at its MLP / attention
    step: list[Piece]             # optimizer-step temporary
    autocast_copies: dict[str, list[Piece]]  # compute-dtype weight copies, by moment
    outside: list[Piece]          # on the device but outside the allocator (paged state)
    host: list[Piece]             # offloaded to host RAM, per rank
    weights_bytes: int
    largest_linear: int
    total_params: int
    #: one resumable checkpoint (unsharded, every rank's part together): the weights it saves
    #: (every weight when the base trains, else the trainable tensors: the gradients' count)
    #: and the optimizer's state (states, master copy, GaLore projectors)
    checkpoint_weights_bytes: int = 0
    checkpoint_state_bytes: int = 0


def static_terms(model: ModelSpec, s: Strategy, plan: PrecisionPlan, trainable: Trainable,
                 sp: ShardPlan, a: MemoryAssumptions) -> Static:
    weights = weight_terms(model, s, plan, trainable, a)
    wbytes = total(weights)
    ob = optimizer_bytes(s, plan, trainable, a,
                         galore_matrices(model, s) if s.optimizer.is_galore else ())
    split = split_params(model, head=head_quantized(model, s))
    resident: list[Piece] = []
    host: list[Piece] = []
    if sp.params_on_host:
        host.append(part("host/params", shard(wbytes, sp.shards), "weights / shards"))
    else:
        resident += [_sharded(t, sp.params_div) for t in weights]
    states = part("optimizer/states", shard(ob.states, sp.states_div), ob.formula
                  + (f" / {sp.states_div} shards" if sp.states_div > 1 else ""),
                  "galore-torch 1.0 adamw.py / adamw8bit.py / adafactor.py (states of the "
                  "projected gradient)" if s.optimizer.is_galore else "")
    master = part("optimizer/master_weights", shard(ob.master, sp.states_div),
                  "fp32 master copy of trainable params / shards", "DeepSpeed bf16/fp16")
    outside: list[Piece] = []
    if sp.states_on_host:
        host += [states, master, *offload_host_extras(model, s)]
    elif s.optimizer.is_paged:
        # bnb paged optimizers put the states of large tensors in CUDA managed memory,
        # outside torch's allocator; small tensors' states are ordinary allocations.
        paged = min(shard(paged_state_bytes(s, plan, trainable, a), sp.states_div),
                    int(states.value))
        outside.append(part("optimizer/paged_states", paged,
                            f"states of tensors >= {PAGED_MIN_ELEMENTS} elements in CUDA "
                            "managed memory, counted as resident on the GPU (bnb prefetches "
                            "them for each step; under memory pressure the driver can evict "
                            "them to host RAM, at a speed cost)",
                            "bitsandbytes 0.50.2 functional.get_paged / "
                            "Optimizer8bit.get_state_buffer"))
        resident += [part("optimizer/states", int(states.value) - paged,
                          ob.formula + f"; tensors under {PAGED_MIN_ELEMENTS} elements "
                          "(not paged)"), master]
    else:
        resident += [states, master]
    if ob.projectors:
        resident.append(part("optimizer/galore_projectors", ob.projectors, ob.projector_formula,
                             "galore-torch 1.0 galore_projector.py get_orthogonal_matrix "
                             "(torch.linalg.svd full_matrices=False), via transformers 5.24 "
                             "trainer_optimizer._setup_low_rank_optimizer",
                             rank=s.galore_rank))
    resident += _buffers(model, s, sp, ob.grads, wbytes, split.total, a)
    grads = _grad_terms(model, s, trainable, ob.grads, ob.grad_largest, sp)
    step = [part("optimizer/step_temporary", shard(ob.step_temp, sp.states_div),
                 ob.step_formula, "galore-torch 1.0 adamw.py / adamw8bit.py / adafactor.py "
                 "step, galore_projector.py project / project_back",
                 update_proj_gap=s.galore_update_proj_gap) if ob.step_formula else
            part("optimizer/step_temporary", shard(ob.step_temp, sp.states_div),
                 f"AdamW '{ob.impl}' step temporaries",
                 "docs/FIELD-NOTES.md: fused 0, foreach one parameter copy, single the largest "
                 "tensor's twice, hf (transformers AdamW) once; impl from "
                 + ("MemoryAssumptions.adamw_impl" if a.adamw_impl else
                    "the stack (versions.hf_default_optim)")),
            *_zero_fp32_grads(s, plan, trainable, sp, a)]
    autocast = _autocast_copies(model, s, plan, trainable)
    return Static(resident=resident, grads=grads[0], grads_top=grads[1], grads_bottom=grads[2],
                  block_grads=block_gradients(model, s, plan, sp.grads_div),
                  step=step, autocast_copies=autocast, outside=outside, host=host,
                  weights_bytes=wbytes, largest_linear=split.largest_linear,
                  total_params=split.total,
                  checkpoint_weights_bytes=wbytes if s.method.trains_base else ob.grads,
                  checkpoint_state_bytes=ob.states + ob.master + ob.projectors)


def _autocast_copies(model: ModelSpec, s: Strategy, plan: PrecisionPlan,
                     trainable: Trainable) -> dict[str, list[Piece]]:
    """Autocast's compute-dtype copies of fp32 weights, per moment of the step.

    Casts of trainable (leaf) weights stay in autocast's cache until forward leaves autocast,
    so all blocks' copies are alive in forward even with checkpointing; backward keeps the
    ones its saved matmuls hold: every block's without checkpointing, the recomputed block's
    with it. The output head's copy (trainable, or PEFT's fp32-upcast frozen head under
    QLoRA) is saved by the head's matmul and freed by its backward, the first in backward.
    LoRA A/B under autocast are cast like any trainable weight."""
    layers = sum(layer.count for layer in model.layers)
    head = block = 0
    what = "block linears"
    if plan.autocast and s.method.trains_base:
        block = split_params(model).block_linear // layers * plan.compute_bytes
        # an encoder's seq-cls head (pooler + classifier) replaced the vocabulary head
        head = (model.head_params if model.is_encoder_only else
                model.vocab_size * model.hidden_size) * plan.compute_bytes
    elif plan.autocast and s.method.is_lora and plan.adapter_bytes != plan.compute_bytes:
        # not DoRA's m, nor the experts' factors (ParamWrapper casts them itself, counted with
        # the merged expert weights in activations/*/adapters_mlp)
        # nor the A/B on the output head / embedding (``outer_targets``): the head's are cast
        # with the head (freed by its backward); the embedding's B (H·r) is left out
        outer = {lin.role: s.lora_rank * (lin.in_features + lin.out_features)
                 for lin in outer_targets(model, s)}
        lora = sum(r * c * n for r, c, n in trainable.matrices if r > 1) - \
            expert_adapter_params(model, s) - sum(outer.values())
        block, what = lora // layers * plan.compute_bytes, "LoRA A/B"
        head = outer.get(LinearRole.OUTPUT_HEAD, 0) * plan.compute_bytes
    if plan.autocast and plan.kbit_upcast and s.task is Task.CAUSAL_LM:
        head += model.vocab_size * model.hidden_size * plan.compute_bytes
    ckpt = s.checkpointing is not Checkpointing.NONE
    src = "torch.autocast weight casts (cached for leaf weights until autocast exits)"

    def term(blocks: int, with_head: bool, when: str) -> list[Piece]:
        return [part("weights/autocast_copies", block * blocks + (head if with_head else 0),
                     f"bf16 copies of fp32 weights {when}: {blocks} blocks' {what} · 2"
                     + (" + the output head's V·H·2" if with_head and head else ""), src,
                     blocks=blocks)]
    return {"forward": term(layers, True, "in forward (autocast cache)"),
            "backward-start": term(0 if ckpt else layers, True, "saved for backward"),
            "top": term(1 if ckpt else layers, False, "saved by blocks not yet back-propagated"),
            "bottom": term(1, False, "saved by the bottom block")}


def _zero_fp32_grads(s: Strategy, plan: PrecisionPlan, trainable: Trainable, sp: ShardPlan,
                     a: MemoryAssumptions) -> list[Piece]:
    """DeepSpeed ZeRO with fp32 master weights steps on fp32 gradients: it flattens the 16-bit
    gradient partition (a copy) and casts it to fp32, ZeRO-1/2 for the whole partition at once,
    ZeRO-3 one ``sub_group_size`` sub-group at a time: 2 + 4 bytes per element, on the GPU
    unless the optimizer is offloaded."""
    if not plan.master_bytes or sp.states_on_host or s.optimizer_in_backward or \
            s.sharding not in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3):
        return []
    elements = shard(trainable.total, sp.states_div)
    if s.sharding is Sharding.ZERO3:
        elements = min(elements, a.zero3_sub_group_elements)
    return [part("optimizer/fp32_grad_partition", elements * (2 + 4),
                 "flattened 16-bit gradient partition + its fp32 cast, (2 + 4) B per element"
                 + (" of one sub-group" if s.sharding is Sharding.ZERO3 else ""),
                 "deepspeed stage_1_and_2 step / stage3 _prepare_fp32_grad_for_sub_group",
                 elements=elements)]


def _sharded(t: Piece, div: int) -> Piece:
    if div == 1:
        return t
    return part(t.path, shard(int(t.value), div), f"({t.formula}) / {div} shards", t.source,
                **dict(t.inputs))


def _buffers(model: ModelSpec, s: Strategy, sp: ShardPlan, grads: int, wbytes: int,
             params: int, a: MemoryAssumptions) -> list[Piece]:
    out: list[Piece] = []
    if sp.ddp_buckets:
        out.append(part("sharding/ddp_buckets", grads, "DDP gradient buckets: a copy of the "
                        "gradients", "torch DDP gradient_as_bucket_view=False (default)"))
    if sp.zero_buckets:
        size = min(grads, model.hidden_size ** 2 * 2 * 2)
        out.append(part("sharding/zero_buckets", size, "reduce + allgather buckets of H² "
                        "elements (HF 'auto') · 2 B", "transformers deepspeed auto config"))
    if sp.gathers_blocks and s.sharding is Sharding.ZERO3 and effective_quant(s) is None:
        out.append(_zero3_gathered(model, s))
    elif sp.gathers_blocks:   # FSDP outside fsdp.py's units, and quantized ZeRO-3
        layers = sum(layer.count for layer in model.layers)
        block = wbytes * sum(layer.params * layer.count for layer in model.layers) // (
            max(params, 1) * layers)
        out.append(part("sharding/gathered_blocks", block * a.gathered_blocks,
                        "gathered (unsharded) blocks: current + prefetched · one block's weights",
                        "ZeRO-3 prefetch / FSDP unit all-gather", blocks=a.gathered_blocks))
    return out


def _zero3_gathered(model: ModelSpec, s: Strategy) -> Piece:
    """ZeRO-3's parameters gathered at once: DeepSpeed's coordinator replayed on the step's
    submodule trace with the emitted JSON's knobs (``zero3_gather``)."""
    knobs = Zero3Knobs.hf_auto(model.hidden_size)
    width = s.precision.compute_bytes
    adapters = 4 if s.method.is_lora else width   # PEFT's fp32 adapters (zero.zero_job)
    peak = gather_peak(model, s, knobs, width, adapters)
    return part("sharding/gathered_params", peak.bytes,
                f"ZeRO-3 parameters gathered at once ({peak.where}): the running submodule "
                f"(largest {peak.largest_submodule:,} elements) + prefetched ones up to the "
                f"bucket of {knobs.prefetch_bucket_size:,} (0.9·H²) while under "
                f"max_live_parameters {knobs.max_live_parameters:.0e}, + those reused within "
                f"max_reuse_distance {knobs.max_reuse_distance:.0e} elements; under "
                "checkpointing a block's frozen weights stay gathered through its backward; "
                f"params of <= {knobs.param_persistence_threshold:,} (10·H) elements are "
                f"persistent, not counted: {peak.elements:,} elements", SOURCE,
                elements=peak.elements)


def _grad_terms(model: ModelSpec, s: Strategy, trainable: Trainable, grads: int,
                largest: int, sp: ShardPlan) -> tuple[list[Piece], list[Piece], list[Piece]]:
    if s.optimizer_in_backward:
        one = [part("gradients/in_flight", largest, "optimizer in backward: one tensor's grad",
                    "torchtune optimizer_in_bwd")]
        return one, one, one
    g = shard(grads, sp.grads_div)
    full = [part("gradients/trainable", g, "trainable params · grad bytes"
                 + (f" / {sp.grads_div} shards" if sp.grads_div > 1 else ""))]
    layers = sum(layer.count for layer in model.layers)
    width = grads // max(trainable.total, 1)
    embed = model.vocab_size * model.hidden_size * width
    if s.method is Method.FULL and model.is_encoder_only:
        # BERT/RoBERTa seq-cls: the head (pooler + classifier) back-propagates first; the
        # embeddings (word, position, token type, LayerNorm) last.
        head = model.head_params * width
        pending = model.embedding_params * width
        block = (grads - head - pending) // layers
    elif s.method in (Method.FULL, Method.LISA):
        # The head's gradient exists once the head ran backward (for tied weights it is the
        # embedding's); an untied embedding's gradient comes last. LISA's bottom block may be
        # a frozen one: none of its gradients is left out there.
        head = embed
        pending = 0 if model.tie_word_embeddings else embed
        block = 0 if s.method is Method.LISA else (
            grads - embed * (1 if model.tie_word_embeddings else 2)) // layers
    else:
        # LoRA on the output head (``outer_targets``): its gradients exist once the head ran
        # backward; on the embedding, they come last.
        head = outer_adapter_params(model, s, LinearRole.OUTPUT_HEAD) * width
        pending = outer_adapter_params(model, s, LinearRole.EMBEDDING) * width
        block = (grads - head - pending) // layers
    top = [part("gradients/trainable", shard(head, sp.grads_div),
                "head gradients (blocks not reached yet)")]
    bottom = [part("gradients/trainable", shard(max(grads - pending - block, 0), sp.grads_div),
                   "all gradients but the bottom block's and the untied input embedding's")]
    return full, top, bottom


def block_gradients(model: ModelSpec, s: Strategy, plan: PrecisionPlan, grads_div: int,
                    frozen_too: bool = False) -> dict[str, int]:
    """One block's gradients that exist while it runs backward: during its MLP backward the
    down projection's; during its attention backward every MLP-side one and o_proj's.
    ``frozen_too``: frozen base weights get gradients as well (FSDP1 with use_orig_params
    hands a block views of one flat parameter, all of which require grad)."""
    down = mlp_side = o = 0
    layers = 0
    frozen = 0 if s.method.trains_base or not frozen_too else (
        plan.compute_bytes if plan.autocast else plan.frozen_weight_bytes)
    for layer in model.layers:
        targets = {id(t) for t in targeted_linears(model, s, layer)}
        for lin in layer.linears:
            size = (_linear_grad(lin, s, plan, id(lin) in targets)
                    + lin.params * frozen) * layer.count
            group = linear_group(lin)
            down += size if group == "down_in" else 0
            mlp_side += size if group in ("down_in", "mlp_in") else 0
            o += size if group == "o_in" else 0
        layers += layer.count
    return {"mlp": shard(down // layers, grads_div),
            "attention": shard((mlp_side + o) // layers, grads_div),
            "none": 0}


def _linear_grad(lin: Linear, s: Strategy, plan: PrecisionPlan, targeted: bool) -> int:
    if s.method.trains_base:
        return lin.params * plan.trainable_weight_bytes
    if not targeted or s.method.is_prompt_learning:
        return 0
    if s.method is Method.IA3:
        return lin.in_features * lin.copies * plan.adapter_bytes  # upper bound of the vector
    if s.method in WEIGHT_TUNERS:
        per = sum(r * c * k for r, c, k in linear_matrices(s.method, lin, s.lora_rank))
        return per * lin.copies * plan.adapter_bytes
    per = lora_rank_of(lin, s) * (lin.in_features + lin.out_features) + (
        lin.out_features if s.method is Method.DORA else 0)
    return per * lin.copies * plan.adapter_bytes


def host_terms(model: ModelSpec, s: Strategy, st: Static, sp: ShardPlan) -> list[Piece]:
    """Host RAM per node: offloaded state of each local rank, offloaded checkpoints, loading."""
    ranks = s.gpus
    out = [part(t.path, int(t.value) * ranks, f"{ranks} ranks · ({t.formula})", t.source)
           for t in st.host]
    if s.checkpointing is Checkpointing.OFFLOAD and s.recipe is Recipe.UNSLOTH and \
            unsloth.uncovered(model, s) is None:
        layout = unsloth.offload_layout(model, s)
        if layout.host_buffers:
            out.append(part("host/offloaded_checkpoints", layout.host_buffers * ranks,
                            "unsloth's pinned CPU_BUFFERS: 200 of 128K elements, the first L "
                            "grown to one layer input T·H (the first step offloads every "
                            "layer) · bytes", unsloth.SOURCE))
    elif s.checkpointing is Checkpointing.OFFLOAD:
        size = s.tokens * model.hidden_size * s.precision.compute_bytes * sum(
            la.count for la in model.layers)
        out.append(part("host/offloaded_checkpoints", size * ranks,
                        "ranks · layers · T·H·bytes (pinned)"))
    if s.sharding is Sharding.ZERO3 and effective_quant(s) is None:
        out.append(_zero3_loading(model, st))
        return out
    loaders = 1 if sp.params_div > 1 else ranks
    out.append(part("host/model_loading", st.weights_bytes * loaders,
                    "weights loaded on the CPU by each process (once with sharded init)",
                    "transformers from_pretrained / FSDP cpu_ram_efficient_loading"))
    return out


def _zero3_loading(model: ModelSpec, st: Static) -> Piece:
    """ZeRO-3 loading (not quantized) books one block's weights of anonymous host RAM.

    transformers 5.24 modeling_utils.py ``_load_pretrained_model``: under
    ``is_deepspeed_zero3_enabled()`` the model is built inside ``deepspeed.zero.Init``
    (each rank holds only its partition, on the GPU: deepspeed partition_parameters.py
    ``Init`` with ``remote_device`` None), and rank 0 alone reads the checkpoint
    (``map_location="cpu"``, the others ``"meta"``). ``load_state_dict`` opens safetensors
    with ``safe_open`` whose default backend is ``"mmap"`` (safetensors 0.8.0), so the merged
    state dict is file-backed page cache the kernel can drop, not allocated RAM.
    integrations/deepspeed.py ``_load_state_dict_into_zero3_model`` then copies module by
    module under ``GatheredParameters`` (on the GPU); weight conversions (fused MoE experts)
    are yielded one at a time, "instead of holding the whole converted checkpoint in
    memory". What rank 0's node allocates is thus about one conversion's output, bounded
    here by the largest block's weights. Not counted: ``disable_mmap`` (hf-mount FUSE) or
    ``.bin`` checkpoints, which read whole files into RAM. Confidence: medium (read, not
    measured)."""
    params = max(st.total_params, 1)
    block = max((layer.params for layer in model.layers), default=0)
    size = st.weights_bytes * block // params
    return part("host/model_loading", size,
                "ZeRO-3: rank 0 maps the safetensors shards (page cache) and converts one "
                "block at a time: the largest block's weights",
                "transformers 5.24 modeling_utils _load_pretrained_model + integrations/"
                "deepspeed.py _load_state_dict_into_zero3_model; safetensors 0.8 mmap")
