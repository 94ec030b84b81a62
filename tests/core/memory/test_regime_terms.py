"""Device terms that exist only in some regimes (core/memory/overheads.py): NCCL's buffers
with a communicator, the all-gather stream's cached block under FSDP; by hand from the
mechanism."""

from __future__ import annotations

from dataclasses import replace

from tests.core.memory.fsdp_cases import CONFIG, strategy

from tuneplan.core.job.strategy import Sharding
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

SPEC = parse_model_config(CONFIG, name="tiny-llama")
#: NCCL 2.21 defaults per connection: Simple 4 MiB + LL 8·512·8·16 + LL128 120·640·8·8
PER_CONNECTION = 4 * 2**20 + 524288 + 4915200
#: one tiny-llama block: q, o 256·256, k, v 256·128, gate/up/down 256·688, two norms 256
BLOCK = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688 + 2 * 256


def _paths(est: object) -> set[str]:
    return {t.path for t in est.breakdown.terms}  # type: ignore[attr-defined]


def _value(est: object, path: str) -> int:
    return int(est.breakdown.value(path))  # type: ignore[attr-defined]


FULL = (1, "full", 1, 128, False, 1)


def test_one_gpu_has_no_communicator_and_no_side_stream_pool() -> None:
    est = estimate_memory(SPEC, replace(strategy(FULL, 1), sharding=Sharding.DDP))
    assert "overheads/nccl" not in _paths(est)
    assert "overheads/side_stream_pool" not in _paths(est)


def test_nccl_buffers_are_channels_connections_and_protocol_buffers() -> None:
    for sharding in (Sharding.DDP, Sharding.ZERO2, Sharding.FSDP):
        est = estimate_memory(SPEC, replace(strategy(FULL, 4), sharding=sharding))
        assert _value(est, "overheads/nccl") == 16 * 3 * PER_CONNECTION == 462422016
    a = MemoryAssumptions(nccl_channels=8)
    assert _value(estimate_memory(SPEC, strategy(FULL, 4), a), "overheads/nccl") == (
        8 * 3 * PER_CONNECTION)


def test_hybrid_shard_across_nodes_holds_two_communicators() -> None:
    s = replace(strategy(FULL, 4), sharding=Sharding.HYBRID, nodes=2)
    assert _value(estimate_memory(SPEC, s), "overheads/nccl") == 2 * 16 * 3 * PER_CONNECTION
    one_node = replace(s, nodes=1)
    assert _value(estimate_memory(SPEC, one_node), "overheads/nccl") == 16 * 3 * PER_CONNECTION


def test_side_stream_pool_only_where_fsdp_gathers_units() -> None:
    for version in (1, 2):
        est = estimate_memory(SPEC, strategy(FULL, 2), MemoryAssumptions(fsdp_version=version))
        # one block's unsharded fp32 parameters cached in the all-gather stream's pool
        assert _value(est, "overheads/side_stream_pool") == BLOCK * 4
        assert est.device_total_bytes == est.breakdown.total
    for sharding in (Sharding.DDP, Sharding.ZERO2, Sharding.ZERO3, Sharding.FSDP_GRAD_OP):
        est = estimate_memory(SPEC, replace(strategy(FULL, 2), sharding=sharding))
        assert "overheads/side_stream_pool" not in _paths(est), sharding
        assert "overheads/nccl" in _paths(est)


def test_side_stream_pool_is_outside_the_reserved_peak_but_in_the_device_total() -> None:
    est = estimate_memory(SPEC, strategy(FULL, 2))
    outside = (_value(est, "overheads/cuda_context") + _value(est, "overheads/nccl")
               + _value(est, "overheads/side_stream_pool"))
    assert est.device_total_bytes - est.reserved_peak_bytes >= outside
