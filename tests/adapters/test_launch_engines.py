"""The engines of a launch bundle really start, on the CPU, with the files as emitted.

- DeepSpeed (CPU accelerator, gloo): ``deepspeed.initialize`` with the ZeRO-2, ZeRO-3 and
  ZeRO-Offload JSONs, one optimizer step each; then the bundle's train.py through the HF
  Trainer's DeepSpeed integration, whose final model must match its last ZeRO checkpoint.
- DDP over 2 processes with the bundle's own ``launch_accelerate.sh`` (accelerate launch ->
  torch elastic): SIGTERM to the running launch gives exit 143 (the launcher itself returns
  1), and the resumed run ends bit-identical to an uninterrupted one, its ``final/`` loading
  with ``from_pretrained``.
- FSDP: accelerate 1.x does not run FSDP on the CPU (``AcceleratorState`` makes a run FSDP
  only for GPU-type distributed modes, and ``FullyShardedDataParallelPlugin`` with
  ``sync_module_states`` asks for a GPU device), so train.py's final save is driven through
  transformers' own FSDP branch of ``Trainer.save_model`` with a real plugin instead.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.adapters.launch_drill import TINY_LLAMA, cpu_env, plan_entry, write_bundle
from tests.waiting import HANG_GUARD_S, wait_until

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.probe
ZERO_PLAN = ("plan_llama70b_full_aws.json", "f838284b7b65")  # full, ZeRO-3, optimizer offload
FSDP_PLAN = ("plan_llama70b_full_aws.json", "b53c1e65f5d9")  # full, FSDP, 8 GPUs
#: The batch write_bundle trains with, in the plan too, so the DeepSpeed JSON agrees with it.
ONE_ROW = {"batch_size": 1, "grad_accum": 1}


def _load(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


# ------------------------------------------------------------------------------ DeepSpeed
ZERO_CASES = {  # name: (strategy changes, the optimizer the Trainer makes: torch's)
    "zero2": ({"sharding": "zero2", "offload": "none"}, "AdamW"),
    "zero3": ({"sharding": "zero3", "offload": "none"}, "AdamW"),
    "zero3-offload-adamw": ({}, "AdamW"),
    "zero3-offload-params": ({"offload": "optimizer+params"}, "AdamW"),
    "zero2-offload-sgd": ({"sharding": "zero2", "optimizer": "sgd"}, "SGD"),
}
OFFLOADED = ("zero3-offload-adamw", "zero3-offload-params", "zero2-offload-sgd")

DS_INITIALIZE = r'''
import json, os, sys
import torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
import deepspeed
from deepspeed.runtime.zero.utils import ZeRORuntimeException
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

sys.path.insert(0, sys.argv[1])
import train  # the bundle's own train.py: its TrainingArguments fill DeepSpeed's "auto"s

def tiny(cfg):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg["model_config"].items()
                                           if k != "model_type"}))

def start(cfg, config, client):
    """deepspeed.initialize as the Trainer calls it: the JSON's optimizer when it names one,
    else the Trainer's own (torch's) passed in."""
    model = tiny(cfg)
    if "optimizer" in config:
        return deepspeed.initialize(model=model, config=config,
                                    model_parameters=model.parameters())
    made = getattr(torch.optim, client)(model.parameters(), lr=1e-2)
    # transformers' deepspeed_optim_sched adds this beside the Trainer's own optimizer.
    config = config | {"zero_allow_untested_optimizer": True}
    return deepspeed.initialize(model=model, config=config, optimizer=made)

out = {}
for name, folder, client in json.loads(sys.argv[2]):
    cfg = json.load(open(os.path.join(folder, "train_config.json")))
    bridge = HfTrainerDeepSpeedConfig(json.load(open(os.path.join(folder, "ds_config.json"))))
    args = train.training_arguments(cfg | {"deepspeed": None})
    bridge.trainer_config_process(args)
    # the Trainer's second pass: the model's hidden size fills the bucket "auto"s
    bridge.trainer_config_finalize(args, tiny(cfg), 10)
    config = bridge.config
    zero = config.get("zero_optimization", {})
    unfixed = {k: v for k, v in config.items()
               if k not in ("optimizer", "zero_force_ds_cpu_optimizer")}
    if unfixed != config:  # the JSON without its fix must hit DeepSpeed's refusal
        try:
            start(cfg, unfixed, client)
            out[name + "/unfixed"] = "started"
        except ZeRORuntimeException as exc:
            out[name + "/unfixed"] = str(exc)
    engine, optimizer, _, _ = start(cfg, config, client)
    ids = torch.randint(0, cfg["model_config"]["vocab_size"], (1, 8))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    out[name] = {"stage": engine.zero_optimization_stage(), "loss": float(loss),
                 "optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
                 "offload": engine.zero_cpu_offload(), "steps": engine.global_steps,
                 "buckets": {k: zero[k] for k in ("reduce_bucket_size",
                                                  "stage3_prefetch_bucket_size",
                                                  "stage3_param_persistence_threshold")
                             if k in zero}}
print("RESULT " + json.dumps(out))
'''


def _need_deepspeed_cpu_adam() -> None:
    """DeepSpeed compiles its CPU Adam on first use (JIT, with ninja and a C++ compiler)."""
    import shutil

    pytest.importorskip("deepspeed")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: DeepSpeed cannot build its CPU Adam")
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        pytest.skip("no ninja: DeepSpeed cannot build its CPU Adam")


def _ds_env(port: int) -> dict[str, str]:
    return cpu_env(DS_ACCELERATOR="cpu", MASTER_PORT=str(port))


def test_deepspeed_initialises_every_emitted_zero_config(tmp_path: Path) -> None:
    _need_deepspeed_cpu_adam()
    cases = []
    for name, (changes, client) in ZERO_CASES.items():
        folder = tmp_path / name
        write_bundle(folder, plan_entry(*ZERO_PLAN, gpus=1, **ONE_ROW, **changes), ("deepspeed",),
                     precision="bf16-mixed")
        cases.append((name, str(folder), client))
    script = tmp_path / "ds_initialize.py"
    script.write_text(DS_INITIALIZE)
    done = subprocess.run([sys.executable, str(script), cases[0][1], json.dumps(cases)],
                          env=_ds_env(29611), capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    for name in ZERO_CASES:
        assert result[name]["steps"] == 1, name
        assert 0 < result[name]["loss"] < 10, name
    assert [result[n]["stage"] for n in ZERO_CASES] == [2, 3, 3, 3, 2]
    assert [result[n]["offload"] for n in ZERO_CASES] == [False, False, True, True, True]
    # The buckets the memory model assumes, filled by the Trainer from the hidden size (32)
    hidden = TINY_LLAMA["hidden_size"]
    assert result["zero2"]["buckets"] == {"reduce_bucket_size": hidden**2}
    assert result["zero3"]["buckets"] == {
        "reduce_bucket_size": hidden**2, "stage3_prefetch_bucket_size": int(0.9 * hidden**2),
        "stage3_param_persistence_threshold": 10 * hidden}
    # AdamW under offload is DeepSpeed's CPU Adam (named in the JSON), not torch's AdamW.
    assert result["zero3-offload-adamw"]["optimizer"] == "DeepSpeedCPUAdam"
    assert result["zero2-offload-sgd"]["optimizer"] == "SGD"  # the plan's own, honoured
    assert [result[n]["optimizer"] for n in ("zero2", "zero3")] == ["AdamW", "AdamW"]
    # Without the emitted fix, DeepSpeed refuses each offloaded start (the old bundles).
    for name in OFFLOADED:
        assert "ZeRO-Offload with a client provided optimizer" in result[name + "/unfixed"]
    assert not [k for k in result if k.endswith("/unfixed") and k[:-8] not in OFFLOADED]


def test_trainer_trains_under_zero3_offload_and_saves_a_loadable_model(tmp_path: Path) -> None:
    """The bundle's train.py through the HF Trainer's DeepSpeed integration (as
    launch_torchrun.sh runs it): final/ loads with from_pretrained and holds the weights of
    the last ZeRO checkpoint (gathered to 16 bits, so equal within bf16 rounding)."""
    _need_deepspeed_cpu_adam()
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "z3"
    write_bundle(folder, plan_entry(*ZERO_PLAN, gpus=1, **ONE_ROW), ("deepspeed",),
                 precision="bf16-mixed", max_steps=2)
    done = subprocess.run(
        [sys.executable, "train.py", "--config", "train_config.json",
         "--deepspeed", "ds_config.json"], cwd=folder,
        env=_ds_env(29612) | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                              "MASTER_ADDR": "127.0.0.1"},
        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = folder / "ckpt" / "checkpoint-2"
    assert (ckpt / "global_step2").is_dir()  # a real ZeRO checkpoint, not a plain one
    master = get_fp32_state_dict_from_zero_checkpoint(str(ckpt))
    model = AutoModelForCausalLM.from_pretrained(str(folder / "ckpt" / "final"))
    name = "model.layers.0.mlp.down_proj.weight"
    loaded = model.state_dict()[name].float()
    assert torch.allclose(loaded, master[name].float(), rtol=1e-2, atol=1e-3)
    torch.manual_seed(42)  # train.py's seed: the random initial model
    from transformers import AutoConfig

    initial = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_LLAMA))
    assert not torch.equal(loaded, initial.state_dict()[name].float())  # it trained


# ------------------------------------------------------------------------------ DDP, 2 ranks
DDP = {"gpus": 2, "sharding": "ddp", "offload": "none"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(folder: Path, **extra: str) -> subprocess.Popen[str]:
    """The bundle's own launch_accelerate.sh (preemptible.sh -> accelerate launch -> 2 ranks
    on gloo), checkpoints in the folder, stderr into ``launch.log``."""
    env = cpu_env(TUNEPLAN_CHECKPOINT_DIR=str(folder / "ckpt"), MASTER_PORT=str(_free_port()),
                  **extra)
    with (folder / "launch.log").open("w") as log:
        return subprocess.Popen(["bash", "launch_accelerate.sh"], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=log, text=True)


def _finish(proc: subprocess.Popen[str], folder: Path) -> tuple[int, str]:
    """(exit code, stderr) of a launch."""
    return proc.wait(timeout=HANG_GUARD_S), (folder / "launch.log").read_text()


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp") / "reference"
    write_bundle(folder, plan_entry(*FSDP_PLAN, **DDP), ("accelerate",))
    code, err = _finish(_launch(folder), folder)
    assert code == 0, err[-3000:]
    return folder


def _run_dir(folder: Path) -> Path:
    cfg = json.loads((folder / "train_config.json").read_text())
    return folder / "ckpt" / cfg["plan_id"]


def test_sigterm_to_the_launch_exits_143_and_the_resume_matches(
        ddp_reference: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "interrupted"
    write_bundle(folder, plan_entry(*FSDP_PLAN, **DDP), ("accelerate",))
    run = _run_dir(folder)
    proc = _launch(folder, TUNEPLAN_FAULT_HOLD_AT_STEP="3")
    wait_until(lambda: proc.poll() is not None or (run / "HOLDING").exists(),
               "rank 0 holding at step 3")
    proc.send_signal(signal.SIGTERM)  # to preemptible.sh, as a scheduler stops a task
    code, err = _finish(proc, folder)
    assert code == 143, err[-3000:]
    # torch's launcher exits 1 when the signal reaches it while its workers save, 143 when
    # they have already stopped (a busy machine): either way preemptible.sh turns it into 143
    # because train.py saved
    assert re.search(r"launcher exited (1|143) after train\.py saved on SIGTERM", err), err
    marker = json.loads((run / "checkpoint-3" / "TUNEPLAN_COMPLETE.json").read_text())
    assert marker["reason"] == "sigterm" and marker["world_size"] == 2
    assert all(len(entry["sha256"]) == 64 for entry in marker["files"].values())
    code, err = _finish(_launch(folder), folder)
    assert code == 0, err[-3000:]
    assert "resuming from checkpoint-3" in err
    done, reference = _load(run / "final" / "model.safetensors"), \
        _load(_run_dir(ddp_reference) / "final" / "model.safetensors")
    assert done.keys() == reference.keys() and done
    assert [k for k in done if not torch.equal(done[k], reference[k])] == []
    for rank in (0, 1):
        steps = [json.loads(line) for line in
                 (run / f"progress-rank{rank}.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == list(range(1, 5))  # 8 rows / 2 ranks
    model = AutoModelForCausalLM.from_pretrained(str(run / "final"))
    name = "model.layers.1.self_attn.o_proj.weight"
    assert torch.equal(model.state_dict()[name], reference[name])


# ------------------------------------------------------------------------------ FSDP save
def test_final_save_under_fsdp_writes_the_whole_model(tmp_path: Path) -> None:
    """train.py's save_final through transformers' FSDP branch of Trainer.save_model, with
    accelerate's real FSDP plugin as the bundle configures it (sharded state dicts): the
    plain save writes no weights (the old empty final/), save_final a loadable model."""
    import torch
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM

    files = write_bundle(tmp_path / "bundle", plan_entry(*FSDP_PLAN, gpus=2), ("accelerate",))
    spec = importlib.util.spec_from_file_location("bundle_train_fsdp",
                                                  tmp_path / "bundle" / "train.py")
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    cfg = json.loads(files["train_config.json"]) | {"deepspeed": None}
    emitted = yaml.safe_load(files["accelerate_config.yaml"])["fsdp_config"]
    fsdp = {k.removeprefix("fsdp_"): v for k, v in emitted.items()}
    assert fsdp["state_dict_type"] == "SHARDED_STATE_DICT"
    args = train.training_arguments(cfg)
    model = train.build_model(cfg)
    tok = train.build_tokenizer(cfg)
    rows, pad = train.build_dataset(cfg, tok)
    trainer = train.make_trainer(model, args, rows, train.make_collator(pad),
                                 train.make_guard(cfg, tmp_path / "p"), tok)
    plugin = FullyShardedDataParallelPlugin(
        state_dict_type=fsdp["state_dict_type"], sync_module_states=False,  # no GPU here
        use_orig_params=fsdp["use_orig_params"])
    try:
        trainer.is_fsdp_enabled = True
        trainer.accelerator.state.fsdp_plugin = plugin
        # One process: the full state dict FSDP would gather is the module's own.
        trainer.accelerator.get_state_dict = lambda m, *a, **k: m.state_dict()
        trainer.save_model(str(tmp_path / "plain"))
        assert not list((tmp_path / "plain").glob("*.safetensors"))  # the defect
        with pytest.raises(SystemExit, match="wrote no weights"):
            train.save_final(_NoSwitch(trainer), tmp_path / "plain")
        train.save_final(trainer, tmp_path / "final")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert "FULL_STATE_DICT" in str(plugin.state_dict_type)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(loaded.state_dict()[name], model.state_dict()[name])


class _NoSwitch:
    """A trainer seen as not FSDP-enabled by save_final (so it does not switch the state
    dict type): its save writes no weights, and save_final must say so."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        self.is_fsdp_enabled = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)
