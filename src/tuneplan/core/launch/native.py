"""A plan made with ``--recipe litgpt`` or ``--recipe torchtune`` as that framework's own run:
its config YAML and the command that starts it (``litgpt finetune_lora --config litgpt.yaml``,
``tune run lora_finetune_single_device --config torchtune.yaml``).

Every key is one of the framework's own options, read from its source: litgpt 0.5.13
``finetune/{lora,full}.py`` ``setup`` (the signature its jsonargparse CLI parses) and
``args.py`` ``TrainArgs``; torchtune 0.6.1 ``recipes/{lora,full}_finetune_*.py`` (the keys
each recipe reads from its config) and the model builders of ``torchtune.models.llama3*``.
The tests parse the YAML with litgpt's own CLI and validate it with torchtune's own config
code. Only what the plan states is mapped; what a framework cannot express is a ``Refusal``
with its one-line reason. Values shared with train.py (learning rate, schedule, seed,
checkpoint cadence) come from the bundle's ``train_config``. Pure text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    ALL_LINEAR,
    Attention,
    Checkpointing,
    Loss,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.core.launch.bundle import CHECKPOINT_DIR, LaunchSpec, train_config
from tuneplan.core.launch.targets import Refusal
from tuneplan.core.launch.yamltext import render_yaml
from tuneplan.core.memory.litgpt import MLP_TARGETS, lit_targets

if TYPE_CHECKING:
    from tuneplan.core.models import ModelSpec

LITGPT = "litgpt"
TORCHTUNE = "torchtune"
LITGPT_VERSION = "0.5.13"
TORCHTUNE_VERSION = "0.6.1"
#: torchtune 0.6.1's ``torchtune.training`` imports ``int4_weight_only`` from
#: ``torchao.quantization``, which later torchao releases dropped (0.16 has none): the run
#: pins a torchao that torchtune 0.6.1 imports with (0.10.0, checked by importing
#: ``torchtune.training`` against it).
TORCHAO_VERSION = "0.10.0"
LITGPT_FILE = "litgpt.yaml"
TORCHTUNE_FILE = "torchtune.yaml"
#: Where torchtune's run downloads the base model (relative to the bundle's folder).
MODEL_DIR = "models"
#: Shell variables the torchtune run sets before ``tune run`` (see ``_torchtune_prelude``).
FILES_VAR = "TUNEPLAN_CHECKPOINT_FILES"
RESUME_VAR = "TUNEPLAN_RESUME"


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeRun:
    """One framework's run of the plan: the config file and the shell that starts it."""

    tool: str                      # litgpt | torchtune
    version: str
    config_file: str
    config: dict[str, Any]
    command: tuple[str, ...]       # argv; words may hold the prelude's shell variables
    prelude: tuple[str, ...]       # shell lines run before the command, on every start
    requirements: tuple[str, ...]  # pip lines (CUDA torch comes from the machine image)
    output_dir: str
    resume: str                    # how a restart resumes, in words (RUN.md)
    data: str                      # what the data file must hold, in words (RUN.md)


def output_dir(spec: LaunchSpec, tool: str) -> str:
    """The bundle's checkpoint folder with the framework's name (its own checkpoints)."""
    return f"{CHECKPOINT_DIR}/{spec.plan_id}-{tool}"


def _targets_refusal(tool: str, s: Strategy, names: set[str], has_no: str,
                     mlp_whole: str) -> Refusal | None:
    """A LoRA target set ``tool`` cannot express: a name outside ``names`` (``has_no``: the
    options it does have), or part of the MLP (``mlp_whole``: why only all of it)."""
    if s.method is Method.FULL or s.all_linear:
        return None
    unknown = sorted(set(s.lora_targets) - names)
    if unknown:
        return Refusal(tool, f"LoRA targets {','.join(unknown)} have no {tool} {has_no}")
    if 0 < len(MLP_TARGETS & set(s.lora_targets)) < len(MLP_TARGETS):
        return Refusal(tool, f"LoRA on part of the MLP: {mlp_whole}")
    return None


