"""The loading peak (estimate._loading): QLoRA's on-the-fly quantisation and
prepare_model_for_kbit_training, by hand (`fit` on a loading-bound job: tests/cli/
test_memory_cli.py)."""

from __future__ import annotations

from dataclasses import replace

from tests.core.memory.fsdp_cases import CONFIG

from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Sharding, Strategy
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

SPEC = parse_model_config(CONFIG, name="tiny-llama")
A = MemoryAssumptions()
QLORA = Strategy(method=Method.QLORA, batch_size=1, seq_len=128, lora_rank=8, lora_alpha=16,
                 lora_targets=("all-linear",))


def test_qlora_loading_holds_weights_plus_the_bf16_source_of_the_embedding_cast() -> None:
    est = estimate_memory(SPEC, QLORA, generation="hopper")
    assert est.loading is not None
    terms = {t.path: int(t.value) for t in est.loading.terms}
    # the last cast moment beats the packing one: vocab · hidden in bf16 vs 256 · 688 in bf16
    assert terms["loading/kbit_cast_source"] == 4096 * 256 * 2
    assert "loading/quantize_source" not in terms
    # packed linears, their constants, the fp32 rest (embedding, head, norms), adapters; not
    # the step's bf16 autocast copy of the head
    weights = {t.path: int(t.value) for t in est.breakdown.terms if t.path.startswith("weights")}
    assert weights["weights/unquantized"] == (2 * 4096 * 256 + 7 * 256) * 4
    assert terms["loading/weights"] == sum(weights.values()) - weights["weights/autocast_copies"]
    allocated = terms["loading/weights"] + 4096 * 256 * 2
    assert terms["overheads/allocator_reserve"] == max(int(allocated * 0.04), 512 * 2**20)
    assert terms["overheads/cuda_context"] == A.context_bytes("hopper")
    assert est.loading_peak_bytes == sum(terms.values())
    assert "overheads/nccl" not in terms   # communicators start at the first collective


def test_no_loading_peak_without_on_the_fly_quantisation_or_with_sharded_params() -> None:
    for method in (Method.LORA, Method.FULL):
        est = estimate_memory(SPEC, replace(QLORA, method=method))
        assert est.loading is None and est.loading_peak_bytes == 0
        assert est.peak_bytes == est.device_total_bytes
    sharded = replace(QLORA, gpus=2, sharding=Sharding.ZERO3)
    assert estimate_memory(SPEC, sharded).loading is None
