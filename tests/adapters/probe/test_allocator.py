"""The caching-allocator replay: torch's rounding, pools, best fit, split and merge rules, and
its reserved peaks against ones measured on a real H200."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tuneplan.adapters.probe.allocator import (
    CachingAllocator,
    allocation_size,
    replay,
    round_size,
    workspace_reserved_bytes,
)
from tuneplan.core.memory.assumptions import MemoryAssumptions

MiB = 2**20
H200_PROBES = (Path(__file__).resolve().parents[3] / "benchmarks" / "calibration" / "device"
               / "h200-2026-12-04" / "probes.jsonl")


def test_sizes_round_as_torch_rounds_them() -> None:
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert round_size(4096) == 4096
    assert allocation_size(1 * MiB) == 2 * MiB          # small pool: 2 MiB segments
    assert allocation_size(1 * MiB + 512) == 20 * MiB   # under 10 MiB: 20 MiB segments
    assert allocation_size(10 * MiB) == 10 * MiB        # from 10 MiB: rounded to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_a_two_mib_segment() -> None:
    a = CachingAllocator()
    for i in range(4):
        a.malloc(i, 100 * 1024)
    assert a.peaks().reserved_peak_bytes == 2 * MiB
    assert a.peaks().allocated_peak_bytes == 4 * 100 * 1024
    assert a.peaks().segments == 1


def test_mid_sized_requests_split_a_twenty_mib_segment_until_it_is_full() -> None:
    a = CachingAllocator()
    for i in range(4):
        a.malloc(i, 5 * MiB)  # 20, 15, 10, then 5 MiB left: the last fits exactly
    assert a.peaks().reserved_peak_bytes == 20 * MiB
    a.malloc(4, 5 * MiB)
    assert a.peaks().reserved_peak_bytes == 40 * MiB


def test_a_large_block_is_not_split_for_less_than_a_mib() -> None:
    a = CachingAllocator()
    a.malloc("x", 12 * MiB)
    a.free("x")
    a.malloc("y", 11 * MiB + 512 * 1024)  # 0.5 MiB would be left: the block goes whole
    assert a.peaks().allocated_peak_bytes == 12 * MiB
    a.malloc("z", 512 * 1024)  # small pool: its own segment, not the large block's rest
    assert a.peaks().reserved_peak_bytes == 14 * MiB


def test_best_fit_takes_the_smallest_free_block_that_holds_the_request() -> None:
    a = CachingAllocator()
    a.malloc("big", 40 * MiB)
    a.malloc("mid", 12 * MiB)
    a.free("big")
    a.free("mid")
    a.malloc("r", 10 * MiB)  # the 12 MiB block: 2 MiB left over is split off
    a.malloc("s", 30 * MiB)  # the 40 MiB block still whole: no new segment
    assert a.peaks().reserved_peak_bytes == 52 * MiB
    a.malloc("t", 30 * MiB)  # 10 MiB left of the 40 and 2 of the 12: a new segment
    assert a.peaks().reserved_peak_bytes == 82 * MiB


def test_freed_neighbours_merge_into_one_block() -> None:
    a = CachingAllocator()
    a.malloc("a", 6 * MiB)
    a.malloc("b", 6 * MiB)
    a.malloc("c", 6 * MiB)
    for k in ("a", "c", "b"):  # b's free joins a's block before it and c's after it
        a.free(k)
    a.malloc("d", 19 * MiB)
    assert a.peaks().reserved_peak_bytes == 20 * MiB


def test_the_workspaces_take_their_own_segments() -> None:
    # Hopper: per thread (forward, autograd's backward) a 32 MiB cuBLAS workspace, a segment
    # of its own, and a 1 MiB cuBLASLt one: both of those share one 2 MiB small-pool segment
    assert workspace_reserved_bytes("hopper", MemoryAssumptions()) == 66 * MiB
    # elsewhere 8.125 MiB each: under 10 MiB, so both fit one 20 MiB segment
    assert workspace_reserved_bytes("ampere", MemoryAssumptions()) == 22 * MiB


def test_replay_reads_sizes_from_then_on() -> None:
    # a storage resized (FSDP's resize_) is reallocated; size 0 frees it
    peaks = replay([("p", 12 * MiB), ("p", 0), ("q", 12 * MiB), ("p", 24 * MiB)])
    assert peaks.reserved_peak_bytes == 36 * MiB
    assert peaks.allocated_peak_bytes == 36 * MiB


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

def _h200_rows() -> list[dict]:
    return [json.loads(line) for line in H200_PROBES.read_text().splitlines() if line.strip()]


# The three fastest of the recorded jobs; benchmarks/allocator_replay.py runs all eleven.
@pytest.mark.parametrize("index", [1, 3, 10])
def test_replayed_reserved_peak_matches_the_h200(index: int) -> None:
    from tuneplan.adapters.hub import load_model_config
    from tuneplan.adapters.probe.harness import StepSetup, measure_step
    from tuneplan.service.jobflags import job_from_values

    row = _h200_rows()[index]
    strategy = job_from_values(row["model"], row["flags"], command="probe").strategy
    config, _ = load_model_config(row["model"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = measure_step(StepSetup(config=config, strategy=strategy, steps=3, fake=True))
    measured = row["measured"]["max_reserved_bytes"]
    # the GPU's cuBLAS workspaces, which a CPU run never makes (66 MiB on Hopper)
    replayed = m.allocator_reserved_bytes + workspace_reserved_bytes("hopper",
                                                                     MemoryAssumptions())
    assert replayed == pytest.approx(measured, rel=0.03)
    # the reserve above the tensors is real and the replay sees it: not the allocated peak
    assert m.allocator_reserved_bytes > m.peak_bytes * 1.01