def _common_refusal(spec: LaunchSpec, tool: str) -> Refusal | None:
    s = spec.strategy
    if s.nodes > 1:
        return Refusal(tool, f"the bundle runs {tool} on one node only (the plan has "
                             f"{s.nodes})")
    if s.task is not Task.CAUSAL_LM:
        return Refusal(tool, f"task {s.task.value}: the bundle trains causal language "
                             "modelling on plain text")
    if s.compile and tool != TORCHTUNE:   # torchtune's config has its own ``compile`` key
        return Refusal(tool, "--compile is not mapped onto its run")
    if s.offload.value != "none":
        return Refusal(tool, f"--offload {s.offload.value} is not mapped onto its run")
    return None


def _epochs(spec: LaunchSpec, tool: str) -> tuple[int, int | None] | Refusal:
    """(whole epochs, optimizer-step cap or None): a fraction of an epoch is the plan's step
    count over the epochs rounded up."""
    if float(spec.epochs).is_integer() and spec.epochs >= 1:
        return int(spec.epochs), None
    if spec.planned_steps is None:
        return Refusal(tool, f"{spec.epochs} epochs with no token count: {tool} counts whole "
                             "epochs or optimizer steps")
    return max(1, math.ceil(spec.epochs)), spec.planned_steps


def _spot_cadence(spec: LaunchSpec, tool: str, why: str) -> Refusal | None:
    """A spot plan's cost assumes restarts resume from its checkpoints: refused when the
    framework's run cannot."""
    if not spec.use_spot:
        return None
    return Refusal(tool, f"the plan runs on spot and {why}, so a preempted run would lose "
                         "more than the plan's checkpoint interval: plan on-demand "
                         "(--no-spot) or with --recipe hf")


# ------------------------------------------------------------------------------ LitGPT
#: Lightning Fabric precision names (litgpt ``setup``: "bf16-true", "bf16-mixed", "32-true";
#: Fabric also takes "16-mixed").
_LIT_PRECISION = {Precision.BF16: "bf16-true", Precision.BF16_MIXED: "bf16-mixed",
                  Precision.FP32: "32-true", Precision.FP16_MIXED: "16-mixed"}
#: litgpt ``lora.py`` maps names onto its fused qkv and MLP (``memory.litgpt.lit_targets``).
_LIT_NAMES = {"q_proj", "k_proj", "v_proj", "o_proj", "lm_head", *MLP_TARGETS}
#: torch optimizers litgpt's ``instantiate_torch_optimizer`` builds from a class path.
_LIT_OPTIMIZERS = {Optimizer.ADAMW: "torch.optim.AdamW", Optimizer.SGD: "torch.optim.SGD"}


def litgpt_run(spec: LaunchSpec) -> NativeRun | Refusal:
    """``litgpt finetune_lora`` / ``finetune_full`` with ``litgpt.yaml``, or why not."""
    refused = _common_refusal(spec, LITGPT) or _litgpt_refusal(spec)
    if refused is not None:
        return refused
    epochs = _epochs(spec, LITGPT)
    if isinstance(epochs, Refusal):
        return epochs
    s, cfg = spec.strategy, train_config(spec)
    lora = s.method is not Method.FULL
    out: dict[str, Any] = {
        # a Hub id: litgpt downloads it into checkpoints/<id> and converts it on first start
        "checkpoint_dir": spec.model_id, "out_dir": output_dir(spec, LITGPT),
        "precision": _LIT_PRECISION[s.precision], "devices": s.gpus, "num_nodes": 1}
    if lora:
        if s.method is Method.QLORA:
            out["quantize"] = f"bnb.{s.quant.value}" + ("-dq" if s.double_quant else "")
        targets = lit_targets(s)
        head = not s.all_linear and "lm_head" in s.lora_targets
        out |= {"lora_r": s.lora_rank, "lora_alpha": s.lora_alpha,
                "lora_dropout": s.lora_dropout, "lora_query": targets.query,
                "lora_key": targets.key, "lora_value": targets.value,
                "lora_projection": targets.projection, "lora_mlp": targets.mlp,
                "lora_head": head}
    else:
        out["resume"] = "auto"
    data = cfg["dataset"]
    out["data"] = {"class_path": "litgpt.data.JSON", "init_args": {
        "json_path": data["path"], "mask_prompt": False, "prompt_style": "default",
        "seed": cfg["seed"]}}
    whole, cap = epochs
    train: dict[str, Any] = {
        "save_interval": spec.save_steps, "log_interval": 1,
        "global_batch_size": s.batch_size * s.grad_accum * spec.world_size,
        "micro_batch_size": s.batch_size, "lr_warmup_steps": cfg["warmup_steps"],
        "epochs": whole, "max_seq_length": s.seq_len}
    if cap is not None:
        train["max_steps"] = cap
    out["train"] = train
    out["optimizer"] = {"class_path": _LIT_OPTIMIZERS[s.optimizer],
                        "init_args": {"lr": cfg["learning_rate"]}}
    out |= {"logger_name": "csv", "seed": cfg["seed"]}
    command = "finetune_lora" if lora else "finetune_full"
    reqs = ["litgpt[extra]==" + LITGPT_VERSION]
    return NativeRun(
        tool=LITGPT, version=LITGPT_VERSION, config_file=LITGPT_FILE, config=out,
        command=(LITGPT, command, "--config", LITGPT_FILE), prelude=(),
        requirements=tuple(reqs), output_dir=output_dir(spec, LITGPT),
        resume=("`resume: auto`: a restart continues from the newest `step-*` checkpoint in "
                "the output folder" if not lora else
                f"litgpt {LITGPT_VERSION}'s finetune_lora has no resume option: a restart "
                "trains from the start (the `step-*` adapters saved so far stay)"),
        data=("litgpt's JSON data module reads `instruction` and `output` fields "
              "(`prompt_style: default` adds no template, `mask_prompt: false` trains on "
              "every token): put each text in `instruction` with an empty `output`; 5 % "
              "of the rows are held out, and litgpt's own validation on them (every 100 "
              "steps, 100 batches: its defaults) adds time the plan does not count"))


