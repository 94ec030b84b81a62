"""The same job as a config for the fine-tuning frameworks teams already run: axolotl's YAML
and LLaMA-Factory's YAML (with the ``dataset_info.json`` it reads the data through).

Each key is one of the framework's own options (axolotl: the pydantic models of
``src/axolotl/utils/schemas/``; LLaMA-Factory: the dataclasses of ``src/llamafactory/hparams/``
and transformers' ``Seq2SeqTrainingArguments`` it extends); the tests validate every emitted
key and value against those schemas (vendored in tests/fixtures/launch/). What a framework
cannot express is a ``Refusal`` with its one-line reason, never a key silently dropped.
Values come from the bundle's own ``train_config`` (one source for learning rate, schedule,
seed, cadence), so the three ways to run the job agree. Pure text.
"""

from __future__ import annotations

import json
from typing import Any

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import (
    ALL_LINEAR,
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Precision,
    Sharding,
    Task,
)
from tuneplan.core.launch.bundle import LaunchSpec, hf_optim, train_config
from tuneplan.core.launch.targets import Refusal
from tuneplan.core.launch.yamltext import render_yaml

AXOLOTL = "axolotl"
LLAMAFACTORY = "llamafactory"
AXOLOTL_FILE = "axolotl.yaml"
LLAMAFACTORY_FILE = "llamafactory.yaml"
#: LLaMA-Factory finds data by name in ``<dataset_dir>/dataset_info.json``; the bundle's
#: folder is the dataset_dir (every bundle file sits at its top level).
DATASET_INFO_FILE = "dataset_info.json"
DATASET_NAME = "tuneplan_train"
#: The versions the schemas were read from (tests/fixtures/launch/README.md).
AXOLOTL_VERSION = "0.18.0"
LLAMAFACTORY_VERSION = "0.9.6.dev0"

#: Methods both frameworks train as train.py does (PEFT LoRA/DoRA over a full, 4-bit or 8-bit
#: base, or every weight).
_METHODS = (Method.FULL, Method.LORA, Method.DORA, Method.QLORA, Method.LORA8BIT)
_AXOLOTL_ATTENTION = {Attention.SDPA: "sdpa", Attention.FLASH: "flash_attention_2",
                      Attention.EAGER: "eager"}
#: LLaMA-Factory ``AttentionFunction`` (extras/constants.py): ``disabled`` is eager.
_LLAMAFACTORY_ATTENTION = {Attention.SDPA: "sdpa", Attention.FLASH: "fa2",
                           Attention.EAGER: "disabled"}


def _common_refusal(spec: LaunchSpec, tool: str) -> Refusal | None:
    """What neither framework expresses (train.py's own limits included)."""
    s = spec.strategy
    if s.method is Method.FREEZE and tool == LLAMAFACTORY:
        # LLaMA-Factory model/adapter.py _setup_freeze_tuning keeps a parameter when any of
        # ".<block>." or a freeze_extra_modules name is a substring of its name
        return Refusal(tool, "freeze: finetuning_type freeze trains the final norm only "
                             "through freeze_extra_modules, which match parameter names by "
                             "substring: `norm` (the final norm of llama, mistral, "
                             "qwen2, gemma) would also train every block's layernorms")
    if s.method not in _METHODS:
        return Refusal(tool, f"method {s.method.value} is not one this bundle maps (full, "
                             "lora, dora, qlora, lora8bit)")
    if s.method.value in ("qlora", "lora8bit") and s.quant not in (Quant.NF4, Quant.FP4,
                                                                    Quant.INT8):
        return Refusal(tool, f"quantisation {s.quant.value} is not bitsandbytes (nf4, fp4, "
                             "int8)")
    if s.task is not Task.CAUSAL_LM:
        return Refusal(tool, f"task {s.task.value}: the bundle trains causal language "
                             "modelling on plain text")
    if s.optimizer_in_backward:
        return Refusal(tool, "the optimizer step inside backward has no option there")
    if s.optimizer.is_galore:
        # transformers 5.24 Trainer._load_optimizer_and_scheduler: torch.load(optimizer.pt,
        # weights_only=True), which refuses the GaLoreProjector objects galore-torch keeps in
        # its optimizer state; train.py allow-lists that class, these frameworks do not.
        return Refusal(tool, "a GaLore checkpoint holds galore-torch projector objects that "
                             "the Trainer's weights-only resume refuses; only train.py "
                             "allow-lists them (spot resume)")
    if s.loss is Loss.CHUNKED:
        return Refusal(tool, "a chunked loss has no plain option there (a plugin's kernel "
                             "is not the loss the plan assumed)")
    return None


