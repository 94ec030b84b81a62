#!/usr/bin/env python3
"""Spot-safe fine-tuning entry point written by ``tuneplan launch`` (settings: train_config.json).

TRL's SFTTrainer (SFTConfig: packing, max_length, loss) + PEFT + bitsandbytes as the plan
says. Checkpoints every ``save_steps`` to ``output_dir``; a checkpoint counts only when its
marker (written last, listing every file with its size and SHA-256) matches; resume is from
the newest complete one whose contents still hash as saved (weights or adapter, optimizer,
scheduler, RNG, data position). SIGTERM saves at once, leaves the flag file
``preemptible.sh`` turns into exit code 143, and exits 143. Text data is tokenised (and
packed) once into a memory-mapped Arrow file that SFTTrainer reads as it is (memory does not
grow with the data).
Run: ``bash preemptible.sh accelerate launch train.py --config train_config.json`` (RUN.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_PREEMPTED = 143  # 128 + SIGTERM: "stopped by a signal, state saved, resume me"
PREFIX = "checkpoint-"
#: Resume drills: ``N`` sends this process SIGTERM inside step N (between forward/backward
#: passes), ``N:update`` while step N updates the weights (the save then waits for its end).
FAULT_ENV = "TUNEPLAN_FAULT_SIGTERM_AT_STEP"
#: Drills from outside: ``N`` holds process 0 at the end of step N, after writing
#: ``HOLDING`` into the output folder, until a SIGTERM arrives (sent to the launcher, say).
HOLD_ENV = "TUNEPLAN_FAULT_HOLD_AT_STEP"
#: Set by preemptible.sh: the file whose presence says "saved on SIGTERM, restart me" (the
#: launchers turn every worker exit code into 1).
PREEMPTED_FILE_ENV = "TUNEPLAN_PREEMPTED_FILE"
HASH_CHUNK_BYTES = 1 << 24


def fault_due(step: int, phase: str) -> bool:
    """Whether the resume drill asks for a SIGTERM in ``step`` (1-based) during ``phase``."""
    want = os.environ.get(FAULT_ENV, "")
    number, _, where = want.partition(":")
    return number.isdigit() and int(number) == step and (where or "compute") == phase


OPTIMIZERS = {"adamw": "adamw_torch", "adamw8bit": "adamw_bnb_8bit",
              "paged-adamw8bit": "paged_adamw_8bit", "paged-adamw32bit": "paged_adamw_32bit",
              "adafactor": "adafactor", "sgd": "sgd", "lion": "lion_32bit",
              "galore-adamw": "galore_adamw", "galore-adamw8bit": "galore_adamw_8bit",
              "galore-adafactor": "galore_adafactor"}
ATTENTION = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}
ZERO_OR_FSDP = {"zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hybrid"}
FSDP_SHARDINGS = {"fsdp", "fsdp-grad-op", "hybrid"}


def log(message: str) -> None:
    sys.stderr.write(f"[train.py] {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- checkpoints (no torch needed)
def checkpoint_step(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
        return None
    return int(name[len(PREFIX):])


def _recorded(entry: Any) -> tuple[int, str | None]:
    """(bytes, sha256 or None) of a marker's file entry; a bare integer is a size alone."""
    if isinstance(entry, dict):
        return int(entry["bytes"]), entry.get("sha256")
    return int(entry), None


