"""Run the real console entry point in-process and capture what a shell would see."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tuneplan.cli.app import main


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def ok_json(self) -> Any:
        """The JSON document of a run that must have succeeded (else fail showing stderr)."""
        assert self.code == 0, self.stderr
        return self.json()


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
            ) -> Callable[..., CliResult]:
    def run(*args: str) -> CliResult:
        monkeypatch.setattr("sys.argv", ["tuneplan", *args])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
