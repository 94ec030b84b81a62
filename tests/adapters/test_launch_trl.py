"""The bundle's train.py on TRL: the plan's settings read back from the SFTConfig and PEFT
config it builds, and SFTTrainer taking the memory-mapped rows as they are."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.launch_drill import TINY_LLAMA, plan_entry, write_bundle

pytest.importorskip("trl")
pytest.importorskip("peft")

pytestmark = pytest.mark.probe
QLORA = ("plan_llama8b_qlora_aws.json", "b9d2e2d7f4db")       # qlora, ddp, 1 GPU
QLORA_FP16 = ("plan_llama8b_qlora_aws.json", "591488aa26ff")  # qlora, fp16-mixed
ZERO3 = ("plan_llama70b_full_aws.json", "f838284b7b65")       # full, ZeRO-3, offload
CASES = {  # name: (plan, strategy changes)
    "qlora": (QLORA, {}),
    "qlora-fp16-packed-paged": (QLORA_FP16, {"packing": True, "optimizer": "paged-adamw8bit",
                                             "grad_accum": 4, "seq_len": 1024}),
    "dora-no-recompute": (QLORA, {"method": "dora", "checkpointing": "none", "lora_rank": 8,
                                  "lora_alpha": 8, "lora_dropout": 0.05,
                                  "lora_targets": ["q_proj", "v_proj"]}),
    "full-zero3": (ZERO3, {}),
    "full-fsdp-accumulating": (ZERO3, {"sharding": "fsdp", "grad_accum": 4}),
    "lisa": (ZERO3, {"method": "lisa", "sharding": "ddp", "offload": "none", "gpus": 1,
                     "lisa_layers": 1, "lisa_interval": 2}),
    "full-galore": (ZERO3, {"sharding": "ddp", "offload": "none", "optimizer": "galore-adamw",
                            "galore_rank": 8, "galore_update_proj_gap": 50,
                            "galore_scale": 0.5}),
}


def _module(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"bundle_train_{folder.name}",
                                                  folder / "train.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bundle(tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the plan's strategy, the bundle's train_config.json as emitted, its train.py)."""
    (doc, plan_id), changes = CASES[name]
    entry = plan_entry(doc, plan_id, **changes)
    files = write_bundle(tmp_path / name, entry, ("accelerate",))
    del files  # write_bundle adapts train_config.json to the CPU; read the emitted one
    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec, train_config

    cfg = train_config(launch_spec(saved_plan_from_entry(entry)))
    cfg |= {"output_dir": str(tmp_path / name / "out"), "deepspeed": None}
    return entry["strategy"], cfg, _module(tmp_path / name)


