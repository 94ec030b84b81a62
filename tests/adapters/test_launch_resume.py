"""The generated train.py really resumes: runs it on the CPU with a tiny random Llama.

An uninterrupted run and an interrupted one (SIGTERM inside a step, then relaunched) must end
with bit-identical weights, identical per-step learning rates, and every sample trained on
exactly once; checkpoints without their marker are ignored; a LoRA resume keeps the adapter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import HANG_GUARD_S, wait_until

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.adapters.launch_files import read_train_script
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import MARKER_NAME, render_bundle

pytestmark = pytest.mark.probe
FIXTURES = Path(__file__).parent.parent / "fixtures" / "launch"
TINY_LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64}
ROWS = 40           # 40 rows / (batch 2 x accumulation 2) = 10 optimizer steps


def _bundle(tmp: Path, method: str, name: str) -> Path:
    """A real bundle from the 8B QLoRA fixture plan, with its config adapted to the CPU: a
    tiny random Llama, synthetic rows, fp32, frequent checkpoints."""
    doc = json.loads((FIXTURES / "plan_llama8b_qlora_aws.json").read_text())
    plan = saved_plan_from_entry({"job": doc["job"], "model": doc.get("model"),
                                  **doc["plans"][0]})
    files = render_bundle(plan, ["accelerate"], train_script=read_train_script())
    folder = tmp / name
    folder.mkdir()
    for rel, text in files.items():
        (folder / rel).write_text(text)
    cfg = json.loads(files["train_config.json"])
    cfg.update(model_config=TINY_LLAMA, method=method, precision="fp32", batch_size=2,
               grad_accum=2, seq_len=16, gradient_checkpointing=False, save_steps=3,
               output_dir=str(folder / "ckpt"), learning_rate=1e-2, warmup_steps=2,
               dataset={"kind": "synthetic", "rows": ROWS, "vocab_size": 64, "seed": 1})
    (folder / "train_config.json").write_text(json.dumps(cfg))
    return folder


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TUNEPLAN_CHECKPOINT_DIR", "TUNEPLAN_FAULT_SIGTERM_AT_STEP")}
    env |= {"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
            "OMP_NUM_THREADS": "1"} | extra
    return env


def _run(folder: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "train.py", "--config", "train_config.json"],
                          cwd=folder, env=_env(**extra), capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)


def _progress(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "ckpt" / "progress.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _final(folder: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "ckpt" / "final" / name))


def _assert_same_run(a: Path, b: Path, weights: str) -> None:
    import torch

    wa, wb = _final(a, weights), _final(b, weights)
    assert wa.keys() == wb.keys() and wa
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert different == []
    pa, pb = _progress(a), _progress(b)
    assert [p["step"] for p in pb] == list(range(1, 11))
    assert [p["lr"] for p in pa] == [p["lr"] for p in pb]
    assert [p["sample_ids"] for p in pa] == [p["sample_ids"] for p in pb]
    seen = [i for p in pb for i in p["sample_ids"]]
    assert sorted(seen) == list(range(ROWS))  # each sample exactly once, none skipped


@pytest.fixture(scope="module")
def full_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = _bundle(tmp_path_factory.mktemp("full"), "full", "reference")
    done = _run(folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def test_sigterm_inside_a_step_then_resume_matches_an_uninterrupted_run(
        full_reference: Path, tmp_path: Path) -> None:
    folder = _bundle(tmp_path, "full", "interrupted")
    # SIGTERM arrives in step 5 between its two micro-batches' forward/backward passes.
    first = _run(folder, TUNEPLAN_FAULT_SIGTERM_AT_STEP="5")
    assert first.returncode == 143, first.stderr[-2000:]
    assert "Traceback" not in first.stderr
    marker = json.loads((folder / "ckpt" / "checkpoint-4" / MARKER_NAME).read_text())
    assert marker["reason"] == "sigterm" and marker["step"] == 4
    assert "optimizer.pt" in marker["files"] and "rng_state.pth" in marker["files"]
    # A newer checkpoint without its marker (the machine died while saving) must be ignored.
    fake = folder / "ckpt" / "checkpoint-9"
    fake.mkdir()
    (fake / "model.safetensors").write_bytes(b"half a file")
    second = _run(folder)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "ignoring checkpoint-9" in second.stderr
    assert "resuming from checkpoint-4" in second.stderr
    _assert_same_run(full_reference, folder, "model.safetensors")


def _interrupt_from_outside(folder: Path, after_steps: int) -> str:
    """Start train.py, send SIGTERM once ``after_steps`` steps are logged (wherever the run
    is then: in a step or between two), return its stderr."""
    proc = subprocess.Popen([sys.executable, "train.py", "--config", "train_config.json"],
                            cwd=folder, env=_env(), stderr=subprocess.PIPE, text=True)
    progress = folder / "ckpt" / "progress.jsonl"
    wait_until(lambda: proc.poll() is not None or (
        progress.exists() and len(progress.read_text().splitlines()) >= after_steps),
        f"{after_steps} logged steps", poll_s=0.005)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 143, stderr[-2000:]
    return stderr


def test_lora_survives_two_interruptions_and_keeps_the_adapter(tmp_path: Path) -> None:
    reference = _bundle(tmp_path, "lora", "reference")
    assert _run(reference).returncode == 0
    folder = _bundle(tmp_path, "lora", "interrupted")
    _interrupt_from_outside(folder, after_steps=3)
    # Second interruption while step 8 updates the weights: the save waits for the step's end.
    update = _run(folder, TUNEPLAN_FAULT_SIGTERM_AT_STEP="8:update")
    assert update.returncode == 143, update.stderr[-2000:]
    marker = json.loads((folder / "ckpt" / "checkpoint-8" / MARKER_NAME).read_text())
    assert marker["reason"] == "sigterm" and "adapter_model.safetensors" in marker["files"]
    # Remove that marker: the resume must fall back to the checkpoint before it.
    (folder / "ckpt" / "checkpoint-8" / MARKER_NAME).unlink()
    last = _run(folder)
    assert last.returncode == 0, last.stderr[-2000:]
    assert "ignoring checkpoint-8" in last.stderr
    _assert_same_run(reference, folder, "adapter_model.safetensors")
    adapter = _final(folder, "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # trained, not re-initialised


def _word_tokenizer_and_train(tmp_path: Path) -> Any:
    """A local word-level tokenizer saved under tmp_path/tok, and the bundle's train.py as a
    module."""
    import importlib.util

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "</s>", "a", "b", "c", "d", "e"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "train.py").write_text(read_train_script())
    spec = importlib.util.spec_from_file_location("bundle_train_data", tmp_path / "train.py")
    assert spec and spec.loader
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def _jsonl_cfg(tmp_path: Path, data: Path, **extra: Any) -> dict[str, Any]:
    return {"model_name_or_path": str(tmp_path / "tok"), "seq_len": 4, "packing": True,
            "dataset": {"kind": "jsonl", "path": str(data), "text_field": "text",
                        "cache_dir": str(tmp_path / "tokenised")}} | extra


def test_jsonl_rows_are_packed_or_cut_at_seq_len(tmp_path: Path) -> None:
    """The real-data path: a local tokenizer, texts joined with EOS and cut into seq_len rows
    (packing: TRL's ``wrapped``), or each text cut at seq_len (no packing), in a
    ``datasets.Dataset`` memory-mapped from the Arrow file it was tokenised into once."""
    from datasets.table import MemoryMappedTable

    train = _word_tokenizer_and_train(tmp_path)
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a b c"}\n{"text": "d e"}\n\n{"text": "a a a a a"}\n')
    cfg = _jsonl_cfg(tmp_path, data)
    packed, pad = train.build_dataset(cfg)
    assert isinstance(packed.data, MemoryMappedTable)  # read from disk, not held in memory
    assert [Path(f["filename"]).name for f in packed.cache_files] == [train.ARROW_FILE]
    assert str(packed.features["input_ids"].feature.dtype) == "uint16"
    # a b c </s> | d e </s> a | a a a a  (the last 2 tokens do not fill a row: dropped)
    assert [packed[i]["input_ids"] for i in range(len(packed))] == [
        [2, 3, 4, 1], [5, 6, 1, 2], [2, 2, 2, 2]]
    assert packed["sample_id"] == [0, 1, 2]
    assert pad == 1  # no pad token: EOS pads
    with pytest.raises(IndexError):
        packed[3]
    again, _ = train.build_dataset(cfg)  # the tokenised files are reused, not rebuilt
    assert len(list((tmp_path / "tokenised").iterdir())) == 1 and len(again) == 3
    cut, _ = train.build_dataset(cfg | {"packing": False})
    assert [cut[i]["input_ids"] for i in range(len(cut))] == [[2, 3, 4, 1], [5, 6, 1],
                                                              [2, 2, 2, 2]]
    batch = train.make_collator(pad)([cut[1], cut[0]])
    assert batch["labels"][0].tolist() == [5, 6, 1, -100]  # padding is not trained on
    assert batch["sample_ids"].tolist() == [1, 0]


def test_tokenising_memory_stays_flat_as_the_data_grows(tmp_path: Path) -> None:
    """Peak Python-side allocation (tracemalloc: lists, ints, numpy buffers) while tokenising
    a file 10x larger stays about the same: tokens go to disk batch by batch, not into one
    list. Holding every token as a Python list would grow it 10x."""
    import tracemalloc

    train = _word_tokenizer_and_train(tmp_path)
    peaks = []
    for lines in (3 * train.TOKENISE_BATCH_LINES, 30 * train.TOKENISE_BATCH_LINES):
        data = tmp_path / f"train{lines}.jsonl"
        data.write_text('{"text": "a b c d e a b c d e a b"}\n' * lines)
        cfg = _jsonl_cfg(tmp_path, data, seq_len=8)
        tracemalloc.start()
        rows, _ = train.build_dataset(cfg)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(rows) == lines * 13 // 8  # 12 words + EOS per line, packed into rows of 8
        assert rows[len(rows) - 1]["input_ids"] == rows[len(rows) - 1]["input_ids"][:8]
    small, large = peaks
    assert large < 2 * small, peaks
