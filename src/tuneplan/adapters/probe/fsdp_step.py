"""Simulate FSDP1 / FSDP2 training steps on the CPU: N real ranks (gloo), each rank's live bytes.

The model is wrapped as accelerate 1.15 wraps it for the HF Trainer: FSDP1 through
``FullyShardedDataParallelPlugin`` (transformer-layer auto-wrap policy, the plugin's sharding
strategy, backward prefetch, ``limit_all_gathers``, ``use_orig_params``) handed to
``FullyShardedDataParallel`` exactly as ``Accelerator.prepare_model`` does; FSDP2 through
accelerate's own ``fsdp2_prepare_model`` (``fully_shard`` per decoder block, the untied input
embedding, the (final norm, lm_head) tail group with ``reshard_after_forward=False``, then the
root). accelerate's ``AcceleratorState`` never selects FSDP on a CPU-only machine, so a minimal
stand-in accelerator object carries the plugin into those functions; everything else is
accelerate's and torch's code. Gradient accumulation follows ``Accelerator.no_sync``: FSDP1's
``no_sync()`` context, FSDP2's ``set_requires_gradient_sync(False)`` on all but the last
micro-batch.

Bytes are counted by ``StorageTracker`` plus a hook on ``UntypedStorage.resize_``: FSDP frees and
re-allocates its unsharded parameters by resizing their storage in place (torch
``distributed/utils.py`` ``_free_storage``/``_alloc_storage``; ``_fully_shard/_fsdp_param.py``
``free_storage``/``alloc_storage``), which no dispatched op shows. On a GPU these are the caching
allocator's bytes; on the CPU they are the same tensors.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from tuneplan.adapters.probe import build
from tuneplan.adapters.probe.tracker import StorageTracker
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.errors import ProbeError, UnsupportedError


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpCase:
    """One FSDP job to simulate: the job (``strategy``: its sharding, GPUs, grad accumulation,
    method, checkpointing…) on ``config``, with FSDP ``version`` 1 or 2."""

    name: str
    config: dict[str, Any]
    strategy: Strategy
    version: int = 2
    steps: int = 2
    use_orig_params: bool = True


@dataclass(frozen=True, slots=True)
class RankResult:
    case: str
    rank: int
    peak_bytes: int
    peak_phase: str
    by_phase: dict[str, int]
    by_category: dict[str, int]     # at the peak
    seconds: float                  # this rank's wall time for the case
    error: str = ""                 # the library's first message line where wrapping failed


def _single(s: Strategy) -> Strategy:
    """The strategy the one-process builder accepts (the sharding is applied here)."""
    return replace(s, sharding=Sharding.DDP, gpus=1, nodes=1, grad_accum=1)


def _setup(case: FsdpCase) -> Any:
    from tuneplan.adapters.probe.harness import StepSetup

    return StepSetup(config=case.config, strategy=_single(case.strategy), steps=case.steps)


def _plugin(case: FsdpCase) -> Any:
    from accelerate.utils import FullyShardedDataParallelPlugin

    grad_op = case.strategy.sharding is Sharding.FSDP_GRAD_OP
    reshard: Any = (not grad_op) if case.version == 2 else (
        "SHARD_GRAD_OP" if grad_op else "FULL_SHARD")
    # FSDP2 takes neither prefetch flag nor use_orig_params (accelerate refuses them)
    v1: dict[str, Any] = {"backward_prefetch": "BACKWARD_PRE", "forward_prefetch": False,
                          "use_orig_params": case.use_orig_params} if case.version == 1 else {}
    return FullyShardedDataParallelPlugin(
        fsdp_version=case.version, reshard_after_forward=reshard,
        auto_wrap_policy="transformer_based_wrap", limit_all_gathers=True,
        sync_module_states=False, cpu_ram_efficient_loading=False,
        state_dict_type="SHARDED_STATE_DICT", **v1)


class _StandInAccelerator:
    """What ``fsdp2_prepare_model`` reads from an Accelerator (its state's plugin, the mesh,
    mixed precision, the main-process flag)."""

    def __init__(self, plugin: Any) -> None:
        self.state = type("State", (), {"fsdp_plugin": plugin})()
        self.torch_device_mesh = None
        self.mixed_precision = "no"
        self.is_main_process = int(os.environ.get("RANK", "0")) == 0
        self.device = torch.device("cpu")


def wrap(model: nn.Module, case: FsdpCase) -> nn.Module:
    """The model wrapped as accelerate's FSDP1 / FSDP2 path wraps it (see the module doc)."""
    plugin = _plugin(case)
    if case.version == 2:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        return fsdp2_prepare_model(_StandInAccelerator(plugin), model)  # type: ignore[no-any-return]
    from torch.distributed.fsdp import FullyShardedDataParallel

    plugin.set_auto_wrap_policy(model)
    return FullyShardedDataParallel(
        model, sharding_strategy=plugin.sharding_strategy or plugin.reshard_after_forward,
        cpu_offload=plugin.cpu_offload, auto_wrap_policy=plugin.auto_wrap_policy,
        mixed_precision=plugin.mixed_precision_policy,
        sync_module_states=plugin.sync_module_states, backward_prefetch=plugin.backward_prefetch,
        forward_prefetch=plugin.forward_prefetch, use_orig_params=plugin.use_orig_params,
        param_init_fn=plugin.param_init_fn, ignored_modules=plugin.ignored_modules,
        limit_all_gathers=plugin.limit_all_gathers, device_id=torch.device("cpu"))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


