"""Opt-in: the real provider APIs still answer in the shape the importers expect.

Runs only with ``TUNEPLAN_LIVE_TESTS=1 pytest -m live`` (network); skipped otherwise.
Every GPU name a live source returns must normalise: a new name fails here first.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import httpx
import pytest

from tuneplan.adapters.importers import azure, gpuhunt, runpod, skypilot_live, vastai
from tuneplan.adapters.importers.base import ImportResult

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(os.environ.get("TUNEPLAN_LIVE_TESTS") != "1",
                       reason="talks to real provider APIs; set TUNEPLAN_LIVE_TESTS=1"),
]


@pytest.mark.parametrize("fetch", [
    azure.fetch, runpod.fetch, vastai.fetch,
    lambda client: gpuhunt.fetch(client, provider="runpod"),
    lambda client: skypilot_live.fetch(client, cloud="lambda"),
], ids=["azure", "runpod", "vastai", "gpuhunt-runpod", "skypilot-lambda"])
def test_live_source_gives_offers_with_known_gpus(
        fetch: Callable[[httpx.Client], ImportResult]) -> None:
    with httpx.Client(follow_redirects=True) as client:
        result = fetch(client)
    assert len(result.offers) > 0
    assert result.unknown_gpu_names == ()
    assert result.total_rejected <= len(result.offers) // 10