def _tokenizer_and_rows(tmp_path: Path, rows: int) -> Path:
    """A word-level tokenizer of eight letters saved at ``tmp_path/tok`` and ``rows`` JSONL
    texts of seven of them at ``tmp_path/train.jsonl`` (returned): what a tiny run trains on."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "</s>", *"abcdefgh"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(str(tmp_path / "tok"))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": "a b c d e f g"}) + "\n" for _ in range(rows)))
    return data


@pytest.mark.parametrize("name", list(CASES))
def test_the_plan_maps_onto_sftconfig(name: str, tmp_path: Path) -> None:
    from trl import SFTConfig

    s, cfg, train = _bundle(tmp_path, name)
    args = train.training_arguments(cfg)
    assert isinstance(args, SFTConfig)
    assert args.per_device_train_batch_size == s["batch_size"]
    assert args.gradient_accumulation_steps == s["grad_accum"]
    assert args.max_length == s["seq_len"]
    assert args.packing is s["packing"] and args.packing_strategy == "wrapped"
    assert args.padding_free is False and args.completion_only_loss is False
    # Prepared once by train.py: SFTTrainer must not tokenise or pack it again.
    assert args.dataset_kwargs == {"skip_prepare_dataset": True}
    recompute = s["checkpointing"] != "none"
    assert args.activation_checkpointing is recompute  # TRL's own default is True
    assert args.gradient_checkpointing is recompute
    assert args.bf16 is (s["precision"] in ("bf16-mixed", "bf16"))  # TRL's default: True
    assert args.fp16 is (s["precision"] == "fp16-mixed")
    assert args.optim.value == {"adamw": "adamw_torch_fused", "paged-adamw8bit": "paged_adamw_8bit",
                                "galore-adamw": "galore_adamw"}[s["optimizer"]]
    if s["optimizer"].startswith("galore"):
        assert args.optim_target_modules == [r".*.attn.*", r".*.mlp.*"]
        assert args.optim_args == "rank=8,update_proj_gap=50,scale=0.5"
    else:
        assert args.optim_target_modules is None and args.optim_args is None
    assert args.logging_steps == 1  # TRL's default is 10
    assert args.save_steps == cfg["save_steps"] and args.seed == cfg["seed"]
    assert args.learning_rate == cfg["learning_rate"]
    # FSDP with accumulation syncs each micro-batch (no unsharded gradients under no_sync),
    # as the plan's memory assumes; the Trainer reads it from the accelerator config.
    sync = args.accelerator_config.gradient_accumulation_kwargs
    if s["sharding"] in ("fsdp", "fsdp-grad-op", "hybrid") and s["grad_accum"] > 1:
        assert sync == {"sync_each_batch": True}
    else:
        assert not (sync or {}).get("sync_each_batch")


@pytest.mark.parametrize("name", ["dora-no-recompute", "qlora"])
def test_the_adapter_config_is_the_plans(name: str, tmp_path: Path) -> None:
    """The PEFT config on the model train.py builds (a tiny random Llama here; the QLoRA
    plan's adapter over an unquantised base, its BitsAndBytesConfig checked apart)."""
    import torch

    s, cfg, train = _bundle(tmp_path, name)
    tiny = cfg | {"model_config": TINY_LLAMA, "precision": "fp32",
                  "method": "lora" if s["method"] == "qlora" else s["method"]}
    lora = train.build_model(tiny).peft_config["default"]
    assert lora.r == s["lora_rank"] and lora.lora_alpha == s["lora_alpha"]
    assert lora.lora_dropout == s["lora_dropout"]
    assert lora.use_dora is (s["method"] == "dora")
    # PEFT expands all-linear into the names of every linear but the output head.
    every_linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    expected = every_linear if "all-linear" in s["lora_targets"] else set(s["lora_targets"])
    assert {name.rsplit(".", 1)[-1] for name in lora.target_modules} == expected
    if s["method"] == "qlora":
        q = train._quantization(cfg, torch.bfloat16)
        assert q.load_in_4bit and q.bnb_4bit_quant_type == s["quant"]
        assert q.bnb_4bit_use_double_quant is s["double_quant"]


def test_sfttrainer_takes_the_memory_mapped_rows_as_they_are(tmp_path: Path) -> None:
    """Tokenised JSONL rows reach SFTTrainer as the same Arrow-backed dataset (no
    ``Dataset.map`` copy in each process), and its batches keep the sample ids."""
    from datasets.table import MemoryMappedTable

    _, cfg, train = _bundle(tmp_path, "qlora-fp16-packed-paged")
    data = _tokenizer_and_rows(tmp_path, 6)
    cfg |= {"model_name_or_path": str(tmp_path / "tok"), "model_config": TINY_LLAMA,
            "method": "lora", "precision": "fp32", "optimizer": "adamw", "seq_len": 4,
            "batch_size": 2, "grad_accum": 1, "gradient_checkpointing": False,
            "dataset": {"kind": "jsonl", "path": str(data), "text_field": "text",
                        "cache_dir": str(tmp_path / "tokenised")}}
    tok = train.build_tokenizer(cfg)
    rows, pad = train.build_dataset(cfg, tok)
    assert len(rows) == 6 * 8 // 4  # 7 words + EOS per text, packed into rows of 4
    args = train.training_arguments(cfg)
    trainer = train.make_trainer(train.build_model(cfg), args, rows, train.make_collator(pad),
                                 train.make_guard(cfg, tmp_path / "progress.jsonl"), tok)
    assert trainer.train_dataset is rows and isinstance(rows.data, MemoryMappedTable)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape == (2, 4)
    ids = batch["sample_ids"].tolist()
    assert len(ids) == 2 and set(ids) <= set(range(len(rows)))


def test_a_chunked_loss_plan_runs_ligers_fused_loss_and_says_it_needs_a_gpu(
        tmp_path: Path) -> None:
    """SFTConfig(use_liger_kernel=True) itself needs CUDA and liger-kernel, so on this CPU
    machine the check is the refusal before any step, the requirement and the config."""
    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec
    from tuneplan.core.launch.engines import requirements

    (doc, plan_id), _ = CASES["qlora"]
    for loss, fused in (("chunked", True), ("standard", False), (None, False)):
        entry = plan_entry(doc, plan_id, loss=loss)
        spec = launch_spec(saved_plan_from_entry(entry))
        assert ("liger-kernel>=0.5" in requirements(spec, deepspeed=False).split()) is fused
        name = f"qlora-{loss}"
        CASES[name] = ((doc, plan_id), {"loss": loss})
        try:
            _, cfg, train = _bundle(tmp_path, name)
        finally:
            del CASES[name]
        assert cfg["loss"] == ("chunked" if fused else "standard")
        if fused:
            with pytest.raises(SystemExit, match=r"chunked \(fused\) loss, which runs on a GPU"):
                train.training_arguments(cfg)
        else:
            assert train.training_arguments(cfg).use_liger_kernel is False


def test_a_galore_plan_starts_galore_torch_and_resumes_its_state(tmp_path: Path) -> None:
    """The HF Trainer takes the GaLore plan's arguments as train.py sets them and builds
    galore-torch's optimizer (rank, gap and scale as planned, on the attention and MLP linears
    of a tiny random Llama); one step is saved and a second run resumes from it through the
    Trainer's own weights-only loader, which only train.py's allow-list lets read the
    projectors."""
    pytest.importorskip("galore_torch")
    import torch
    from galore_torch import GaLoreAdamW

    _, cfg, train = _bundle(tmp_path, "full-galore")
    data = _tokenizer_and_rows(tmp_path, 4)
    cfg |= {"model_name_or_path": str(tmp_path / "tok"), "model_config": TINY_LLAMA,
            "precision": "fp32", "seq_len": 4, "batch_size": 2, "grad_accum": 1,
            "gradient_checkpointing": False, "save_steps": 1, "max_steps": 1,
            "dataset": {"kind": "jsonl", "path": str(data), "text_field": "text",
                        "cache_dir": str(tmp_path / "tokenised")}}
    tok = train.build_tokenizer(cfg)
    rows, pad = train.build_dataset(cfg, tok)

    def trainer_for(max_steps: int) -> Any:
        args = train.training_arguments(cfg | {"max_steps": max_steps})
        guard = train.make_guard(cfg, tmp_path / "progress.jsonl")
        trainer = train.make_trainer(train.build_model(cfg), args, rows,
                                     train.make_collator(pad), guard, tok)
        guard.trainer = trainer  # as main() does
        return trainer

    first = trainer_for(1)
    optimizer = first.create_optimizer()
    assert type(optimizer) is GaLoreAdamW
    plain, projected = optimizer.param_groups
    assert (projected["rank"], projected["update_proj_gap"], projected["scale"],
            projected["proj_type"]) == (8, 50, 0.5, "std")
    names = {id(p): n for n, p in first.model.named_parameters()}
    # 2 blocks x (q, k, v, o, gate, up, down) weights; embeddings, norms and head stay plain
    assert sorted(names[id(p)].split(".")[-2] for p in projected["params"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] * 2)
    assert "lm_head.weight" in {names[id(p)] for p in plain["params"]}
    first.train()
    ckpt = Path(cfg["output_dir"]) / "checkpoint-1"
    state = torch.load(ckpt / "optimizer.pt", weights_only=False)["state"]
    assert sum(1 for s in state.values() if "projector" in s) == 14
    # the Trainer's own resume path (torch.load weights_only=True) reads it back
    second = trainer_for(2)
    second.train(resume_from_checkpoint=str(ckpt))
    assert second.state.global_step == 2
    resumed = [s for s in second.optimizer.state.values() if "projector" in s]
    assert len(resumed) == 14 and all(s["step"] == 2 for s in resumed)


def test_a_lisa_plan_trains_k_blocks_and_keeps_only_their_optimizer_state(
        tmp_path: Path) -> None:
    """train.py's LISA switch on a tiny random 4-block Llama through the real Trainer: after
    the blocks switch, exactly one block (--lisa-layers 1) plus the embedding, final norm and
    head require grad and hold AdamW state, and those state bytes are the estimate's
    ``optimizer/states`` for the same job."""
    import torch

    from tuneplan.core.job.methods import Method
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.job.strategy import Checkpointing, Precision, Strategy
    from tuneplan.core.memory import estimate_memory
    from tuneplan.core.models import parse_model_config

    _, cfg, train = _bundle(tmp_path, "lisa")
    assert cfg["lisa"] == {"layers": 1, "interval": 2}
    data = _tokenizer_and_rows(tmp_path, 8)
    four = TINY_LLAMA | {"num_hidden_layers": 4, "architectures": ["LlamaForCausalLM"]}
    cfg |= {"model_name_or_path": str(tmp_path / "tok"), "model_config": four,
            "precision": "fp32", "seq_len": 4, "batch_size": 1, "grad_accum": 1,
            "gradient_checkpointing": False, "save_steps": 1000, "max_steps": 5,
            "dataset": {"kind": "jsonl", "path": str(data), "text_field": "text",
                        "cache_dir": str(tmp_path / "tokenised")}}
    tok = train.build_tokenizer(cfg)
    rows, pad = train.build_dataset(cfg, tok)
    args = train.training_arguments(cfg)
    guard = train.make_guard(cfg, tmp_path / "progress.jsonl")
    model = train.build_model(cfg)
    trainer = train.make_trainer(model, args, rows, train.make_collator(pad), guard, tok,
                                 cfg["lisa"] | {"seed": cfg["seed"]})
    guard.trainer = trainer
    switch = next(c for c in trainer.callback_handler.callbacks if hasattr(c, "choose"))
    draws = [switch.choose(step) for step in (0, 2, 4)]
    assert draws[0] != draws[-1]  # the run's seed switches blocks at step 4
    trainer.train()
    assert trainer.state.global_step == 5 and switch.active == draws[-1]
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    block = f"model.layers.{draws[-1][0]}."
    assert trains == {n for n, _ in model.named_parameters()
                      if n.startswith(block) or not n.startswith("model.layers.")}
    names = {id(p): n for n, p in model.named_parameters()}
    held = trainer.optimizer.optimizer.state if hasattr(trainer.optimizer, "optimizer") \
        else trainer.optimizer.state
    assert {names[id(p)] for p in held} == trains  # the blocks that stopped: no state left
    moments = sum(t.untyped_storage().nbytes() for s in held.values()
                  for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))
    strategy = Strategy(method=Method.LISA, recipe=Recipe.PLAIN, precision=Precision.FP32,
                        lisa_layers=1, seq_len=4, checkpointing=Checkpointing.NONE)
    est = estimate_memory(parse_model_config(four | {"rms_norm_eps": 1e-6}, name="tiny"),
                          strategy)
    assert int(est.breakdown.value("optimizer/states")) == moments
    assert est.trainable_params == sum(p.numel() for n, p in model.named_parameters()
                                       if n in trains)
    assert torch.is_grad_enabled()


