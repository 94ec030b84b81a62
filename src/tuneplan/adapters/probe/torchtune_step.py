"""torchtune's own training step under the live-bytes tracker (``--recipe torchtune``).

Builds torchtune 0.6.1's llama-3 decoder with its own component builders
(``torchtune.models.llama3_1.llama3_1`` / ``lora_llama3_1`` for an untied head,
``llama3_2.llama3_2`` / ``lora_llama3_2`` for a tied one) from a llama config.json mapping and
runs the step of ``recipes/lora_finetune_single_device.py`` / ``full_finetune_single_device.py``
(torchtune v0.6.1) as written there:

- the model built under ``training.set_default_dtype(dtype)``: every parameter in the recipe
  dtype (bf16 or fp32), no autocast, no fp32 master copy; the RoPE cache (fp32, built at the
  builder's ``max_seq_len``) is a buffer; LoRA: ``set_trainable_params(model,
  get_adapter_params(model))``.
- checkpointing: ``training.set_activation_checkpointing(model, auto_wrap_policy=
  {TransformerSelfAttentionLayer})`` (torch's non-reentrant checkpoint wrapper per layer).
- ``CEWithChunkedOutputLoss`` (the configs' loss, ``--loss chunked``, the default):
  ``model.set_num_output_chunks(8)``, the model returns a list of 8 logits chunks, each upcast
  to fp32 by the loss; ``--loss standard``: ``torch.nn.CrossEntropyLoss`` over the model's
  ``output(h).float()``.
- ``_loss_step``: labels shifted with ``torch.hstack`` and the recipe's ``ignore_labels_cache``
  (B×1, int64); ``del logits``; ``current_loss = loss * current_num_tokens``;
  ``running_loss += current_loss``; backward; ``training.scale_grads``; ``optimizer.step()``;
  ``optimizer.zero_grad(set_to_none=True)``.

- ``--packing``: the packed batch's ``input_pos`` (B×S, int64) goes to the model, so each RoPE
  call gathers ``cache[input_pos]`` (a new fp32 B×S×head_dim tensor, saved by its products).
  On CUDA torchtune runs flex attention over a ``BlockMask`` (``_SUPPORTS_FLEX_ATTENTION``);
  here SDPA runs causal over the whole row: both save q, k, v, the output and the fp32
  logsumexp; the BlockMask's int32 block tables (of B·(S/128)² entries) are not counted.

``torchtune.training`` is not imported: it imports ``torchao.quantization.int4_weight_only``,
which torchao 0.16 no longer has. Its three helpers the recipes call here are repeated with the
same torch calls (``set_default_dtype``: training/precision.py; ``set_activation_checkpointing``:
training/memory.py, ``apply_activation_checkpointing`` with a ``ModuleWrapPolicy``;
``scale_grads``: training/_grad_scaler.py, ``p.grad *= scaler`` per parameter).

- ``--compile``: the recipes' ``training.compile_model`` (every layer compiled, before
  checkpointing wraps it) and ``compile_loss`` (the chunked loss's ``compute_cross_entropy``
  in place; a standard loss compiled only where the LoRA recipe keeps the returned module),
  with ``compile_backend``: inductor's decompositions and partitioner decide what each layer
  saves, the partitioned graphs then run eagerly, so the state held for backward is
  inductor's to the byte while transients inside a graph are eager's (every intermediate
  inductor would fuse away exists once). Real tensors only: dynamo does not trace here
  under fake tensors.

- ``--offload-activations``: the recipe's ``get_act_offloading_ctx_manager`` over checkpointed
  layers, with ``OffloadActivations``' bookkeeping repeated here (``training`` cannot be
  imported, above): the same ids, forward and backward stashes and hooks, no CUDA streams, host
  copies made outside the tracker.
- ``--method qlora``: the LoRA builders with ``quantize_base=True`` (every block linear a
  torchao ``NF4Tensor``: ``LoRALinear``'s base and ``FrozenNF4Linear``; the embedding and a tied
  head stay in the recipe dtype), on real tensors only (``to_nf4`` quantizes real weights).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from tuneplan.adapters.probe import build
from tuneplan.adapters.probe.harness import MeasuredStep, StepSetup, measured_step
from tuneplan.adapters.probe.tracker import StorageTracker
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Checkpointing, Loss, Precision, Strategy
from tuneplan.core.memory.torchtune import OFFLOAD_STASH, qlora_quant_problem
from tuneplan.errors import ProbeError, UnsupportedError

#: torchtune configs: ``loss: CEWithChunkedOutputLoss`` (``num_output_chunks=8`` default).
OUTPUT_CHUNKS = 8
#: torchtune's ``CROSS_ENTROPY_IGNORE_IDX`` (torchtune/data/_common.py).
IGNORE_INDEX = -100
#: tuneplan's LoRA target names -> torchtune's ``lora_attn_modules`` entries.
_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
_MLP = frozenset({"gate_proj", "up_proj", "down_proj"})


def refuse_unrunnable(s: Strategy, *, fake: bool = False) -> None:
    """What this torchtune step cannot run, with the flag."""
    quant = qlora_quant_problem(s)
    reasons = [
        (s.method not in (Method.FULL, Method.LORA, Method.QLORA),
         f"--method {s.method} (the torchtune simulation runs full, lora and qlora)"),
        (quant is not None, quant or ""),
        (s.method is Method.QLORA and fake, "--method qlora under fake tensors (torchao's "
                                            "to_nf4 needs real weights: run the tiny configs)"),
        (s.precision not in (Precision.BF16, Precision.FP32),
         f"--precision {s.precision} (torchtune trains in one dtype: bf16 or fp32)"),
        (s.world_size > 1 or s.grad_accum > 1, "more than one GPU or micro-batch"),
        (bool(s.trainable_modules), "--trainable-modules"),
        (s.attention is Attention.EAGER, "--attention eager (torchtune runs SDPA)"),
        (s.optimizer_in_backward, "--optimizer-in-backward"),
        (s.compile and fake, "--compile under fake tensors (dynamo traces real tensors here: "
                             "run the tiny configs for real)"),
    ]
    for bad, what in reasons:
        if bad:
            raise UnsupportedError(f"the torchtune simulation cannot run {what}")


def lora_args(s: Strategy) -> dict[str, Any]:
    """The LoRA builder's ``lora_attn_modules`` / ``apply_lora_to_mlp`` /
    ``apply_lora_to_output`` for the job's targets ("all-linear": every block linear, not the
    head, as PEFT's rule)."""
    if s.all_linear:
        return {"lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
                "apply_lora_to_mlp": True, "apply_lora_to_output": False}
    targets = set(s.lora_targets)
    mlp = _MLP & targets
    if 0 < len(mlp) < 3:
        raise UnsupportedError("torchtune's apply_lora_to_mlp adapts gate, up and down "
                               "together: name all three or none")
    unknown = targets - set(_ATTN) - _MLP - {"lm_head"}
    if unknown:
        raise UnsupportedError(f"torchtune has no LoRA option for target {sorted(unknown)[0]!r}")
    return {"lora_attn_modules": [_ATTN[n] for n in _ATTN if n in targets],
            "apply_lora_to_mlp": bool(mlp), "apply_lora_to_output": "lora_head" in targets
            or "lm_head" in targets}