def _litgpt_refusal(spec: LaunchSpec) -> Refusal | None:
    s = spec.strategy
    if s.method not in (Method.FULL, Method.LORA, Method.QLORA):
        return Refusal(LITGPT, f"method {s.method.value} is not one this bundle maps onto "
                               "litgpt (full, lora, qlora)")
    if s.method is Method.QLORA and s.quant not in (Quant.NF4, Quant.FP4):
        return Refusal(LITGPT, f"quantisation {s.quant.value}: litgpt quantizes a QLoRA base "
                               "with bitsandbytes nf4 or fp4")
    if s.method is Method.QLORA and (s.precision.is_mixed or spec.world_size > 1):
        return Refusal(LITGPT, "litgpt quantizes only under a -true precision on one GPU "
                               "(finetune/lora.py raises otherwise)")
    if s.trainable_modules:
        return Refusal(LITGPT, "--trainable-modules has no litgpt option")
    if (targets := _targets_refusal(
            LITGPT, s, _LIT_NAMES, "switch (lora_query/key/value/projection/mlp/head)",
            "litgpt's lora_mlp wraps all three MLP linears")) is not None:
        return targets
    if s.optimizer not in _LIT_OPTIMIZERS:
        return Refusal(LITGPT, f"optimizer {s.optimizer.value} is not mapped onto litgpt "
                               "(adamw, sgd)")
    if s.optimizer_in_backward or s.packing:
        return Refusal(LITGPT, "--optimizer-in-backward and --packing have no litgpt "
                               "finetune option")
    if s.loss is Loss.STANDARD:
        return Refusal(LITGPT, "--loss standard: litgpt's finetune scripts always use "
                               "chunked_cross_entropy")
    if s.attention is not Attention.SDPA:
        return Refusal(LITGPT, f"--attention {s.attention.value}: litgpt runs PyTorch SDPA")
    if spec.world_size > 1 and s.sharding is not Sharding.FSDP:
        return Refusal(LITGPT, f"sharding {s.sharding.value} on {spec.world_size} GPUs: "
                               "litgpt shards several GPUs with FSDP (full shard)")
    many = spec.world_size > 1
    if s.checkpointing is Checkpointing.OFFLOAD or (
            (s.checkpointing is Checkpointing.FULL) is not many):
        return Refusal(LITGPT, f"activation checkpointing {s.checkpointing.value} on "
                               f"{spec.world_size} GPU(s): litgpt {LITGPT_VERSION} "
                               "checkpoints every block under its multi-GPU strategy and "
                               "never on one GPU (re-plan with --gradient-checkpointing "
                               f"{'on' if many else 'off'})")
    if s.method is not Method.FULL:
        return _spot_cadence(spec, LITGPT, f"litgpt {LITGPT_VERSION}'s finetune_lora "
                                           "cannot resume from its checkpoints")
    return None


