"""The analytic allocated peak under ``--recipe torchtune`` held to a simulation of torchtune's
own single-device recipe step (``adapters/probe/torchtune_step.py``: torchtune 0.6.1's llama-3
builders, LoRALinear, CEWithChunkedOutputLoss, the recipes' ``_loss_step``), tiny configs for
real on the CPU and full-size ones under fake tensors. Tolerance ±3 % on the allocated peak for
every configuration.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtune")

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Attention, Checkpointing, Loss, Precision, Strategy
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

pytestmark = pytest.mark.probe

_BASE = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "model_type": "llama",
         "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
CONFIGS = {
    "llama-gqa": _BASE,
    "llama-mha": {**_BASE, "num_key_value_heads": 4},
    # blocks and norm backward, not the logits, set the peak
    "llama-small-vocab": {**_BASE, "vocab_size": 128},
    "llama-tied": {**_BASE, "tie_word_embeddings": True},   # llama3_2's TiedLinear head
}
BF16, FP32 = Precision.BF16, Precision.FP32
ALL = ("all-linear",)
QVO = ("q_proj", "v_proj", "o_proj")   # torchtune's 8B LoRA configs, without the MLP
QV = ("q_proj", "v_proj")
CHUNKED, STANDARD = Loss.CHUNKED, Loss.STANDARD
Case = tuple[str, str, int, int, bool, Precision, tuple[str, ...], Loss]
CASES: list[Case] = [
    ("llama-gqa", "lora", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-gqa", "full", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-gqa", "lora", 2, 256, True, BF16, ALL, CHUNKED),
    ("llama-gqa", "full", 2, 256, True, BF16, ALL, CHUNKED),
    ("llama-gqa", "lora", 1, 512, False, BF16, QV, CHUNKED),
    ("llama-gqa", "lora", 4, 128, True, BF16, ALL, CHUNKED),
    ("llama-gqa", "lora", 2, 200, False, BF16, ALL, CHUNKED),    # uneven chunks
    ("llama-gqa", "lora", 2, 256, False, BF16, QVO, CHUNKED),
    ("llama-gqa", "lora", 2, 256, False, FP32, ALL, CHUNKED),
    ("llama-gqa", "full", 1, 128, False, FP32, ALL, CHUNKED),
    ("llama-gqa", "lora", 2, 256, False, BF16, ALL, STANDARD),
    ("llama-gqa", "full", 2, 256, False, FP32, ALL, STANDARD),
    ("llama-mha", "lora", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-mha", "full", 3, 128, False, BF16, ALL, CHUNKED),
    ("llama-mha", "lora", 2, 256, True, FP32, QV, CHUNKED),
    ("llama-small-vocab", "lora", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-small-vocab", "full", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-small-vocab", "lora", 2, 256, True, BF16, ALL, CHUNKED),
    ("llama-small-vocab", "full", 2, 256, True, BF16, ALL, CHUNKED),
    ("llama-tied", "lora", 2, 256, False, BF16, ALL, CHUNKED),
    ("llama-tied", "full", 2, 256, False, BF16, ALL, CHUNKED),
]


def _strategy(method: str, b: int, s: int, ckpt: bool, precision: Precision,
              targets: tuple[str, ...], loss: Loss, rank: int = 8,
              packing: bool = False) -> Strategy:
    return Strategy(method=Method(method), recipe=Recipe.TORCHTUNE, precision=precision,
                    batch_size=b, seq_len=s, packing=packing, lora_rank=rank,
                    lora_alpha=2 * rank,
                    lora_targets=targets, loss=loss,
                    checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE)


def _tensors(est: object) -> int:
    peak: int = est.allocated_peak_bytes  # type: ignore[attr-defined]
    return peak - int(est.breakdown.value("overheads/cublas_workspace"))  # type: ignore[attr-defined]


def _case_id(c: Case) -> str:
    tag = {ALL: "all", QV: "qv", QVO: "qvo"}[c[6]]
    return "-".join(str(x) for x in c[:6]) + f"-{tag}-{c[7]}"


# Packed rows (``--packing``): the batch's input_pos reaches every RoPE call, which gathers
# its own fp32 cache rows (saved by the products) instead of viewing the cache. Full / LoRA
# (all-linear, and q,v where layer 0's k gather is freed), checkpointing on and off, fp32 and
# the standard loss.
PACKED = [CASES[i] for i in (0, 1, 2, 3, 4, 11, 15, 18)]
RUNS = [(c, False) for c in CASES] + [(c, True) for c in PACKED]


@pytest.mark.parametrize("case,packing", RUNS,
                         ids=[_case_id(c) + ("-packed" if p else "") for c, p in RUNS])
def test_torchtune_peak_matches_simulation(case: Case, packing: bool) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    arch, method, b, s, ckpt, precision, targets, loss = case
    config = CONFIGS[arch]
    strategy = _strategy(method, b, s, ckpt, precision, targets, loss, packing=packing)
    measured = measure_step(StepSetup(config=config, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(config, name=arch), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    assert estimate.trainable_params == measured.trainable_params
    assert any("torchtune's own layout" in n for n in estimate.notes)
    _assert_peak_and_state(estimate, measured)


def _assert_peak_and_state(estimate: object, measured: object) -> None:
    """The allocated peak (less the cuBLAS workspaces the tracker cannot see) and the state
    held as backward begins, each within 3 % of the simulation."""
    tensors = _tensors(estimate)
    peak: int = measured.peak_bytes  # type: ignore[attr-defined]
    assert abs(tensors - peak) / peak <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs simulated {peak} "  # type: ignore[attr-defined]
        f"({measured.peak_phase})")  # type: ignore[attr-defined]
    _assert_state_at_backward_start(estimate, measured)


def _assert_state_at_backward_start(estimate: object, measured: object) -> None:
    state: int = estimate.phases["forward-end"]  # type: ignore[attr-defined]
    held: int = measured.backward_start_bytes  # type: ignore[attr-defined]
    assert abs(state - held) / held <= 0.03, f"estimated {state} vs simulated {held}"


# --compile (torchtune's compile_model per layer and compile_loss), tiny configs for real:
# full / LoRA (all-linear, q,v and q,v,o), checkpointing on and off, bf16 and fp32, the
# chunked and the standard loss (compiled under LoRA, dropped by the full recipe), packed.
COMPILED = [(CASES[i], p) for i, p in ((0, False), (1, False), (2, True), (3, False),
                                       (4, False), (7, False), (9, False), (10, False),
                                       (11, True), (14, False), (15, False), (20, False))]


@pytest.mark.parametrize("case,packing", COMPILED,
                         ids=[_case_id(c) + ("-packed" if p else "") for c, p in COMPILED])
def test_torchtune_compiled_state_matches_simulation(case: Case, packing: bool) -> None:
    """The state held as backward begins (every compiled layer's saved set, the compiled
    loss's saved input and rows, parameters, optimizer state) within 3 % of the simulation,
    where inductor's partitioner decides it. Transients inside compiled graphs are counted
    fused, as inductor runs them; the simulation runs the partitioned graphs eagerly and holds
    every intermediate once, so its peak is an upper bound: the estimated peak lies between
    the state and that bound."""
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    arch, method, b, s, ckpt, precision, targets, loss = case
    config = CONFIGS[arch]
    strategy = dataclasses.replace(_strategy(method, b, s, ckpt, precision, targets, loss,
                                             packing=packing), compile=True)
    measured = measure_step(StepSetup(config=config, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(config, name=arch), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    assert any("--compile: each layer saves" in n for n in estimate.notes)
    _assert_state_at_backward_start(estimate, measured)
    state = estimate.phases["forward-end"]
    tensors = _tensors(estimate)
    assert state <= tensors <= measured.peak_bytes * 1.03, (
        f"estimated peak {tensors} ({estimate.peak_phase}) outside [{state}, simulated "
        f"{measured.peak_bytes}]")
    eager = estimate_memory(parse_model_config(config, name=arch),
                            dataclasses.replace(strategy, compile=False),
                            MemoryAssumptions(adamw_impl="fused"))
    assert tensors < _tensors(eager)   # compiled layers keep less than eager ones


# Full-size models under fake tensors: (bundled name, method, checkpointing, batch, sequence,
# loss), bf16, LoRA r16 "all-linear".
FULL_SIZE = [
    ("meta-llama/Llama-3.1-8B", "lora", True, 1, 2048, CHUNKED),
    ("meta-llama/Llama-3.1-8B", "full", True, 1, 2048, CHUNKED),
    ("meta-llama/Llama-3.1-8B", "lora", False, 1, 1024, CHUNKED),
    ("meta-llama/Llama-3.1-8B", "lora", True, 2, 1024, STANDARD),
    ("meta-llama/Llama-3.2-1B", "lora", True, 4, 2048, CHUNKED),
]


@pytest.mark.parametrize("case", FULL_SIZE, ids=lambda c: "-".join(str(x) for x in c))
def test_torchtune_full_size_peak_matches_fake_simulation(
        case: tuple[str, str, bool, int, int, Loss]) -> None:
    from tuneplan.adapters.hub import find_bundled, load_bundled_config, resolve_model
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    name, method, ckpt, b, s, loss = case
    bundled = find_bundled(name)
    assert bundled is not None
    strategy = _strategy(method, b, s, ckpt, BF16, ALL, loss, rank=16)
    measured = measure_step(StepSetup(config=load_bundled_config(bundled), strategy=strategy,
                                      fake=True))
    estimate = estimate_memory(resolve_model(name), strategy)
    assert estimate.trainable_params == measured.trainable_params
    tensors = _tensors(estimate)
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs simulated {measured.peak_bytes}")


def test_torchtune_layout_differs_from_hf() -> None:
    """The same LoRA job: torchtune's fp32 RoPE cache at the builder's 131072 positions and its
    eight logits chunks are in the estimate, and it says which layout it used."""
    from tuneplan.adapters.hub import resolve_model

    model = resolve_model("meta-llama/Llama-3.1-8B")
    job = _strategy("lora", 1, 2048, True, BF16, ALL, CHUNKED, rank=16)
    est = estimate_memory(model, job)
    hf = estimate_memory(model, Strategy(method=Method.LORA, recipe=Recipe.HF, precision=BF16,
                                         seq_len=2048, lora_rank=16, lora_alpha=32,
                                         checkpointing=Checkpointing.FULL))
    assert est.breakdown.value("weights/rope_cache") == 131072 * 128 * 4 + 64 * 4
    # all 8 chunks in bf16 + their fp32 log-softmax + the running chunk's fp32 copy
    assert est.breakdown.value("logits/forward") == 2048 * 128256 * (2 + 4) + 256 * 128256 * 4
    assert est.allocated_peak_bytes != hf.allocated_peak_bytes
    assert any("torchtune's own layout" in n for n in est.notes)


@pytest.mark.parametrize(("changes", "words"), [
    ({"method": Method.DORA}, "--method dora"),
    ({"attention": Attention.EAGER}, "--attention eager"),
    ({"lora_targets": ("gate_proj",)}, "gate, up and down together"),
    ({"trainable_modules": ("lm_head",)}, "--trainable-modules"),
])
def test_torchtune_simulation_refuses_what_it_does_not_run(changes: dict[str, object],
                                                            words: str) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step
    from tuneplan.errors import UnsupportedError

    strategy = Strategy(**{"method": Method.LORA, "recipe": Recipe.TORCHTUNE, "precision": BF16,
                           "batch_size": 1, "seq_len": 64, **changes})  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match=words):
        measure_step(StepSetup(config=CONFIGS["llama-gqa"], strategy=strategy))
    # the estimate does not pretend: the hf layout stands in, and says why
    est = estimate_memory(parse_model_config(CONFIGS["llama-gqa"], name="x"), strategy)
    assert any("hf layout with torchtune's dtypes stands in" in n for n in est.notes)



def test_compile_is_refused_where_no_compiled_layout_is_modelled() -> None:
    """--compile is estimated only on torchtune's own layout; elsewhere (the hf recipe, or a
    torchtune job its layout does not cover) it is refused, and the simulation refuses it
    under fake tensors, where dynamo does not trace."""
    from tuneplan.adapters.probe.harness import StepSetup
    from tuneplan.errors import UnsupportedError

    model = parse_model_config(CONFIGS["llama-gqa"], name="x")
    tune = dataclasses.replace(_strategy("lora", 1, 64, False, BF16, ALL, CHUNKED),
                               compile=True)
    assert estimate_memory(model, tune).phases["forward-end"] > 0
    for other in (dataclasses.replace(tune, recipe=Recipe.HF, precision=Precision.BF16_MIXED),
                  dataclasses.replace(tune, method=Method.DORA)):
        with pytest.raises(UnsupportedError, match="--compile is modelled for torchtune"):
            estimate_memory(model, other)
    with pytest.raises(UnsupportedError, match="--compile under fake tensors"):
        StepSetup(config=CONFIGS["llama-gqa"], strategy=tune, fake=True)


# --offload-activations (torchtune's OffloadActivations over checkpointed layers, the output
# projection under a NoOpManager): LoRA, bf16 (and one fp32 case), the chunked and the standard
# loss, tied and untied heads, packed, 2 and 6 layers (the forward stash then holds fewer
# layer inputs than there are layers).
_DEEP = {**_BASE, "num_hidden_layers": 6}
_DEEP_SMALL_VOCAB = {**_BASE, "num_hidden_layers": 6, "vocab_size": 128}
OFFLOADED: list[tuple[dict[str, object], int, int, Precision, tuple[str, ...], Loss, bool]] = [
    (CONFIGS["llama-gqa"], 2, 256, BF16, ALL, CHUNKED, False),
    (CONFIGS["llama-tied"], 2, 256, BF16, ALL, CHUNKED, False),
    (CONFIGS["llama-gqa"], 1, 512, BF16, QV, CHUNKED, True),
    (CONFIGS["llama-small-vocab"], 2, 256, BF16, ALL, CHUNKED, False),   # backward peak
    (CONFIGS["llama-gqa"], 2, 256, BF16, ALL, STANDARD, False),
    (_DEEP, 2, 256, BF16, ALL, CHUNKED, False),
    (_DEEP_SMALL_VOCAB, 2, 256, BF16, ALL, CHUNKED, False),
    (CONFIGS["llama-mha"], 2, 256, FP32, QV, CHUNKED, False),
]


def _offload_id(c: tuple[dict[str, object], int, int, Precision, tuple[str, ...], Loss, bool]
                ) -> str:
    cfg, b, s, precision, targets, loss, packed = c
    tag = {ALL: "all", QV: "qv", QVO: "qvo"}[targets]
    return (f"L{cfg['num_hidden_layers']}-V{cfg['vocab_size']}-tied{cfg['tie_word_embeddings']}"
            f"-{b}x{s}-{precision}-{tag}-{loss}" + ("-packed" if packed else ""))


def _offloaded(b: int, s: int, precision: Precision, targets: tuple[str, ...], loss: Loss,
               packed: bool, rank: int = 8) -> Strategy:
    return dataclasses.replace(_strategy("lora", b, s, True, precision, targets, loss,
                                         rank=rank, packing=packed),
                               checkpointing=Checkpointing.OFFLOAD)


@pytest.mark.parametrize("case", OFFLOADED, ids=[_offload_id(c) for c in OFFLOADED])
def test_torchtune_offloaded_peak_matches_simulation(
        case: tuple[dict[str, object], int, int, Precision, tuple[str, ...], Loss, bool]) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    cfg, b, s, precision, targets, loss, packed = case
    strategy = _offloaded(b, s, precision, targets, loss, packed)
    measured = measure_step(StepSetup(config=cfg, strategy=strategy, optimizer_impl="fused"))
    model = parse_model_config(cfg, name="x")
    estimate = estimate_memory(model, strategy, MemoryAssumptions(adamw_impl="fused"))
    assert any("torchtune's own layout" in n for n in estimate.notes)
    _assert_peak_and_state(estimate, measured)
    # the offloaded layer inputs left the device: the state held as backward begins is the
    # checkpointed one less every layer input but the one the forward stash still holds
    kept = estimate_memory(model, dataclasses.replace(strategy,
                                                      checkpointing=Checkpointing.FULL),
                           MemoryAssumptions(adamw_impl="fused"))
    layers, hidden = model.num_layers, model.hidden_size
    width = 4 if precision is FP32 else 2
    assert kept.phases["forward-end"] - estimate.phases["forward-end"] == (
        (layers - 1) * b * s * hidden * width)


@pytest.mark.parametrize("case", [OFFLOADED[0], OFFLOADED[6]],
                         ids=[_offload_id(OFFLOADED[0]), _offload_id(OFFLOADED[6])])
def test_torchtune_compiled_offloaded_state_matches_simulation(
        case: tuple[dict[str, object], int, int, Precision, tuple[str, ...], Loss, bool]) -> None:
    """--compile with --offload-activations (the torchtune README's LoRA row): the state held
    as backward begins within 3 % of the simulation, the peak between it and the simulation's
    eager-transient bound."""
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    cfg, b, s, precision, targets, loss, packed = case
    strategy = dataclasses.replace(_offloaded(b, s, precision, targets, loss, packed),
                                   compile=True)
    measured = measure_step(StepSetup(config=cfg, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(cfg, name="x"), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    _assert_state_at_backward_start(estimate, measured)
    assert estimate.phases["forward-end"] <= _tensors(estimate) <= measured.peak_bytes * 1.03


def test_torchtune_offloaded_full_size_matches_fake_simulation() -> None:
    """Llama-3.2-1B (16 layers, tied head), LoRA r16 all-linear, packed, offloaded."""
    from tuneplan.adapters.hub import find_bundled, load_bundled_config, resolve_model
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    name = "meta-llama/Llama-3.2-1B"
    bundled = find_bundled(name)
    assert bundled is not None
    strategy = _offloaded(2, 2048, BF16, ALL, CHUNKED, True, rank=16)
    measured = measure_step(StepSetup(config=load_bundled_config(bundled), strategy=strategy,
                                      fake=True))
    estimate = estimate_memory(resolve_model(name), strategy)
    tensors = _tensors(estimate)
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs simulated {measured.peak_bytes}")
    _assert_state_at_backward_start(estimate, measured)


def test_offloaded_full_fine_tuning_keeps_the_hf_stand_in_and_says_so() -> None:
    """A full fine-tune's offloaded backward is not modelled on torchtune's layout: the hf
    layout stands in, with the reason in the notes (the simulation runs it)."""
    model = parse_model_config(CONFIGS["llama-gqa"], name="x")
    job = dataclasses.replace(_strategy("full", 2, 256, True, BF16, ALL, CHUNKED),
                              checkpointing=Checkpointing.OFFLOAD)
    est = estimate_memory(model, job)
    assert any("--offload-activations with --method full" in n for n in est.notes)


# torchtune QLoRA (torchao NF4 weights, every block linear), tiny configs for real (to_nf4
# needs weights divisible into 64-blocks of 256-block scales: hidden 256, MLP 512). Eager
# dequantization (torchao's int64 unpacking) sets the backward peaks; the simulated weights
# are held to the estimate's weight terms too.
_NF4 = {**_BASE, "hidden_size": 256, "intermediate_size": 512}
_NF4_SMALL_VOCAB = {**_NF4, "vocab_size": 128, "num_hidden_layers": 4}
#: the same model's block linears in bf16: 2 layers · (q, o 256² + k, v 256·128 + 3 · 256·512)
_NF4_BF16_BYTES = 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512) * 2
QLORA: list[tuple[dict[str, object], int, int, tuple[str, ...], Loss, bool, Checkpointing]] = [
    (_NF4, 2, 256, ALL, CHUNKED, False, Checkpointing.NONE),
    (_NF4, 2, 256, ALL, CHUNKED, False, Checkpointing.FULL),
    ({**_NF4, "tie_word_embeddings": True}, 2, 256, QVO, CHUNKED, True, Checkpointing.OFFLOAD),
    (_NF4_SMALL_VOCAB, 2, 256, ALL, CHUNKED, False, Checkpointing.FULL),
    (_NF4_SMALL_VOCAB, 2, 256, ALL, CHUNKED, False, Checkpointing.OFFLOAD),
    (_NF4, 1, 512, QV, STANDARD, False, Checkpointing.NONE),
    (_NF4_SMALL_VOCAB, 2, 256, QVO, CHUNKED, False, Checkpointing.NONE),   # forward peak
    (_NF4_SMALL_VOCAB, 2, 256, QVO, CHUNKED, False, Checkpointing.FULL),
    (_NF4_SMALL_VOCAB, 1, 512, QV, STANDARD, True, Checkpointing.OFFLOAD),
]


def _qlora_id(c: tuple[dict[str, object], int, int, tuple[str, ...], Loss, bool, Checkpointing]
              ) -> str:
    cfg, b, s, targets, loss, packed, ckpt = c
    tag = {ALL: "all", QV: "qv", QVO: "qvo"}[targets]
    return (f"L{cfg['num_hidden_layers']}-V{cfg['vocab_size']}-{b}x{s}-{tag}-{loss}-{ckpt}"
            + ("-packed" if packed else ""))


def _qlora(b: int, s: int, targets: tuple[str, ...], loss: Loss, packed: bool,
           ckpt: Checkpointing) -> Strategy:
    from tuneplan.core.job.methods import Quant

    return dataclasses.replace(_strategy("qlora", b, s, False, BF16, targets, loss,
                                         packing=packed),
                               checkpointing=ckpt, quant=Quant.NF4, double_quant=True)


@pytest.mark.parametrize("case", QLORA, ids=[_qlora_id(c) for c in QLORA])
def test_torchtune_qlora_peak_matches_simulation(
        case: tuple[dict[str, object], int, int, tuple[str, ...], Loss, bool, Checkpointing]
) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    cfg, b, s, targets, loss, packed, ckpt = case
    strategy = _qlora(b, s, targets, loss, packed, ckpt)
    measured = measure_step(StepSetup(config=cfg, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(cfg, name="x"), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    assert any("torchtune's own layout" in n for n in estimate.notes)
    assert estimate.trainable_params == measured.trainable_params
    _assert_peak_and_state(estimate, measured)
    if ckpt is not Checkpointing.NONE:   # the rerun dequantizes down_proj: torchao's 14n
        assert estimate.peak_phase == "backward-recompute-dequant"


def test_torchtune_qlora_simulation_holds_nf4_weights() -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    job = _qlora(1, 128, ALL, CHUNKED, False, Checkpointing.NONE)
    measured = measure_step(StepSetup(config=_NF4, strategy=job, optimizer_impl="fused"))
    est = estimate_memory(parse_model_config(_NF4, name="x"), job)
    weights = sum(est.breakdown.value(k) for k in (
        "weights/quantized", "weights/quant_constants", "weights/unquantized"))
    held = measured.max_by_category["parameters"] - 2 * est.trainable_params   # bf16 A/B
    assert abs(held - weights) / weights <= 0.01, f"simulated {held} vs estimated {weights}"
    # the block linears in 4-bit blocks (about 4.1 bits a weight), not bf16
    blocks = held - est.breakdown.value("weights/unquantized")
    assert 0.25 * _NF4_BF16_BYTES < blocks < 0.27 * _NF4_BF16_BYTES


def test_nf4_dequantization_transient_is_torchaos_to_the_byte() -> None:
    """One eager ``weight.to(bf16)`` of a torchao NF4 weight under the tracker: its peak above
    the weight itself is ``nf4_dequant_bytes`` (14n + n/32)."""
    import torch
    from torchao.dtypes.nf4tensor import to_nf4

    from tuneplan.adapters.probe.tracker import StorageTracker
    from tuneplan.core.memory.torchtune import nf4_dequant_bytes

    weight = to_nf4(torch.randn(512, 256, dtype=torch.bfloat16))
    tracker = StorageTracker()
    tracker.register(weight, "parameters")
    with tracker:
        before = tracker.live_bytes
        tracker.take_window_peak()
        dense = weight.to(torch.bfloat16)
        peak = tracker.take_window_peak() - before
    assert dense.dtype == torch.bfloat16
    assert peak == nf4_dequant_bytes(512 * 256)


def test_torchtune_qlora_needs_torchaos_nf4() -> None:
    """--quant fp4 or --no-double-quant is not torchtune's QLoRA: the hf layout stands in and
    says why; compiled NF4 layers without checkpointing too."""
    from tuneplan.core.job.methods import Quant

    model = parse_model_config(_NF4, name="x")
    for job, words in ((dataclasses.replace(_qlora(1, 64, ALL, CHUNKED, False,
                                                   Checkpointing.NONE), quant=Quant.FP4),
                        "--quant fp4"),
                       (dataclasses.replace(_qlora(1, 64, ALL, CHUNKED, False,
                                                   Checkpointing.NONE), double_quant=False),
                        "--no-double-quant")):
        est = estimate_memory(model, job)
        assert any(words in n and "stands in" in n for n in est.notes)


@pytest.mark.parametrize("case", [QLORA[2], QLORA[4]], ids=[_qlora_id(QLORA[2]),
                                                           _qlora_id(QLORA[4])])
def test_torchtune_compiled_qlora_state_matches_simulation(
        case: tuple[dict[str, object], int, int, tuple[str, ...], Loss, bool, Checkpointing]
) -> None:
    """--compile with QLoRA under checkpointing (the README's QLoRA row): the state held as
    backward begins within 3 % of the simulation; inductor fuses the dequantization into one
    kernel, so the estimate's peak lies between that state and the simulation's eager bound."""
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    cfg, b, s, targets, loss, packed, ckpt = case
    strategy = dataclasses.replace(_qlora(b, s, targets, loss, packed, ckpt), compile=True)
    measured = measure_step(StepSetup(config=cfg, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(cfg, name="x"), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    _assert_state_at_backward_start(estimate, measured)
    assert estimate.phases["forward-end"] <= _tensors(estimate) <= measured.peak_bytes * 1.03
