"""DeepSpeed ZeRO buffer rules (``core/memory/zero.py``) at DeepSpeed's default knobs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Offload, Sharding, Strategy
from tuneplan.core.memory.parts import Piece, total
from tuneplan.core.memory.zero import ZeroJob, zero_job, zero_phases
from tuneplan.core.models import parse_model_config

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
         "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 4096}


def _paths(pieces: Sequence[Piece]) -> dict[str, int]:
    return {p.path: int(p.value) for p in pieces}


def test_padding_and_partition_follow_deepspeeds_alignment() -> None:
    # params padded to 8 bf16 elements (16 B) but the last; group to 2 * world elements
    job = ZeroJob(trainable=[3, 5, 7], frozen=[], stage=2, world=4)
    flat = _paths(zero_phases(job)["init"].device)["zero/bit16_flat"]
    assert flat == 24 * 2            # 8 + 8 + 7 = 23 -> 24 (multiple of 8)
    master = _paths(zero_phases(job)["init"].device)["zero/fp32_master_partition"]
    assert master == 6 * 4


def test_zero3_rank_keeps_a_default_reduce_bucket_of_one_gigabyte() -> None:
    model = parse_model_config(LLAMA, name="llama-7b")
    s = Strategy(method=Method.FULL, sharding=Sharding.ZERO3, gpus=4)
    step = zero_phases(zero_job(model, s))["step"]
    assert _paths(step.device)["zero/ipg_bucket"] == 500_000_000 * 2
    # 16-bit + fp32 master + 16-bit grads + 2 fp32 states per element, a quarter each
    params = sum(zero_job(model, s).trainable)
    assert 6_700_000_000 < params < 6_800_000_000
    assert total(step.device) - 500_000_000 * 2 >= params // 4 * (2 + 4 + 2 + 8)


def test_offload_moves_master_grads_and_states_to_the_host() -> None:
    model = parse_model_config(LLAMA, name="llama-7b")
    on = Strategy(method=Method.FULL, sharding=Sharding.ZERO2, gpus=2)
    off = Strategy(method=Method.FULL, sharding=Sharding.ZERO2, gpus=2,
                   offload=Offload.OPTIMIZER)
    dev_on = zero_phases(zero_job(model, on))["step"]
    dev_off = zero_phases(zero_job(model, off))["step"]
    assert dev_on.host == []
    assert "zero/optimizer_states" in _paths(dev_off.host)
    assert "zero/temp_grad_gpu" in _paths(dev_off.device)
    assert total(dev_off.device) < total(dev_on.device) / 3


def test_the_estimate_counts_offloads_pinned_gradient_buffers_in_host_ram() -> None:
    from tuneplan.core.memory import estimate_memory

    model = parse_model_config(LLAMA, name="llama-7b")
    for sharding, extra in ((Sharding.ZERO2, "host/bit16_staging"),
                            (Sharding.ZERO3, "host/grad_partitions")):
        s = Strategy(method=Method.FULL, sharding=sharding, gpus=2, seq_len=512,
                     offload=Offload.OPTIMIZER)
        est = estimate_memory(model, s)
        partition = sum(-(-n // 2) for n in zero_job(model, s).trainable)
        # fp32 gradient partition, pinned, per rank; 2 ranks on the node
        assert est.host.value("host/fp32_master_grad") == pytest.approx(
            2 * partition * 4, rel=0.001)
        assert est.host.value(extra) > 0
    plain = Strategy(method=Method.FULL, sharding=Sharding.ZERO2, gpus=2, seq_len=512)
    assert est.host.value("host/fp32_master_grad") > 0
    assert all(not t.path.startswith("host/fp32") for t in estimate_memory(model, plain).host.terms)


def test_zero3_loading_books_one_block_of_host_ram_not_the_whole_model() -> None:
    """transformers 5.24 under ZeRO-3: zero.Init partitions on the GPUs, rank 0 maps the
    safetensors shards (page cache) and converts a block at a time; FSDP and DDP keep the
    whole-model term (rank 0's CPU copy; every rank's copy)."""
    from tuneplan.core.memory import estimate_memory

    model = parse_model_config(LLAMA, name="llama-7b")
    block = model.layers[0].params * 2   # bf16
    zero3 = estimate_memory(model, Strategy(method=Method.LORA, sharding=Sharding.ZERO3,
                                            gpus=8, seq_len=512))
    assert zero3.host.value("host/model_loading") == pytest.approx(block, rel=0.01)
    whole = sum(la.params * la.count for la in model.layers) * 2
    fsdp = estimate_memory(model, Strategy(method=Method.LORA, sharding=Sharding.FSDP,
                                           gpus=8, seq_len=512))
    assert fsdp.host.value("host/model_loading") > whole
    ddp = estimate_memory(model, Strategy(method=Method.LORA, sharding=Sharding.DDP, gpus=2,
                                          seq_len=512))
    assert ddp.host.value("host/model_loading") == pytest.approx(
        2 * fsdp.host.value("host/model_loading"), rel=0.01)
