"""`tuneplan models` and the CLI's error contract (one line on stderr, exit 2 for bad input)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]


def test_models_json_lists_every_bundled_model_with_exact_counts(run_cli: Run) -> None:
    result = run_cli("models", "--json")
    assert result.code == 0, result.stderr
    rows = {row["name"]: row for row in result.json()}
    assert len(rows) == 81  # with google-bert/bert-large-uncased
    assert rows["meta-llama/Llama-3.1-8B"]["total_params"] == 8_030_261_248
    assert rows["meta-llama/Llama-3.1-8B"]["alias"] == "llama-3.1-8b"
    mixtral = rows["mistralai/Mixtral-8x7B-v0.1"]
    assert mixtral["total_params"] == 46_702_792_704
    assert mixtral["active_params"] < mixtral["total_params"]


def test_models_table_renders(run_cli: Run) -> None:
    result = run_cli("models")
    assert result.code == 0 and "Qwen/Qwen2.5-0.5B" in result.stdout


def test_unsupported_model_type_is_exit_2_one_line(run_cli: Run, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "mamba", "hidden_size": 8}')
    result = run_cli("memory", str(tmp_path), "--json")
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "mamba" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_config_is_exit_2(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "llama", ')
    result = run_cli("memory", str(path))
    assert result.code == 2 and "not valid JSON" in result.stderr


def test_unknown_command_is_a_usage_error(run_cli: Run) -> None:
    result = run_cli("no-such-command")
    assert result.code == 2


def test_kimi_k2_remote_config_plans_lora_and_qlora(run_cli: Run, tmp_path: Path) -> None:
    """kimi_k2 (remote code) is parsed, not refused; its per-expert nn.Linear experts are
    quantized, so QLoRA's weights are far below LoRA's bf16 ones."""
    import json

    from tests.core.test_models_kimi_k2 import KIMI

    (tmp_path / "config.json").write_text(json.dumps(KIMI))

    def weights(method: str) -> int:
        doc = run_cli("memory", str(tmp_path), "--method", method, "--json").ok_json()
        assert doc["total_params"] == 1_026_408_232_448
        return sum(t["bytes"] for t in doc["per_gpu"]["terms"]
                   if t["name"].startswith("weights/") and t["name"] != "weights/adapters")

    assert weights("qlora") < weights("lora") * 3 // 10
