"""How data parallelism splits memory per GPU: DDP (no pooling, gradient buckets), ZeRO-1/2/3,
FSDP full-shard / grad-op / hybrid (gathered blocks), CPU offload of optimizer and parameters.

Sources: DeepSpeed ZeRO stages (1 shards optimizer state + fp32 master, 2 adds gradients, 3 adds
parameters and gathers them per submodule, ``zero3_gather.py``); torch FSDP ShardingStrategy
(FULL_SHARD ≈ ZeRO-3, SHARD_GRAD_OP ≈ ZeRO-2, HYBRID_SHARD shards inside a node only); DDP
without ``gradient_as_bucket_view`` keeps a bucket copy of every gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.strategy import Offload, Sharding, Strategy


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPlan:
    """Divisors per tensor kind (0 = moved to host) and extra per-GPU buffers' switches."""

    shards: int
    params_div: int
    grads_div: int
    states_div: int
    states_on_host: bool
    params_on_host: bool
    gathers_blocks: bool
    ddp_buckets: bool
    zero_buckets: bool


def shard_plan(strategy: Strategy) -> ShardPlan:
    s, world = strategy.sharding, strategy.world_size
    n = strategy.gpus if s is Sharding.HYBRID else world
    n = max(n, 1)
    params = n if s in (Sharding.ZERO3, Sharding.FSDP, Sharding.HYBRID) else 1
    grads = n if s not in (Sharding.DDP, Sharding.ZERO1) else 1
    states = 1 if s is Sharding.DDP else n
    return ShardPlan(
        shards=n, params_div=params, grads_div=grads, states_div=states,
        states_on_host=strategy.offload is not Offload.NONE,
        params_on_host=strategy.offload is Offload.OPTIMIZER_PARAMS,
        # FSDP's gathered units are core/memory/fsdp.py's (HF recipes on several GPUs)
        gathers_blocks=(params > 1 and not _fsdp_units(strategy))
        or (strategy.offload is Offload.OPTIMIZER_PARAMS),
        ddp_buckets=s is Sharding.DDP and world > 1,
        zero_buckets=s in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3) and world > 1)


def _fsdp_units(strategy: Strategy) -> bool:
    from tuneplan.core.memory.fsdp import applies

    return applies(strategy) and strategy.offload is Offload.NONE


def shard(value: int, div: int) -> int:
    """Bytes one GPU holds of ``value`` split ``div`` ways (ceil; DeepSpeed pads partitions)."""
    return -(-value // div)
