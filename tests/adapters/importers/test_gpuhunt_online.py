"""gpuhunt's online providers (vast.ai, Vultr, DigitalOcean) replayed by a local HTTP server.

The recorded answers: vast.ai's is a real offer (``fixtures/importers/vastai_bundles_offer.json``);
Vultr's and DigitalOcean's are the bodies of gpuhunt's own tests
(``fixtures/importers/gpuhunt_online``, see its README). gpuhunt's provider code parses
them; every request goes through our client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers import gpuhunt_online
from tuneplan.adapters.importers.network import FetchError
from tuneplan.adapters.refresh import LiveSource, live_sources, refresh, select_sources
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import OfferFilter

pytest.importorskip("gpuhunt")

PAYLOADS = FIXTURES / "importers"
ONLINE = PAYLOADS / "gpuhunt_online"


class _Replay(BaseHTTPRequestHandler):
    """vast.ai's search and Vultr's two plan lists; ``fail_first`` answers 503 once per path."""

    seen: ClassVar[list[str]] = []
    fail_first: ClassVar[set[str]] = set()

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, body: bytes) -> None:
        path = self.path.split("?")[0]
        self.seen.append(f"{self.command} {self.path}")
        if path in self.fail_first:
            self.fail_first.discard(path)
            self._send(b"busy", 503)
        else:
            self._send(body)

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        assert asked["rentable"] == {"eq": True} and asked["rented"] == {"eq": False}
        offers = json.loads((PAYLOADS / "vastai_bundles_offer.json").read_text())
        if self.path.startswith("/vast/bundles/"):
            self._answer(json.dumps({"offers": offers}).encode())
        else:
            self._send(b"not found", 404)

    def do_GET(self) -> None:
        if self.path == "/vultr/v2/plans-metal?per_page=500":
            self._answer((ONLINE / "vultr_plans_metal.json").read_bytes())
        elif self.path == "/vultr/v2/plans?type=all&per_page=500":
            self._answer((ONLINE / "vultr_plans.json").read_bytes())
        elif self.path == "/do/v2/sizes?per_page=500":
            if self.headers.get("Authorization") != "Bearer test-token":
                self._send(b'{"id": "unauthorized"}', 401)
            else:
                self._answer((ONLINE / "digitalocean_sizes.json").read_bytes())
        elif self.path.startswith("/broken/"):
            self._answer(b'{"plans_metal": "not a list"}')
        else:
            self._send(b"not found", 404)


@pytest.fixture
def server() -> Iterator[str]:
    _Replay.seen, _Replay.fail_first = [], set()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_requests_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuhunt's own HTTP (``requests``) must never run: every request is ours."""
    import requests

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("gpuhunt sent a request with the requests library")

    monkeypatch.setattr(requests.sessions.Session, "request", refuse)


def _sources(server: str) -> tuple[LiveSource, ...]:
    urls = {"gpuhunt/vastai": f"{server}/vast/bundles/", "gpuhunt/vultr": f"{server}/vultr/v2",
            "gpuhunt/digitalocean": f"{server}/do"}
    return tuple(replace(s, fetch=partial(s.fetch, base_url=urls[s.name]))
                 for s in live_sources() if s.name in urls)


def test_online_providers_replay_into_the_store(server: str, tmp_path: Path) -> None:
    _Replay.fail_first = {"/vast/bundles/", "/vultr/v2/plans"}  # retried by our HTTP layer
    with CatalogStore.open(tmp_path / "c.sqlite") as store, httpx.Client() as client:
        outcomes = refresh(store, ["gpuhunt/vastai,gpuhunt/vultr"], client,
                           available=_sources(server))
        assert [(o.source, o.status) for o in outcomes] == [
            ("gpuhunt/vastai", "ok"), ("gpuhunt/vultr", "ok")]
        vultr_outcome = outcomes[1]
        assert vultr_outcome.rejected_rows == 2  # two vGPU slices of an A100
        # (the store is seeded with the bundled snapshot: keep this refresh's sources)
        vast = [o for o in store.offers(OfferFilter(providers=("vast.ai",)))
                if o.source == "gpuhunt/vastai"]
        vultr = [o for o in store.offers(OfferFilter(providers=("vultr",)))
                 if o.source == "gpuhunt/vultr"]
    (offer,) = vast
    assert (offer.source, offer.gpu, offer.gpu_count) == ("gpuhunt/vastai", "RTX 4090", 1)
    assert offer.instance_type == "1x RTX4090 #11684738"
    # gpuhunt prices the whole offer's disk: dph_base + disk_space x storage_cost / 720 h
    assert offer.price_per_hour == Decimal("0.24964")
    assert offer.spot_price_per_hour == Decimal("0.20298")  # min_bid + the same disk cost
    assert offer.vcpus == 24
    by_type = {o.instance_type: o for o in vultr}
    assert set(by_type) == {"vbm-256c-2048gb-8-mi300x-gpu", "vbm-112c-2048gb-8-h100-gpu",
                            "vcg-a100-12c-120g-80vram"}
    h100 = by_type["vbm-112c-2048gb-8-h100-gpu"]
    assert (h100.provider, h100.gpu, h100.gpu_count, h100.region) == (
        "Vultr", "H100 SXM5", 8, "sea")
    assert h100.price_per_hour == Decimal("23.92") and h100.spot_price_per_hour is None
    assert by_type["vbm-256c-2048gb-8-mi300x-gpu"].gpu == "MI300X"
    assert sum(line.startswith("GET /vultr/v2/plans?") for line in _Replay.seen) == 2


