"""Each importer's ``fetch`` through ``httpx.MockTransport``: URLs, pagination, failures."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers import (
    aws,
    azure,
    gpuhunt,
    lambda_cloud,
    runpod,
    skypilot_live,
    vastai,
)
from tuneplan.adapters.importers.network import FetchError, SourceSkipped
from tuneplan.adapters.importers.validation import PayloadError

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PAYLOADS = FIXTURES / "importers"
Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def fixture_bytes(name: str) -> bytes:
    return (PAYLOADS / name).read_bytes()


def test_azure_follows_next_page_link_until_null() -> None:
    page = json.loads(fixture_bytes("azure_retail_prices_gpu_page.json"))
    first = {**page, "Items": page["Items"][:10],
             "NextPageLink": "https://prices.example/api/retail/prices?$skip=10"}
    second = {**page, "Items": page["Items"][10:], "NextPageLink": None}
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(200, json=second if "skip" in str(request.url) else first)

    result = azure.fetch(client(handler), base_url="https://prices.example/api/retail/prices",
                         fetched_at=AT)
    assert len(seen) == 2
    assert seen[0].params["api-version"] == azure.API_VERSION
    assert "priceType eq 'Consumption'" in seen[0].params["$filter"]
    assert len(result.offers) == 6  # same as the single page: split pages lose nothing
    offers = {o.instance_type: o for o in result.offers}
    assert offers["Standard_NC48ads_A100_v4"].price_per_hour == Decimal("7.346")


def test_azure_page_without_items_fails_the_source() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"Error": "throttled"})

    with pytest.raises(PayloadError, match="no Items"):
        azure.fetch(client(handler))


def test_aws_downloads_one_offer_file_per_region() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, content=fixture_bytes("aws_price_list_ec2_offer.json"))

    result = aws.fetch(client(handler), base_url="https://pricing.example",
                       regions=("us-east-1", "us-west-2"), fetched_at=AT)
    assert paths == ["/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json",
                     "/offers/v1.0/aws/AmazonEC2/current/us-west-2/index.json"]
    assert len(result.offers) == 2  # the sample is us-east-1 in both (regionCode rules)


def test_runpod_posts_the_graphql_query() -> None:
    bodies: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        types = json.loads(fixture_bytes("runpod_gpu_types.json"))
        return httpx.Response(200, json={"data": {"gpuTypes": types}})

    result = runpod.fetch(client(handler), fetched_at=AT)
    assert "gpuTypes" in bodies[0]["query"] and "securePrice" in bodies[0]["query"]
    assert len(result.offers) == 83


def test_vastai_posts_a_rentable_search() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        assert json.loads(request.content)["rentable"] == {"eq": True}
        offers = json.loads(fixture_bytes("vastai_bundles_offer.json"))
        return httpx.Response(200, json={"offers": offers})

    assert len(vastai.fetch(client(handler), fetched_at=AT).offers) == 1


def test_lambda_is_skipped_without_key_and_sends_it_when_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    with pytest.raises(SourceSkipped, match="LAMBDA_API_KEY"):
        lambda_cloud.fetch(client(lambda r: httpx.Response(500)))
    monkeypatch.setenv("LAMBDA_API_KEY", "secret-key")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"].startswith("Basic ")
        return httpx.Response(200, content=fixture_bytes("lambda_instance_types.json"))

    (offer,) = lambda_cloud.fetch(client(handler), fetched_at=AT).offers
    assert offer.price_per_hour == Decimal("1.1")


def _gpuhunt_zip(provider: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr(f"{provider}.csv", fixture_bytes(f"gpuhunt_v3/{provider}.csv"))
    return buffer.getvalue()


def test_gpuhunt_reads_the_provider_version_then_its_zip() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/v3/runpod/version":
            return httpx.Response(200, text="20261130-01\n")
        return httpx.Response(200, content=_gpuhunt_zip("runpod"))

    result = gpuhunt.fetch(client(handler), provider="runpod",
                           base_url="https://bucket.example/v3", fetched_at=AT)
    assert paths == ["/v3/runpod/version", "/v3/runpod/20261130-01/catalog.zip"]
    assert {o.provider for o in result.offers} == {"RunPod"}
    assert len(result.offers) == 3


def test_gpuhunt_corrupt_or_foreign_zip_is_a_payload_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/version"):
            return httpx.Response(200, text="1")
        return httpx.Response(200, content=_gpuhunt_zip("runpod")[:100])

    with pytest.raises(PayloadError, match="zip"):
        gpuhunt.fetch(client(handler), provider="runpod")
    with pytest.raises(PayloadError, match=r"holds no aws\.csv"):
        gpuhunt.fetch(client(lambda r: httpx.Response(200, content=_gpuhunt_zip("runpod"))
                             if r.url.path.endswith(".zip") else httpx.Response(200, text="1")),
                      provider="aws")


def test_skypilot_live_fetches_one_cloud_csv() -> None:
    csv_text = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
                "GpuInfo,SpotPrice\ngpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.49,us-east-1,,\n")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/catalogs/v8/lambda/vms.csv"
        return httpx.Response(200, text=csv_text)

    result = skypilot_live.fetch(client(handler), cloud="lambda",
                                 base_url="https://raw.example/catalogs", fetched_at=AT)
    (offer,) = result.offers
    assert (offer.source, offer.price_per_hour) == ("skypilot/lambda", Decimal("2.49"))


@pytest.mark.parametrize(("response", "message"), [
    (httpx.Response(500, text="oops"), "HTTP 500"),
    (httpx.Response(404), "HTTP 404"),
    (httpx.Response(200, text='{"offers": [{"id": 1, "gpu_na'), "unreadable JSON"),
    (httpx.Response(200, content=b"\xff\xfe\x00garbage"), "unreadable JSON"),
])
def test_http_failures_become_one_line_fetch_errors(response: httpx.Response,
                                                    message: str) -> None:
    with pytest.raises(FetchError, match=message):
        vastai.fetch(client(lambda request: response))


@pytest.mark.parametrize(("exc", "message"), [
    (httpx.ReadTimeout("slow"), "timeout"),
    (httpx.ConnectError("refused"), "network error"),
])
def test_transport_failures_become_fetch_errors(exc: Exception, message: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(FetchError, match=message):
        runpod.fetch(client(handler))


def test_throttled_requests_are_retried() -> None:
    replies = iter([httpx.Response(429, headers={"Retry-After": "2"}),
                    httpx.Response(200, content=fixture_bytes("vastai_bundles_offer.json"))])
    assert len(vastai.fetch(client(lambda request: next(replies))).offers) == 1
    always = httpx.Response(429)
    with pytest.raises(FetchError, match="HTTP 429"):
        vastai.fetch(client(lambda request: always))
