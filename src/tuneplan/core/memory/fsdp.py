"""FSDP as accelerate wraps it: the gathered units and the unsharded gradients of each moment.

Units (accelerate 1.15 ``TRANSFORMER_BASED_WRAP``): one per decoder block, and the rest. FSDP1
(torch 2.13 ``FullyShardedDataParallel``, what tuneplan's accelerate config launches:
``core/launch/engines.py`` writes ``fsdp_version: 1``) puts the embedding, final norm and head
in the root unit's flat parameter, which is never resharded between forward and backward
(torch ``fsdp/_runtime_utils.py``: the root keeps its parameters after forward). FSDP2
(``fully_shard``, accelerate ``fsdp2_prepare_model``) shards the embedding on its own and the
(final norm, head) tail with ``reshard_after_forward=False``; the tail's all-gather output is
kept until the next all-gather (``_fully_shard/_fsdp_param_group.py``).

Gradient accumulation: ``Accelerator.no_sync`` (FSDP1 ``no_sync()``, FSDP2
``set_requires_gradient_sync(False)``) keeps every unit's gradient unsharded, full size, from
the first micro-batch on; FSDP1's flat parameter has one gradient for all of a unit's elements,
frozen ones included, so a LoRA block accumulates a gradient as large as the block
(``fsdp/_wrap_utils.py _validate_frozen_params`` warns about this).

Backward, block by block: the running block and the one its pre-backward prefetches
(BACKWARD_PRE) are unsharded, and the running block's gradients exist only as far as its
backward has made them. FSDP1 (use_orig_params=True) hands a block ``torch.split`` views of
its flat parameter, so the per-parameter gradients wait in the split's backward until the
block's last one is made and are then concatenated into the flat gradient: both at once, the
block's largest moment when its activations are small. FSDP2 keeps the previous unit's
reduce-scatter input until the next unit's post-backward, prefetches the embedding unit at
the bottom block, and prefetches the last block only from the tail's pre-backward, which
runs once the loss has back-propagated to the logits (``_fsdp_param_group.py``
``pre_backward`` / ``_backward_prefetch`` / ``post_backward``).

Checked against ``adapters/probe/fsdp_step`` (2 and 4 gloo ranks, fp32, no FSDP mixed
precision); terms are in the stored dtype of the weights, which FSDP ``MixedPrecision`` /
``MixedPrecisionPolicy`` (not simulated) would change to its ``param_dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.methods import Method, Trainable
from tuneplan.core.job.recipes import PrecisionPlan, Recipe
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.memory.parts import Item, Piece, part
from tuneplan.core.models import ModelSpec

_SRC1 = "torch 2.13 fsdp/fully_sharded_data_parallel.py + _runtime_utils.py (FSDP1)"
_SRC2 = "torch 2.13 fsdp/_fully_shard (FSDP2), accelerate 1.15 fsdp2_prepare_model"
_SYNC = "accelerate 1.15 Accelerator.no_sync; torch 2.13 FSDP no_sync / set_requires_gradient_sync"


def applies(s: Strategy) -> bool:
    """FSDP on several GPUs in an HF-Trainer recipe (the wrap modelled here); HYBRID_SHARD
    has the same units, sharded inside a node."""
    return (s.sharding in (Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID)
            and s.world_size > 1
            and s.recipe in (Recipe.HF, Recipe.PLAIN))


@dataclass(frozen=True, slots=True)
class Units:
    block: int        # one decoder block's parameters, unsharded (adapters included)
    root: int         # FSDP1 root flat parameter: embedding + final norm + head
    tail: int         # FSDP2 (final norm, head) unit
    no_sync: int      # gradients kept unsharded between micro-batches
    head_grad: int    # the output head's gradient, unsharded (0 when the head is frozen)
    root_grad: int    # FSDP1 root flat parameter's gradient, unsharded (0 when frozen)
    embed: int        # FSDP2 input-embedding unit, unsharded
    block_params: int  # one block's parameters (elements, adapters excluded)
    block_grad: int   # one block's gradient as its unit reduces it: FSDP1 the flat gradient
    #                   (frozen elements included), FSDP2 its trainable parameters'
    tail_grad: int    # FSDP2 (final norm, head) unit's gradient (0 when frozen)


def units(model: ModelSpec, s: Strategy, plan: PrecisionPlan, trainable: Trainable,
          version: int) -> Units:
    layers = sum(layer.count for layer in model.layers)
    block_params = sum(layer.params * layer.count for layer in model.layers) // layers
    width = plan.trainable_weight_bytes if s.method.trains_base else plan.frozen_weight_bytes
    adapter_width = plan.adapter_bytes
    grad_width = plan.trainable_weight_bytes
    if plan.autocast:
        # accelerate 1.15 set_mixed_precision under bf16: MixedPrecision(param_dtype=bf16,
        # reduce_dtype=bf16): units are gathered, and their gradients made, in bf16 (the
        # shards, and the optimizer's gradients, stay fp32). Not simulated (fp32 runs only).
        width = adapter_width = grad_width = plan.compute_bytes
    adapters = trainable.adapter_params // layers * adapter_width
    block = block_params * width + adapters
    head = 0 if model.tie_word_embeddings else model.vocab_size * (
        model.head_in_features or model.hidden_size)
    embed = model.vocab_size * model.hidden_size
    norm = model.hidden_size
    root = (embed + head + norm) * width
    tail = (head + norm) * width
    if version == 1:
        # one flat gradient per unit holding any trainable parameter, all its elements
        if s.method is Method.FULL:
            no_sync = (embed + head + norm + block_params * layers) * grad_width
        else:
            no_sync = (block_params * layers + trainable.adapter_params) * grad_width
    else:
        no_sync = (trainable.base_params + trainable.adapter_params) * grad_width
    full = s.method is Method.FULL
    head_grad = (head or embed) * grad_width if full else 0
    root_grad = (embed + head + norm) * grad_width if full else 0
    if version == 1:
        block_grad = (block_params * grad_width if s.method is Method.FULL else
                      (block_params + trainable.adapter_params // layers) * grad_width)
    else:
        block_grad = (block_params * grad_width if s.method is Method.FULL else
                      trainable.adapter_params // layers * grad_width)
    return Units(block=block, root=root, tail=tail, no_sync=no_sync, head_grad=head_grad,
                 root_grad=root_grad, embed=embed * width, block_params=block_params,
                 block_grad=block_grad, tail_grad=(head + norm) * grad_width if full else 0)


@dataclass(frozen=True, slots=True)
class Running:
    """The block running backward, as the generic moments hold it: its own saved tensors,
    transients and gradient piece (``items``, found by identity in the top and bottom
    moments), its gradients made by that moment, unsharded (``grads``), and the tokens."""

    items: list[Item]
    grads: int
    tokens: int


def adjust(moments: dict[str, list[Item]], model: ModelSpec, s: Strategy,
           plan: PrecisionPlan, trainable: Trainable, grads: list[Piece],
           version: int, sync_each_batch: bool = False, running: Running | None = None) -> None:
    """Add FSDP's gathered units (FULL_SHARD) and, under gradient accumulation, swap the
    sharded gradients for the unsharded ones ``no_sync`` keeps, in every moment but the
    optimizer step (unless ``sync_each_batch``: then every micro-batch reduce-scatters)."""
    u = units(model, s, plan, trainable, version)
    src = _SRC1 if version == 1 else _SRC2
    no_sync = s.grad_accum > 1 and not sync_each_batch
    if no_sync:
        held = {id(g) for g in grads}
        kept = part("sharding/fsdp_no_sync_gradients", u.no_sync,
                    "gradients kept unsharded by no_sync between micro-batches"
                    + (": every unit's flat gradient, frozen elements included" if version == 1
                       else ": trainable parameters · grad bytes"), _SYNC)
        for name, items in moments.items():
            if name == "optimizer":
                continue
            rest = [i for i in items if id(i) not in held]
            if len(rest) != len(items) or name.startswith(("forward", "backward")):
                items[:] = [*rest, kept]
    if s.sharding is Sharding.FSDP_GRAD_OP:
        return  # SHARD_GRAD_OP keeps every parameter unsharded: nothing more is gathered
    shards = s.gpus if s.sharding is Sharding.HYBRID else s.world_size
    block = u.block
    # the running block's gradients made so far are unsharded until its post-backward (the
    # generic moments count them sharded, or not at all under no_sync): topped up here
    own = _own_gradients(running, no_sync, src)
    if version == 1:
        # use_orig_params=True: the head's gradient is the original parameter's, unsharded,
        # until the root unit's post-backward hook reduces the root flat gradient (the last
        # thing backward does); the estimate's sharded head gradient is topped up to it
        counted = 0 if no_sync else u.head_grad // shards
        pending = part("sharding/fsdp_head_gradient", u.head_grad - counted,
                       "head gradient unsharded until the root's post-backward"
                       + (f" (less the 1/{shards} already counted)" if counted else ""),
                       src)
        root = part("sharding/fsdp_root_unit", u.root, "FSDP1 root flat parameter unsharded "
                    "from forward to the end of backward: embedding + final norm + head", src)
        gathered = {"forward": [root], "forward-head": [root],
                    "forward-last-block": [root, _block(block, 1, src)],
                    "backward-start": [root, _block(block, 1, src)],
                    "backward-top-block": [root, pending, _block(block, 2, src), *own],
                    "backward-bottom-block": [root, pending, _block(block, 1, src), *own],
                    "backward-recompute": [root, pending, _block(block, 2, src)]}
        if running is not None and "backward-top-block" in moments:
            moments["backward-block-gradient"] = [
                *_settled(moments["backward-top-block"], running), root, pending,
                _block(block, 2, src), *_flat_gradient(model, plan, u, running)]
        if u.root_grad:
            # the root's post-backward: its flat gradient is made (full) while the original
            # head and embedding gradients still exist; every block's gradient is sharded
            base = moments["optimizer"][0] if "optimizer" in moments else None
            if base is not None:
                blocks = (u.no_sync - u.root_grad if no_sync else
                          sum(int(g.value) for g in grads) - -(-u.root_grad // shards))
                moments["backward-root"] = [
                    base, part("gradients/trainable", blocks, "every block's gradient"
                               + (" (no_sync)" if no_sync else " (sharded)")),
                    root, part("sharding/fsdp_root_gradient", 2 * u.root_grad,
                               "root flat gradient + the original head/embedding gradients "
                               "it is copied from, unsharded", src)]
    else:
        tail = [part("sharding/fsdp_tail_unit", 2 * u.tail, "FSDP2 (final norm, head) unit "
                     "unsharded + its all-gather output (reshard_after_forward=False)", src)]
        kept_tail = part("sharding/fsdp_tail_unit", u.tail,
                         "FSDP2 (final norm, head) unit unsharded", src)
        # FSDPParamGroup.post_backward keeps the previous unit's reduce-scatter input (one
        # buffer: comm_ctx.reduce_scatter_states, reduce_scatter_max_input_buffers = 1) until
        # the next unit's post-backward. Under no_sync nothing is reduced before the last
        # micro-batch, whose buffers take the place of the accumulated gradients they copy
        # (freed there): the no_sync term already counts them.
        rs_tail = [] if no_sync or not u.tail_grad else [part(
            "sharding/fsdp_reduce_scatter_input", u.tail_grad, "the (final norm, head) "
            "unit's reduce-scatter input, kept until the next unit's post-backward", src)]
        rs_block = [] if no_sync or not u.block_grad else [part(
            "sharding/fsdp_reduce_scatter_input", u.block_grad, "the block above's "
            "reduce-scatter input, kept until this block's post-backward", src)]
        # the bottom block's pre-backward prefetches the unit before it in forward order:
        # the embedding, its own unit when untied (all-gathered even when frozen)
        embed = [] if model.tie_word_embeddings else [part(
            "sharding/fsdp_embedding_unit", u.embed, "the input embedding's unit, "
            "prefetched by the bottom block's pre-backward (_backward_prefetch)", src)]
        gathered = {"forward": tail, "forward-head": tail,
                    "forward-last-block": [_block(2 * block, 1, src)],
                    "backward-start": [kept_tail],
                    "backward-head": [kept_tail, _block(block, 1, src)],
                    "backward-top-block": [_block(block, 2, src), *rs_tail, *own],
                    "backward-bottom-block": [_block(block, 1, src), *embed, *rs_block, *own],
                    "backward-recompute": [_block(block, 2, src), *rs_tail]}
        if u.head_grad and "backward-start" in moments:
            moments["backward-head"] = _head_backward(moments["backward-start"], model, s,
                                                      plan, u)
    for name, items in moments.items():
        items.extend(gathered.get(name, []))


def _own_gradients(running: Running | None, no_sync: bool, src: str) -> list[Piece]:
    """The running block's gradients made so far, unsharded, less what the moment counts."""
    if running is None or not running.grads:
        return []
    counted = 0 if no_sync else sum(
        int(i.value) for i in running.items
        if isinstance(i, Piece) and i.path == "gradients/current_block")
    return [part("sharding/fsdp_running_gradients", running.grads - counted,
                 "the running block's gradients made so far, unsharded until its "
                 "post-backward" + (" (less the sharded share counted)" if counted else ""),
                 src)]


