"""Hostile and malformed rows: rejected one by one with a reason, never silently dropped."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers.aws import parse_aws_offer_file
from tuneplan.adapters.importers.azure import parse_azure_prices
from tuneplan.adapters.importers.base import ImportResult
from tuneplan.adapters.importers.gpuhunt import parse_gpuhunt_catalog
from tuneplan.adapters.importers.runpod import parse_runpod_gpu_types
from tuneplan.adapters.importers.validation import (
    MAX_REJECT_REASONS,
    PayloadError,
    RowRejected,
    merge_results,
    read_price,
    require_price,
)
from tuneplan.adapters.importers.vastai import parse_vastai_offers

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PAYLOADS = FIXTURES / "importers"


def load(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


@pytest.mark.parametrize("value", [-1, 0, "0", float("nan"), float("inf"), "NaN", "abc", True,
                                   {"USD": 1}, [1.0], "-0.5"])
def test_read_price_rejects_hostile_values(value: object) -> None:
    with pytest.raises(RowRejected):
        read_price(value, "price")


@pytest.mark.parametrize(("value", "expected"), [(2.49, Decimal("2.49")), ("32.7726000000",
                         Decimal("32.7726")), (110, Decimal(110)), (None, None), ("", None)])
def test_read_price_keeps_decimal_text_exact(value: object, expected: Decimal | None) -> None:
    assert read_price(value, "price") == expected


def test_require_price_rejects_an_absent_price() -> None:
    assert require_price("1.5", "price") == Decimal("1.5")
    with pytest.raises(RowRejected, match="price is missing"):
        require_price("", "price")


def test_merged_results_cap_reasons_but_count_every_reject() -> None:
    part = ImportResult(offers=(), unknown_gpu_names=("X1",),
                        rejected_rows=tuple(f"row {i}" for i in range(40)), rejected_count=45)
    merged = merge_results([part, part])
    assert merged.total_rejected == 90 and len(merged.rejected_rows) == MAX_REJECT_REASONS
    assert merged.unknown_gpu_names == ("X1",)


def _azure_item(**changes: Any) -> dict[str, Any]:
    item = {"currencyCode": "USD", "retailPrice": 7.346, "armRegionName": "eastus",
            "meterName": "NC48ads_A100_v4", "skuName": "NC48ads_A100_v4",
            "productName": "NCads A100 v4 Series Linux", "unitOfMeasure": "1 Hour",
            "type": "Consumption", "armSkuName": "Standard_NC48ads_A100_v4"}
    item.update(changes)
    return item


def test_azure_rejects_bad_rows_and_keeps_the_good_one() -> None:
    items = [
        _azure_item(),
        _azure_item(armRegionName="westus", retailPrice=-3.0),
        _azure_item(armRegionName="westus2", retailPrice="NaN"),
        _azure_item(armRegionName="westus3", retailPrice={"USD": 1}),
        _azure_item(armRegionName="centralus", retailPrice=5_000.0),  # > 200 USD/GPU-h cap
        _azure_item(armRegionName="northeurope", currencyCode="EUR"),
        _azure_item(armRegionName="uksouth", unitOfMeasure="1/Month"),
        _azure_item(armSkuName="Standard_NV6ads_A10_v5"),  # 1/6 of an A10
        _azure_item(armSkuName="Standard_NG32ads_V620_v1"),  # a GPU size we do not know
        "not an object",
    ]
    result = parse_azure_prices({"Items": items}, AT)
    (offer,) = result.offers
    assert (offer.region, offer.price_per_hour) == ("eastus", Decimal("7.346"))
    assert result.total_rejected == 8
    reasons = "\n".join(result.rejected_rows)
    for fragment in ("must be > 0", "not a finite number", "type dict", "sanity cap", "EUR",
                     "1/Month", "fractional GPU", "expected an object"):
        assert fragment in reasons
    assert result.unknown_gpu_names == ("Standard_NG32ads_V620_v1",)


def test_aws_negative_and_garbage_prices_are_rejected() -> None:
    payload = load("aws_price_list_ec2_offer.json")
    dims = payload["terms"]["OnDemand"]["H7NGEAC6UEHNTKSJ"]["H7NGEAC6UEHNTKSJ.JRTCKXETXF"][
        "priceDimensions"]
    for bad in ("-32.7726", "free", None):
        broken = copy.deepcopy(payload)
        key = next(iter(dims))
        broken["terms"]["OnDemand"]["H7NGEAC6UEHNTKSJ"]["H7NGEAC6UEHNTKSJ.JRTCKXETXF"][
            "priceDimensions"][key]["pricePerUnit"]["USD"] = bad
        result = parse_aws_offer_file(broken, AT)
        assert result.offers == () and result.total_rejected == 1


def test_aws_unknown_instance_family_is_reported() -> None:
    payload = load("aws_price_list_ec2_offer.json")
    payload["products"]["H7NGEAC6UEHNTKSJ"]["attributes"]["instanceType"] = "g4ad.xlarge"
    result = parse_aws_offer_file(payload, AT)
    assert result.offers == () and result.unknown_gpu_names == ("aws:g4ad",)


def test_aws_wrong_shape_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        parse_aws_offer_file({"products": []}, AT)
    with pytest.raises(PayloadError):
        parse_aws_offer_file([], AT)


def test_runpod_unknown_gpu_and_wrong_types() -> None:
    rows = load("runpod_gpu_types.json")[:2]
    rows[0] = {**rows[0], "displayName": "Quantum QPU 9000", "id": "QPU"}
    rows[1] = {**rows[1], "securePrice": "lots", "secureSpotPrice": -1}
    result = parse_runpod_gpu_types(rows, AT)
    assert result.unknown_gpu_names == ("Quantum QPU 9000",)
    # A100 PCIe: the secure tier is rejected (4 pod sizes); the community tier still works.
    assert result.total_rejected == 4
    assert {o.instance_type for o in result.offers} == {
        f"{n}x A100 PCIe COMMUNITY" for n in (1, 2, 4, 8)}


def test_vastai_bad_counts_and_names() -> None:
    good = load("vastai_bundles_offer.json")[0]
    rows = [good, {**good, "num_gpus": 0}, {**good, "num_gpus": 1.5},
            {**good, "gpu_name": "RTX\x1b[31m 4090"}, {**good, "dph_total": None},
            {**good, "gpu_name": "GTX 1080 Ti"}]
    result = parse_vastai_offers(rows, AT)
    assert len(result.offers) == 1 and result.total_rejected == 4
    assert result.unknown_gpu_names == ("GTX 1080 Ti",)


def test_gpuhunt_malformed_csv_rows() -> None:
    header = (PAYLOADS / "gpuhunt_v3" / "aws.csv").read_text().splitlines()[0]
    text = "\n".join([header, "ok,us,1.0,8,32,1,L4,24.0,False,,nvidia,,x86,{}",
                      "neg,us,-1.0,8,32,1,L4,24.0,False,,nvidia,,x86,{}",
                      "spot,us,1.0,8,32,1,L4,24.0,maybe,,nvidia,,x86,{}",
                      "short,us,1.0", "cpu,us,0.1,8,32,0,,,False,,,,x86,{}",
                      "tpu,us,1.0,8,32,1,v5litepod-1,16,False,,google,,x86,{}"]) + "\n"
    result = parse_gpuhunt_catalog({"gcp": text}, AT)
    assert [o.instance_type for o in result.offers] == ["ok"]
    # gpuhunt's reader skips the bad spot flag and the short row; our check rejects the price.
    assert result.total_rejected == 3
    reasons = "\n".join(result.rejected_rows)
    assert "gcp.csv line 4: Cannot parse field 'spot'" in reasons
    assert "gcp.csv line 5: Required field 'gpu_count' is missing" in reasons
    assert "gcp.csv item 2: price must be > 0" in reasons
    with pytest.raises(PayloadError, match="lacks columns"):
        parse_gpuhunt_catalog({"gcp": "a,b\n1,2\n"}, AT)
    with pytest.raises(PayloadError, match="no offline provider 'vastai'"):
        parse_gpuhunt_catalog({"vastai": text}, AT)
