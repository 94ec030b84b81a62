"""Waiting on another process or thread in a test, without making a speed claim.

``HANG_GUARD_S`` only stops a test that has hung for good: it is far beyond anything a slow,
busy CI machine needs, so no test depends on how fast something runs (speed is measured in
``benchmarks/``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

HANG_GUARD_S = 900.0


def wait_until(ready: Callable[[], bool], what: str, *, poll_s: float = 0.02) -> None:
    """Poll ``ready`` until it is true; fail naming ``what`` only if it never happens."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: nothing after {HANG_GUARD_S:.0f} s (hung?)")
        time.sleep(poll_s)