def read_complete_marker(ckpt: Path, marker_name: str) -> dict[str, Any] | None:
    """The marker's content when the checkpoint is complete: the marker parses and every file
    it lists exists with the size it lists (contents: ``changed_files``). Else None."""
    try:
        info = json.loads((ckpt / marker_name).read_text(encoding="utf-8"))
        files = info["files"]
        sizes = {rel: _recorded(entry)[0] for rel, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not sizes:
        return None
    for rel, size in sizes.items():
        target = ckpt / rel
        if not target.is_file() or target.stat().st_size != size:
            return None
    return dict(info)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_all(paths: list[Path]) -> list[str]:
    """SHA-256 of each file, several at once (hashlib releases the GIL on large buffers)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        return list(pool.map(file_sha256, paths))


def changed_files(ckpt: Path, info: dict[str, Any]) -> list[str]:
    """Files of a complete checkpoint whose SHA-256 differs from the one recorded at save
    time (a file damaged or overwritten after the save, even at the same size)."""
    recorded = {rel: _recorded(entry)[1] for rel, entry in info["files"].items()}
    hashed = sorted(rel for rel, digest in recorded.items() if digest)
    now = _hash_all([ckpt / rel for rel in hashed])
    return [rel for rel, digest in zip(hashed, now, strict=True) if digest != recorded[rel]]


def newest_complete(output_dir: Path, marker_name: str) -> tuple[Path, dict[str, Any]] | None:
    """The complete checkpoint with the highest step whose files still hash as saved,
    ignoring unfinished ones and refusing damaged ones. Raises SystemExit when damaged ones
    leave none (starting over would silently throw their progress away)."""
    if not output_dir.is_dir():
        return None
    found = [(checkpoint_step(p), p) for p in output_dir.iterdir() if p.is_dir()]
    refused: list[str] = []
    for step, path in sorted(((s, p) for s, p in found if s is not None), reverse=True):
        info = read_complete_marker(path, marker_name)
        if info is None:
            log(f"ignoring {path.name}: no complete marker (step {step} was not fully saved)")
            continue
        bad = changed_files(path, info)
        if not bad:
            return path, info
        log(f"REFUSING {path.name}: {', '.join(bad)} no longer match the SHA-256 recorded "
            "when it was saved (damaged or overwritten since); trying an older checkpoint")
        refused.append(path.name)
    if refused:
        raise SystemExit(f"[train.py] no usable checkpoint: {', '.join(refused)} failed the "
                         "content check and no older complete one is left. Restore them, or "
                         "move them away to start over.")
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(ckpt: Path, marker_name: str, info: dict[str, Any]) -> None:
    """Fsync every file, then write the marker (via a temporary name) listing each with its
    size and SHA-256: last."""
    paths = [path for path in sorted(ckpt.rglob("*")) if path.is_file()
             and path.name != marker_name and not path.name.endswith(".tmp")]
    for path in paths:
        _fsync(path)
    files = {str(path.relative_to(ckpt)): {"bytes": path.stat().st_size, "sha256": digest}
             for path, digest in zip(paths, _hash_all(paths), strict=True)}
    tmp = ckpt / (marker_name + ".tmp")
    tmp.write_text(json.dumps({**info, "files": files}, indent=1), encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, ckpt / marker_name)
    _fsync(ckpt)


def warn_world_size(info: dict[str, Any], world_size: int, sharding: str) -> None:
    saved = info.get("world_size")
    if saved is None or saved == world_size:
        return
    if sharding in ZERO_OR_FSDP:
        log(f"WARNING: checkpoint was saved by {saved} processes, now {world_size}, under "
            f"{sharding}: its optimizer state is partitioned per rank. Convert it first "
            "(DeepSpeed: python -m deepspeed.checkpoint.ds_to_universal, then "
            "load_universal) or run with the same number of GPUs.")
    else:
        log(f"WARNING: world size changed {saved} -> {world_size}: the global batch changes "
            "and the data position is counted in the old steps.")


def flag_preempted(step: int) -> None:
    """Leave the file preemptible.sh reads: this run stopped on SIGTERM with its state saved."""
    path = os.environ.get(PREEMPTED_FILE_ENV)
    if path:
        Path(path).write_text(json.dumps({"step": step, "pid": os.getpid()}), encoding="utf-8")


# ---------------------------------------------------------------- settings
def load_config(path: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    base = os.environ.get("TUNEPLAN_CHECKPOINT_DIR")
    if base:  # the cloud's durable mount wins over the path in the file
        cfg["output_dir"] = str(Path(base) / str(cfg.get("plan_id", "run")))
    return cfg


#: How the bundle's data is prepared, stated in SFTConfig (trl 1.16 ``trainer/sft_config.py``):
#: texts are tokenised once here (``tokenised_rows``), packed the way TRL's ``wrapped``
#: strategy packs (texts joined with EOS, cut into max_length rows, the last partial row
#: dropped) or cut at max_length (TRL's ``keep_start``), so SFTTrainer skips its own
#: preparation (``skip_prepare_dataset``), which would redo it with ``Dataset.map`` in every
#: process. The plan has no prompt/completion split (plain ``text`` rows): every token is a
#: label, so ``completion_only_loss`` is off.
PACKING_STRATEGY = "wrapped"


def training_arguments(cfg: dict[str, Any], deepspeed: str | None = None) -> Any:
    """trl.SFTConfig (a transformers.TrainingArguments) from the plan's settings, validated by
    its constructor. Every TRL default that differs from the plan is set explicitly
    (SFTConfig turns activation checkpointing and bf16 on, logs every 10 steps)."""
    import torch
    from trl.trainer.sft_config import SFTConfig

    precision = cfg["precision"]
    recompute = bool(cfg["gradient_checkpointing"])
    # transformers 5 renamed gradient_checkpointing (the old name mirrors the new one).
    names: dict[str, Any] = {"gradient_checkpointing": recompute}
    if "activation_checkpointing" in SFTConfig.__dataclass_fields__:
        names["activation_checkpointing"] = recompute
    # A plan made with --loss chunked fits only if the logits are never held whole:
    # transformers' use_liger_kernel swaps in Liger's fused linear cross-entropy, which
    # computes them chunk by chunk (it needs Triton on CUDA or ROCm).
    fused_loss = cfg.get("loss") == "chunked"
    if fused_loss and not torch.cuda.is_available():
        raise SystemExit("train.py: the plan uses a chunked (fused) loss, which runs on a GPU "
                         "only (Liger kernels); on the CPU re-plan with --loss standard")
    # FSDP: reduce-scatter after every micro-batch instead of accelerate's no_sync, which
    # keeps every gradient unsharded on every rank until the last one (transformers 5
    # Trainer; what the plan's memory assumes: MemoryAssumptions.fsdp_sync_each_batch).
    if cfg.get("sharding") in FSDP_SHARDINGS and cfg["grad_accum"] > 1:
        names["accelerator_config"] = {"gradient_accumulation_kwargs": {
            "sync_each_batch": True}}
    # GaLore: the projected linears' patterns and rank/update_proj_gap/scale, as planned
    # (transformers reads optim_args for galore_* optimizers; no other optimizer gets them).
    if cfg.get("galore"):
        names["optim_target_modules"] = cfg["galore"]["optim_target_modules"]
        names["optim_args"] = cfg["galore"]["optim_args"]
    config: Any = SFTConfig  # called through Any: its many fields do not type **names
    return config(use_liger_kernel=fused_loss,
        use_cpu=not torch.cuda.is_available(), **names,
        output_dir=cfg["output_dir"], per_device_train_batch_size=cfg["batch_size"],
        gradient_accumulation_steps=cfg["grad_accum"], num_train_epochs=cfg["epochs"],
        max_steps=cfg.get("max_steps", -1), learning_rate=cfg["learning_rate"],
        lr_scheduler_type=cfg["lr_scheduler"], warmup_steps=cfg.get("warmup_steps", 0),
        optim=cfg.get("optim") or OPTIMIZERS[cfg["optimizer"]], max_grad_norm=1.0,
        bf16=precision in ("bf16-mixed", "bf16"), fp16=precision == "fp16-mixed",
        save_strategy="steps", save_steps=cfg["save_steps"],
        save_total_limit=max(2, cfg["save_total_limit"]), logging_steps=1,
        seed=cfg["seed"], data_seed=cfg["seed"], report_to="none",
        remove_unused_columns=False, dataloader_num_workers=0,
        deepspeed=deepspeed or cfg.get("deepspeed"),
        # SFT: the data as tokenised and packed here (PACKING_STRATEGY).
        max_length=cfg["seq_len"], packing=bool(cfg["packing"]),
        packing_strategy=PACKING_STRATEGY, padding_free=False, truncation_mode="keep_start",
        completion_only_loss=False, assistant_only_loss=False, shuffle_dataset=False,
        dataset_text_field=(cfg.get("dataset") or {}).get("text_field", "text"),
        dataset_kwargs={"skip_prepare_dataset": True},
    )


# ---------------------------------------------------------------- model and data
def _quantization(cfg: dict[str, Any], dtype: Any) -> Any:
    import transformers

    bnb: Any = transformers.BitsAndBytesConfig  # untyped library: called through Any
    if cfg["method"] == "lora8bit" or cfg["quant"] == "int8":
        return bnb(load_in_8bit=True)
    return bnb(load_in_4bit=True, bnb_4bit_quant_type=cfg["quant"],
               bnb_4bit_use_double_quant=cfg["double_quant"],
               bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)


def build_model(cfg: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    method, precision = cfg["method"], cfg["precision"]
    half = torch.float16 if precision == "fp16-mixed" else torch.bfloat16
    # Full fine-tuning under mixed precision keeps fp32 weights (the optimizer's masters);
    # adapters train in fp32 over a half-precision base; pure bf16 is bf16 throughout.
    # freeze loads in half precision and apply_freeze upcasts only what trains.
    dtype = torch.float32 if precision == "fp32" or (
        method in ("full", "lisa") and precision.endswith("mixed")) else half
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": ATTENTION[cfg["attention"]]}
    if method in ("qlora", "lora8bit"):
        kwargs["quantization_config"] = _quantization(cfg, half)
    if cfg.get("model_config"):
        torch.manual_seed(cfg["seed"])  # a random model from a config dict (drills, tests)
        config = AutoConfig.for_model(**cfg["model_config"])
        auto: Any = AutoModelForCausalLM
        model = auto.from_config(config, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg["model_name_or_path"], **kwargs)
    return add_adapters(model, cfg)


def add_adapters(model: Any, cfg: dict[str, Any]) -> Any:
    method = cfg["method"]
    if method in ("full", "lisa"):  # lisa: make_lisa_switch freezes blocks during training
        return model
    if method == "freeze":
        return apply_freeze(model, cfg["freeze"], upcast=cfg["precision"].endswith("mixed"),
                            planned=cfg.get("trainable_params"))
    if cfg.get("peft"):
        return add_tuner(model, cfg["peft"])
    if method not in ("lora", "dora", "qlora", "lora8bit"):
        raise SystemExit(f"method {method!r}: this entry point trains full, freeze, lisa, "
                         "lora, dora, qlora and lora8bit; add the PEFT config for it in "
                         "add_adapters()")
    import peft
    from peft import LoraConfig, get_peft_model

    if method in ("qlora", "lora8bit"):
        prepare: Any = peft.prepare_model_for_kbit_training
        model = prepare(
            model, use_gradient_checkpointing=cfg["gradient_checkpointing"])
    targets = peft_targets(model, cfg["lora_targets"])
    lora = LoraConfig(
        r=cfg["lora_rank"], lora_alpha=cfg["lora_alpha"], lora_dropout=cfg["lora_dropout"],
        target_modules="all-linear" if "all-linear" in targets else targets,
        modules_to_save=cfg["trainable_modules"] or None, use_dora=method == "dora",
        task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def apply_freeze(model: Any, freeze: dict[str, Any], *, upcast: bool,
                 planned: int | None = None) -> Any:
    """``--method freeze`` as the plan counted it (``freeze`` from train_config.json): every
    parameter frozen, then the last ``last_blocks`` blocks of the model's block list (its
    ``ModuleList`` of ``num_hidden_layers`` blocks), the final norm (the child of the block
    list's parent named in ``final_norm``) and the modules named in ``modules`` trained; under
    mixed precision those are upcast to fp32 (the frozen rest stays in half precision). A
    count other than the plan's ``planned`` is logged: the plan's memory did not count it."""
    import torch

    layers = int(model.config.get_text_config().num_hidden_layers)
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    if len(lists) != 1:
        raise SystemExit(f"[train.py] freeze: {len(lists)} block lists of {layers} blocks in "
                         f"{type(model).__name__}, expected one")
    path, blocks = lists[0]
    parent = model.get_submodule(path.rpartition(".")[0])
    norms = [getattr(parent, n) for n in freeze["final_norm"]
             if isinstance(getattr(parent, n, None), torch.nn.Module)]
    if len(norms) != 1:
        raise SystemExit("[train.py] freeze: no single final norm ("
                         f"{', '.join(freeze['final_norm'])}) beside {path}")
    named = [(name.rsplit(".", 1)[-1], m) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in freeze["modules"]]
    missing = set(freeze["modules"]) - {short for short, _ in named}
    if missing:
        raise SystemExit(f"[train.py] freeze: no module named {', '.join(sorted(missing))}")
    model.requires_grad_(False)
    count = int(freeze["last_blocks"])
    for module in [*list(blocks)[len(blocks) - count:], *norms, *(m for _, m in named)]:
        module.requires_grad_(True)
    trains = [p for p in model.parameters() if p.requires_grad]  # a tied weight once
    if upcast:
        for param in trains:
            param.data = param.data.float()
    total = sum(p.numel() for p in trains)
    log(f"freeze: {total} parameters train (the last {count} blocks of {path}, the final "
        f"norm, {', '.join(freeze['modules']) or 'no other module'})")
    if planned is not None and total != planned:
        log(f"WARNING: the plan counted {planned} trainable parameters, this model has {total}")
    return model


def add_tuner(model: Any, spec: dict[str, Any]) -> Any:
    """One of PEFT's other tuners, as the plan estimated it: ``peft.<config_class>(**kwargs)``
    (targets mapped as for LoRA; adaption prompt on every block), then the parameters named
    in ``freeze`` frozen (LoRA-FA trains lora_B only)."""
    import peft

    kwargs = dict(spec["kwargs"])
    if isinstance(kwargs.get("target_modules"), list):
        kwargs["target_modules"] = peft_targets(model, kwargs["target_modules"])
    if "adapter_layers" in kwargs and kwargs["adapter_layers"] is None:
        kwargs["adapter_layers"] = model.config.num_hidden_layers
    wrapped = peft.get_peft_model(model, getattr(peft, spec["config_class"])(**kwargs))
    for name, param in wrapped.named_parameters():
        if any(f".{part}." in name for part in spec.get("freeze", [])):
            param.requires_grad_(False)
    return wrapped


SPLIT_QKV_NAMES = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value"})


def peft_targets(model: Any, targets: list[str]) -> list[str]:
    """The planner's target rule: on a model whose attention is one fused ``query_key_value``
    (GPT-NeoX, BLOOM, Falcon), split q/k/v names that name no module wrap the fused linear, as
    PEFT's own default targets do for these types (by suffix, ``q_proj`` finds nothing there)."""
    if "all-linear" in targets or not hasattr(model, "named_modules"):
        return targets
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if "query_key_value" not in names:
        return targets
    out: list[str] = []
    for t in targets:
        mapped = "query_key_value" if t in SPLIT_QKV_NAMES and t not in names else t
        if mapped not in out:
            out.append(mapped)
    return out


TOKENISE_BATCH_LINES = 1024
ARROW_FILE = "rows.arrow"


def _tokenised_key(cfg: dict[str, Any], data_path: Path) -> str:
    """What the tokenised files depend on: the data file (path, size, mtime), the tokenizer,
    seq_len and packing."""
    data, stat = cfg["dataset"], data_path.stat()
    parts = [str(data_path.resolve()), stat.st_size, stat.st_mtime_ns,
             cfg["model_name_or_path"], data.get("text_field", "text"), cfg["seq_len"],
             bool(cfg["packing"]), ARROW_FILE]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _row_batch(rows: list[Any], first_id: int, id_type: Any) -> Any:
    """A pyarrow RecordBatch of token-id rows (``input_ids``) and their indices
    (``sample_id``: the data position is auditable)."""
    import numpy as np
    import pyarrow as pa

    offsets = np.cumsum([0, *map(len, rows)], dtype=np.int32)
    values = np.concatenate(rows).astype(id_type) if rows else np.zeros(0, dtype=id_type)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    sample = pa.array(np.arange(first_id, first_id + len(rows), dtype=np.int64))
    return pa.RecordBatch.from_arrays([ids, sample], names=["input_ids", "sample_id"])


def _write_tokenised(cfg: dict[str, Any], tok: Any, data_path: Path, folder: Path) -> None:
    """Stream the JSONL file through the tokenizer, TOKENISE_BATCH_LINES lines at a time, into
    one Arrow stream file (the format ``datasets.Dataset.from_file`` memory-maps); ``meta.json``
    last. Packing joins texts with EOS and cuts seq_len rows (a last partial row is dropped:
    TRL's ``wrapped`` packing), else each text is cut at seq_len (TRL's ``keep_start``)."""
    import numpy as np
    import pyarrow as pa

    data, seq_len, packing = cfg["dataset"], int(cfg["seq_len"]), bool(cfg["packing"])
    field = data.get("text_field", "text")
    id_type = np.uint16 if len(tok) <= np.iinfo(np.uint16).max else np.uint32
    schema = pa.schema([("input_ids", pa.list_(pa.from_numpy_dtype(id_type))),
                        ("sample_id", pa.int64())])
    folder.mkdir(parents=True)
    rows_written = tokens_written = 0
    carry = np.zeros(0, dtype=np.int64)  # packing: tokens not yet in a full row

    with pa.OSFile(str(folder / ARROW_FILE), "wb") as sink, \
            pa.ipc.new_stream(sink, schema) as writer:
        def flush(texts: list[str]) -> None:
            nonlocal rows_written, tokens_written, carry
            if not texts:
                return
            encoded = [np.asarray([*ids, tok.eos_token_id], dtype=np.int64)
                       for ids in tok(texts)["input_ids"]]
            if packing:
                flat = np.concatenate([carry, *encoded])
                full = len(flat) - len(flat) % seq_len
                rows = list(flat[:full].reshape(-1, seq_len))
                carry = flat[full:]
            else:
                rows = [row[:seq_len] for row in encoded]
            if rows:
                writer.write_batch(_row_batch(rows, rows_written, id_type))
                rows_written += len(rows)
                tokens_written += sum(map(len, rows))

        batch: list[str] = []
        with data_path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    batch.append(json.loads(line)[field])
                if len(batch) >= TOKENISE_BATCH_LINES:
                    flush(batch)
                    batch = []
        flush(batch)
    (folder / "meta.json").write_text(json.dumps(
        {"rows": rows_written, "tokens": tokens_written, "dtype": np.dtype(id_type).name}),
        encoding="utf-8")


def tokenised_rows(cfg: dict[str, Any], tok: Any) -> Any:
    """The JSONL data as a ``datasets.Dataset`` memory-mapped from an Arrow file, tokenised
    once into the cache folder (``dataset.cache_dir``, node-local) and reused while the data
    file, tokenizer, seq_len and packing stay the same. Written under a private name, then
    renamed: processes racing to build it agree on one copy. Only the rows a batch asks for
    become Python lists."""
    from datasets import Dataset

    data = cfg["dataset"]
    data_path = Path(data["path"])
    folder = Path(data.get("cache_dir") or "data/tokenised") / _tokenised_key(cfg, data_path)
    if not (folder / "meta.json").is_file():
        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        _write_tokenised(cfg, tok, data_path, tmp)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished first: use its copy
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if not meta["rows"]:
        raise SystemExit(f"[train.py] {data_path} holds no full row of {cfg['seq_len']} "
                         f"tokens ({data.get('text_field', 'text')})")
    return Dataset.from_file(str(folder / ARROW_FILE), in_memory=False)


def stand_in_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``vocab_size`` ids for a random model built from a config
    (drills, tests): SFTTrainer needs a processing class, and there is no hub to load one."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    fast: Any = PreTrainedTokenizerFast  # untyped constructor
    return fast(tokenizer_object=core, unk_token="t0", eos_token="t0",
                                   pad_token="t0")


def build_tokenizer(cfg: dict[str, Any]) -> Any:
    if cfg.get("model_config") and cfg["dataset"]["kind"] == "synthetic":
        return stand_in_tokenizer(int(cfg["model_config"]["vocab_size"]))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg["model_name_or_path"])


