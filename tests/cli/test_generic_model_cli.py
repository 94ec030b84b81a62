"""The CLI says when a model's structure was read off transformers' module tree (the generic
path for a type tuneplan's parsers do not know)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult

pytestmark = pytest.mark.probe
pytest.importorskip("transformers")

Run = Callable[..., CliResult]
_COHERE = {"model_type": "cohere", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           "vocab_size": 128}


def test_cli_memory_json_and_table_name_the_structure(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_COHERE))
    doc = run_cli("memory", str(path), "--seq-len", "32", "--json").ok_json()
    assert doc["model"]["structure"] == "transformers-meta"
    assert doc["model"]["structure_confidence"] == "medium"
    assert any("meta device" in note for note in doc["notes"])
    table = run_cli("memory", str(path), "--seq-len", "32")
    assert table.code == 0 and "transformers-meta" in table.stdout
    speed = run_cli("throughput", str(path), "--seq-len", "32", "--gpu", "H100", "--json")
    assert any("meta device" in note for note in speed.ok_json()["notes"])