def _settled(top: list[Item], running: Running) -> list[Item]:
    """The top block's moment without the running block's own tensors: what is left when
    its backward has made its last gradient."""
    mine = {id(i) for i in running.items}
    return [i for i in top if id(i) not in mine]


def _flat_gradient(model: ModelSpec, plan: PrecisionPlan, u: Units,
                   running: Running) -> list[Piece]:
    """FSDP1 (use_orig_params=True): autograd reaches the flat parameter through the
    ``torch.split`` views FSDP hands the block in forward (``_flat_param.py``
    ``_use_unsharded_views``), so every parameter's gradient waits in the split's backward
    until the block's last one is made, then ``split_with_sizes_backward`` concatenates them
    into the unit's flat gradient: both alive at once. The views all require grad (the flat
    parameter does), so a LoRA block's frozen weights get gradients too: the pieces are
    the flat gradient's size either way."""
    return [part("sharding/fsdp_block_gradient", 2 * u.block_grad,
                 "the block's parameter gradients + the flat gradient concatenated from them",
                 _SRC1),
            part("activations/output_grad", running.tokens * model.hidden_size
                 * plan.compute_bytes, "gradient leaving the block T·H·bytes")]


def _head_backward(start: list[Item], model: ModelSpec, s: Strategy, plan: PrecisionPlan,
                   u: Units) -> list[Item]:
    """FSDP2, the head training: the tail's pre-backward hook (``FSDPParamGroup.pre_backward``
    → ``_backward_prefetch``) is registered on the tail's output, the logits, so it runs once
    the loss has back-propagated to them: the loss's backward temporaries and its saved
    log-softmax are freed, the logits' gradient is alive, and the last block is all-gathered
    (prefetched) before the head's matmul backward makes the head's gradient (unsharded,
    V·H) and its input's gradient (T·H). The prefetched block is added by the caller."""
    tokens = s.batch_size * s.seq_len
    logit = plan.compute_bytes if plan.autocast else plan.trainable_weight_bytes
    width = model.head_in_features or model.hidden_size
    return [*(i for i in start if not (isinstance(i, Piece) and i.path.startswith("logits/"))),
            part("logits/head_output_grad", tokens * model.vocab_size * logit,
                 "gradient of the logits reaching the head T·V·logit_bytes (the loss's own "
                 "backward tensors freed)", _SRC2, tokens=tokens),
            part("sharding/fsdp_head_gradient", u.head_grad, "the head's gradient made by "
                 "its matmul backward, unsharded: V·H·grad bytes", _SRC2),
            part("activations/head_input_grad", tokens * width * plan.compute_bytes,
                 "gradient of the head's input T·H·bytes", _SRC2, tokens=tokens)]


def _block(block: int, count: int, src: str) -> Piece:
    return part("sharding/fsdp_block_units", block * count,
                f"{count} × one block unsharded (running + prefetched, BACKWARD_PRE; "
                "in backward the running block's unsharded gradient too)", src, blocks=count)