def test_digitalocean_sends_its_token_in_a_header_and_gets_per_gpu_memory(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with CatalogStore.open(tmp_path / "c.sqlite") as store, httpx.Client() as client:
        monkeypatch.delenv("DIGITAL_OCEAN_API_KEY", raising=False)
        (skipped,) = refresh(store, ["gpuhunt/digitalocean"], client, available=_sources(server))
        assert skipped.status == "skipped" and "DIGITAL_OCEAN_API_KEY" in skipped.message
        assert _Replay.seen == []  # nothing asked without a token
        monkeypatch.setenv("DIGITAL_OCEAN_API_KEY", "test-token")
        (outcome,) = refresh(store, ["gpuhunt/digitalocean"], client, available=_sources(server))
        assert outcome.status == "ok", outcome.message
        offers = {o.instance_type: o for o in store.offers()
                  if o.source == "gpuhunt/digitalocean"}
    assert set(offers) == {"gpu-h100x8-640gb", "gpu-mi300x8-1536gb"}  # CPU droplets dropped
    h100 = offers["gpu-h100x8-640gb"]
    # gpuhunt gives the droplet's 640 GiB of VRAM; per GPU it is 80: an SXM5 H100, not an NVL
    assert (h100.provider, h100.gpu, h100.gpu_count, h100.region) == (
        "DigitalOcean", "H100 SXM5", 8, "nyc1")
    assert h100.price_per_hour == Decimal("23.92")
    assert offers["gpu-mi300x8-1536gb"].gpu == "MI300X"


def test_a_refused_token_is_named_by_status_never_by_value(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIGITAL_OCEAN_API_KEY", "wrong-secret")
    with httpx.Client() as client, pytest.raises(FetchError) as raised:
        gpuhunt_online.fetch(client, provider="digitalocean", base_url=f"{server}/do")
    assert str(raised.value) == f"HTTP 401 from {server}/do/v2/sizes"
    assert "wrong-secret" not in str(raised.value)


def test_a_broken_answer_is_one_line_and_keeps_the_previous_snapshot(
        server: str, tmp_path: Path) -> None:
    broken = LiveSource(name="gpuhunt/vultr", group="gpuhunt",
                        fetch=partial(gpuhunt_online.fetch, provider="vultr",
                                      base_url=f"{server}/broken/v2"))
    with CatalogStore.open(tmp_path / "c.sqlite") as store, httpx.Client() as client:
        (outcome,) = refresh(store, ["gpuhunt/vultr"], client, available=(broken,))
        assert not any(o.source == "gpuhunt/vultr" for o in store.offers())
    assert outcome.status == "failed" and "\n" not in outcome.message
    assert outcome.message.startswith("gpuhunt/vultr: failed: gpuhunt vultr: unreadable answer")


def test_an_http_error_names_the_url_without_its_query(server: str) -> None:
    with httpx.Client() as client, pytest.raises(FetchError) as raised:
        gpuhunt_online.fetch(client, provider="vultr", base_url=f"{server}/missing/v2")
    assert str(raised.value) == f"HTTP 404 from {server}/missing/v2/plans-metal"


def test_online_sources_run_only_when_named_and_replace_the_vastai_source() -> None:
    assert {"gpuhunt/vastai", "gpuhunt/vultr", "gpuhunt/digitalocean"}.isdisjoint(
        s.name for s in select_sources(None))
    assert [s.name for s in select_sources(["vastai,gpuhunt/vastai"])] == ["gpuhunt/vastai"]
    assert [s.name for s in select_sources(["vastai"])] == ["vastai"]
    everything = {s.name for s in select_sources(["all"])}
    assert "gpuhunt/vultr" in everything and "vastai" not in everything


def test_wired_providers_are_online_in_the_pinned_library_with_these_urls() -> None:
    import importlib

    from gpuhunt._internal.catalog import ONLINE_PROVIDERS

    for name, spec in gpuhunt_online.PROVIDERS.items():
        assert name in ONLINE_PROVIDERS
        module = importlib.import_module(spec.module)
        assert getattr(module, spec.url_constant) == spec.default_url
        assert name == getattr(module, spec.cls).NAME