def test_a_freeze_plan_trains_the_blocks_norm_and_modules_the_estimate_counts(
        tmp_path: Path) -> None:
    """train.py's freeze on a tiny random 4-block Llama through the real SFTTrainer: the last
    2 blocks, the final norm and ``--trainable-modules lm_head`` require grad, nothing else;
    their count is the estimate's ``trainable_params`` for the same job exactly, and after
    two steps only they hold AdamW state. Under bf16-mixed the trainable ones are fp32 and
    the frozen rest bf16 (the estimate's trainable and frozen weight widths)."""
    import torch

    from tuneplan.core.job.methods import Method
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.job.strategy import Checkpointing, Precision, Strategy
    from tuneplan.core.memory import estimate_memory
    from tuneplan.core.models import parse_model_config

    (doc, plan_id) = ZERO3
    entry = plan_entry(doc, plan_id, method="freeze", sharding="ddp", offload="none", gpus=1,
                       trainable_layers=2, trainable_modules=["lm_head"])
    write_bundle(tmp_path / "freeze", entry, ("accelerate",))
    from tuneplan.adapters.plans import saved_plan_from_entry
    from tuneplan.core.launch.bundle import launch_spec, train_config

    cfg = train_config(launch_spec(saved_plan_from_entry(entry)))
    assert cfg["freeze"] == {"last_blocks": 2, "modules": ["lm_head"],
                             "final_norm": ["norm", "ln_f", "final_layer_norm",
                                            "final_layernorm"]}
    train = _module(tmp_path / "freeze")
    data = _tokenizer_and_rows(tmp_path, 4)
    four = TINY_LLAMA | {"num_hidden_layers": 4, "architectures": ["LlamaForCausalLM"]}
    strategy = Strategy(method=Method.FREEZE, recipe=Recipe.PLAIN, precision=Precision.FP32,
                        trainable_layers=2, trainable_modules=("lm_head",), seq_len=4,
                        checkpointing=Checkpointing.NONE)
    planned = estimate_memory(parse_model_config(four | {"rms_norm_eps": 1e-6}, name="tiny"),
                              strategy).trainable_params
    cfg |= {"model_name_or_path": str(tmp_path / "tok"), "model_config": four,
            "output_dir": str(tmp_path / "out"), "deepspeed": None, "trainable_params": planned,
            "precision": "fp32", "seq_len": 4, "batch_size": 1, "grad_accum": 1,
            "gradient_checkpointing": False, "save_steps": 1000, "max_steps": 2,
            "dataset": {"kind": "jsonl", "path": str(data), "text_field": "text",
                        "cache_dir": str(tmp_path / "tokenised")}}
    tok = train.build_tokenizer(cfg)
    rows, pad = train.build_dataset(cfg, tok)
    guard = train.make_guard(cfg, tmp_path / "progress.jsonl")
    model = train.build_model(cfg)
    trainer = train.make_trainer(model, train.training_arguments(cfg), rows,
                                 train.make_collator(pad), guard, tok)
    guard.trainer = trainer
    trainer.train()
    assert trainer.state.global_step == 2
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains == {n for n, _ in model.named_parameters()
                      if n.startswith(("model.layers.2.", "model.layers.3.", "model.norm.",
                                       "lm_head."))}
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == planned
    names = {id(p): n for n, p in model.named_parameters()}
    held = trainer.optimizer.optimizer.state if hasattr(trainer.optimizer, "optimizer") \
        else trainer.optimizer.state
    assert {names[id(p)] for p in held} == trains
    mixed = train.build_model(cfg | {"precision": "bf16-mixed"})
    assert {p.dtype for p in mixed.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in mixed.parameters() if not p.requires_grad} == {torch.bfloat16}
    # a tied head is the embedding's Parameter: naming both trains (and counts) it once
    tied = four | {"tie_word_embeddings": True}
    both = ("embed_tokens", "lm_head")
    planned = estimate_memory(
        parse_model_config(tied | {"rms_norm_eps": 1e-6}, name="tiny-tied"),
        Strategy(method=Method.FREEZE, recipe=Recipe.PLAIN, precision=Precision.FP32,
                 trainable_layers=2, trainable_modules=both, seq_len=4,
                 checkpointing=Checkpointing.NONE)).trainable_params
    model = train.build_model(cfg | {"model_config": tied, "freeze": cfg["freeze"] | {
        "modules": list(both)}})
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == planned


@pytest.mark.parametrize("wait", [True, False])
def test_train_py_leaves_the_process_group_before_it_exits(tmp_path: Path, wait: bool) -> None:
    """A rank that exits with its process group alive can take the rendezvous store down
    under another rank still finishing (seen: SIGABRT, "terminate called without an active
    exception", on a finished 2-node run): train.py destroys the group at the end, after a
    barrier when the run finished, without one after SIGTERM."""
    import torch.distributed as dist

    _, _, train = _bundle(tmp_path, "qlora-fp16-packed-paged")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        assert dist.is_initialized()
        train.leave_process_group(wait=wait)
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    train.leave_process_group(wait=wait)  # no group: nothing to do, no error
