"""Throughput accuracy on the calibration cases that publish tokens/s.

Runs ``estimate_throughput`` on every case of ``benchmarks/calibration/cases.jsonl`` with an
``expected_tokens_per_s`` and prints case, expected, predicted, error %, then the median
absolute error and the share within +-15 % (headline: cases the CLI can express).

    .venv/bin/python benchmarks/throughput_accuracy.py [--cases PATH] [--all]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.throughput import (
    ModelShape,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
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
from tuneplan.core.models import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind
from tuneplan.errors import TuneplanError, UnsupportedError

DEFAULT_CASES = Path(__file__).resolve().parent / "calibration" / "cases.jsonl"
_ATTENTION_LINEARS = ("c_attn", "query", "key", "value")


def _block(name: str, layers: int, linears: list[tuple[str, int, int, bool]],
           hidden: int, vocab: int, embedding: int, heads: int, *, model_type: str,
           tied: bool, causal: bool = True) -> ModelShape:
    """One kind of block; ``embedding`` and the untied head hold every parameter outside the
    blocks' linears (norms are not counted: the figures below reproduce published totals)."""
    block = LayerSpec(
        kind="decoder" if causal else "encoder", count=layers, norm_params=0,
        linears=tuple(Linear(name=n, in_features=i, out_features=o, bias=bias,
                             role=LinearRole.ATTENTION if n.rsplit(".", 1)[-1]
                             in _ATTENTION_LINEARS else LinearRole.MLP)
                      for n, i, o, bias in linears))
    spec = ModelSpec(
        name=name, model_type=model_type, hidden_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        intermediate_size=max(o for _, _, o, _ in linears), vocab_size=vocab,
        max_position_embeddings=None, tie_word_embeddings=tied, norm_kind=NormKind.LAYERNORM,
        mlp_kind=MlpKind.PLAIN, hidden_act="gelu", layers=(block,),
        embedding_params=embedding, final_norm_params=0)
    return model_shape_from_spec(spec)


def _qwen1(name: str, layers: int, hidden: int, mlp: int, vocab: int) -> ModelShape:
    # Qwen-1 config.json (QWenLMHeadModel): c_attn (h -> 3h, bias), attn c_proj (h -> h),
    # w1/w2 (h -> intermediate_size/2), mlp c_proj (intermediate_size/2 -> h); untied head.
    linears = [("attn.c_attn", hidden, 3 * hidden, True), ("attn.c_proj", hidden, hidden, False),
               ("mlp.w1", hidden, mlp, False), ("mlp.w2", hidden, mlp, False),
               ("mlp.c_proj", mlp, hidden, False)]
    return _block(name, layers, linears, hidden, vocab, vocab * hidden, hidden // 128,
                  model_type="qwen", tied=False)


# Models the calibration uses that tuneplan does not bundle: dimensions from their config.json
# (Qwen/Qwen-*: published totals 1.84B, 7.72B, 14.17B, 72.3B are reproduced within 0.1 %).
LOCAL_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen-1_8B": _qwen1("Qwen/Qwen-1_8B", 24, 2048, 5504, 151_936),
    "Qwen/Qwen-7B": _qwen1("Qwen/Qwen-7B", 32, 4096, 11_008, 151_936),
    "Qwen/Qwen-14B": _qwen1("Qwen/Qwen-14B", 40, 5120, 13_696, 152_064),
    "Qwen/Qwen-72B": _qwen1("Qwen/Qwen-72B", 80, 8192, 24_576, 152_064),
    "google-bert/bert-large-uncased": _block(
        "google-bert/bert-large-uncased", 24,
        [("query", 1024, 1024, False), ("key", 1024, 1024, False),
         ("value", 1024, 1024, False), ("dense", 1024, 1024, False),
         ("intermediate", 1024, 4096, False), ("output", 4096, 1024, False)],
        1024, 30_522, 30_522 * 1024 + 512 * 1024, 16, model_type="bert", tied=True,
        causal=False),
}


def model_shape(case: dict[str, Any]) -> ModelShape:
    name = case["model"]
    if name in LOCAL_SHAPES:
        return LOCAL_SHAPES[name]
    from tuneplan.adapters.hub import resolve_model

    return model_shape_from_spec(resolve_model(case.get("model_fallback") or name))