def build_dataset(cfg: dict[str, Any], tok: Any = None) -> tuple[Any, int]:
    """(a ``datasets.Dataset`` of ``input_ids`` and ``sample_id`` rows, pad id). ``synthetic``:
    seeded random ids (own generator: the global RNG is not touched); ``jsonl``: a text field
    tokenised into a memory-mapped Arrow file (``tokenised_rows``)."""
    import torch
    from datasets import Dataset

    data, seq_len = cfg["dataset"], cfg["seq_len"]
    if data["kind"] == "synthetic":
        gen = torch.Generator().manual_seed(int(data.get("seed", 0)))
        rows = int(data["rows"])
        ids = torch.randint(0, int(data["vocab_size"]), (rows, seq_len), generator=gen)
        return Dataset.from_dict({"input_ids": ids.tolist(), "sample_id": list(range(rows))}), 0
    tok = tok if tok is not None else build_tokenizer(cfg)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return tokenised_rows(cfg, tok), pad


def make_collator(pad_id: int) -> Any:
    """Pads a batch to its longest row; labels are the ids (every token is trained on, none of
    the padding: the plan has no completion-only loss), with the rows' sample ids."""
    import torch

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, :len(item["input_ids"])] = torch.as_tensor(item["input_ids"],
                                                                dtype=torch.long)
            mask[row, :len(item["input_ids"])] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels,
                "sample_ids": torch.tensor([item["sample_id"] for item in items])}

    return collate


