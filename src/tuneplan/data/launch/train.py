#!/usr/bin/env python3
"""Spot-safe fine-tuning entry point written by ``tuneplan launch`` (settings: train_config.json).

transformers Trainer + PEFT + bitsandbytes as the plan says. Checkpoints every ``save_steps``
to ``output_dir``; a checkpoint counts only when its marker (written last, listing every file
and its size) matches; resume is from the newest complete one (weights or adapter, optimizer,
scheduler, RNG, data position). SIGTERM saves at once and exits with code 143.
Run: ``accelerate launch train.py --config train_config.json`` (or torchrun, see RUN.md).
"""

from __future__ import annotations

import argparse
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


def fault_due(step: int, phase: str) -> bool:
    """Whether the resume drill asks for a SIGTERM in ``step`` (1-based) during ``phase``."""
    want = os.environ.get(FAULT_ENV, "")
    number, _, where = want.partition(":")
    return number.isdigit() and int(number) == step and (where or "compute") == phase


OPTIMIZERS = {"adamw": "adamw_torch", "adamw8bit": "adamw_bnb_8bit",
              "paged-adamw8bit": "paged_adamw_8bit", "paged-adamw32bit": "paged_adamw_32bit",
              "adafactor": "adafactor", "sgd": "sgd", "lion": "lion_32bit"}
ATTENTION = {"sdpa": "sdpa", "flash": "flash_attention_2", "eager": "eager"}
ZERO_OR_FSDP = {"zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hybrid"}