@contextlib.contextmanager
def _resize_hook(tracker: StorageTracker) -> Iterator[None]:
    """Book every ``UntypedStorage.resize_`` (FSDP's free/alloc of unsharded storage)."""
    original = torch.UntypedStorage.resize_

    def resize_(self: Any, size: int) -> Any:
        out = original(self, size)
        tracker.storage_resized(self)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _without_gloo_scratch(tracker: StorageTracker) -> Iterator[None]:
    """gloo's reduce-scatter copies its whole input to a scratch tensor (NCCL reduces in
    place): torch.distributed's ``reduce_scatter_single`` runs with the tracker paused, so
    only the input and output FSDP allocates are booked."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.reduce_scatter_single

    def reduce_scatter_single(*args: Any, **kwargs: Any) -> Any:
        with tracker.paused():
            return original(*args, **kwargs)

    # both bindings: torch.distributed re-exports the function under its own name
    c10d.reduce_scatter_single = dist.reduce_scatter_single = reduce_scatter_single
    try:
        yield
    finally:
        c10d.reduce_scatter_single = dist.reduce_scatter_single = original


def _no_sync(model: nn.Module, version: int) -> contextlib.AbstractContextManager[Any]:
    """``Accelerator.no_sync`` for FSDP (accelerate 1.15 accelerator.py)."""
    if version == 1:
        return model.no_sync()  # type: ignore[operator,no-any-return]

    @contextlib.contextmanager
    def fsdp2() -> Iterator[None]:
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
    return fsdp2()


def _tolerate_old_torchao() -> None:
    """peft 0.21's LoRA dispatcher raises ImportError when a torchao older than 0.16 is
    installed, even for plain ``nn.Linear`` targets; no torchao-quantised weight is used here,
    so an incompatible torchao counts as absent (peft import_utils.is_torchao_available)."""
    import peft.tuners.lora.torchao as lora_torchao

    module: Any = lora_torchao
    try:
        module.is_torchao_available()
    except ImportError:
        module.is_torchao_available = lambda: False


def run_case(case: FsdpCase) -> RankResult:
    """Build, wrap and train ``case`` on this rank (the process group is up); its live bytes."""
    started = time.perf_counter()
    _tolerate_old_torchao()
    setup = _setup(case)
    s = case.strategy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build.apply_method(build.build_base(setup), setup)
        model = wrap(model, case)
    vocab = int(build.make_config(case.config, s.task).vocab_size)
    micro = [build.make_inputs(replace(setup, seed=setup.seed + i), vocab)
             for i in range(s.grad_accum)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build.make_optimizer(params, setup)
    tracker = StorageTracker()
    tracker.register_all(model.buffers(), "buffers")
    tracker.register_all((_local(p) for p in model.parameters()), "parameters")
    for inputs in micro:
        tracker.register_all(inputs.values(), "inputs")
    model.train()
    with _resize_hook(tracker), _without_gloo_scratch(tracker), tracker, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(case.steps):
            for i, inputs in enumerate(micro):
                last = i == len(micro) - 1
                sync = contextlib.nullcontext() if last else _no_sync(model, case.version)
                with sync:
                    with tracker.phase("forward"):
                        loss = model(**inputs).loss
                    with tracker.phase("backward"):
                        loss.backward()
                        del loss
            with tracker.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    result = tracker.result()
    rank = int(os.environ.get("RANK", "0"))
    del model, opt
    return RankResult(case=case.name, rank=rank, peak_bytes=result.peak_bytes,
                      peak_phase=result.peak_phase,
                      by_phase={k: v for k, v in result.peak_by_phase.items() if k != "setup"},
                      by_category=dict(result.peak_by_category),
                      seconds=time.perf_counter() - started)


def _run_or_refusal(case: FsdpCase, rank: int) -> RankResult:
    """``run_case``, or the ValueError torch raises for a wrapping it refuses (FSDP1 with
    ``use_orig_params=False`` over a unit mixing frozen and trainable parameters)."""
    try:
        return run_case(case)
    except ValueError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return RankResult(case=case.name, rank=rank, peak_bytes=0, peak_phase="", by_phase={},
                          by_category={}, seconds=0.0, error=first)


def _rank_main(rank: int, world: int, store: str, cases: Sequence[FsdpCase],
               out: str) -> None:
    import pickle

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = [_run_or_refusal(c, rank) for c in cases]
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "wb") as f:
        pickle.dump(results, f)


def simulate(cases: Sequence[FsdpCase], world: int,
             deadline_s: float | None = None) -> dict[str, list[RankResult]]:
    """Run ``cases`` on ``world`` gloo ranks spawned once; per case, every rank's result.

    ``deadline_s``: wall-clock seconds the ranks may take; past it (or on any interruption,
    Ctrl-C included, or a rank failing) every rank still alive is stopped before the error
    is raised, so no rank outlives the call."""
    import pickle

    import torch.multiprocessing as mp

    for c in cases:
        if c.strategy.world_size != world:
            raise UnsupportedError(
                f"case {c.name} is for {c.strategy.world_size} GPUs, not {world}")
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "result")
        start: Any = mp.start_processes  # type: ignore[attr-defined]
        ranks = start(_rank_main, args=(world, store, list(cases), out), nprocs=world,
                      join=False, start_method="spawn")
        end = None if deadline_s is None else time.monotonic() + deadline_s
        try:
            while not ranks.join(timeout=None if end is None else
                                 max(min(1.0, end - time.monotonic()), 0.01)):
                if end is not None and time.monotonic() >= end:
                    raise ProbeError(f"the FSDP simulation ran past {deadline_s:g} s: its "
                                     f"{world} ranks were stopped")
        except BaseException:
            stop_processes(ranks.processes)
            raise
        per_rank = []
        for r in range(world):
            with open(f"{out}.{r}", "rb") as f:
                per_rank.append(pickle.load(f))
    return {c.name: [rs[i] for rs in per_rank] for i, c in enumerate(cases)}


def stop_processes(processes: Sequence[Any], grace_s: float = 5.0) -> None:
    """Terminate every process still alive, wait ``grace_s`` for each, then kill it."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join()
