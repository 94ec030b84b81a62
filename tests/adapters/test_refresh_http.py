"""End to end over real HTTP: a stdlib server on 127.0.0.1 replays the recorded payloads."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers import aws, azure, gpuhunt, runpod, skypilot_live, vastai
from tuneplan.adapters.refresh import LiveSource, live_sources, refresh
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import OfferFilter

PAYLOADS = FIXTURES / "importers"
OLD = datetime(2026, 11, 1, tzinfo=UTC)
SKYPILOT_CSV = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
                "GpuInfo,SpotPrice\ngpu_8x_h100_sxm5,H100,8.0,208.0,1800.0,23.92,us-east-1,,\n")


GPUHUNT_VERSION = "20261130-01"
GPUHUNT_PROVIDERS = ("aws", "lambdalabs", "runpod")  # the CSVs in fixtures gpuhunt_v3/


def gpuhunt_zip(provider: str) -> bytes:
    """One provider's catalog archive as gpuhunt 0.1.34 downloads it: ``<provider>.csv``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.write(PAYLOADS / "gpuhunt_v3" / f"{provider}.csv", f"{provider}.csv")
    return buffer.getvalue()


def gpuhunt_sources(server: str) -> tuple[LiveSource, ...]:
    """The live gpuhunt sources of the fixture's providers, pointed at the replay server."""
    return tuple(replace(s, fetch=partial(s.fetch, base_url=f"{server}/v3"))
                 for s in live_sources()
                 if s.group == "gpuhunt" and s.name.split("/")[1] in GPUHUNT_PROVIDERS)


class _Replay(BaseHTTPRequestHandler):
    """Serves the recorded payloads; the AWS offer file is cut short on purpose."""

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _send(self, body: bytes, *, declared: int | None = None, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(declared or len(body)))
        self.end_headers()
        # The client may have given up first (the timeout test): nothing left to tell it.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/graphql"):
            types = json.loads((PAYLOADS / "runpod_gpu_types.json").read_text())
            self._send(json.dumps({"data": {"gpuTypes": types}}).encode())
        else:
            offers = json.loads((PAYLOADS / "vastai_bundles_offer.json").read_text())
            self._send(json.dumps({"offers": offers}).encode())

    def do_GET(self) -> None:
        page = json.loads((PAYLOADS / "azure_retail_prices_gpu_page.json").read_text())
        if self.path.startswith("/prices") and "skip" not in self.path:
            port = self.server.server_address[1]
            first = {**page, "Items": page["Items"][:7],
                     "NextPageLink": f"http://127.0.0.1:{port}/prices?$skip=7"}
            self._send(json.dumps(first).encode())
        elif self.path.startswith("/prices"):
            self._send(json.dumps({**page, "Items": page["Items"][7:]}).encode())
        elif self.path.startswith("/v3/") and self.path.endswith("/version"):
            self._send(GPUHUNT_VERSION.encode() + b"\n")
        elif self.path.startswith("/v3/") and self.path.endswith(
                f"/{GPUHUNT_VERSION}/catalog.zip"):
            self._send(gpuhunt_zip(self.path.split("/")[2]))
        elif self.path == "/catalogs/v8/lambda/vms.csv":
            self._send(SKYPILOT_CSV.encode())
        elif self.path.endswith("/index.json"):
            body = (PAYLOADS / "aws_price_list_ec2_offer.json").read_bytes()
            self._send(body[:1000], declared=len(body))  # connection closes mid-body
        else:
            self._send(b"not found", status=404)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_refresh_over_http_writes_good_sources_and_reports_the_truncated_one(
        server: str, tmp_path: Path) -> None:
    available = (
        LiveSource(name="azure", group="azure", fetch=partial(azure.fetch,
                                                               base_url=f"{server}/prices")),
        LiveSource(name="aws", group="aws", fetch=partial(aws.fetch, base_url=server)),
        LiveSource(name="runpod", group="runpod",
                   fetch=partial(runpod.fetch, base_url=f"{server}/graphql")),
        LiveSource(name="vastai", group="vastai",
                   fetch=partial(vastai.fetch, base_url=f"{server}/bundles/")),
        *gpuhunt_sources(server),
        LiveSource(name="skypilot/lambda", group="skypilot",
                   fetch=partial(skypilot_live.fetch, cloud="lambda",
                                 base_url=f"{server}/catalogs")),
    )
    with CatalogStore.open(tmp_path / "catalog.sqlite", seed=False) as store:
        outcomes = {o.source: o for o in refresh(store, available=available)}
        assert outcomes["aws"].failed and "network error" in outcomes["aws"].message
        assert [s for s, o in outcomes.items() if o.status == "ok"] == [
            "azure", "runpod", "vastai", "gpuhunt/aws", "gpuhunt/lambdalabs", "gpuhunt/runpod",
            "skypilot/lambda"]
        counts = {s.source: s.offers for s in store.status()}
        assert counts == {"azure": 6, "runpod": 83, "vastai": 1, "gpuhunt/aws": 1,
                          "gpuhunt/lambdalabs": 1, "gpuhunt/runpod": 3, "skypilot/lambda": 1}
        offers = store.offers()
        spot_offers = store.offers(OfferFilter(spot=True))
    # NC24ads has only a Spot meter: listed by a spot query, not by the on-demand default.
    assert "Standard_NC24ads_A100_v4" not in {o.instance_type for o in offers}
    nc24 = next(o for o in spot_offers if o.instance_type == "Standard_NC24ads_A100_v4")
    assert (nc24.gpu, nc24.gpu_count, nc24.spot_price_per_hour) == (
        "A100 80GB PCIe", 1, Decimal("1.041296"))
    providers = {o.provider for o in offers}
    assert providers == {"Azure", "RunPod", "Vast.ai", "AWS", "Lambda"}


