"""SkyPilot itself, in its own virtual environment, reading the bundles' sky.yaml.

SkyPilot cannot be installed beside this project (skypilot 0.14.1 pins click<8.2 and
uvicorn<0.36), so the README's test command makes ``.venv-sky`` next to ``.venv`` and the tests
run its interpreter in a subprocess on ``skypilot_check.py``. Without ``.venv-sky`` they skip,
saying how to make it. SkyPilot downloads its catalog on first use; here the catalog is the
bundled snapshot, written where SkyPilot looks (``sky/catalog/common.py``:
``$SKY_RUNTIME_DIR/.sky/catalogs/<CATALOG_SCHEMA_VERSION>/<cloud>/vms.csv``, a file without a
``.meta`` md5 counts as user-provided and is never refreshed), under a private HOME.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import HANG_GUARD_S
from tuneplan.adapters.bundled import SNAPSHOT_DIR, list_snapshot_files, read_data_text
from tuneplan.core.launch.targets import SKYPILOT_VERSION

ROOT = Path(__file__).parents[2]
SKY_PYTHON = ROOT / ".venv-sky" / "bin" / "python"
CHECK_SCRIPT = Path(__file__).with_name("skypilot_check.py")
#: ``CATALOG_SCHEMA_VERSION`` of skypilot 0.14.1 (sky/skylet/constants.py).
CATALOG_SCHEMA = "v8"
#: The step of the README's test command that makes it (no bytecode compiled at install:
#: the modules SkyPilot imports compile on first use, a small part of the whole).
INSTALL = ("python3 -m venv .venv-sky && "
           f".venv-sky/bin/pip install -q --no-compile 'skypilot=={SKYPILOT_VERSION}'")


def need_skypilot() -> None:
    if not SKY_PYTHON.exists():
        pytest.skip(f"no {SKY_PYTHON.relative_to(ROOT)}: SkyPilot runs in its own venv "
                    f"(the README's test command makes it: {INSTALL})")


def sky_home(folder: Path) -> Path:
    """A HOME holding SkyPilot's catalog as the bundled snapshot has it, one ``vms.csv`` per
    cloud (``runpod_v7.csv`` rows appended to RunPod's, columns matched by name, as
    ``load_sky_catalog`` reads them); returns it."""
    by_cloud: dict[str, list[str]] = {}
    for name in sorted(list_snapshot_files()):
        by_cloud.setdefault(name.removesuffix(".csv").removesuffix("_v7"), []).append(name)
    for cloud, names in by_cloud.items():
        header: list[str] | None = None
        rows: list[dict[str, str]] = []
        for name in sorted(names, key=lambda n: n.endswith("_v7.csv")):  # v8 columns first
            reader = csv.DictReader(io.StringIO(read_data_text(SNAPSHOT_DIR, name)))
            header = header or list(reader.fieldnames or [])
            rows += list(reader)
        target = folder / ".sky" / "catalogs" / CATALOG_SCHEMA / cloud / "vms.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, fieldnames=header or [])
            writer.writeheader()
            writer.writerows(rows)
    return folder


def run_skypilot(home: Path, cases: dict[str, Path], clouds: list[str] | None = None
                 ) -> dict[str, Any]:
    """``skypilot_check.py`` under SkyPilot's interpreter, offline: a private HOME with the
    snapshot catalog, no cloud credentials in its environment, usage reports off."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SKY_RUNTIME_DIR": str(home),
           "LANG": "C.UTF-8", "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    request = {"cases": {k: str(v) for k, v in cases.items()}, "clouds": clouds or []}
    done = subprocess.run([str(SKY_PYTHON), str(CHECK_SCRIPT)], input=json.dumps(request),
                          env=env, cwd=home, capture_output=True, text=True, check=False,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    assert result["version"] == SKYPILOT_VERSION, "the README pins the version the bundle targets"
    return result
