"""Run every calibration case through ``tuneplan memory`` and compare with the published peak.

Prints one row per case (case, metric, expected, predicted, error %), then the median absolute
error and the share within ±15 % over the measurement rows that could be estimated, and the
fit/OOM agreement. Reads ``benchmarks/calibration/cases.jsonl`` (vendored from
the project's calibration data on 2026-11-30), or the path given.
Offline: models that are not bundled are reported as unavailable.
Run: ``.venv/bin/python benchmarks/accuracy.py [cases.jsonl] [--all]``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tuneplan.errors import TuneplanError
from tuneplan.service.memory_report import run_memory

DEFAULT = Path(__file__).resolve().parent / "calibration" / "cases.jsonl"
GiB = 2**30

# Qwen-1 (model_type "qwen", remote code) is not bundled. Its blocks have the shapes of a
# qwen2 block with kv_heads = heads (fused c_attn with bias = q/k/v with bias; w1, w2, c_proj =
# gate, up, down), so an equivalent qwen2 config stands in; the LoRA targets c_attn, c_proj,
# w1, w2 cover every block linear. Dimensions from the Qwen-1 config.json files.
# (hidden, layers, heads, per-matrix MLP width = intermediate_size / 2, vocabulary)
_QWEN1 = {"Qwen/Qwen-1_8B": (2048, 24, 16, 5504, 151936),
          "Qwen/Qwen-7B": (4096, 32, 32, 11008, 151936),
          "Qwen/Qwen-14B": (5120, 40, 40, 13696, 152064),
          "Qwen/Qwen-72B": (8192, 80, 64, 24576, 152064)}
_QWEN1_TARGETS = {"c_attn": "q_proj,k_proj,v_proj", "c_proj": "o_proj,down_proj",
                  "w1": "gate_proj", "w2": "up_proj"}


def stand_in(model_id: str) -> Any:
    if model_id not in _QWEN1:
        return None
    from tuneplan.core.models import parse_model_config

    h, layers, heads, inter, vocab = _QWEN1[model_id]
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": h,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": heads, "intermediate_size": inter, "vocab_size": vocab,
              "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "rms_norm_eps": 1e-6, "hidden_act": "silu"}
    return parse_model_config(config, name=f"{model_id} (qwen2-shaped stand-in)")


def map_targets(args: dict[str, Any], model_id: str) -> dict[str, Any]:
    if model_id not in _QWEN1 or "lora-targets" not in args:
        return args
    names = [_QWEN1_TARGETS.get(t, t) for t in str(args["lora-targets"]).split(",")]
    return args | {"lora-targets": ",".join(names)}


def map_unmapped(case: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Settings the case lists as "not in the CLI" that now have a flag: a GPTQ int4 base
    (mapped to ``--quant nf4`` before the estimate knew GPTQ: no fp32 upcast, group-128
    scales) and prompt/prefix tuning's number of virtual tokens (``--num-virtual-tokens``)."""
    outside = " ".join(case.get("settings_not_in_cli", []))
    if "GPTQ" in outside and args.get("quant") == "nf4":
        args = args | {"quant": "gptq-int4", "double-quant": False}
    tokens = re.search(r"(\d+) virtual tokens", outside)
    if tokens and args.get("method") in ("prompt", "prefix") and "num-virtual-tokens" not in args:
        args = args | {"num-virtual-tokens": int(tokens.group(1))}
    return args


def case_request(model: str, args: dict[str, Any]) -> Any:
    """A case's flags as the service's job request (a case describes a whole job, as a job
    file does: ``plan`` is the command that takes every job flag)."""
    from tuneplan.service.jobflags import normalise
    from tuneplan.service.jobs import JobRequest

    return JobRequest(model=model, command="plan",
                      values=normalise(args, origin=f"case {model}"))


