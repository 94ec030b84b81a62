"""Every tunable constant of the memory estimate, in one object printed with each result.

Nothing here is computed; defaults carry their source. Pass a modified copy
(``dataclasses.replace``) to ``estimate_memory`` to explore other settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

MiB = 2**20

# CUDA context + loaded kernels per GPU generation, outside the caching allocator.
_CONTEXT_BYTES = MappingProxyType({
    # V100, CUDA 11 without lazy module loading: the transformers docs measured 1343 MiB for a
    # one-element tensor (calibration set, transformers-docs group).
    "volta": 1343 * MiB,
    "turing": 1000 * MiB,
    # A100: fitted to the calibration set's whole-device Qwen rows (CUDA 11.8, PyTorch 2.0,
    # DeepSpeed launcher); lazy module loading keeps later stacks lower. Fit: together with
    # allocator_reserve_fraction, minimise the median |error| of the high/medium-confidence
    # printed peaks with metric reserved or whole-device (57 Qwen A100 rows + 9 PEFT L40S
    # rows); reproduced, and scored leave-one-source-out, by benchmarks/accuracy.py. The
    # reproduction lands at 955 MiB with fraction 0.017 (median 3.5 % vs 3.9 % here): the two
    # trade off on the same rows, so the pair is loosely determined; values kept.
    "ampere": 1000 * MiB,
    # CUDA >= 11.7 lazy loading (default since 12.2): context + cuBLAS/cuDNN handles.
    "ada": 600 * MiB,
    # Measured on an H200 (torch 2.11 + CUDA 13.0, driver 580.159.04): device used - reserved
    # after the HF step's probes, 767-771 MiB (529 MiB right after init, 594 after a first
    # mm: kernels load lazily as a step first needs them); benchmarks/calibration/device/
    # h200-2026-12-04 (probes.jsonl context_bytes, device.json).
    "hopper": 771 * MiB,
    "blackwell": 800 * MiB,
    "default": 700 * MiB,
})


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAssumptions:
    """Constants the estimate uses; each field says where it comes from."""

    # bitsandbytes 4-bit: blocksize 64 (bnb.functional.quantize_4bit), absmax fp32; nested
    # quantization stores absmax as uint8 with a 256-block fp32 second level.
    nf4_blocksize: int = 64
    nested_blocksize: int = 256
    # GPTQ int4 (auto-gptq / optimum): scales and zeros per group of input features.
    gptq_group_size: int = 128
    # bnb 8-bit optimizers: blockwise state quantization, 256-element blocks (fp32 absmax);
    # tensors below 4096 elements keep 32-bit state (min_8bit_size).
    optim8bit_blocksize: int = 256
    optim8bit_min_size: int = 4096
    # torch AdamW implementation: "fused" (HF Trainer default from transformers 4.54 with
    # torch>=2.8, torchtune configs), "foreach" (torch default on CUDA) adds one parameter-sized
    # temporary, "single" twice the largest tensor, "hf" (transformers AdamW) once. None: the
    # HF Trainer's default optim for Strategy.stack (core/job/versions.py), fused elsewhere.
    adamw_impl: str | None = None
    context_bytes_by_generation: Mapping[str, int] = field(default_factory=lambda: _CONTEXT_BYTES)
    # cuBLAS workspace through the caching allocator (torch default :4096:8 = 32 MiB on sm90,
    # 4096 KiB·2 + 16 KiB·8 otherwise) and cuBLASLt's (1 MiB), per thread that runs matmuls:
    # torch keeps a cuBLAS handle, and a workspace, per (thread, stream). A training step
    # runs them from two threads, Python's (forward) and autograd's device thread
    # (backward). Measured on an H200 (torch 2.11, benchmarks/calibration/device/
    # h200-2026-12-04/details.json "workspaces"): +32 MiB at the first bf16 mm, +1 MiB at the
    # first linear with a bias (cuBLASLt), +32 MiB at the first backward, +32 MiB for a mm on
    # a second stream; nothing more for an fp32 mm.
    workspace_bytes_hopper: int = 32 * MiB
    workspace_bytes_other: int = 8 * MiB + 128 * 2**10
    cublaslt_workspace_bytes: int = 1 * MiB
    workspace_threads: int = 2
    # Caching allocator: reserved exceeds the allocated peak by block rounding and
    # fragmentation; fraction of the allocated peak, with a floor. Fitted (median |error|) to
    # the calibration set's reserved and whole-device rows of high/medium confidence, jointly
    # with the Ampere context above (see there; benchmarks/accuracy.py refits both). The
    # floor is not fitted.
    allocator_reserve_fraction: float = 0.04
    allocator_reserve_min_bytes: int = 512 * MiB
    # NCCL channels per communicator (NCCL picks them by topology, ncclTopoCompute; 16 is
    # what NVSwitch H100/A100 nodes report under NCCL_DEBUG=INFO; bounded by
    # NCCL_MIN/MAX_NCHANNELS) and receive connections per channel (ring: one from the
    # previous rank; intra-node tree chain: one from each side). Each connection holds one
    # buffer per protocol (``overheads.NCCL_PROTOCOL_BUFFER_BYTES``). Outside the allocator.
    nccl_channels: int = 16
    nccl_connections_per_channel: int = 3
    # DeepSpeed defaults (HF "auto"): reduce/allgather buckets hold this many elements.
    zero_bucket_elements: int = 500_000_000
    # DeepSpeed ZeRO-3 ``sub_group_size`` (its default, and HF's example configs): the optimizer
    # steps one sub-group of about this many elements at a time.
    zero3_sub_group_elements: int = 1_000_000_000
    # FSDP outside core/memory/fsdp.py's units (parameter offload) keeps this many gathered
    # blocks alive (current + prefetched). ZeRO-3 is not sized by it: DeepSpeed's coordinator
    # is replayed on the step's submodule trace (core/memory/zero3_gather.py).
    gathered_blocks: int = 2
    # FSDP generation the HF recipes run: tuneplan's accelerate config writes fsdp_version 1
    # (core/launch/engines.py); 2 is accelerate's fully_shard path (core/memory/fsdp.py).
    fsdp_version: int = 1
    # HF Trainer under FSDP accumulates with accelerate's no_sync unless the accelerator config
    # sets gradient_accumulation_kwargs sync_each_batch (transformers 5.24 trainer.py);
    # tuneplan's train.py sets it for FSDP plans (a reduce-scatter per micro-batch), so True;
    # False (a Trainer left at its default) keeps every gradient unsharded between
    # micro-batches.
    fsdp_sync_each_batch: bool = True
    # Unsloth/torchtune offloaded checkpoints: blocks whose input stays on device in flight.
    offload_blocks_on_device: int = 2
    # LoRA dropout mask element: CUDA native_dropout keeps a bool mask (1 B); the CPU kernel
    # multiplies by a float noise tensor (4 B) - set 4 to compare with a CPU simulation.
    dropout_mask_bytes: int = 1
    # Chunked cross-entropy: number of chunks the logits are cut into (torchtune: 8).
    loss_chunks: int = 8
    # Where a field's value came from when it is not the default above (field name -> source),
    # e.g. a probe calibration: "calibrated from probe #3 on NVIDIA H100 80GB HBM3, 2026-11-30".
    sources: Mapping[str, str] = field(default_factory=dict)

    def source_of(self, name: str, default: str) -> str:
        return self.sources.get(name, default)

    def context_bytes(self, generation: str | None) -> int:
        table = self.context_bytes_by_generation
        return table.get((generation or "default").lower(), table["default"])

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = dict(value) if isinstance(value, Mapping) else value
        return out