# ------------------------------------------------------------------------------ torchtune
@dataclass(frozen=True, slots=True)
class TorchtuneModel:
    """A torchtune builder family: ``torchtune.models.<package>.[lora_]<package>_<size>``."""

    package: str
    size: str
    model_type: str  # the checkpointer's ``model_type`` (torchtune ``ModelType``)


#: Llama-3 builders of torchtune 0.6.1 by (vocab, layers, heads, kv heads, hidden,
#: intermediate, max positions, tied head): the values in ``models/llama3*/_model_builders.py``
#: (the tests build each on the meta device and compare). Llama 3.3 70B has 3.1 70B's layout.
TORCHTUNE_MODELS: dict[tuple[int, ...], TorchtuneModel] = {
    (128256, 32, 32, 8, 4096, 14336, 8192, 0): TorchtuneModel("llama3", "8b", "LLAMA3"),
    (128256, 80, 64, 8, 8192, 28672, 8192, 0): TorchtuneModel("llama3", "70b", "LLAMA3"),
    (128256, 32, 32, 8, 4096, 14336, 131072, 0): TorchtuneModel("llama3_1", "8b", "LLAMA3"),
    (128256, 80, 64, 8, 8192, 28672, 131072, 0): TorchtuneModel("llama3_1", "70b", "LLAMA3"),
    (128256, 126, 128, 8, 16384, 53248, 131072, 0):
        TorchtuneModel("llama3_1", "405b", "LLAMA3"),
    (128256, 16, 32, 8, 2048, 8192, 131072, 1): TorchtuneModel("llama3_2", "1b", "LLAMA3_2"),
    (128256, 28, 24, 8, 3072, 8192, 131072, 1): TorchtuneModel("llama3_2", "3b", "LLAMA3_2"),
}
#: PEFT / HF module names -> torchtune's ``lora_attn_modules`` names.
_TT_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
_TT_OPTIMIZERS = {Optimizer.ADAMW: "torch.optim.AdamW", Optimizer.SGD: "torch.optim.SGD",
                  Optimizer.ADAMW8BIT: "bitsandbytes.optim.AdamW8bit",
                  Optimizer.PAGED_ADAMW8BIT: "bitsandbytes.optim.PagedAdamW8bit"}
_TT_DTYPE = {Precision.BF16: "bf16", Precision.FP32: "fp32"}


def torchtune_model(model: ModelSpec) -> TorchtuneModel | None:
    """torchtune's builder family for ``model``, by its dimensions; None when it has none."""
    if model.model_type != "llama" or model.num_experts or model.head_bias:
        return None
    key = (model.vocab_size, model.num_layers, model.num_heads, model.num_kv_heads,
           model.hidden_size, model.intermediate_size, model.max_position_embeddings or 0,
           int(model.tie_word_embeddings))
    return TORCHTUNE_MODELS.get(key)


def torchtune_recipe(spec: LaunchSpec) -> str:
    """The recipe ``tune run`` starts: LoRA or full, one device or distributed (FSDP)."""
    kind = "full" if spec.strategy.method is Method.FULL else "lora"
    where = "single_device" if spec.world_size == 1 else "distributed"
    return f"{kind}_finetune_{where}"