def builder_args(config: Mapping[str, Any]) -> dict[str, Any]:
    """The component builder's arguments for a llama config.json mapping."""
    if config.get("model_type") != "llama":
        raise UnsupportedError("the torchtune simulation builds llama-3 configs")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    if int(config.get("head_dim") or hidden // heads) != hidden // heads:
        raise UnsupportedError("torchtune's llama-3 builders take head_dim = hidden / heads")
    return dict(vocab_size=int(config["vocab_size"]),
                num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads", heads)), embed_dim=hidden,
                max_seq_len=int(config.get("max_position_embeddings", 8192)),
                intermediate_dim=int(config["intermediate_size"]),
                norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                rope_base=int(config.get("rope_theta", 500_000)))


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torchtune training/precision.py ``set_default_dtype``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def set_activation_checkpointing(model: nn.Module, layer: type[nn.Module]) -> None:
    """torchtune training/memory.py ``set_activation_checkpointing(model,
    auto_wrap_policy={layer})``: torch's non-reentrant checkpoint wrapper on every layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    apply_activation_checkpointing(model, auto_wrap_policy=ModuleWrapPolicy({layer}))


def compile_backend() -> Any:
    """What inductor decides about saved tensors, without its code generation: inductor's
    decomposition table and its partition function (joint-graph passes, then the min-cut
    rematerialisation partitioner), the partitioned forward and backward graphs run as FX
    graphs of aten ops (``aot_autograd`` with identity compilers). The saved set is
    inductor's; transients inside a graph are eager's (inductor fuses many of them away)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    def identity(gm: Any, _: Any) -> Any:
        return gm

    return aot_autograd(fw_compiler=identity, bw_compiler=identity, partition_fn=partition_fn,
                        decompositions=select_decomp_table())


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """A fresh dynamo cache per measurement (compiled code from an earlier model must not
    count against this one's recompile limit), and a hard error, not a silent fall back to
    eager, should a layer still need more recompilations than the limit allows (one
    per layer instance and per grad mode of its input: the first layer under LoRA differs)."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
            yield
    finally:
        torch._dynamo.reset()


def compile_model(model: nn.Module, layer: type[nn.Module]) -> None:
    """torchtune training/_compile.py ``compile_model``: ``m.compile()`` on every layer (last
    first), here with ``compile_backend``."""
    backend = compile_backend()
    for m in reversed(list(model.modules())):
        if isinstance(m, layer):
            m.compile(backend=backend)


def compile_loss(loss: Any, *, keep: bool) -> Any:
    """torchtune training/_compile.py ``compile_loss``: a chunked loss gets its
    ``compute_cross_entropy`` compiled in place; any other loss is returned compiled, which
    the LoRA recipe assigns (``keep``) and the full recipe discards
    (``full_finetune_single_device.py``: ``training.compile_loss(self._loss_fn)``)."""
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    backend = compile_backend()
    if isinstance(loss, CEWithChunkedOutputLoss):
        loss.compute_cross_entropy = torch.compile(
            loss.compute_cross_entropy, backend=backend)
        return loss
    compiled = torch.compile(loss, backend=backend)
    return compiled if keep else loss


def scale_grads(model: nn.Module, scaler: torch.Tensor) -> None:
    """torchtune training/_grad_scaler.py ``scale_grads``: every gradient scaled in place."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= scaler.to(p.device)


#: torchtune ``OffloadActivations()``'s ``min_offload_size`` default, bytes
#: (training/_activation_offloading.py; its ``max_fwd_stash_size`` is ``OFFLOAD_STASH``).
OFFLOAD_MIN_BYTES = 1024


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """torchtune 0.6.1 training/_activation_offloading.py ``OffloadActivations()`` with its
    defaults (``use_streams=True``), its bookkeeping line for line, the CUDA stream and event
    calls dropped (there is no second stream here, so every copy has finished by the time
    torchtune would wait for it). What it decides about device memory is kept:

    - forward: a saved tensor of at least ``min_offload_size`` bytes that is not a Parameter
      or Buffer gets a host copy (made with the tracker paused: host memory is not the
      device's) and its device tensor stays in the forward stash until a later offload's id
      is ``max_fwd_stash_size`` past its own, or the first backward node's hook empties the
      stash; smaller ones stay as they are;
    - backward: an offloaded tensor is brought back (a new device tensor, unless it is still
      in the forward stash) and kept in the backward stash until the hook of the next autograd
      node that brings one back has run (or released at once where a view of it outlived the
      node: ``record_stream``), the rest at the end of backward.
    """

    def __init__(self, tracker: StorageTracker) -> None:
        self.host: dict[int, tuple[torch.Tensor, bool]] = {}
        self.tensor_id = 0
        self.is_first_forward_call = True
        self.is_first_backward_call = True
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.bwd_tensor_stash: dict[int, torch.Tensor] = {}
        self.curr_graph_id: Any = None
        self.curr_autograd_node: Any = None

        def pack(activation: torch.Tensor) -> int:
            if self.is_first_forward_call:
                assert not self.host, "backward pass should have cleared tracker of all tensors"
                self.is_first_forward_call = False
                self.is_first_backward_call = True
            num_bytes = activation.element_size() * activation.nelement()
            self.tensor_id += 1
            tensor_id = self.tensor_id
            if num_bytes >= OFFLOAD_MIN_BYTES and not isinstance(
                    activation, (nn.Parameter, nn.Buffer)):
                for old in list(self.fwd_stash):
                    if old <= tensor_id - OFFLOAD_STASH:
                        del self.fwd_stash[old]
                    else:
                        break
                with tracker.paused():   # torch.empty_like(..., pin_memory, device="cpu")
                    host = torch.empty_like(activation)
                    host.copy_(activation)
                self.host[tensor_id] = (host, True)
                self.fwd_stash[tensor_id] = activation
            else:
                self.host[tensor_id] = (activation, False)
            return tensor_id

        def unpack(tensor_id: int) -> torch.Tensor:
            if self.is_first_backward_call:
                self.curr_graph_id = torch._C._current_graph_task_id()

                def wait_and_del_remaining_references() -> None:
                    self.bwd_tensor_stash.clear()

                torch.autograd.Variable._execution_engine.queue_callback(
                    wait_and_del_remaining_references)
                self.is_first_backward_call = False
                self.is_first_forward_call = True
            tensor, modified = self.host.pop(tensor_id)
            if not modified:
                return tensor
            graph_id = torch._C._current_graph_task_id()
            node = torch._C._current_autograd_node()
            prev_node_ids: list[int] = []
            if graph_id == self.curr_graph_id and self.curr_autograd_node != node:
                self.curr_autograd_node = node
                prev_node_ids = list(self.bwd_tensor_stash)
            brought_back = tensor_id not in self.fwd_stash
            if brought_back:
                tensor = tensor.clone()   # .to("cuda", non_blocking=True): a new device tensor
                self.bwd_tensor_stash[tensor_id] = tensor
                refcount = torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)
            else:
                tensor = self.fwd_stash[tensor_id]

            def hook(outputs: Any, inputs: Any) -> Any:
                if brought_back:
                    unpacked = self.bwd_tensor_stash[tensor_id]
                    if torch._C._storage_Use_Count(unpacked.untyped_storage()._cdata) > \
                            refcount:
                        del self.bwd_tensor_stash[tensor_id]   # record_stream(s0)
                self.fwd_stash.clear()
                for old in prev_node_ids:
                    self.bwd_tensor_stash.pop(old, None)
                return outputs

            node.register_hook(hook)
            return tensor

        super().__init__(pack, unpack)