# ---------------------------------------------------------------- the spot guard
def rng_snapshot() -> dict[str, Any]:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def rng_restore(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.random.set_rng_state_all(state["cuda"])


def make_guard(cfg: dict[str, Any], progress_path: Path) -> Any:
    """A TrainerCallback that marks checkpoints complete, logs each finished step (lr, sample
    ids) and turns SIGTERM into a save: at once when one process is inside a step's forward
    or backward (that step is redone on resume), else at the end of the current step, with
    every rank agreeing (a save is a collective under ZeRO/FSDP)."""
    import torch
    from transformers import TrainerCallback

    class SpotGuard(TrainerCallback):
        def __init__(self) -> None:
            self.trainer: Any = None
            self.phase = "setup"          # setup -> compute -> update -> boundary -> ...
            self.pending = False           # SIGTERM seen, save at the next safe point
            self.preempted = False
            self.rng: dict[str, Any] | None = None
            self.lr = 0.0
            self.sample_ids: list[int] = []

        # -- signal side
        def on_sigterm(self, signum: int, frame: Any) -> None:
            if self.phase == "setup":
                log("SIGTERM before training started: nothing to save")
                flag_preempted(0)
                raise SystemExit(EXIT_PREEMPTED)
            self.pending = True
            if self.phase == "compute" and self.trainer.args.world_size == 1:
                self.save_now_and_exit()

        def save_now_and_exit(self) -> None:
            """Save the state of the last finished step, then leave (exit code 143)."""
            t = self.trainer
            step = t.state.global_step
            ckpt = Path(t.args.output_dir) / f"{PREFIX}{step}"
            if step > 0 and read_complete_marker(ckpt, cfg["marker_name"]) is None:
                if self.rng is not None:
                    rng_restore(self.rng)  # RNG as the unfinished step found it
                t._save_checkpoint(t.model, trial=None)
                self.mark(ckpt, "sigterm")
            log(f"SIGTERM: state of step {step} is in {ckpt.name}; exiting {EXIT_PREEMPTED}")
            self.preempted = True
            flag_preempted(step)
            raise SystemExit(EXIT_PREEMPTED)

        def mark(self, ckpt: Path, reason: str) -> None:
            t = self.trainer
            t.accelerator.wait_for_everyone()
            if t.args.should_save:
                write_marker(ckpt, cfg["marker_name"], {
                    "step": t.state.global_step, "world_size": t.args.world_size,
                    "sharding": cfg["sharding"], "plan_id": cfg.get("plan_id"),
                    "reason": reason, "saved_at": time.time()})
            t.accelerator.wait_for_everyone()

        def agreed_pending(self) -> bool:
            if self.trainer.args.world_size == 1:
                return self.pending
            flag = torch.tensor([1 if self.pending else 0], device=self.trainer.args.device)
            return bool(self.trainer.accelerator.reduce(flag, reduction="sum").item() > 0)

        # -- trainer side
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.rng = rng_snapshot()
            if self.pending and args.world_size == 1:
                self.save_now_and_exit()  # a boundary: the state of the last step is whole
            self.lr = float(kw["lr_scheduler"].get_last_lr()[0])
            self.sample_ids = []
            self.phase = "compute"

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.phase = "update"  # weights change now: a save must wait for the step's end
            if fault_due(state.global_step + 1, "update"):
                os.kill(os.getpid(), signal.SIGTERM)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.phase = "boundary"
            with progress_path.open("a", encoding="utf-8") as out:  # one file per rank
                out.write(json.dumps({"step": state.global_step, "lr": self.lr,
                                      "sample_ids": self.sample_ids}) + "\n")
            if os.environ.get(HOLD_ENV) == str(state.global_step) and args.process_index == 0:
                (Path(args.output_dir) / "HOLDING").write_text(str(state.global_step))
                while not self.pending:
                    time.sleep(0.01)
            if self.agreed_pending():
                control.should_save = True
                control.should_training_stop = True
                self.preempted = True

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ckpt = Path(args.output_dir) / f"{PREFIX}{state.global_step}"
            self.mark(ckpt, "sigterm" if self.preempted else "interval")

    return SpotGuard()


def allow_galore_checkpoints() -> None:
    """Let a resume read GaLore's optimizer state: galore-torch 1.0 keeps a ``GaLoreProjector``
    object (its projection matrix inside) per projected weight in the state the Trainer saves,
    and the Trainer loads ``optimizer.pt`` with ``torch.load(weights_only=True)``, which
    refuses any class not allow-listed."""
    import torch
    from galore_torch.galore_projector import GaLoreProjector

    torch.serialization.add_safe_globals([GaLoreProjector])


def make_lisa_switch(model: Any, lisa: dict[str, Any]) -> Any:
    """LISA as the plan estimated it: at the start of every ``interval`` steps, ``layers``
    blocks of ``model.model.layers`` train and the others get ``requires_grad = False``, the
    embedding, final norm and head always train (as LMFlow's DynamicLayerActivationCallback
    does), and the optimizer state of every parameter that stops training is dropped, so
    only the active blocks' state exists (re-created from zero when a block trains again).
    The blocks of interval i are drawn from a generator seeded with (the run's seed, i): a
    resumed run trains the same blocks as the run it continues."""
    from transformers import TrainerCallback

    blocks = model.model.layers
    count, interval, seed = int(lisa["layers"]), int(lisa["interval"]), int(lisa["seed"])

    class LisaSwitch(TrainerCallback):
        def __init__(self) -> None:
            self.active: list[int] | None = None

        def choose(self, step: int) -> list[int]:
            draw = random.Random(seed * 1_000_003 + step // interval)
            return sorted(draw.sample(range(len(blocks)), count))

        def switch(self, step: int, optimizer: Any) -> None:
            active = self.choose(step)
            if active == self.active:
                return
            state = getattr(optimizer, "optimizer", optimizer).state if optimizer else {}
            for index, block in enumerate(blocks):
                for param in block.parameters():
                    param.requires_grad_(index in active)
                    if index not in active:
                        param.grad = None
                        state.pop(param, None)
            self.active = active
            log(f"lisa: blocks {active} train for steps {step + 1}..{step + interval}")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.switch(state.global_step, kw.get("optimizer"))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % interval == 0:
                self.switch(state.global_step, kw.get("optimizer"))

    return LisaSwitch()


def make_trainer(model: Any, args: Any, dataset: Any, collate: Any, guard: Any,
                 tokenizer: Any, lisa: dict[str, Any] | None = None) -> Any:
    """trl.SFTTrainer over the prepared rows (``args``: ``training_arguments``). The model comes
    with its adapters already on (``add_adapters``), so no ``peft_config`` is passed: given
    one, SFTTrainer casts a quantised base's adapters to bf16 (trl 1.16
    ``trainer/sft_trainer.py``), which neither an fp16 card nor the plan's fp32-adapter memory
    estimate expects."""
    from trl.trainer.sft_trainer import SFTTrainer

    if str(getattr(args.optim, "value", args.optim)).startswith("galore"):
        allow_galore_checkpoints()

    class GuardedTrainer(SFTTrainer):
        """SFTTrainer that records which samples each step trains on (the data position)."""

        def training_step(self, model: Any, inputs: dict[str, Any], *rest: Any) -> Any:
            guard.sample_ids.extend(int(i) for i in inputs.pop("sample_ids").tolist())
            last_micro = len(guard.sample_ids) >= args.per_device_train_batch_size * \
                args.gradient_accumulation_steps
            if last_micro and fault_due(self.state.global_step + 1, "compute"):
                os.kill(os.getpid(), signal.SIGTERM)  # handled right here, inside the step
            step: Any = super().training_step  # untyped in trl
            return step(model, inputs, *rest)

    callbacks = [guard] + ([make_lisa_switch(model, lisa)] if lisa else [])
    return GuardedTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                          processing_class=tokenizer, callbacks=callbacks)


def truncate_progress(path: Path, step: int) -> None:
    """Keep the log of steps up to the resumed one: later lines belong to lost work."""
    if not path.exists():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def save_final(trainer: Any, final: Path) -> None:
    """The whole trained model (or adapter) into ``final``, loadable with from_pretrained.

    Interval checkpoints under FSDP use sharded state dicts (each rank writes its part: quick),
    but the Trainer's save_model writes weights only for a FULL_STATE_DICT (transformers
    ``Trainer.save_model``): switch to it for this save. Raises SystemExit when no weights
    came out (a run that ends "successfully" with nothing to load is a failure)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(final))
    trainer.accelerator.wait_for_everyone()
    if not trainer.args.should_save:
        return
    weights = [p.name for p in final.iterdir() if p.suffix in WEIGHT_SUFFIXES
               and p.name != "training_args.bin"] if final.is_dir() else []
    if not weights:
        raise SystemExit(f"[train.py] the final save wrote no weights into {final}")


def resume_point(args: Any, output_dir: Path, marker_name: str
                 ) -> tuple[Path, dict[str, Any]] | None:
    """``newest_complete`` found once (by process 0, which reads and hashes the checkpoints)
    and shared with every process, so all resume from the same one or stop together."""
    import torch.distributed as dist

    if args.world_size == 1 or not dist.is_initialized():
        return newest_complete(output_dir, marker_name)
    answer: list[Any] = [None]
    if args.process_index == 0:
        try:
            found = newest_complete(output_dir, marker_name)
            answer = [("found", str(found[0]), found[1]) if found else ("none",)]
        except SystemExit as stop:
            answer = [("stop", str(stop.code))]
    dist.broadcast_object_list(answer, src=0)
    kind = answer[0][0]
    if kind == "stop":
        raise SystemExit(answer[0][1])
    return (Path(answer[0][1]), answer[0][2]) if kind == "found" else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="train_config.json")
    parser.add_argument("--deepspeed", default=None, help="DeepSpeed JSON (torchrun launch)")
    opts = parser.parse_args(argv)
    cfg = load_config(opts.config)
    output_dir = Path(cfg["output_dir"])
    output_dir.mkdir(parents=True, exist_ok=True)
    args = training_arguments(cfg, opts.deepspeed)
    rank = args.process_index
    progress = output_dir / ("progress.jsonl" if args.world_size == 1
                             else f"progress-rank{rank}.jsonl")
    guard = make_guard(cfg, progress)
    signal.signal(signal.SIGTERM, guard.on_sigterm)
    found = resume_point(args, output_dir, cfg["marker_name"])
    resume = None
    if found is not None:
        resume, info = found
        warn_world_size(info, args.world_size, cfg["sharding"])
        log(f"resuming from {resume.name} (process {rank} of {args.world_size})")
        truncate_progress(progress, int(info["step"]))
    elif progress.exists():
        progress.unlink()  # no checkpoint: the run starts over, so does its log
    tokenizer = build_tokenizer(cfg)
    with args.main_process_first(local=True, desc="tokenising"):  # one process per node
        dataset, pad = build_dataset(cfg, tokenizer)
    trainer = make_trainer(build_model(cfg), args, dataset, make_collator(pad), guard,
                           tokenizer, cfg["lisa"] | {"seed": cfg["seed"]} if cfg.get("lisa")
                           else None)
    guard.trainer = trainer
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if guard.preempted:
        log(f"stopped on SIGTERM after saving step {trainer.state.global_step}")
        flag_preempted(trainer.state.global_step)
        leave_process_group(wait=False)
        return EXIT_PREEMPTED
    final = output_dir / "final"
    save_final(trainer, final)
    if args.should_save:
        write_marker(final, cfg["marker_name"], {"step": trainer.state.global_step,
                                                 "reason": "final", "saved_at": time.time()})
    leave_process_group(wait=True)
    return 0


def leave_process_group(*, wait: bool) -> None:
    """Destroy the process group before the process exits (several processes only). A rank
    that exits with it alive can take down the rendezvous store while another rank's
    background threads still talk to it, and that rank dies with "terminate called without
    an active exception" (SIGABRT): the launcher then reports a failed run after a finished
    one. ``wait``: first a barrier, so every rank has written its final files (not after
    SIGTERM, where a rank may already be gone and the grace period is short)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if wait:
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