class _TimesOut(httpx.HTTPTransport):
    """Real HTTP to the replay server, except that ``/slow/`` times out as httpx does when a
    server never answers within the timeout (no clock in the test: a busy machine can't make
    the fast source late, nor the slow one early)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/slow/"):
            raise httpx.ReadTimeout("timed out", request=request)
        return super().handle_request(request)


def test_a_source_slower_than_the_timeout_fails_alone(server: str, tmp_path: Path) -> None:
    available = (
        LiveSource(name="gpuhunt/runpod", group="gpuhunt",
                   fetch=partial(gpuhunt.fetch, provider="runpod", base_url=f"{server}/slow")),
        LiveSource(name="vastai", group="vastai",
                   fetch=partial(vastai.fetch, base_url=f"{server}/bundles/")),
    )
    from tuneplan.adapters.importers.network import TIMEOUT_S

    with CatalogStore.open(tmp_path / "catalog.sqlite", seed=False) as store, httpx.Client(
            transport=_TimesOut()) as client:
        slow, fast = refresh(store, available=available, client=client)
        assert slow.failed and f"timeout after {TIMEOUT_S:g} s" in slow.message
        assert fast.status == "ok" and fast.offers_written == 1


def test_gpuhunt_sources_read_the_fixture_through_the_gpuhunt_library(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuhunt as library

    queried: list[list[str]] = []
    original = library.Catalog.query

    def spy(self: object, **kwargs: object) -> object:
        queried.append(list(kwargs["provider"]))  # type: ignore[call-overload]
        return original(self, **kwargs)

    monkeypatch.setattr(library.Catalog, "query", spy)
    with CatalogStore.open(tmp_path / "catalog.sqlite", seed=False) as store:
        legacy = gpuhunt.parse_gpuhunt_catalog(
            {"aws": (PAYLOADS / "gpuhunt_v3" / "aws.csv").read_text()}, OLD)
        store.replace_source("gpuhunt", legacy.offers, OLD)  # what earlier versions wrote
        queried.clear()
        outcomes = refresh(store, ["gpuhunt"], available=gpuhunt_sources(server))
        assert [(o.source, o.status, o.offers_written) for o in outcomes] == [
            ("gpuhunt/aws", "ok", 1), ("gpuhunt/lambdalabs", "ok", 1),
            ("gpuhunt/runpod", "ok", 3)]
        assert "gpuhunt" not in {s.source for s in store.status()}  # retired, kept as history
        offers = {(o.source, o.instance_type, o.gpu_count): o
                  for o in store.offers(OfferFilter(spot=True))}
        offers.update({(o.source, o.instance_type, o.gpu_count): o for o in store.offers()})
    assert sorted(queried) == [["aws"], ["lambdalabs"], ["runpod"]]
    assert len(offers) == 5
    p4d = offers["gpuhunt/aws", "p4d.24xlarge", 8]
    assert (p4d.provider, p4d.gpu, p4d.price_per_hour, p4d.spot_price_per_hour) == (
        "AWS", "A100 40GB SXM4", Decimal("32.7726"), None)
    assert (p4d.vcpus, p4d.ram_bytes) == (96.0, 1152 * 2**30)
    lam = offers["gpuhunt/lambdalabs", "gpu_1x_a100_sxm4 [example-flag]", 1]
    assert (lam.provider, lam.price_per_hour, lam.disk_bytes, lam.notes) == (
        "Lambda", Decimal("1.1"), 512 * 10**9, "gpuhunt flags: example-flag")
    runpod_prices = {(t, n): (o.gpu, o.price_per_hour, o.spot_price_per_hour)
                     for (s, t, n), o in offers.items() if s == "gpuhunt/runpod"}
    assert runpod_prices == {
        ("NVIDIA H100 80GB HBM3", 1): ("H100 SXM5", Decimal("2.99"), Decimal("1.75")),
        ("NVIDIA H100 80GB HBM3", 8): ("H100 SXM5", Decimal("23.92"), None),
        ("AMD Instinct MI300X OAM", 1): ("MI300X", Decimal("2.49"), Decimal("1.49")),
    }


def test_gpuhunt_sources_are_every_offline_provider_of_the_pinned_library() -> None:
    from gpuhunt._internal.catalog import CATALOG_URL, OFFLINE_PROVIDERS

    assert tuple(OFFLINE_PROVIDERS) == gpuhunt.PROVIDERS
    assert gpuhunt.DEFAULT_URL == CATALOG_URL
    names = [s.name for s in live_sources() if s.group == "gpuhunt" and not s.opt_in]
    assert names == [f"gpuhunt/{p}" for p in OFFLINE_PROVIDERS]