class NoOpManager(torch.autograd.graph.saved_tensors_hooks):
    """torchtune's ``NoOpManager``: the innermost hooks, saving tensors as they are."""

    def __init__(self) -> None:
        super().__init__(lambda t: t, lambda t: t)


def offloading_context(model: nn.Module, tracker: StorageTracker) -> OffloadActivations:
    """torchtune ``get_act_offloading_ctx_manager(model, True)``: ``OffloadActivations()``, with
    the output projection (``model.output``, or a tied head's ``.linear``) under a
    ``NoOpManager`` so its saved input stays on the device."""
    from torchtune.modules import TiedLinear

    ctx = OffloadActivations(tracker)
    noop = NoOpManager()
    output: Any = model.output
    head: nn.Module = output.linear if isinstance(output, TiedLinear) else output
    head.register_forward_pre_hook(lambda *_: noop.__enter__())
    head.register_forward_hook(lambda *_: noop.__exit__(), always_call=True)
    return ctx


def _dtype(s: Strategy) -> torch.dtype:
    return torch.bfloat16 if s.precision is Precision.BF16 else torch.float32


def build_model(setup: StepSetup) -> nn.Module:
    """The torchtune decoder, built as the recipes' ``_setup_model`` does (on the meta device
    when fake, the RoPE cache then built for real and swapped like every other tensor)."""
    from torchtune.models import llama3_1, llama3_2
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    s = setup.strategy
    kw = builder_args(setup.config)
    tied = bool(setup.config.get("tie_word_embeddings"))
    lora = s.method.is_lora
    if lora:
        kw.update(lora_args(s), lora_rank=s.lora_rank, lora_alpha=float(s.lora_alpha),
                  lora_dropout=s.lora_dropout, quantize_base=s.method is Method.QLORA)
        if tied and kw["apply_lora_to_output"]:
            raise UnsupportedError("torchtune refuses LoRA on a tied output projection")
    if tied:
        make: Any = llama3_2.lora_llama3_2 if lora else llama3_2.llama3_2
        kw["tie_word_embeddings"] = True
    else:
        make = llama3_1.lora_llama3_1 if lora else llama3_1.llama3_1
    torch.manual_seed(setup.seed)
    device = torch.device("meta") if setup.fake else torch.device("cpu")
    with set_default_dtype(_dtype(s)), device:
        model: nn.Module = make(**kw)
    if setup.fake:   # rope_init skips meta tensors: build the (fp32) cache on the CPU
        for m in model.modules():
            init = getattr(m, "rope_init", None)
            if init is not None and not getattr(m, "is_cache_built", True):
                init()
    if lora:
        set_trainable_params(model, get_adapter_params(model))
    return model


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def measure_torchtune_step(setup: StepSetup, *, on_step: Callable[[int], None] | None = None,
                           starts: list[float] | None = None) -> MeasuredStep:
    """``setup.steps`` steps of torchtune's single-device recipe (module docstring) under the
    tracker; ``on_step(i)`` is called as step i starts, whose start time is appended to
    ``starts``."""
    s = setup.strategy
    refuse_unrunnable(s, fake=setup.fake)
    with _quiet():
        from torch._dynamo.exc import FailOnRecompileLimitHit
        from torchtune import modules
        from torchtune.modules.loss import CEWithChunkedOutputLoss

    started = time.perf_counter()
    notes = ["torchtune 0.6.1 single-device recipe step"]
    with _quiet():
        model = build_model(setup)
    fake_mode: Any = contextlib.nullcontext()
    if setup.fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        build.fakeify_(model, fake_mode)
        notes.append("fake tensors on cpu (FakeTensorMode)")
    tracker = StorageTracker()
    chunked = s.loss is not Loss.STANDARD
    with fake_mode, _quiet(), contextlib.ExitStack() as stack:
        if s.compile:   # _setup_model: compile_model before set_activation_checkpointing
            stack.enter_context(_compiling())
            compile_model(model, modules.TransformerSelfAttentionLayer)
            notes.append("torch.compile per layer: inductor's decompositions, joint-graph "
                         "passes and min-cut partition; the partitioned graphs run eagerly")
        offload = None
        if s.checkpointing is not Checkpointing.NONE:
            # the recipes refuse offloading without checkpointing: --offload-activations is both
            set_activation_checkpointing(model, modules.TransformerSelfAttentionLayer)
        if s.checkpointing is Checkpointing.OFFLOAD:
            offload = offloading_context(model, tracker)
            notes.append("activation offloading: torchtune's OffloadActivations bookkeeping, "
                         "host copies outside the tracker")
        loss_fn: Any = CEWithChunkedOutputLoss(num_output_chunks=OUTPUT_CHUNKS) if chunked \
            else nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
        if s.compile:
            loss_fn = compile_loss(loss_fn, keep=s.method is not Method.FULL)
        if chunked:
            model.set_num_output_chunks(OUTPUT_CHUNKS)  # type: ignore[operator]
        gen = None if setup.fake else torch.Generator().manual_seed(setup.seed)
        vocab = int(setup.config["vocab_size"])
        tokens = torch.randint(1, vocab, (s.batch_size, s.seq_len), generator=gen)
        labels = tokens.clone()
        # PackedDataset's input_pos restarts per document; the sizes are what count here
        input_pos = torch.arange(s.seq_len).repeat(s.batch_size, 1) if s.packing else None
        ignore_labels_cache = torch.full((s.batch_size, 1), IGNORE_INDEX)
        tracker.register_all(model.buffers(), "buffers")
        tracker.register_all(model.parameters(), "parameters")
        tracker.register_all([tokens, labels, ignore_labels_cache]
                             + ([] if input_pos is None else [input_pos]), "inputs")
        params = [p for p in model.parameters() if p.requires_grad]
        opt, hooks = build.tracked_optimizer(params, setup, tracker)
        model.train()
        tracker.take_window_peak()
        peaks: list[int] = []
        step_start = time.perf_counter()
        running_loss: Any = None
        current_loss: Any = None
        backward_start = 0
        try:
            with tracker:
                for i in range(setup.steps):
                    if starts is not None:
                        starts.append(time.perf_counter())
                    if on_step is not None:
                        on_step(i + 1)
                    with tracker.phase("forward"):
                        num_tokens = (labels != IGNORE_INDEX).sum()
                        current_loss = _loss_step(model, loss_fn, tokens, labels,
                                                  ignore_labels_cache, chunked,
                                                  input_pos, offload) * num_tokens
                        running_loss = current_loss   # running_loss = 0; running_loss += ...
                    backward_start = tracker.live_bytes
                    with tracker.phase("backward"):
                        current_loss.backward()
                    with tracker.phase("optimizer"):
                        scale_grads(model, 1 / num_tokens)
                        opt.step()
                        tracker.finish_optimizer_step(
                            v for st in opt.state.values() for v in st.values()
                            if isinstance(v, torch.Tensor))
                        opt.zero_grad(set_to_none=True)
                        running_loss = None   # the recipe resets it to 0 after logging
                    peaks.append(tracker.take_window_peak())
        except (RuntimeError, AssertionError, NotImplementedError, ValueError,
                FailOnRecompileLimitHit) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ProbeError(f"the torchtune {s.method} step failed: {first}") from exc
        finally:
            for h in hooks:
                h.remove()
        step_seconds = time.perf_counter() - step_start
        del current_loss, running_loss
    result = tracker.result()
    return measured_step(model, result, peaks, seconds=time.perf_counter() - started,
                         step_seconds=step_seconds, notes=tuple(notes),
                         backward_start_bytes=backward_start)


def _loss_step(model: nn.Module, loss_fn: Any, tokens: torch.Tensor, labels: torch.Tensor,
               ignore_labels_cache: torch.Tensor, chunked: bool,
               input_pos: torch.Tensor | None = None,
               offload: contextlib.AbstractContextManager[Any] | None = None) -> torch.Tensor:
    """The recipes' ``_loss_step`` (torchtune v0.6.1), line for line (``self._model(**batch)``:
    a packed batch also carries ``input_pos``; the model runs under
    ``self.activations_handling_ctx``)."""
    with offload or contextlib.nullcontext():
        logits = model(tokens) if input_pos is None else model(tokens, input_pos=input_pos)
    shifted = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
    if not isinstance(logits, list):
        shifted = shifted.reshape(-1)
        logits = logits.reshape(-1, logits.size(-1))
    loss: torch.Tensor = loss_fn(logits, shifted)
    del logits   # "free logits otherwise it peaks backward memory"
    return loss