def _quantised_bits(spec: LaunchSpec) -> int | None:
    s = spec.strategy
    if s.method is Method.LORA8BIT or (s.method is Method.QLORA and s.quant is Quant.INT8):
        return 8
    return 4 if s.method is Method.QLORA else None


def output_dir(spec: LaunchSpec, tool: str) -> str:
    """The bundle's checkpoint folder with the framework's name: its checkpoints carry no
    tuneplan markers, so they never mix with train.py's."""
    return f"{train_config(spec)['output_dir']}-{tool}"


# ------------------------------------------------------------------------------ axolotl
def axolotl_config(spec: LaunchSpec) -> dict[str, Any] | Refusal:
    """axolotl's config for the plan's job, or why it cannot be written."""
    refused = _common_refusal(spec, AXOLOTL)
    if refused is not None:
        return refused
    s, cfg = spec.strategy, train_config(spec)
    if s.sharding is Sharding.HYBRID:
        return Refusal(AXOLOTL, "hybrid sharding needs axolotl's device-mesh sizes "
                                "(dp_shard_size, dp_replicate_size), which this bundle does "
                                "not choose")
    out: dict[str, Any] = {"base_model": spec.model_id}
    bits = _quantised_bits(spec)
    if s.method is not Method.FULL:
        out["adapter"] = "qlora" if bits == 4 else "lora"
        if bits == 4:
            out["load_in_4bit"] = True
            out["bnb_config_kwargs"] = {"bnb_4bit_quant_type": s.quant.value,
                                        "bnb_4bit_use_double_quant": s.double_quant}
        elif bits == 8:
            out["load_in_8bit"] = True
        out |= {"lora_r": s.lora_rank, "lora_alpha": s.lora_alpha,
                "lora_dropout": s.lora_dropout}
        if ALL_LINEAR in s.lora_targets:
            out["lora_target_linear"] = True
        else:
            out["lora_target_modules"] = list(spec.lora_targets)
        if s.trainable_modules:
            out["lora_modules_to_save"] = list(s.trainable_modules)
        if s.method is Method.DORA:
            out["peft_use_dora"] = True
    out |= {
        "datasets": [{"path": cfg["dataset"]["path"], "ds_type": "json", "type": "completion",
                      "field": cfg["dataset"]["text_field"]}],
        "dataset_prepared_path": "data/axolotl_prepared",
        "sequence_len": s.seq_len, "sample_packing": s.packing,
        "micro_batch_size": s.batch_size, "gradient_accumulation_steps": s.grad_accum,
        "num_epochs": cfg["epochs"], "optimizer": hf_optim(s),
        "learning_rate": cfg["learning_rate"], "lr_scheduler": cfg["lr_scheduler"],
        "warmup_steps": cfg["warmup_steps"], "max_grad_norm": 1.0, "seed": cfg["seed"],
    }
    out |= _axolotl_precision(s.precision)
    out["gradient_checkpointing"] = {Checkpointing.NONE: False, Checkpointing.FULL: True,
                                     Checkpointing.OFFLOAD: "offload"}[s.checkpointing]
    out["attn_implementation"] = _AXOLOTL_ATTENTION[s.attention]
    if s.compile:
        out["torch_compile"] = True
    if spec.zero_stage is not None:
        out["deepspeed"] = "ds_config.json"
    elif spec.is_fsdp:
        out["fsdp_version"] = 2
        out["fsdp_config"] = {
            # FSDP2: resharding after forward is FULL_SHARD, keeping the gathered weights
            # until backward is SHARD_GRAD_OP.
            "reshard_after_forward": s.sharding is Sharding.FSDP,
            "offload_params": s.offload is not Offload.NONE,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "cpu_ram_efficient_loading": True,
            "state_dict_type": "SHARDED_STATE_DICT", "final_state_dict_type": "FULL_STATE_DICT"}
    out |= {"output_dir": output_dir(spec, AXOLOTL), "save_strategy": "steps",
            "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
            "auto_resume_from_checkpoints": True, "logging_steps": 1}
    return out


def _axolotl_precision(precision: Precision) -> dict[str, Any]:
    """``bf16``/``fp16`` are mixed precision (AMP); ``bfloat16`` loads the model in bf16 with
    no AMP (axolotl's own description), the plan's pure bf16."""
    if precision is Precision.BF16:
        return {"bf16": False, "fp16": False, "bfloat16": True}
    return {"bf16": precision is Precision.BF16_MIXED, "fp16": precision is Precision.FP16_MIXED}