def torchtune_run(spec: LaunchSpec, model: ModelSpec | None) -> NativeRun | Refusal:
    """``tune run <recipe> --config torchtune.yaml``, or why not."""
    refused = _common_refusal(spec, TORCHTUNE) or _torchtune_refusal(spec)
    if refused is not None:
        return refused
    if model is None:
        return Refusal(TORCHTUNE, f"{spec.model_id} could not be resolved now, and torchtune's "
                                  "model builder is chosen by the model's dimensions")
    family = torchtune_model(model)
    if family is None:
        return Refusal(TORCHTUNE, f"torchtune {TORCHTUNE_VERSION} has no model builder with "
                                  f"{model.name}'s layout (the bundle maps its Llama-3, 3.1 "
                                  "and 3.2 builders)")
    epochs = _epochs(spec, TORCHTUNE)
    if isinstance(epochs, Refusal):
        return epochs
    s, cfg = spec.strategy, train_config(spec)
    whole, cap = epochs
    if cap is not None and whole > 1:
        return Refusal(TORCHTUNE, f"{spec.epochs} epochs: torchtune caps steps per epoch "
                                  "(max_steps_per_epoch), so only whole epochs or less than "
                                  "one map")
    steps_per_epoch = (math.ceil(spec.planned_steps / spec.epochs)
                       if spec.planned_steps else None)
    late = steps_per_epoch is None or steps_per_epoch > spec.save_steps
    cadence = _spot_cadence(spec, TORCHTUNE, f"torchtune {TORCHTUNE_VERSION} saves only at "
                                              "the end of each epoch (its recipes have no "
                                              f"mid-epoch checkpoints), not every "
                                              f"{spec.save_steps} steps") if late else None
    if cadence is not None:
        return cadence
    lora = s.method is not Method.FULL
    prefix = "lora_" if lora else ""
    component = f"torchtune.models.{family.package}.{prefix}{family.package}_{family.size}"
    model_cfg: dict[str, Any] = {"_component_": component}
    if lora:
        all_linear = ALL_LINEAR in s.lora_targets
        names = s.lora_targets
        attn = [v for k, v in _TT_ATTN.items() if all_linear or k in names]
        model_cfg |= {"lora_attn_modules": attn,
                      "apply_lora_to_mlp": all_linear or set(names) >= MLP_TARGETS,
                      "apply_lora_to_output": not all_linear and "lm_head" in names,
                      "lora_rank": s.lora_rank, "lora_alpha": s.lora_alpha,
                      "lora_dropout": s.lora_dropout}
        if s.method is Method.DORA:
            model_cfg["use_dora"] = True
        if s.method is Method.QLORA:
            model_cfg["quantize_base"] = True
    out_dir = output_dir(spec, TORCHTUNE)
    local = f"{MODEL_DIR}/{spec.model_id.rsplit('/', 1)[-1]}"
    data = cfg["dataset"]
    out: dict[str, Any] = {
        "output_dir": out_dir, "model": model_cfg,
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer",
                      "path": f"{local}/original/tokenizer.model", "max_seq_len": s.seq_len},
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer",
                         "checkpoint_dir": local, "checkpoint_files": [],
                         "recipe_checkpoint": None, "output_dir": out_dir,
                         "model_type": family.model_type},
        "resume_from_checkpoint": False,
        "dataset": {"_component_": "torchtune.datasets.text_completion_dataset",
                    "source": "json", "data_files": data["path"], "column": data["text_field"],
                    "split": "train", "packed": s.packing},
        "seed": cfg["seed"], "shuffle": True, "batch_size": s.batch_size,
        "optimizer": {"_component_": _TT_OPTIMIZERS[s.optimizer], "lr": cfg["learning_rate"]},
        "lr_scheduler": {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": cfg["warmup_steps"]},
        "loss": {"_component_": "torch.nn.CrossEntropyLoss" if s.loss is Loss.STANDARD
                 else "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "epochs": whole, "max_steps_per_epoch": cap,
        "gradient_accumulation_steps": s.grad_accum,
        "clip_grad_norm": 1.0,  # as train.py (the HF Trainer's max_grad_norm) and axolotl
        "compile": s.compile, "device": "cuda", "dtype": _TT_DTYPE[s.precision],
        "enable_activation_checkpointing": s.checkpointing is not Checkpointing.NONE,
        "enable_activation_offloading": s.checkpointing is Checkpointing.OFFLOAD,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger",
                          "log_dir": f"{out_dir}/logs"},
        "log_every_n_steps": 1, "log_peak_memory_stats": True,
    }
    if lora:
        out["save_adapter_weights_only"] = False
    else:
        out["optimizer_in_bwd"] = s.optimizer_in_backward  # the full recipes read it
    recipe = torchtune_recipe(spec)
    launcher = ("tune", "run") if spec.world_size == 1 else (
        "tune", "run", "--nproc_per_node", str(s.gpus))
    reqs = [f"torchtune=={TORCHTUNE_VERSION}", f"torchao=={TORCHAO_VERSION}"]
    if s.optimizer.is_8bit:
        reqs.append("bitsandbytes>=0.43")
    return NativeRun(
        tool=TORCHTUNE, version=TORCHTUNE_VERSION, config_file=TORCHTUNE_FILE, config=out,
        command=(*launcher, recipe, "--config", TORCHTUNE_FILE,
                 f"checkpointer.checkpoint_files=[${{{FILES_VAR}}}]",
                 f"resume_from_checkpoint=${{{RESUME_VAR}}}"),
        prelude=_torchtune_prelude(spec.model_id, local, out_dir),
        requirements=tuple(reqs), output_dir=out_dir,
        resume=(f"torchtune saves at the end of each epoch into `{out_dir}/epoch_N` and its "
                "recipe state under `recipe_state/`; a restart finds that state and sets "
                "`resume_from_checkpoint=True`, continuing from the last finished epoch"),
        data=(f"`{data['path']}`, one JSON object per line, its `{data['text_field']}` "
              "field read by torchtune's text_completion_dataset"))