def comparable(case: dict[str, Any]) -> bool:
    """A case the estimate should match: not low confidence, no torch.compile or GPTQ base
    (settings without a flag), and a sequence length the data actually reaches."""
    outside = " ".join(case.get("settings_not_in_cli", []))
    return (case["confidence"] != "low" and "compile" not in outside and "GPTQ" not in outside
            and not case.get("seq_len_basis", "").startswith("cap-not"))


def evaluate(case: dict[str, Any]) -> dict[str, Any]:
    row = {"id": case["id"], "metric": case["metric"], "type": case["row_type"],
           "confidence": case["confidence"], "expected": case.get("expected_bytes"),
           "comparable": comparable(case)}
    model = case.get("model_fallback") or case["model"]
    try:
        request = case_request(model, map_unmapped(case, map_targets(case["args"], model)))
        est, _, gpu = run_memory(request, model=stand_in(model))
    except TuneplanError as exc:
        return row | {"status": f"refused: {str(exc)[:70]}"}
    predicted = {"allocated_peak_bytes": est.allocated_peak_bytes,
                 "reserved_peak_bytes": est.reserved_peak_bytes,
                 "device_total_bytes": est.device_total_bytes}[case["metric"]]
    row |= {"predicted": predicted, "status": "ok"}
    if row["expected"]:
        row["error_pct"] = (predicted - row["expected"]) / row["expected"] * 100
    elif case.get("fits") is not None:
        capacity = case.get("gpu_memory_bytes") or (gpu.usable_memory_bytes if gpu else None)
        if capacity:
            row["fit_ok"] = (predicted <= capacity) == bool(case["fits"])
            row["capacity"] = capacity
    return row


def main(argv: list[str]) -> None:
    path = Path(next((a for a in argv if not a.startswith("--")), DEFAULT))
    include_unsupported = "--all" in argv
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [evaluate(c) for c in cases if include_unsupported or c.get("cli_supported", True)]
    print(f"{'case':52} {'metric':10} {'conf':6} {'expected':>10} {'predicted':>10} {'error':>8}")
    for r in rows:
        exp = f"{r['expected'] / GiB:.2f}G" if r.get("expected") else "-"
        pred = f"{r['predicted'] / GiB:.2f}G" if r.get("predicted") else "-"
        if "error_pct" in r:
            err = f"{r['error_pct']:+.1f}%"
        elif "fit_ok" in r:
            err = "fit ok" if r["fit_ok"] else "fit WRONG"
        else:
            err = r["status"]
        print(f"{r['id'][:52]:52} {r['metric'][:10]:10} {r['confidence'][:6]:6} {exp:>10} "
              f"{pred:>10} {err}")
    errors = [abs(r["error_pct"]) for r in rows if "error_pct" in r]
    fits = [r["fit_ok"] for r in rows if "fit_ok" in r]
    skipped = sum(1 for r in rows if r["status"] != "ok")
    print(f"\nmeasurement cases estimated: {len(errors)}; not estimated (model not bundled or "
          f"refused): {skipped}")
    if errors:
        within = sum(e <= 15 for e in errors) / len(errors)
        print(f"median absolute error: {statistics.median(errors):.1f}%   "
              f"within ±15%: {within:.0%}   mean absolute error: {statistics.mean(errors):.1f}%")
    fair = [abs(r["error_pct"]) for r in rows if "error_pct" in r and r["comparable"]]
    if fair:
        print(f"comparable subset ({len(fair)}: high/medium confidence, no compile/GPTQ, "
              f"sequence reached): median {statistics.median(fair):.1f}%   within ±15%: "
              f"{sum(e <= 15 for e in fair) / len(fair):.0%}")
    if fits:
        print(f"fit/OOM rows classified correctly: {sum(fits)}/{len(fits)}")
    # Throughput: the cases that publish tokens/s, from throughput_accuracy.py.
    sys.path.insert(0, str(Path(__file__).parent))
    from throughput_accuracy import evaluate as evaluate_throughput
    from throughput_accuracy import print_table as print_throughput_table

    print()
    print_throughput_table(evaluate_throughput(path, include_unsupported=include_unsupported))


if __name__ == "__main__":
    main(sys.argv[1:])
