"""Pinned byte figures of 49 varied estimates: a change meant only to make the estimate
faster (caches, lazy terms) must leave every figure as it was, byte for byte.

The expected figures are in ``tests/fixtures/memory/pinned_estimates.json``, written by this
module from the estimate as it stood (``PYTHONPATH=src python
tests/core/memory/test_pinned_figures.py --write``). A change that is meant to move an
estimate rewrites the file with that command and says so in its commit; a change meant to be
a pure speed-up must pass unchanged.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.stack import Stack
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.core.memory import estimate as memory_estimate
from tuneplan.core.memory import estimate_memory
from tuneplan.core.memory.assumptions import MemoryAssumptions

FIXTURE = Path(__file__).parents[2] / "fixtures" / "memory" / "pinned_estimates.json"

LLAMA = "meta-llama/Llama-3.1-8B"
QWEN = "Qwen/Qwen2.5-0.5B"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
QWEN_MOE = "Qwen/Qwen3-30B-A3B"
GEMMA = "google/gemma-2-2b"
PYTHIA = "EleutherAI/pythia-1b"
SMOL = "HuggingFaceTB/SmolLM2-135M"
T0 = "bigscience/T0_3B"   # encoder-decoder (T5)

S = Strategy
#: (name, model, strategy, generation); names are the fixture's keys
JOBS: list[tuple[str, str, Strategy, str | None]] = [
    ("llama-full-b1-s512", LLAMA, S(method=Method.FULL, seq_len=512), None),
    ("llama-full-b4-s4096", LLAMA, S(method=Method.FULL, batch_size=4, seq_len=4096), None),
    ("llama-lora-b1-s512", LLAMA, S(seq_len=512), None),
    ("llama-lora-b7-s4096", LLAMA, S(batch_size=7, seq_len=4096), "hopper"),
    ("llama-qlora-b4-s512", LLAMA, S(method=Method.QLORA, batch_size=4, seq_len=512), None),
    ("llama-qlora-b13-s2048-eager", LLAMA, S(method=Method.QLORA, batch_size=13,
                                             attention=Attention.EAGER), "ampere"),
    ("llama-full-zero3-8gpu", LLAMA, S(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3),
     None),
    ("llama-full-zero3-offload", LLAMA, S(method=Method.FULL, gpus=8, batch_size=3,
                                          sharding=Sharding.ZERO3,
                                          offload=Offload.OPTIMIZER_PARAMS), "hopper"),
    ("llama-full-fsdp-2nodes", LLAMA, S(method=Method.FULL, gpus=8, nodes=2,
                                        sharding=Sharding.FSDP, batch_size=2), "hopper"),
    ("llama-full-zero2-accum", LLAMA, S(method=Method.FULL, gpus=4, sharding=Sharding.ZERO2,
                                        grad_accum=8, batch_size=5), None),
    ("llama-lora-nockpt", LLAMA, S(checkpointing=Checkpointing.NONE, batch_size=2,
                                   seq_len=1024), None),
    ("llama-lora-offload-acts", LLAMA, S(checkpointing=Checkpointing.OFFLOAD, batch_size=9),
     None),
    ("llama-lora-dropout-qv", LLAMA, S(lora_dropout=0.05, lora_targets=("q_proj", "v_proj"),
                                       lora_rank=64, batch_size=3), None),
    ("llama-lora-lmhead", LLAMA, S(lora_targets=("all-linear", "lm_head"), batch_size=2),
     None),
    ("llama-lora-chunked", LLAMA, S(loss=Loss.CHUNKED, batch_size=6, seq_len=8192), None),
    ("llama-full-adamw8bit", LLAMA, S(method=Method.FULL, optimizer=Optimizer.ADAMW8BIT,
                                      batch_size=2), None),
    ("llama-full-paged-bf16", LLAMA, S(method=Method.FULL, precision=Precision.BF16,
                                       optimizer=Optimizer.PAGED_ADAMW8BIT), None),
    ("llama-full-in-backward", LLAMA, S(method=Method.FULL, optimizer_in_backward=True,
                                        recipe=Recipe.TORCHTUNE, precision=Precision.BF16,
                                        batch_size=2), None),
    ("llama-dora", LLAMA, S(method=Method.DORA, batch_size=2, grad_accum=4), None),
    ("llama-lora8bit", LLAMA, S(method=Method.LORA8BIT, batch_size=3), None),
    ("llama-qlora-fp4-nodq", LLAMA, S(method=Method.QLORA, quant=Quant.FP4,
                                      double_quant=False, batch_size=2), None),
    ("llama-qlora-old-bnb", LLAMA, S(method=Method.QLORA, batch_size=2,
                                     stack=Stack.parse("bitsandbytes=0.42,transformers=4.40")),
     None),
    ("llama-lora-litgpt", LLAMA, S(recipe=Recipe.LITGPT, batch_size=2, seq_len=1024), None),
    ("llama-full-litgpt", LLAMA, S(method=Method.FULL, recipe=Recipe.LITGPT, seq_len=1024,
                                   gpus=4, sharding=Sharding.FSDP), None),
    ("llama-lora-torchtune", LLAMA, S(recipe=Recipe.TORCHTUNE, precision=Precision.BF16,
                                        batch_size=4), None),
    ("llama-freeze", LLAMA, S(method=Method.FREEZE, trainable_layers=4, batch_size=2), None),
    ("llama-seqcls", LLAMA, S(task=Task.SEQ_CLS, num_labels=5, batch_size=8, seq_len=512),
     None),
    ("qwen-full-fp32", QWEN, S(method=Method.FULL, precision=Precision.FP32, batch_size=2),
     None),
    ("qwen-full-fp16", QWEN, S(method=Method.FULL, precision=Precision.FP16_MIXED,
                               batch_size=16, seq_len=1024), "volta"),
    ("qwen-lora-b32", QWEN, S(batch_size=32, seq_len=512), None),
    ("qwen-prefix", QWEN, S(method=Method.PREFIX, num_virtual_tokens=30, batch_size=4), None),
    ("qwen-prompt", QWEN, S(method=Method.PROMPT, batch_size=4), None),
    ("qwen-ia3", QWEN, S(method=Method.IA3, batch_size=4), None),
    ("qwen-lora-trainable-embed", QWEN, S(trainable_modules=("embed_tokens", "lm_head"),
                                          batch_size=2), None),
    ("qwen-full-ddp-4gpu", QWEN, S(method=Method.FULL, gpus=4, batch_size=8), "hopper"),
    ("mixtral-qlora", MIXTRAL, S(method=Method.QLORA, batch_size=2), None),
    ("mixtral-lora-attn", MIXTRAL, S(lora_targets=("q_proj", "v_proj"), gpus=8,
                                     sharding=Sharding.ZERO3, batch_size=2), "hopper"),
    ("qwen3moe-lora", QWEN_MOE, S(batch_size=2, seq_len=1024), None),
    ("qwen3moe-full-zero3", QWEN_MOE, S(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3),
     None),
    ("gemma2-lora", GEMMA, S(batch_size=4, attention=Attention.EAGER), None),
    ("gemma2-full", GEMMA, S(method=Method.FULL, batch_size=2, attention=Attention.EAGER),
     None),
    ("pythia-lora", PYTHIA, S(batch_size=8, seq_len=1024), None),
    ("pythia-full-nockpt", PYTHIA, S(method=Method.FULL, checkpointing=Checkpointing.NONE,
                                     batch_size=2), None),
    ("t0-lora", T0, S(batch_size=2, seq_len=512), None),
    ("t0-full-nockpt", T0, S(method=Method.FULL, checkpointing=Checkpointing.NONE,
                             seq_len=512), None),
    ("qwen-loha", QWEN, S(method=Method.LOHA, batch_size=2), None),
    ("qwen-vera-nockpt", QWEN, S(method=Method.VERA, checkpointing=Checkpointing.NONE,
                                 batch_size=2), None),
    ("smol-lora-adafactor", SMOL, S(optimizer=Optimizer.ADAFACTOR, batch_size=64,
                                    packing=True), None),
    ("smol-full-sgd", SMOL, S(method=Method.FULL, optimizer=Optimizer.SGD, batch_size=16),
     None),
]

#: One job with assumptions of its own (a CPU-simulation dropout mask, other chunks).
OWN_ASSUMPTIONS = MemoryAssumptions(dropout_mask_bytes=4, loss_chunks=4)
OWN_ASSUMPTIONS_JOBS = {"llama-lora-dropout-qv", "llama-lora-chunked"}


def _figures(name: str, model_name: str, strategy: Strategy,
             generation: str | None) -> dict[str, Any]:
    model = resolve_model(model_name)
    a = OWN_ASSUMPTIONS if name in OWN_ASSUMPTIONS_JOBS else None
    est = estimate_memory(model, strategy, a, generation=generation)
    return {
        "allocated": est.allocated_peak_bytes, "reserved": est.reserved_peak_bytes,
        "device": est.device_total_bytes, "host": est.host_ram_bytes,
        "peak": est.peak_phase, "phases": dict(est.phases),
        "trainable": est.trainable_params, "total_params": est.total_params,
        "terms": [[t.path, t.value] for t in est.breakdown],
        "host_terms": [[t.path, t.value] for t in est.host],
    }


def _all() -> dict[str, dict[str, Any]]:
    memory_estimate.clear_cache()
    return {name: _figures(name, m, s, g) for name, m, s, g in JOBS}


def test_the_jobs_are_many_and_named_once() -> None:
    names = [name for name, *_ in JOBS]
    assert len(names) >= 30 and len(set(names)) == len(names)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_every_pinned_figure_is_unchanged(warm: bool) -> None:
    expected = json.loads(FIXTURE.read_text())
    assert sorted(expected) == sorted(name for name, *_ in JOBS)
    memory_estimate.clear_cache()
    if warm:  # other micro-batches of every job first: the batch-independent work is reused
        for name, m, s, g in JOBS:
            for batch in (1, s.batch_size + 1):
                _figures(name, m, replace(s, batch_size=batch), g)
    for name, m, s, g in JOBS:
        assert _figures(name, m, s, g) == expected[name], name


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_pinned_figures.py --write   (rewrites the pinned figures)")
    FIXTURE.write_text(json.dumps(_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(JOBS)} estimates to {FIXTURE}")
