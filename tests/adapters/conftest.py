"""Adapter tests never wait out a retry backoff: the default retry policy sleeps not at all."""

from __future__ import annotations

import pytest

from tuneplan.adapters.importers import network


@pytest.fixture(autouse=True)
def _no_retry_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "DEFAULT_RETRY", network.RetryPolicy(sleep=lambda s: None))
