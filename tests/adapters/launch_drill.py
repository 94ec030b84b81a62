"""Real launch bundles adapted to run on the CPU with a tiny random Llama (no download).

A bundle is rendered from a fixture plan (its strategy changed where a test says so); only
``train_config.json`` is adapted: the tiny model, synthetic rows, a few steps. The engine
files (accelerate config, DeepSpeed JSON, preemptible.sh, launch scripts) stay as emitted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tuneplan.adapters.launch_files import read_train_script
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import render_bundle

FIXTURES = Path(__file__).parent.parent / "fixtures" / "launch"
TINY_LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64}
VENV_BIN = str(Path(sys.executable).parent)


def plan_entry(doc: str, plan_id: str, **strategy: Any) -> dict[str, Any]:
    data = json.loads((FIXTURES / doc).read_text())
    entry = next(p for p in data["plans"] if p["id"] == plan_id)
    out = {"job": data["job"], "model": data.get("model"), **entry}
    out["strategy"] = out["strategy"] | strategy
    return out


def write_bundle(folder: Path, entry: dict[str, Any], targets: tuple[str, ...] = ("all",),
                 **config: Any) -> dict[str, str]:
    """The bundle's files written into ``folder``; ``train_config.json`` set for the CPU
    (tiny model, fp32, synthetic rows, checkpoints every 2 steps) and then ``config``."""
    files = render_bundle(saved_plan_from_entry(entry), list(targets),
                          train_script=read_train_script())
    folder.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (folder / rel).write_text(text)
    cfg = json.loads(files["train_config.json"])
    cfg.update(model_config=TINY_LLAMA, precision="fp32", batch_size=1, grad_accum=1,
               seq_len=16, gradient_checkpointing=False, save_steps=2, epochs=1,
               output_dir=str(folder / "ckpt"), learning_rate=1e-2, warmup_steps=0,
               dataset={"kind": "synthetic", "rows": 8, "vocab_size": 64, "seed": 1})
    cfg.update(config)
    (folder / "train_config.json").write_text(json.dumps(cfg))
    files["train_config.json"] = json.dumps(cfg)
    return files


def cpu_env(**extra: str) -> dict[str, str]:
    """The environment of a CPU run: no GPU, no hub, the venv's launchers on PATH, no
    inherited checkpoint or drill settings."""
    drop = ("TUNEPLAN_CHECKPOINT_DIR", "TUNEPLAN_FAULT_SIGTERM_AT_STEP",
            "TUNEPLAN_FAULT_HOLD_AT_STEP", "TUNEPLAN_PREEMPTED_FILE", "RANK", "WORLD_SIZE",
            "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
            "OMP_NUM_THREADS": "1", "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"}
    return env | extra
