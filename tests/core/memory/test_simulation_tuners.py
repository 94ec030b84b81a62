"""Every PEFT tuner of ``core/job/tuners.py`` held to the exact CPU simulation on a small Llama.

The simulated step is the estimated job: ``get_peft_model`` with the config ``tuners.peft_spec``
builds (the probe's and, through train.py, the launch bundle's), random weights, two real steps,
live tensor bytes counted by the harness. Tolerance ±3 % on the allocated peak, as for the
other methods (``test_simulation.py``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Precision, Strategy
from tuneplan.core.job.tuners import CHECKPOINTING_MISSES, HALF_PRECISION_MISSES, TUNER_METHODS
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

pytestmark = pytest.mark.probe

#: A small Llama whose sizes every tuner's peft defaults accept (C3A's block 256 divides
#: every linear; RoAD's group 64 every output) and a small vocabulary, so that the blocks,
#: not the loss, set the peak.
SMALL_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128,
               "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
               "tie_word_embeddings": False}
TUNERS = sorted(TUNER_METHODS, key=str)
#: Tuners whose estimate misses the simulation by more than 3 % with activation
#: checkpointing (measured at batch 2, sequence 256: LoKr +3.2 %, RoAD +3.3 %, C3A -5.9 %):
#: held to it without checkpointing only, and the test below fails if one starts to agree.
CKPT_MISSES = CHECKPOINTING_MISSES


def _measure(method: Method, batch: int, seq: int, ckpt: bool,
             precision: Precision = Precision.FP32,
             targets: tuple[str, ...] = ("all-linear",)) -> tuple[int, int, int, int]:
    """(estimated tensors, simulated peak, estimated and simulated trainable parameters)."""
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    recipe = Recipe.HF if precision is Precision.BF16_MIXED else Recipe.PLAIN
    strategy = Strategy(method=method, recipe=recipe, precision=precision,
                        batch_size=batch, seq_len=seq, lora_rank=16, num_virtual_tokens=8,
                        lora_targets=targets,
                        checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE)
    measured = measure_step(StepSetup(config=SMALL_LLAMA, strategy=strategy,
                                      optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(SMALL_LLAMA, name="small-llama"), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    tensors = estimate.allocated_peak_bytes - int(
        estimate.breakdown.value("overheads/cublas_workspace"))  # GPU-only, not simulated
    return tensors, measured.peak_bytes, estimate.trainable_params, measured.trainable_params


@pytest.mark.parametrize("method", TUNERS, ids=str)
def test_tuner_peak_matches_simulation(method: Method) -> None:
    tensors, peak, ours, theirs = _measure(method, 2, 64, False)
    assert ours == theirs
    assert abs(tensors - peak) / peak <= 0.03, f"estimated {tensors} vs measured {peak}"


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.BF16_MIXED], ids=str)
@pytest.mark.parametrize("method", TUNERS, ids=str)
def test_tuner_peak_in_half_precision(method: Method, precision: Precision) -> None:
    # within 3 % unless HALF_PRECISION_MISSES lists the miss (then within half a point of the
    # listed error, so a change that moves it updates the table and the note it prints)
    tensors, peak, _, _ = _measure(method, 2, 64, False, precision)
    error = (tensors - peak) / peak * 100
    listed = HALF_PRECISION_MISSES.get(method, {}).get(precision.value)
    if listed is None:
        assert abs(error) <= 3, f"{method} {precision}: {error:+.1f} % (add it to the table)"
    else:
        assert abs(error - listed) <= 0.5, f"{method} {precision}: {error:+.1f} % vs {listed}"


@pytest.mark.parametrize("method", TUNERS, ids=str)
def test_tuner_peak_with_checkpointing(method: Method) -> None:
    tensors, peak, _, _ = _measure(method, 2, 256, True)
    error = abs(tensors - peak) / peak
    if method in CKPT_MISSES:
        assert 0.03 < error < 0.08, f"{method}: {error:.1%} (update CKPT_MISSES)"
    else:
        assert error <= 0.03, f"estimated {tensors} vs measured {peak}"


#: DoRA where its weight norm sets the peak (a short sequence: batch 2 x 64 tokens) and where
#: the backward does, on all linears and on q/v, in fp32, pure bf16 and bf16 autocast: before
#: ``activations.dora_transients`` the estimate missed the first kind by -15 % (fp32) and -24 %
#: (bf16 and bf16-mixed), on every linear.
DORA_CASES = [(precision, targets, batch, seq, ckpt)
              for precision in (Precision.FP32, Precision.BF16, Precision.BF16_MIXED)
              for targets in (("all-linear",), ("q_proj", "v_proj"))
              for batch, seq, ckpt in ((2, 64, False), (4, 64, True))]


@pytest.mark.parametrize("case", DORA_CASES, ids=lambda c: "-".join(
    [c[0].value, c[1][0], str(c[2]), str(c[3]), "ckpt" if c[4] else "none"]))
def test_dora_peak_with_its_weight_norm_matches_simulation(
        case: tuple[Precision, tuple[str, ...], int, int, bool]) -> None:
    precision, targets, batch, seq, ckpt = case
    tensors, peak, _, _ = _measure(Method.DORA, batch, seq, ckpt, precision, targets)
    assert abs(tensors - peak) / peak <= 0.03, f"estimated {tensors} vs measured {peak}"
