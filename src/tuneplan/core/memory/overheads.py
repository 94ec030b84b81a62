"""Memory outside the tensors a step allocates: CUDA context and library workspaces (by GPU
generation), NCCL buffers, and the caching allocator's reserve above the allocated peak.

Reported as explicit terms, never folded into a fudge factor. Constants live in
``MemoryAssumptions``; the CPU simulation sees none of these (they are GPU-only).
"""

from __future__ import annotations

from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.parts import Piece, part


def workspace_term(generation: str | None, a: MemoryAssumptions) -> Piece:
    size = a.workspace_bytes_hopper if (generation or "").lower() in ("hopper", "blackwell") \
        else a.workspace_bytes_other
    return part("overheads/cublas_workspace", size, "cuBLAS workspace (allocated through torch)",
                "torch CUDABlas getChosenWorkspaceSize defaults", generation=generation)


def reserve_term(allocated: int, a: MemoryAssumptions) -> Piece:
    reserve = max(int(allocated * a.allocator_reserve_fraction), a.allocator_reserve_min_bytes)
    return part("overheads/allocator_reserve", reserve,
                "max(fraction · allocated peak, floor): block rounding and fragmentation",
                a.source_of("allocator_reserve_fraction",
                            "assumption, checked against reserved peaks in the calibration set"),
                fraction=a.allocator_reserve_fraction, floor_bytes=a.allocator_reserve_min_bytes)


def device_terms(generation: str | None, world: int, a: MemoryAssumptions) -> list[Piece]:
    terms = [part("overheads/cuda_context", a.context_bytes(generation),
                  "CUDA context + loaded kernels by GPU generation (outside the allocator)",
                  a.source_of("context_bytes", "MemoryAssumptions.context_bytes_by_generation"),
                  generation=generation)]
    if world > 1:
        terms.append(part("overheads/nccl", a.nccl_bytes, "NCCL communicator buffers per GPU",
                          "assumption", world_size=world))
    return terms
