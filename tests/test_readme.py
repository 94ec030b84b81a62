"""The README opens with the two commands, and CI runs exactly the second one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text("utf-8"), re.S)


def test_readme_opens_with_two_single_line_commands() -> None:
    first, second = _bash_blocks()[:2]
    assert first.strip().count("\n") == 0 and second.strip().count("\n") == 0
    assert "tuneplan " in first and "pip install" in first
    assert "torch==2.13.0" in second and "pytest" in second


def test_the_test_command_installs_the_skypilot_the_bundles_target() -> None:
    """SkyPilot in its own venv, at the release whose schemas the tests vendor and whose
    names the bundles use, before the tests that run it."""
    from tests.adapters.skypilot_venv import INSTALL
    from tuneplan.core.launch.targets import SKYPILOT_VERSION

    second = _bash_blocks()[1].strip()
    assert f"&& {INSTALL} &&" in second
    assert second.index(INSTALL) < second.index("pytest")
    vendored = sorted(p.name for p in (ROOT / "tests" / "fixtures" / "launch").glob("skypilot_*"))
    assert vendored == [f"skypilot_{SKYPILOT_VERSION}_schemas.json"]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
    second = _bash_blocks()[1].strip()
    assert second in ci_lines