def render_axolotl(spec: LaunchSpec, config: dict[str, Any]) -> str:
    return render_yaml(config, header=(
        f"axolotl {AXOLOTL_VERSION} config for plan {spec.plan_id}: the same job as train.py "
        "(see RUN.md).\nRun: axolotl train axolotl.yaml"))


# ------------------------------------------------------------------------------ LLaMA-Factory
_HF_FSDP = {Sharding.FSDP: "full_shard", Sharding.FSDP_GRAD_OP: "shard_grad_op",
            Sharding.HYBRID: "hybrid_shard"}


def llamafactory_config(spec: LaunchSpec) -> dict[str, Any] | Refusal:
    """LLaMA-Factory's training config for the plan's job (stage ``pt``: plain text, every
    token a label, as train.py trains), or why it cannot be written."""
    refused = _common_refusal(spec, LLAMAFACTORY)
    if refused is not None:
        return refused
    s, cfg = spec.strategy, train_config(spec)
    out: dict[str, Any] = {"model_name_or_path": spec.model_id, "stage": "pt",
                           "do_train": True,
                           "finetuning_type": "full" if s.method is Method.FULL else "lora"}
    bits = _quantised_bits(spec)
    if s.method is not Method.FULL:
        out |= {"lora_rank": s.lora_rank, "lora_alpha": s.lora_alpha,
                "lora_dropout": s.lora_dropout,
                "lora_target": "all" if ALL_LINEAR in s.lora_targets
                else ",".join(spec.lora_targets)}
        if s.trainable_modules:
            out["additional_target"] = ",".join(s.trainable_modules)
        if s.method is Method.DORA:
            out["use_dora"] = True
        if bits is not None:
            out |= {"quantization_method": "bnb", "quantization_bit": bits}
            if bits == 4:
                out |= {"quantization_type": s.quant.value,
                        "double_quantization": s.double_quant}
    out |= {
        "dataset": DATASET_NAME, "dataset_dir": ".", "cutoff_len": s.seq_len,
        "packing": s.packing, "per_device_train_batch_size": s.batch_size,
        "gradient_accumulation_steps": s.grad_accum, "num_train_epochs": cfg["epochs"],
        "optim": hf_optim(s), "learning_rate": cfg["learning_rate"],
        "lr_scheduler_type": cfg["lr_scheduler"], "warmup_steps": cfg["warmup_steps"],
        "max_grad_norm": 1.0, "seed": cfg["seed"],
        "bf16": s.precision in (Precision.BF16_MIXED, Precision.BF16),
        "fp16": s.precision is Precision.FP16_MIXED,
    }
    if s.precision is Precision.BF16:
        out["pure_bf16"] = True
    out["disable_gradient_checkpointing"] = s.checkpointing is Checkpointing.NONE
    if s.checkpointing is Checkpointing.OFFLOAD:
        out["use_unsloth_gc"] = True  # LLaMA-Factory's checkpoints kept on the host
    out["flash_attn"] = _LLAMAFACTORY_ATTENTION[s.attention]
    if s.compile:
        out["torch_compile"] = True
    if spec.zero_stage is not None:
        out["deepspeed"] = "ds_config.json"
    elif spec.is_fsdp:
        words = [_HF_FSDP[s.sharding], "auto_wrap"]
        if s.offload is not Offload.NONE:
            words.append("offload")
        out["fsdp"] = " ".join(words)
    out |= {"output_dir": output_dir(spec, LLAMAFACTORY), "save_strategy": "steps",
            "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
            # False: LLaMA-Factory resumes from the newest checkpoint-N in output_dir.
            "overwrite_output_dir": False, "logging_steps": 1, "report_to": "none"}
    return out


def llamafactory_dataset_info(spec: LaunchSpec) -> str:
    """``dataset_info.json``: the bundle's JSONL file (its path from the bundle's folder) as a
    pre-training set, its text field as LLaMA-Factory's ``prompt`` column."""
    data = train_config(spec)["dataset"]
    entry = {"file_name": data["path"], "formatting": "alpaca",
             "columns": {"prompt": data["text_field"]}}
    return json.dumps({DATASET_NAME: entry}, indent=2) + "\n"


def render_llamafactory(spec: LaunchSpec, config: dict[str, Any]) -> str:
    return render_yaml(config, header=(
        f"LLaMA-Factory {LLAMAFACTORY_VERSION} config for plan {spec.plan_id}: the same job "
        "as train.py (see RUN.md).\nRun: llamafactory-cli train llamafactory.yaml"))
