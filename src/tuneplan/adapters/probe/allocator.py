"""A replay of torch's CUDA caching allocator over a step's allocations: the reserved peak.

The tracker (``tracker.StorageTracker``) records every storage a step creates and frees, in
order, on the CPU (real or fake tensors). On a GPU each of those is a request to
``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x, default settings), which this replays:

- sizes round up to 512 B (``round_size``); requests up to 1 MiB come from the small pool,
  larger ones from the large pool (``get_pool``);
- a request takes the smallest cached free block of its pool that holds it (best fit,
  lowest address among equals: ``get_free_block``'s ``lower_bound``); a larger block is
  split when what is left is at least 512 B (small pool) or more than 1 MiB (large pool)
  (``should_split``);
- with no such block a new segment is reserved (``cudaMalloc``): 2 MiB for small requests,
  20 MiB for requests under 10 MiB, else the request rounded up to 2 MiB
  (``get_allocation_size``);
- a freed block merges with free neighbours in its segment (``try_merge_blocks``); segments
  are never given back (no ``empty_cache``, no memory pressure), so the reserved peak is the
  sum of the segments reserved.

One stream (the HF step's compute stream); no ``max_split_size_mb``, ``expandable_segments``
or ``roundup_power2_divisions``. What the tracker cannot see, it cannot replay: memory a kernel
allocates internally. The cuBLAS/cuBLASLt workspaces, which a CPU run never makes, are the
estimate's own term replayed alone (``workspace_reserved_bytes``).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.overheads import workspace_term

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20          # kSmallSize
SMALL_BUFFER = 2 << 20        # kSmallBuffer
LARGE_BUFFER = 20 << 20       # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20    # kMinLargeAlloc
ROUND_LARGE = 2 << 20         # kRoundLarge


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


class _Block:
    __slots__ = ("addr", "allocated", "next", "prev", "size", "small")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr, self.size, self.small = addr, size, small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass(frozen=True, slots=True)
class AllocatorPeaks:
    """Bytes: the allocated peak as the allocator counts it (rounded requests), the reserved
    peak (segments), and the segments reserved."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    segments: int


class CachingAllocator:
    """The replay: ``malloc(key, nbytes)`` (a live key is freed first) and ``free(key)``;
    ``peaks()`` at any time."""

    def __init__(self) -> None:
        self._free: dict[bool, list[tuple[int, int, _Block]]] = {True: [], False: []}
        self._live: dict[Hashable, _Block] = {}
        self._next_addr = 0
        self._reserved = 0
        self._allocated = 0
        self._allocated_peak = 0
        self._segments = 0

    def _take(self, block: _Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.size, block.addr))
        del pool[i]

    def _put(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr, block))

    def malloc(self, key: Hashable, nbytes: int) -> None:
        if key in self._live:
            self.free(key)
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool[i][2]
            del pool[i]
        else:
            seg = allocation_size(size)
            block = _Block(self._next_addr, seg, small)
            self._next_addr += seg
            self._reserved += seg
            self._segments += 1
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(block.addr + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._put(rest)
        block.allocated = True
        self._live[key] = block
        self._allocated += block.size
        self._allocated_peak = max(self._allocated_peak, self._allocated)

    def free(self, key: Hashable) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        block.allocated = False
        self._allocated -= block.size
        for other in (block.prev, block.next):
            if other is None or other.allocated:
                continue
            self._take(other)
            if other is block.prev:  # absorb the previous block into this one
                block.addr, block.prev = other.addr, other.prev
                if other.prev is not None:
                    other.prev.next = block
            else:
                block.next = other.next
                if other.next is not None:
                    other.next.prev = block
            block.size += other.size
        self._put(block)

    def peaks(self) -> AllocatorPeaks:
        return AllocatorPeaks(allocated_peak_bytes=self._allocated_peak,
                              reserved_peak_bytes=self._reserved, segments=self._segments)


def replay(events: Iterable[tuple[Hashable, int]]) -> AllocatorPeaks:
    """Replay ``(key, size)`` events, each the size a storage has from then on: a new key is
    allocated, size 0 frees it, another size on a live key reallocates it (``resize_``)."""
    alloc = CachingAllocator()
    for key, size in events:
        if size > 0:
            alloc.malloc(key, size)
        else:
            alloc.free(key)
    return alloc.peaks()


def workspace_reserved_bytes(generation: str | None, a: MemoryAssumptions) -> int:
    """The segments a GPU step's cuBLAS and cuBLASLt workspaces take (one pair per thread that
    runs matmuls: ``overheads.workspace_term``), replayed on their own: added to a CPU run's
    replay to compare with a GPU's reserved peak (their small-pool segment may in truth also
    hold small tensors: at most 2 MiB high)."""
    term = workspace_term(generation, a)
    threads = int(term.inputs["threads"])
    sizes = (int(term.inputs["cublas_bytes"]), int(term.inputs["cublaslt_bytes"]))
    return replay([((i, j), size) for i in range(threads)
                   for j, size in enumerate(sizes)]).reserved_peak_bytes