def log(message: str) -> None:
    sys.stderr.write(f"[train.py] {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- checkpoints (no torch needed)
def checkpoint_step(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
        return None
    return int(name[len(PREFIX):])


def read_complete_marker(ckpt: Path, marker_name: str) -> dict[str, Any] | None:
    """The marker's content when the checkpoint is complete: the marker parses and every file
    it lists exists with the size it lists. Else None."""
    try:
        info = json.loads((ckpt / marker_name).read_text(encoding="utf-8"))
        files = info["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not files:
        return None
    for rel, size in files.items():
        target = ckpt / rel
        if not target.is_file() or target.stat().st_size != size:
            return None
    return dict(info)


def newest_complete(output_dir: Path, marker_name: str) -> tuple[Path, dict[str, Any]] | None:
    """The complete checkpoint with the highest step, ignoring unfinished ones."""
    if not output_dir.is_dir():
        return None
    found = [(checkpoint_step(p), p) for p in output_dir.iterdir() if p.is_dir()]
    for step, path in sorted(((s, p) for s, p in found if s is not None), reverse=True):
        info = read_complete_marker(path, marker_name)
        if info is not None:
            return path, info
        log(f"ignoring {path.name}: no complete marker (step {step} was not fully saved)")
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(ckpt: Path, marker_name: str, info: dict[str, Any]) -> None:
    """Fsync every file, then write the marker (via a temporary name) listing them: last."""
    files: dict[str, int] = {}
    for path in sorted(ckpt.rglob("*")):
        if path.is_file() and path.name != marker_name and not path.name.endswith(".tmp"):
            _fsync(path)
            files[str(path.relative_to(ckpt))] = path.stat().st_size
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


# ---------------------------------------------------------------- settings
def load_config(path: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    base = os.environ.get("TUNEPLAN_CHECKPOINT_DIR")
    if base:  # the cloud's durable mount wins over the path in the file
        cfg["output_dir"] = str(Path(base) / str(cfg.get("plan_id", "run")))
    return cfg


def training_arguments(cfg: dict[str, Any], deepspeed: str | None = None) -> Any:
    """transformers.TrainingArguments from the plan's settings (validated by its constructor)."""
    import torch
    from transformers import TrainingArguments

    precision = cfg["precision"]
    # transformers 5 renamed gradient_checkpointing (the old name still works, with a warning).
    recompute = ("activation_checkpointing" if "activation_checkpointing"
                 in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing")
    return TrainingArguments(
        use_cpu=not torch.cuda.is_available(), **{recompute: cfg["gradient_checkpointing"]},
        output_dir=cfg["output_dir"], per_device_train_batch_size=cfg["batch_size"],
        gradient_accumulation_steps=cfg["grad_accum"], num_train_epochs=cfg["epochs"],
        max_steps=cfg.get("max_steps", -1), learning_rate=cfg["learning_rate"],
        lr_scheduler_type=cfg["lr_scheduler"], warmup_steps=cfg.get("warmup_steps", 0),
        optim=OPTIMIZERS[cfg["optimizer"]], max_grad_norm=1.0,
        bf16=precision in ("bf16-mixed", "bf16"), fp16=precision == "fp16-mixed",
        save_strategy="steps", save_steps=cfg["save_steps"],
        save_total_limit=max(2, cfg["save_total_limit"]), logging_steps=1,
        seed=cfg["seed"], data_seed=cfg["seed"], report_to="none",
        remove_unused_columns=False, dataloader_num_workers=0,
        deepspeed=deepspeed or cfg.get("deepspeed"),
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
    dtype = torch.float32 if precision == "fp32" or (
        method == "full" and precision.endswith("mixed")) else half
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
    if method == "full":
        return model
    if method not in ("lora", "dora", "qlora", "lora8bit"):
        raise SystemExit(f"method {method!r}: this entry point trains full, lora, dora, qlora "
                         "and lora8bit; add the PEFT config for it in add_adapters()")
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


class TokenRows:
    """Token-id rows with their index (``sample_id``: the data position is auditable)."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.rows[index], "sample_id": index}


def build_dataset(cfg: dict[str, Any]) -> tuple[TokenRows, int]:
    """(rows, pad id). ``synthetic``: seeded random ids (own generator: the global RNG is not
    touched); ``jsonl``: a text field tokenised, packed to seq_len or cut at it."""
    import torch

    data, seq_len = cfg["dataset"], cfg["seq_len"]
    if data["kind"] == "synthetic":
        gen = torch.Generator().manual_seed(int(data.get("seed", 0)))
        ids = torch.randint(0, int(data["vocab_size"]), (int(data["rows"]), seq_len), generator=gen)
        return TokenRows(ids.tolist()), 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg["model_name_or_path"])
    texts = [json.loads(line)[data.get("text_field", "text")]
             for line in Path(data["path"]).read_text(encoding="utf-8").splitlines() if line]
    encoded = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    if cfg["packing"]:
        flat = [i for row in encoded for i in row]
        rows = [flat[i:i + seq_len] for i in range(0, len(flat) - seq_len + 1, seq_len)]
    else:
        rows = [row[:seq_len] for row in encoded]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return TokenRows(rows), pad


def make_collator(pad_id: int) -> Any:
    import torch

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, :len(item["input_ids"])] = torch.tensor(item["input_ids"])
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
            if self.agreed_pending():
                control.should_save = True
                control.should_training_stop = True
                self.preempted = True

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ckpt = Path(args.output_dir) / f"{PREFIX}{state.global_step}"
            self.mark(ckpt, "sigterm" if self.preempted else "interval")

    return SpotGuard()


def make_trainer(model: Any, args: Any, dataset: Any, collate: Any, guard: Any) -> Any:
    from transformers import Trainer

    class GuardedTrainer(Trainer):
        """Trainer that records which samples each step trains on (the data position)."""

        def training_step(self, model: Any, inputs: dict[str, Any], *rest: Any) -> Any:
            guard.sample_ids.extend(int(i) for i in inputs.pop("sample_ids").tolist())
            last_micro = len(guard.sample_ids) >= args.per_device_train_batch_size * \
                args.gradient_accumulation_steps
            if last_micro and fault_due(self.state.global_step + 1, "compute"):
                os.kill(os.getpid(), signal.SIGTERM)  # handled right here, inside the step
            return super().training_step(model, inputs, *rest)

    return GuardedTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                          callbacks=[guard])


def truncate_progress(path: Path, step: int) -> None:
    """Keep the log of steps up to the resumed one: later lines belong to lost work."""
    if not path.exists():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


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
    found = newest_complete(output_dir, cfg["marker_name"])
    resume = None
    if found is not None:
        resume, info = found
        warn_world_size(info, args.world_size, cfg["sharding"])
        log(f"resuming from {resume.name}")
        truncate_progress(progress, int(info["step"]))
    elif progress.exists():
        progress.unlink()  # no checkpoint: the run starts over, so does its log
    dataset, pad = build_dataset(cfg)
    trainer = make_trainer(build_model(cfg), args, dataset, make_collator(pad), guard)
    guard.trainer = trainer
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if guard.preempted:
        log(f"stopped on SIGTERM after saving step {trainer.state.global_step}")
        return EXIT_PREEMPTED
    final = output_dir / "final"
    trainer.save_model(str(final))
    if args.should_save:
        write_marker(final, cfg["marker_name"], {"step": trainer.state.global_step,
                                                 "reason": "final", "saved_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
