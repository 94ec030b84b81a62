"""Memory outside the tensors a step allocates: CUDA context and library workspaces (by GPU
generation), NCCL buffers, and the caching allocator's reserve above the allocated peak.

Reported as explicit terms, never folded into a fudge factor. Constants live in
``MemoryAssumptions``; the CPU simulation sees none of these (they are GPU-only).
"""

from __future__ import annotations

from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.parts import Piece, part


def workspace_term(generation: str | None, a: MemoryAssumptions) -> Piece:
    """cuBLAS + cuBLASLt workspaces, one pair per thread that runs the step's matmuls (the
    forward's and autograd's backward thread), allocated through torch's caching allocator."""
    cublas = a.workspace_bytes_hopper if (generation or "").lower() in ("hopper", "blackwell") \
        else a.workspace_bytes_other
    size = a.workspace_threads * (cublas + a.cublaslt_workspace_bytes)
    return part("overheads/cublas_workspace", size,
                "threads (forward, autograd's backward) · (cuBLAS + cuBLASLt workspace), "
                "allocated through torch",
                "torch CUDABlas getChosenWorkspaceSize / cuBLASLt defaults, a handle per "
                "thread and stream; measured on an H200 (torch 2.11)",
                generation=generation, threads=a.workspace_threads, cublas_bytes=cublas,
                cublaslt_bytes=a.cublaslt_workspace_bytes)


def reserve_term(allocated: int, a: MemoryAssumptions) -> Piece:
    reserve = max(int(allocated * a.allocator_reserve_fraction), a.allocator_reserve_min_bytes)
    return part("overheads/allocator_reserve", reserve,
                "max(fraction · allocated peak, floor): block rounding and fragmentation",
                a.source_of("allocator_reserve_fraction",
                            "fitted to the calibration set's reserved peaks; on 11 HF steps "
                            "measured on an H200 the real reserve made the reserved peak -15 "
                            ".. +2 % off this (median 4.4 %, low mostly on small jobs with a "
                            "large vocabulary); `tuneplan probe --simulate` replays the caching "
                            "allocator for a job"),
                fraction=a.allocator_reserve_fraction, floor_bytes=a.allocator_reserve_min_bytes,
                confidence="low")


#: NCCL's device buffer per connection for each protocol, at its defaults (NCCL 2.21
#: src/include/device.h, src/init.cc ``ncclGetBuffSizes``): Simple = NCCL_BUFFSIZE (default
#: 1 << 22 = 4194304, docs "NCCL_BUFFSIZE"); LL = NCCL_LL_LINES_PER_THREAD (8) ·
#: NCCL_LL_MAX_NTHREADS (512) · NCCL_STEPS (8) · sizeof(ncclLLFifoLine) (16) = 524288;
#: LL128 = NCCL_LL128_ELEMS_PER_THREAD (120) · NCCL_LL128_MAX_NTHREADS (640) · NCCL_STEPS (8)
#: · sizeof(uint64_t) (8) = 4915200.
NCCL_PROTOCOL_BUFFER_BYTES = {"simple": 1 << 22, "ll": 8 * 512 * 8 * 16, "ll128": 120 * 640 * 8 * 8}
_NCCL_SRC = ("NCCL 2.21 src/include/device.h (DEFAULT_BUFFSIZE, DEFAULT_LL_BUFFSIZE, "
             "DEFAULT_LL128_BUFFSIZE), NCCL_BUFFSIZE docs; channels and connections: assumption")


def communicators(strategy: Strategy) -> int:
    """NCCL communicators a rank holds buffers for: one per process group that spans more
    than one rank. HYBRID_SHARD (torch FSDP ``_init_intra_and_inter_node_groups``) has an
    intra-node shard group and an inter-node replicate group; every other sharding one."""
    if strategy.world_size <= 1:
        return 0
    if strategy.sharding is Sharding.HYBRID:
        return (strategy.gpus > 1) + (strategy.nodes > 1)
    return 1


def nccl_term(strategy: Strategy, a: MemoryAssumptions) -> Piece | None:
    """NCCL's own device buffers (cudaMalloc'd by NCCL, outside torch's allocator): per
    communicator, channels · receive connections · (Simple + LL + LL128 buffer). None on one
    GPU (no communicator)."""
    n = communicators(strategy)
    if n == 0:
        return None
    per_connection = sum(NCCL_PROTOCOL_BUFFER_BYTES.values())
    size = n * a.nccl_channels * a.nccl_connections_per_channel * per_connection
    return part("overheads/nccl", size,
                "NCCL buffers: communicators · channels · connections per channel · "
                "(Simple 4 MiB + LL 512 KiB + LL128 4.69 MiB)",
                a.source_of("nccl_channels", _NCCL_SRC), communicators=n,
                channels=a.nccl_channels, connections=a.nccl_connections_per_channel,
                per_connection_bytes=per_connection, confidence="medium")


def side_stream_term(strategy: Strategy, gathered_unit: int) -> Piece | None:
    """Memory the caching allocator holds for a collective's own stream and cannot hand to
    the compute stream: torch's CUDACachingAllocator keeps blocks per stream (a block freed
    by one stream is reused only by allocations on that stream; ``record_stream`` defers
    even that until the recorded work completes). FSDP all-gathers each unit on its own
    stream (FSDP1 ``_unshard_stream``, with ``limit_all_gathers`` at most two units in
    flight; FSDP2 ``all_gather_stream``, two in flight through its events): while one unit's
    unsharded parameters are in use (counted as allocated), the block of the unit last
    resharded stays cached in the all-gather stream's pool, reserved but unallocated: one
    unit's unsharded parameters. DDP (its buckets persist and are all-reduced in place) and
    DeepSpeed ZeRO-1/2 (persistent ipg buckets, ``sharding/zero_buckets``) churn no
    side-stream blocks: no term; ZeRO-3's all-gather stream is not modelled."""
    if gathered_unit <= 0:
        return None
    return part("overheads/side_stream_pool", gathered_unit,
                "FSDP all-gather stream's cached block: one unit's unsharded parameters, "
                "reserved but not allocated while the next unit is in use",
                "torch 2.13 c10/cuda/CUDACachingAllocator.cpp (per-stream pools), "
                "fsdp/_runtime_utils.py _unshard (FSDP1), _fully_shard/_fsdp_param_group.py "
                "(FSDP2)", confidence="low")


def device_terms(generation: str | None, strategy: Strategy, a: MemoryAssumptions,
                 gathered_unit: int = 0) -> list[Piece]:
    """The device terms outside the step's allocated peak: the CUDA context, and in
    multi-process regimes NCCL's buffers and the side-stream pool (``gathered_unit``: one
    FSDP unit's unsharded bytes, 0 where parameters are not gathered on a side stream)."""
    terms = [part("overheads/cuda_context", a.context_bytes(generation),
                  "CUDA context + loaded kernels by GPU generation (outside the allocator)",
                  a.source_of("context_bytes", "MemoryAssumptions.context_bytes_by_generation"),
                  generation=generation)]
    for extra in (nccl_term(strategy, a), side_stream_term(strategy, gathered_unit)):
        if extra is not None:
            terms.append(extra)
    return terms
