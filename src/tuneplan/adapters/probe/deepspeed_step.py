"""DeepSpeed ZeRO's own engine on simulated ranks: the buffers each rank holds after each phase.

Spawns ``world`` processes on the CPU (gloo, DeepSpeed's CPU accelerator), builds a tiny real
``LlamaForCausalLM`` in each, and calls ``deepspeed.initialize`` with a ZeRO JSON (the one
``core/launch/engines.py::deepspeed_config`` emits, bucket knobs scaled down by the caller).
Each rank runs ``grad_accum`` micro-batches of forward / ``engine.backward`` / ``engine.step``
(DeepSpeed steps the optimizer at the accumulation boundary only).

What is measured, per rank, after ``initialize``, after the last backward (before the step)
and after the step: every tensor storage reachable from the engine's ZeRO optimizer (its
attributes, walked through lists, tuples and dicts), the inner optimizer's ``state``, and the
model's parameters (``data``, ``grad``, ZeRO-3's ``ds_tensor``), each storage counted once and
labelled by the first attribute path that reaches it. On the CPU accelerator every tensor is CPU
memory, so "on the GPU" is decided by who allocates a buffer and where DeepSpeed 0.19 would put
it on a GPU: with ``offload_optimizer`` the fp32 master partitions, their gradients, the
optimizer state and the pinned staging buffers live on the host (``device=self.device`` =
``cpu`` in ``stage_1_and_2.py`` / ``stage3.py``); the rest is on the accelerator.

Under ZeRO-3 each rank also records the most elements of non-persistent parameters gathered
at once during its last micro-batch (``_watch_gathered``), for ``core/memory/zero3_gather.py``.
A case may name its own ``model`` (LLaMA config) and ``checkpointing`` (non-reentrant, as
transformers 5 enables it).

This is the persistent-buffer state of the engine, exact to the byte; it is not the transient
peak inside backward (activations, autograd temporaries, a bucket being reduced), which the
CPU run cannot attribute to a device.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: Attribute names (last path component) of buffers DeepSpeed keeps on the host when
#: ``offload_optimizer.device == "cpu"`` (deepspeed 0.19.8 ``runtime/zero/stage_1_and_2.py``
#: ``single_partition_of_fp32_groups`` / ``param_buffer_of_bit16_for_cpu_offload_groups`` /
#: ``temp_grad_buffer_for_cpu_offload`` / ``accumulated_grads_in_cpu``, and ``stage3.py``
#: ``fp32_partitioned_groups_flat`` and its pinned gradient buffers), plus the optimizer state.
HOST_WHEN_OFFLOADED = (
    "single_partition_of_fp32_groups", "param_buffer_of_bit16_for_cpu_offload_groups",
    "temp_grad_buffer_for_cpu_offload", "accumulated_grads_in_cpu", "optimizer.state",
    "fp32_partitioned_groups_flat", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    "grad_partitions_flat_buffer", "averaged_gradients", "norm_for_param_grads",
    "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer_cpu")


def _storages(obj: Any, path: str, seen: set[int],
              depth: int = 0) -> Iterator[tuple[str, int, int]]:
    import torch

    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        ptr = st.data_ptr()
        if ptr and ptr not in seen:
            seen.add(ptr)
            yield path, ptr, st.nbytes()
        grad = obj.grad if obj.is_leaf or obj.requires_grad else None
        if grad is not None:
            yield from _storages(grad, path + ".grad", seen, depth + 1)
        return
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = k if isinstance(k, (str, int)) else type(k).__name__
            yield from _storages(v, f"{path}[{key}]" if depth else path, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _storages(v, path, seen, depth + 1)
    elif hasattr(obj, "buffer") and hasattr(obj, "params"):   # ipg bucket objects
        yield from _storages(obj.buffer, path + ".buffer", seen, depth + 1)


def buffers(engine: Any) -> dict[str, int]:
    """Bytes by attribute path of every storage the engine's ZeRO optimizer and model hold."""
    import torch

    seen: set[int] = set()
    out: dict[str, int] = {}
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)

    def add(items: Iterator[tuple[str, int, int]]) -> None:
        for name, _, size in items:
            out[name] = out.get(name, 0) + size

    if isinstance(inner, torch.optim.Optimizer):
        add(_storages(list(inner.state.values()), "optimizer.state", seen))
    for name, value in vars(opt).items():
        if name in ("optimizer", "module", "param_names"):
            continue
        add(_storages(value, name, seen))
    for p in engine.module.parameters():
        ds = getattr(p, "ds_tensor", None)
        if ds is not None:
            add(_storages(ds, "param.ds_tensor", seen))
        add(_storages(p.data, "param.data", seen))
        if p.grad is not None:
            add(_storages(p.grad, "param.grad", seen))
    return out


