"""Each live importer's pure parser on its recorded or documented payload (no network)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers.aws import parse_aws_offer_file
from tuneplan.adapters.importers.azure import gpus_of_sku, parse_azure_prices
from tuneplan.adapters.importers.gpuhunt import parse_gpuhunt_catalog
from tuneplan.adapters.importers.lambda_cloud import parse_lambda_instance_types
from tuneplan.adapters.importers.runpod import parse_runpod_gpu_types
from tuneplan.adapters.importers.validation import PayloadError
from tuneplan.adapters.importers.vastai import parse_vastai_offers
from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PAYLOADS = FIXTURES / "importers"


def load(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


def by_instance(offers: tuple[Any, ...]) -> dict[str, Any]:
    return {o.instance_type: o for o in offers}


def test_azure_gpu_page_gives_linux_pay_as_you_go_and_spot_per_vm_size() -> None:
    result = parse_azure_prices(load("azure_retail_prices_gpu_page.json"), AT)
    offers = by_instance(result.offers)
    assert sorted(offers) == [
        "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5", "Standard_NC48ads_A100_v4",
        "Standard_NC96ads_A100_v4", "Standard_ND128isr_NDR_GB200_v6", "Standard_ND96isr_H100_v5"]
    nc24 = offers["Standard_NC24ads_A100_v4"]
    # Only a Spot meter is listed for NC24ads: spot price, no on-demand price, 1 x A100 80GB.
    assert (nc24.gpu, nc24.gpu_count, nc24.region) == ("A100 80GB PCIe", 1, "eastus")
    assert nc24.spot_price_per_hour == Decimal("1.041296") and nc24.price_per_hour is None
    assert nc24.gpu_memory_bytes == 80 * GiB and nc24.vcpus == 24
    # Linux pay-as-you-go 7.346 for 2 GPUs; the Windows 9.554, DevTest and the 42,066 / 71,642
    # reservation term totals must not leak in as hourly prices.
    nc48 = offers["Standard_NC48ads_A100_v4"]
    assert (nc48.gpu_count, nc48.price_per_hour) == (2, Decimal("7.346"))
    assert nc48.price_per_gpu_hour == Decimal("3.673") and nc48.spot_price_per_hour is None
    h100 = offers["Standard_ND96isr_H100_v5"]
    assert (h100.gpu, h100.gpu_count, h100.price_per_hour) == ("H100 SXM5", 8, Decimal("98.32"))
    nvl = offers["Standard_NC40ads_H100_v5"]
    assert (nvl.gpu, nvl.price_per_hour, nvl.spot_price_per_hour) == (
        "H100 NVL", Decimal("6.98"), Decimal("6.98"))
    gb200 = offers["Standard_ND128isr_NDR_GB200_v6"]
    assert (gb200.gpu_count, gb200.spot_price_per_hour) == (4, Decimal("21.632"))
    assert all(o.source == "azure" and o.provider == "Azure" and o.fetched_at == AT
               for o in result.offers)
    assert result.unknown_gpu_names == () and result.total_rejected == 0


def test_azure_documented_example_is_a_windows_devtest_cpu_item_and_gives_nothing() -> None:
    result = parse_azure_prices(load("azure_retail_prices_envelope_example.json"), AT)
    assert result.offers == () and result.total_rejected == 0


@pytest.mark.parametrize(("sku", "expected"), [
    ("Standard_NC24ads_A100_v4", ("A100 80GB PCIe", 1)),
    ("Standard_ND96amsr_A100_v4", ("A100 80GB SXM4", 8)),  # NDm A100 v4: 8 x 80 GB SXM
    ("Standard_ND96asr_v4", ("A100 40GB SXM4", 8)),
    ("Standard_NC80adis_H100_v5", ("H100 NVL", 2)),
    ("Standard_NC64as_T4_v3", ("T4", 4)),
    ("Standard_NV36ads_A10_v5", ("A10", 1)),
    ("Standard_D14", (None, 0)),  # not a GPU size: skipped, not unknown
])
def test_azure_size_table(sku: str, expected: tuple[str | None, float]) -> None:
    assert gpus_of_sku(sku) == expected


def test_azure_unlisted_gpu_size_is_unknown_not_dropped() -> None:
    with pytest.raises(UnknownGpuError):
        gpus_of_sku("Standard_NG32ads_V620_v1")


def test_aws_offer_file_filters_the_zero_priced_capacity_block_twin() -> None:
    result = parse_aws_offer_file(load("aws_price_list_ec2_offer.json"), AT)
    (offer,) = result.offers
    assert (offer.instance_type, offer.gpu, offer.gpu_count) == ("p4d.24xlarge",
                                                                "A100 40GB SXM4", 8)
    assert offer.price_per_hour == Decimal("32.7726")
    assert offer.price_per_gpu_hour == Decimal("4.096575")
    assert (offer.region, offer.vcpus, offer.ram_bytes) == ("us-east-1", 96, 1152 * GiB)
    assert offer.spot_price_per_hour is None  # spot is not in the Price List API
    # The NIC rate is not the GPU link: it must not land in ``interconnect`` (NVLink ...).
    assert offer.interconnect is None and offer.notes == "network: 400 Gigabit"


def test_runpod_prices_are_per_gpu_times_pod_size_and_placeholders_are_ignored() -> None:
    result = parse_runpod_gpu_types(load("runpod_gpu_types.json"), AT)
    offers = by_instance(result.offers)
    a100 = offers["4x A100 SXM SECURE"]
    assert (a100.gpu, a100.gpu_count) == ("A100 80GB SXM4", 4)
    assert (a100.price_per_hour, a100.spot_price_per_hour) == (Decimal("6.96"), Decimal("3.80"))
    assert offers["1x H100 PCIe COMMUNITY"].price_per_hour == Decimal("1.99")
    # MI300X: communityCloud false, so its 0.5 communityPrice is a placeholder, not an offer.
    assert "1x MI300X COMMUNITY" not in offers and "1x MI300X SECURE" in offers
    # RTX 3070: secureCloud false (securePrice 0) -> no secure offer; community 0.13.
    assert "1x RTX 3070 SECURE" not in offers
    assert offers["1x RTX 3070 COMMUNITY"].price_per_hour == Decimal("0.13")
    # RTX PRO 6000: maxGpuCount 4 -> no 8-GPU pod.
    assert "8x RTX PRO 6000 SECURE" not in offers and "4x RTX PRO 6000 SECURE" in offers
    assert offers["1x B200 SECURE"].gpu == "B200 (HGX)"
    assert result.unknown_gpu_names == () and result.total_rejected == 0
    assert len(result.offers) == 83


def test_runpod_accepts_the_graphql_envelope_and_reports_graphql_errors() -> None:
    payload = {"data": {"gpuTypes": load("runpod_gpu_types.json")[:1]}}
    assert len(parse_runpod_gpu_types(payload, AT).offers) == 4  # MI300X secure 1/2/4/8
    with pytest.raises(PayloadError, match="errors"):
        parse_runpod_gpu_types({"errors": [{"message": "rate limited"}]}, AT)


def test_vastai_offer_uses_dph_total_and_min_bid() -> None:
    (offer,) = parse_vastai_offers(load("vastai_bundles_offer.json"), AT).offers
    assert (offer.gpu, offer.gpu_count, offer.region) == ("RTX 4090", 1, "Guangxi, CN")
    assert offer.price_per_hour == Decimal("0.2466759259259259")
    assert offer.spot_price_per_hour == Decimal("0.2")
    assert offer.gpu_memory_bytes == 24 * GiB
    # 64,393 MB host RAM shared by 24 of 96 cores.
    assert offer.ram_bytes == 16_098_250_000 and offer.vcpus == 24
    wrapped = parse_vastai_offers({"offers": load("vastai_bundles_offer.json")}, AT)
    assert wrapped.offers == (offer,)


def test_lambda_cents_become_dollars_and_description_names_the_gpu() -> None:
    (offer,) = parse_lambda_instance_types(load("lambda_instance_types.json"), AT).offers
    assert (offer.instance_type, offer.gpu, offer.gpu_count) == ("gpu_1x_a100_sxm4",
                                                                "A100 40GB SXM4", 1)
    assert offer.price_per_hour == Decimal("1.10") and offer.region == "us-tx-3"
    assert offer.ram_bytes == 85 * GiB


def test_gpuhunt_csv_merges_spot_rows_and_keeps_flags_distinct() -> None:
    text = (PAYLOADS / "gpuhunt_catalog_v2_sample.csv").read_text()
    text += "i1,us,0.2,30,240,1,A10,24.0,True,,nvidia,\n"  # the spot row of i1
    result = parse_gpuhunt_catalog({"lambdalabs": text}, AT)
    offers = by_instance(result.offers)
    assert sorted(offers) == ["i1", "i2 [f1]", "i3 [f1 f2]", "i4"]
    assert (offers["i1"].price_per_hour, offers["i1"].spot_price_per_hour) == (
        Decimal("0.5"), Decimal("0.2"))
    assert offers["i4"].gpu_count == 8 and offers["i4"].price_per_gpu_hour == Decimal("0.5")
    assert {o.provider for o in result.offers} == {"Lambda"}
    assert all(o.source == "gpuhunt/lambdalabs" for o in result.offers)


def test_gpuhunt_v1_header_without_flags_still_parses() -> None:
    text = "instance_name,location,price,cpu,memory,gpu_count,gpu_name,gpu_memory,spot," \
           "disk_size,gpu_vendor\nx,eu,1.5,8,32,1,L4,24.0,False,100,nvidia\n"
    (offer,) = parse_gpuhunt_catalog({"gcp": text}, AT).offers
    assert (offer.provider, offer.gpu, offer.disk_bytes) == ("GCP", "L4", 100 * 10**9)