def _torchtune_prelude(model_id: str, local: str, out_dir: str) -> tuple[str, ...]:
    """Download the base (``tune download`` reads HF_TOKEN), list its safetensors shards for
    the checkpointer, and resume when an earlier start left its recipe state."""
    return (f'tune download {model_id} --output-dir {local} '
            '--ignore-patterns "original/consolidated*"',
            f'{FILES_VAR}="$(cd {local} && ls *.safetensors | paste -sd, -)"',
            f'{RESUME_VAR}=False; if [ -f {out_dir}/recipe_state/recipe_state.pt ]; then '
            f'{RESUME_VAR}=True; fi')


def _torchtune_refusal(spec: LaunchSpec) -> Refusal | None:
    s = spec.strategy
    if s.method not in (Method.FULL, Method.LORA, Method.DORA, Method.QLORA):
        return Refusal(TORCHTUNE, f"method {s.method.value} is not one this bundle maps onto "
                                  "torchtune (full, lora, dora, qlora)")
    if s.method is Method.QLORA and (s.quant is not Quant.NF4 or not s.double_quant):
        return Refusal(TORCHTUNE, "torchtune quantizes a QLoRA base as torchao NF4, whose "
                                  "scales are always quantized too (nf4 with double quant)")
    if s.precision not in _TT_DTYPE:
        return Refusal(TORCHTUNE, f"--precision {s.precision.value}: torchtune trains in one "
                                  "dtype (bf16 or fp32), no autocast")
    if s.trainable_modules:
        return Refusal(TORCHTUNE, "--trainable-modules has no torchtune option")
    if (targets := _targets_refusal(
            TORCHTUNE, s, {*_TT_ATTN, *MLP_TARGETS, "lm_head"},
            "option (lora_attn_modules, apply_lora_to_mlp/output)",
            "apply_lora_to_mlp wraps w1, w2 and w3 together")) is not None:
        return targets
    if s.optimizer not in _TT_OPTIMIZERS:
        return Refusal(TORCHTUNE, f"optimizer {s.optimizer.value} is not mapped onto "
                                  "torchtune (adamw, adamw8bit, paged-adamw8bit, sgd)")
    if s.optimizer_in_backward and (s.method is not Method.FULL or spec.world_size > 1):
        return Refusal(TORCHTUNE, "the optimizer step in backward is an option of torchtune's "
                                  "full_finetune_single_device only")
    if s.attention is not Attention.SDPA:
        return Refusal(TORCHTUNE, f"--attention {s.attention.value}: torchtune runs PyTorch "
                                  "SDPA")
    if spec.world_size > 1 and s.sharding is not Sharding.FSDP:
        return Refusal(TORCHTUNE, f"sharding {s.sharding.value} on {spec.world_size} GPUs: "
                                  "torchtune's distributed recipes shard with FSDP (full "
                                  "shard)")
    return None


# ------------------------------------------------------------------------------ both
def native_run(spec: LaunchSpec, model: ModelSpec | None) -> NativeRun | Refusal | None:
    """The framework's own run for the plan's recipe; None for a recipe train.py runs."""
    if spec.strategy.recipe is Recipe.LITGPT:
        return litgpt_run(spec)
    if spec.strategy.recipe is Recipe.TORCHTUNE:
        return torchtune_run(spec, model)
    return None


def render_native(spec: LaunchSpec, run: NativeRun) -> str:
    return render_yaml(run.config, header=(
        f"{run.tool} {run.version} config for plan {spec.plan_id} (--recipe {run.tool}: the "
        f"plan's memory is {run.tool}'s own layout).\nRun: "
        + " ".join(run.command[:-2] if run.tool == TORCHTUNE else run.command)
        + (" (checkpoint files and resume are set by the bundle's run lines, see RUN.md)"
           if run.tool == TORCHTUNE else "")))


def native_requirements(run: NativeRun) -> str:
    return "\n".join(run.requirements) + "\n"
