"""End to end over real HTTP: a stdlib server on 127.0.0.1 replays the recorded payloads."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from decimal import Decimal
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers import aws, azure, gpuhunt, runpod, skypilot_live, vastai
from tuneplan.adapters.refresh import LiveSource, refresh
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import OfferFilter

PAYLOADS = FIXTURES / "importers"
SKYPILOT_CSV = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
                "GpuInfo,SpotPrice\ngpu_8x_h100_sxm5,H100,8.0,208.0,1800.0,23.92,us-east-1,,\n")


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        sample = (PAYLOADS / "gpuhunt_catalog_v2_sample.csv").read_text()
        bundle.writestr("datacrunch.csv", sample)
    return buffer.getvalue()


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
        elif self.path == "/v2/version":
            self._send(b"20261130")
        elif self.path == "/v2/20261130/catalog.zip":
            self._send(_zip())
        elif self.path == "/catalogs/v8/lambda/vms.csv":
            self._send(SKYPILOT_CSV.encode())
        elif self.path == "/slow/v2/version":
            time.sleep(1.0)
            self._send(b"too late")
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
        LiveSource(name="gpuhunt", group="gpuhunt",
                   fetch=partial(gpuhunt.fetch, base_url=server)),
        LiveSource(name="skypilot/lambda", group="skypilot",
                   fetch=partial(skypilot_live.fetch, cloud="lambda",
                                 base_url=f"{server}/catalogs")),
    )
    with CatalogStore.open(tmp_path / "catalog.sqlite", seed=False) as store:
        outcomes = {o.source: o for o in refresh(store, available=available)}
        assert outcomes["aws"].failed and "network error" in outcomes["aws"].message
        assert [s for s, o in outcomes.items() if o.status == "ok"] == [
            "azure", "runpod", "vastai", "gpuhunt", "skypilot/lambda"]
        counts = {s.source: s.offers for s in store.status()}
        assert counts == {"azure": 6, "runpod": 83, "vastai": 1, "gpuhunt": 4,
                          "skypilot/lambda": 1}
        offers = store.offers()
        spot_offers = store.offers(OfferFilter(spot=True))
    # NC24ads has only a Spot meter: listed by a spot query, not by the on-demand default.
    assert "Standard_NC24ads_A100_v4" not in {o.instance_type for o in offers}
    nc24 = next(o for o in spot_offers if o.instance_type == "Standard_NC24ads_A100_v4")
    assert (nc24.gpu, nc24.gpu_count, nc24.spot_price_per_hour) == (
        "A100 80GB PCIe", 1, Decimal("1.041296"))
    providers = {o.provider for o in offers}
    assert providers == {"Azure", "RunPod", "Vast.ai", "Verda (ex-DataCrunch)", "Lambda"}


def test_a_source_slower_than_the_timeout_fails_alone(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tuneplan.adapters.importers.network.TIMEOUT_S", 0.2)
    available = (
        LiveSource(name="gpuhunt", group="gpuhunt",
                   fetch=partial(gpuhunt.fetch, base_url=f"{server}/slow")),
        LiveSource(name="vastai", group="vastai",
                   fetch=partial(vastai.fetch, base_url=f"{server}/bundles/")),
    )
    with CatalogStore.open(tmp_path / "catalog.sqlite", seed=False) as store:
        slow, fast = refresh(store, available=available)
        assert slow.failed and "timeout after 0.2 s" in slow.message
        assert fast.status == "ok" and fast.offers_written == 1