def case_strategy(case: dict[str, Any]) -> tuple[Strategy, int | None]:
    """(Strategy, avg_tokens) of the case's CLI flags; settings without a flag read from the
    case. Raises UnsupportedError for a value tuneplan has no word for."""
    args = case["args"]
    settings = " ".join(case.get("settings_not_in_cli") or [])
    targets = str(args.get("lora-targets", "all-linear"))
    virtual = re.search(r"(\d+) virtual tokens", settings)
    checkpointing = (Checkpointing.OFFLOAD if args.get("offload-activations") else
                     Checkpointing.FULL if args.get("gradient-checkpointing", True) else
                     Checkpointing.NONE)
    try:
        strategy = Strategy(
            method=Method(args.get("method", "lora")), lora_rank=int(args.get("lora-rank", 16)),
            lora_alpha=int(args.get("lora-alpha", 32)), lora_targets=tuple(targets.split(",")),
            num_virtual_tokens=int(virtual.group(1)) if virtual else 20,
            quant=Quant(args.get("quant", "nf4")),
            double_quant=bool(args.get("double-quant", True)),
            precision=Precision(args.get("precision", "bf16-mixed")),
            optimizer=Optimizer(args.get("optimizer", "adamw")),
            batch_size=int(args.get("batch-size", 1)), grad_accum=int(args.get("grad-accum", 1)),
            seq_len=int(args.get("seq-len", 2048)), packing=bool(args.get("packing", False)),
            checkpointing=checkpointing, attention=Attention(args.get("attention", "sdpa")),
            compile=bool(args.get("compile", False)) or "torch.compile enabled" in settings,
            gpus=int(args.get("gpus", 1)), nodes=int(args.get("nodes", 1)),
            sharding=Sharding(args.get("sharding", "ddp")),
            offload=Offload(args.get("offload", "none")),
            recipe=Recipe(args.get("recipe", "hf")),
            loss=Loss(args["loss"]) if args.get("loss") else None,
            task=Task.SEQ_CLS if "sequence-classification" in settings
            else Task(args.get("task", "causal-lm")))
    except ValueError as exc:
        raise UnsupportedError(f"no tuneplan setting for this case: {exc}") from exc
    avg = args.get("avg-tokens")
    return strategy, int(avg) if avg is not None else None


def evaluate(cases_path: Path, assumptions: ThroughputAssumptions | None = None,
             include_unsupported: bool = False) -> list[dict[str, Any]]:
    """One row per case with a published tokens/s: expected, predicted, error %."""
    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.core.catalog.gpu_names import normalise_gpu_name

    rows: list[dict[str, Any]] = []
    for line in cases_path.read_text("utf-8").splitlines():
        case = json.loads(line)
        expected = case.get("expected_tokens_per_s")
        if expected is None or (not case.get("cli_supported") and not include_unsupported):
            continue
        row: dict[str, Any] = {"case": case["id"], "expected": expected, "predicted": None,
                               "error_pct": None, "supported": case.get("cli_supported")}
        try:
            gpu = load_gpu_spec(normalise_gpu_name(case["args"]["gpu"]))
            strategy, avg_tokens = case_strategy(case)
            result = estimate_throughput(model_shape(case), strategy, gpu,
                                         avg_tokens=avg_tokens, assumptions=assumptions)
            row["predicted"] = result.tokens_per_second
            row["error_pct"] = 100 * (result.tokens_per_second - expected) / expected
        except TuneplanError as exc:
            row["skipped"] = str(exc)
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    if not errors:
        return {"cases": 0, "median_abs_error_pct": float("nan"), "within_15_pct": 0.0}
    return {"cases": len(errors), "median_abs_error_pct": statistics.median(errors),
            "within_15_pct": sum(e <= 15 for e in errors) / len(errors)}


def print_table(rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    out.write(f"{'case':64} {'expected':>10} {'predicted':>10} {'error %':>8}\n")
    for r in rows:
        if r["predicted"] is None:
            out.write(f"{r['case'][:64]:64} {r['expected']:10.1f} {'-':>10} skipped: "
                      f"{r.get('skipped', '')[:60]}\n")
            continue
        out.write(f"{r['case'][:64]:64} {r['expected']:10.1f} {r['predicted']:10.1f} "
                  f"{r['error_pct']:+8.1f}\n")
    s = summary(rows)
    out.write(f"\nthroughput: {s['cases']} cases, "
              f"median |error| {s['median_abs_error_pct']:.1f} %, "
              f"within +-15 %: {100 * s['within_15_pct']:.0f} %\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--all", action="store_true",
                        help="also the cases the CLI cannot express (cli_supported: false)")
    options = parser.parse_args(argv)
    print_table(evaluate(options.cases, include_unsupported=options.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
