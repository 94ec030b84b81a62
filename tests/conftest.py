"""Shared fixtures: every test runs with a private TUNEPLAN_HOME and HF cache, never the network."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("tests.fakehub",)  # the fake_hub fixture, for the adapter and web tests


@pytest.fixture(autouse=True)
def _private_dirs(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("tuneplan-home")
    monkeypatch.setenv("TUNEPLAN_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # huggingface_hub reads HF_HOME once, at import: point its cache here too, or a test's
    # fake-hub download lands in the user's real cache and changes later runs.
    try:
        from huggingface_hub import constants
    except ImportError:
        return
    monkeypatch.setattr(constants, "HF_HOME", str(home / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hf" / "hub"))


FIXTURES = Path(__file__).parent / "fixtures"