def _rank(rank: int, world: int, port: int, cases: Sequence[Mapping[str, Any]],
          model_config: Mapping[str, Any], result_dir: str) -> None:
    # The interpreter's own bin first on PATH: DeepSpeed JIT-builds its CPU ops with the
    # ninja found there, and a build made by another ninja (the system's) is rebuilt from
    # scratch (1-3 minutes) instead of loaded from ~/.cache/torch_extensions.
    bin_dir = os.path.dirname(sys.executable)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu",
                      PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    import logging

    import deepspeed  # type: ignore[import-untyped]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for case in cases:
        torch.manual_seed(0)
        config = dict(case["config"])
        stage3 = config["zero_optimization"]["stage"] == 3
        ctx = deepspeed.zero.Init(config_dict_or_path=config) if stage3 else _null()
        shape = dict(case.get("model") or model_config)
        with ctx:
            model = LlamaForCausalLM(LlamaConfig(**shape))
        if case.get("checkpointing"):   # transformers 5's default: non-reentrant
            model.gradient_checkpointing_enable(  # type: ignore[no-untyped-call]
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if case.get("lora"):
            import peft.tuners.lora.torchao as peft_torchao
            from peft import LoraConfig, get_peft_model

            # peft 0.18 raises ImportError on an installed torchao older than 0.16 while it
            # dispatches LoRA layers; no torchao layer is used here.
            peft_torchao.is_torchao_available = lambda: False  # type: ignore[assignment,attr-defined]

            model = get_peft_model(model, LoraConfig(**case["lora"]))  # type: ignore[assignment]
            if case.get("checkpointing"):   # as the HF Trainer does for PEFT + checkpointing
                model.enable_input_require_grads()  # type: ignore[no-untyped-call]
        if config["bf16"]["enabled"] if "bf16" in config else False:
            pass   # DeepSpeed casts the module to bf16 itself (engine._configure_distributed_model)
        late: dict[str, Any] = {}
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3) if "optimizer" not in config else None
        engine, *_ = deepspeed.initialize(
            model=model, config=config | ({"zero_allow_untested_optimizer": True} if opt else {}),
            optimizer=opt, model_parameters=params if opt is None else None)
        phases = {"init": buffers(engine)}
        late["engine"] = engine
        gathered = _watch_gathered(engine) if stage3 else None

        def at_bottom_grad(grad: Any, late: dict[str, Any] = late) -> None:
            # every block above the bottom one has run backward
            late["backward_end"] = buffers(late["engine"])

        def on_bottom(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if out.requires_grad:
                out.register_hook(at_bottom_grad)

        _blocks(model)[0].register_forward_hook(on_bottom)
        accum = config["gradient_accumulation_steps"]
        batch = config["train_micro_batch_size_per_gpu"]
        gen = torch.Generator().manual_seed(rank)
        for micro in range(accum):
            if gathered is not None:
                gathered["peak"] = 0
            ids = torch.randint(0, shape["vocab_size"], (batch, case["seq"]), generator=gen)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            if micro == accum - 1:
                phases["backward_end"] = late.pop("backward_end")
                phases["backward"] = buffers(engine)
            engine.step()
        phases["step"] = buffers(engine)
        results.append({"name": case["name"], "phases": phases, "loss": float(loss.detach()),
                        "trainable": sum(getattr(p, "ds_numel", p.numel()) for p in params),
                        "steps": engine.global_steps,
                        # the last micro-batch's (a complete trace: prefetch and reuse apply)
                        "gathered": None if gathered is None else gathered["peak"]})
        engine.destroy()
        del engine, model, opt
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _watch_gathered(engine: Any) -> dict[str, int]:
    """Wrap the ZeRO-3 parameter coordinator's fetch and release (deepspeed 0.19.8
    ``PartitionedParameterCoordinator.fetch_sub_module`` / ``release_sub_module``) to record
    the most elements of non-persistent parameters gathered (available or in flight) at
    once: after each fetch with its prefetch, and before each release."""
    from deepspeed.runtime.zero.partition_parameters import (  # type: ignore[import-untyped]
        ZeroParamStatus,
    )

    coord = engine.optimizer.parameter_offload.get_param_coordinator()
    params = list(engine.module.parameters())
    seen = {"peak": 0}

    def note() -> None:
        live = sum(p.ds_numel for p in params if not p.ds_persist
                   and p.ds_status != ZeroParamStatus.NOT_AVAILABLE)
        seen["peak"] = max(seen["peak"], live)

    fetch, release = coord.fetch_sub_module, coord.release_sub_module

    def fetched(module: Any, forward: bool) -> None:
        fetch(module, forward)
        note()

    def released(module: Any, forward: bool = False) -> None:
        note()
        release(module, forward=forward)

    coord.fetch_sub_module, coord.release_sub_module = fetched, released
    return seen


def _blocks(model: Any) -> Any:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model.layers


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def simulate(cases: Sequence[Mapping[str, Any]], model_config: Mapping[str, Any],
             world: int, result_dir: str) -> list[list[dict[str, Any]]]:
    """Run every case on ``world`` spawned ranks (one process group for all); per rank, per
    case: ``{"name", "phases": {phase: {path: bytes}}, "loss", "trainable", "steps"}``."""
    import torch.multiprocessing as mp

    args = (world, _free_port(), list(cases), dict(model_config), result_dir)
    mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
        _rank, args=args, nprocs=world, start_method="spawn")
    out = []
    for r in range(world):
        with open(os.path.join(result_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def split_by_device(phase: Mapping[str, int], offloaded: bool) -> tuple[int, int]:
    """(accelerator bytes, host bytes) of one phase's buffers."""
    host = sum(v for k, v in phase.items() if offloaded and _on_host(k))
    return sum(phase.values()) - host, host


def _on_host(path: str) -> bool:
    return any(path == h or path.startswith(h + ".") or path.startswith(h + "[")
               for h in HOST_WHEN_OFFLOADED)


if __name__ == "__main__":   # python -m tuneplan.adapters.probe.deepspeed_step CASES.json WORLD DIR
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    print(json.dumps(simulate(spec["cases"], spec["model"], int(sys.argv[2]), sys.argv[3])))
