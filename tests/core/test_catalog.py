"""Offers, GPU-name normalisation, filters, provider features and the shipped snapshot."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from tuneplan.adapters.bundled import (
    SNAPSHOT_DIR,
    list_snapshot_files,
    load_providers,
    read_data_text,
)
from tuneplan.adapters.importers.skypilot import row_gpu
from tuneplan.adapters.importers.snapshot import load_bundled_snapshot
from tuneplan.core.catalog.offers import (
    CANONICAL_GPUS,
    Offer,
    OfferFilter,
    OfferSort,
    filter_offers,
    gpu_matches,
    is_safe_text,
    normalise_gpu_name,
    sort_offers,
)
from tuneplan.core.catalog.providers import (
    parse_duration_text,
    parse_price_text,
    provider_matches,
    resold_provider_name,
    selling_provider,
    split_resold,
)
from tuneplan.errors import InvalidOfferError, UnknownGpuError
from tuneplan.units import GB, GiB

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def make(**changes: Any) -> Offer:
    base = Offer(provider="AWS", instance_type="p5.48xlarge", gpu="H100 SXM5", gpu_count=8,
                 gpu_memory_bytes=80 * GiB, vcpus=192.0, ram_bytes=2048 * GiB, region="us-east-1",
                 zone="use1-az1", price_per_hour=Decimal("55.04"),
                 spot_price_per_hour=Decimal("20.1"), fetched_at=NOW, source="test")
    return replace(base, **changes)


def test_offer_per_gpu_prices_and_id() -> None:
    offer = make()
    assert offer.price_per_gpu_hour == Decimal("6.88")
    assert offer.spot_price_per_gpu_hour == Decimal("2.5125")
    assert offer.id == make(price_per_hour=Decimal(1)).id  # prices do not change the id
    assert offer.id != make(zone="use1-az2").id and len(offer.id) == 12


@pytest.mark.parametrize(("changes", "message"), [
    ({"price_per_hour": None, "spot_price_per_hour": None}, "no price"),
    ({"price_per_hour": Decimal(0)}, "must be a finite Decimal > 0"),
    ({"spot_price_per_hour": Decimal("-1")}, "must be a finite Decimal > 0"),
    ({"price_per_hour": Decimal("NaN")}, "must be a finite Decimal > 0"),
    ({"price_per_hour": 3.5}, "must be a finite Decimal > 0"),            # float money
    ({"price_per_hour": Decimal(1601)}, "sanity cap"),                    # > 200 USD/GPU-h x 8
    ({"gpu_count": 0}, "gpu_count"),
    ({"gpu_count": 0.25}, "gpu_count"),                                   # fractional GPU
    ({"gpu": "H100"}, "not a canonical GPU"),                            # not normalised
    ({"gpu_memory_bytes": 0}, "gpu_memory_bytes"),
    ({"fetched_at": datetime(2026, 1, 1)}, "timezone-aware UTC"),        # naive
    ({"fetched_at": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))}, "UTC"),
    ({"region": " "}, "region is empty"),
    ({"currency": "EUR"}, "not USD"),
])
def test_offer_invariants(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidOfferError, match=message):
        make(**changes)


def test_spot_only_offer_is_valid() -> None:
    assert make(price_per_hour=None).price_per_gpu_hour is None


@pytest.mark.parametrize(("raw", "hint", "expected"), [
    ("H100", None, "H100 SXM5"),                     # bare H100 on a cloud = HGX board
    ("H100", 94 * GB, "H100 NVL"),                   # 94 GB says NVL
    ("H100-80G-PCIe-NVLink", None, "H100 PCIe"),     # Hyperstack
    ("NVIDIA-H100-80GB-HBM3", None, "H100 SXM5"),    # Hyperbolic's GpuInfo name
    ("H100-MEGA", None, "H100 SXM5"),                # GCP a3-megagpu
    ("A100", 40 * GiB, "A100 40GB SXM4"),
    ("A100", 80 * GiB, "A100 80GB SXM4"),
    ("A100-80GB", None, "A100 80GB SXM4"),
    ("A100 PCIe", 80 * GiB, "A100 80GB PCIe"),
    ("V100", 32 * GiB, "V100 SXM2 32GB"),
    ("V100-32GB", None, "V100 SXM2 32GB"),
    ("A10G", None, "A10G"),
    ("A6000", None, "RTX A6000"),
    ("RTX6000Ada", None, "RTX 6000 Ada"),
    ("RTX-6000-Ada", None, "RTX 6000 Ada"),
    ("RTX6000", None, "Quadro RTX 6000"),            # Turing, 24 GB: not the Ada card
    ("GAUDI2", None, "Gaudi 2"),
    ("RTXPRO6000S", None, "RTX PRO 6000 Blackwell"),
    ("rtx 4090", None, "RTX 4090"),
])
def test_normalise_gpu_name(raw: str, hint: int | None, expected: str) -> None:
    assert normalise_gpu_name(raw, hint) == expected


@pytest.mark.parametrize("name", CANONICAL_GPUS)
def test_canonical_names_normalise_to_themselves(name: str) -> None:
    assert normalise_gpu_name(name) == name
    # Respelled, a canonical name must not be captured by an alias meant for another GPU.
    assert normalise_gpu_name(name.lower().replace(" ", "-")) == name


def test_unknown_gpu_is_reported_with_its_name() -> None:
    with pytest.raises(UnknownGpuError) as info:
        normalise_gpu_name("TPU-v5e")
    assert info.value.raw == "TPU-v5e"
    with pytest.raises(UnknownGpuError):  # a 144 GB GH200 is not the 96 GB spec row
        normalise_gpu_name("GH200", 144 * GiB)


def test_every_gpu_name_in_the_shipped_snapshot_normalises() -> None:
    names = set()
    for name in list_snapshot_files():
        for row in csv.DictReader(io.StringIO(read_data_text(SNAPSHOT_DIR, name))):
            if name == "spheron.csv":  # H100_PCIE_BAREMETAL: the importer strips the variant
                assert row_gpu(row, "spheron") is not None, row["AcceleratorName"]
            elif row["AcceleratorName"]:
                names.add(row["AcceleratorName"])
    assert len(names) > 60
    failures = []
    for raw in sorted(names):
        try:
            normalise_gpu_name(raw)
        except UnknownGpuError:
            failures.append(raw)
    assert failures == []
    assert all(not result.unknown_gpu_names for _, result, _ in load_bundled_snapshot())


@pytest.mark.parametrize(("query", "gpu", "expected"), [
    ("H100", "H100 PCIe", True), ("H100", "H100 SXM5", True), ("H100", "H100 NVL", True),
    ("H100", "GH200 (96GB HBM3)", False), ("H100", "H200 SXM", False),
    ("h100 sxm", "H100 SXM5", True), ("H100 SXM", "H100 PCIe", False),
    ("A100 80", "A100 80GB PCIe", True), ("A100 80", "A100 40GB SXM4", False),
    ("A10", "A10", True), ("A10", "A10G", False), ("A10", "A100 80GB SXM4", False),
    ("A100-80GB", "A100 80GB SXM4", True),           # an alias selects what it normalises to
])
def test_gpu_family_match(query: str, gpu: str, expected: bool) -> None:
    assert gpu_matches(query, gpu) is expected


def test_filter_and_sort() -> None:
    offers = [
        make(),
        make(provider="RunPod", gpu="H100 PCIe", gpu_count=1, price_per_hour=Decimal("2.39"),
             spot_price_per_hour=None, region="US", zone="US-TX-3"),
        make(provider="Lambda", gpu="A100 40GB SXM4", gpu_memory_bytes=40 * GiB, gpu_count=8,
             price_per_hour=Decimal("14.32"), spot_price_per_hour=None,
             region="europe-central-1", zone=None),
    ]
    assert [o.provider for o in filter_offers(offers, OfferFilter(gpu="H100"))] == ["AWS",
                                                                                     "RunPod"]
    assert [o.provider for o in filter_offers(offers, OfferFilter(spot=True))] == ["AWS"]
    big = OfferFilter(min_gpu_memory_bytes=80 * GB, gpu_count=8)
    assert [o.provider for o in filter_offers(offers, big)] == ["AWS"]
    assert [o.provider for o in filter_offers(offers, OfferFilter(providers=("aws", "lambda")))
            ] == ["AWS", "Lambda"]
    assert [o.provider for o in filter_offers(offers, OfferFilter(region="us"))] == ["AWS",
                                                                                      "RunPod"]
    cheap = OfferFilter(max_price_per_hour=Decimal(15))
    assert [o.provider for o in filter_offers(offers, cheap)] == ["RunPod", "Lambda"]
    assert [o.provider for o in sort_offers(offers, OfferSort.PRICE)] == ["RunPod", "Lambda",
                                                                          "AWS"]
    assert [o.provider for o in sort_offers(offers, OfferSort.PRICE_PER_GPU)] == [
        "Lambda", "RunPod", "AWS"]  # 1.79 < 2.39 < 6.88 per GPU-hour
    assert [o.provider for o in sort_offers(offers, OfferSort.MEMORY)] == ["AWS", "Lambda",
                                                                           "RunPod"]


def test_shipped_providers_meet_invariants_and_keep_unknowns() -> None:
    providers = {p.name: p for p in load_providers()}
    assert len(providers) == 18
    aws = providers["AWS"]
    assert (aws.billing_granularity_s, aws.billing_minimum_s, aws.spot_notice_s) == (1, 60, 120)
    assert aws.egress_usd_per_gb == Decimal("0.09")                 # after the free 100 GB
    assert aws.storage_price_usd_per_gb_month == Decimal("0.08")    # gp3, not the "3" in it
    lam = providers["Lambda"]
    assert lam.spot_available is False and lam.billing_granularity_s == 60
    assert lam.storage_price_usd_per_gb_month == Decimal("0.20") * GB / GiB  # quoted per GiB
    tensordock = providers["TensorDock"]
    assert tensordock.billing_granularity_s is None and tensordock.spot_available is None
    assert tensordock.storage_price_usd_per_gb_month is None
    assert providers["Vast.ai"].spot_notice_s == 0                   # "none: outbid = stopped"
    for p in providers.values():
        assert p.billing_granularity_raw  # the raw text is always kept
        for value in (p.storage_price_usd_per_gb_month, p.egress_usd_per_gb):
            assert value is None or Decimal(0) <= value < 1


@pytest.mark.parametrize(("text", "seconds"), [
    ("per-second (Linux on-demand/spot)", 1), ("1-minute increments (hourly price)", 60),
    ("2 minutes (plus optional rebalance)", 120), ("up to 30 seconds", 30),
    ("unknown (not verified)", None), ("not published", None), ("hourly rates", 3600),
])
def test_duration_text(text: str, seconds: int | None) -> None:
    assert parse_duration_text(text) == seconds


def test_price_text_without_a_number_is_unknown() -> None:
    assert parse_price_text("host-set (search field storage_cost)") is None
    assert parse_price_text("0 (no data transfer fees)") == 0


SNAPSHOT = {source: result for source, result, _ in load_bundled_snapshot()}


def test_snapshot_counts_and_rejections() -> None:
    assert len(SNAPSHOT) == 22
    assert sum(len(r.offers) for r in SNAPSHOT.values()) == 5095
    aws = SNAPSHOT["skypilot-snapshot/aws"]
    assert aws.total_rejected == 36  # 31 fractional g6f.2xlarge (0.25 L4) + 5 p5e without price
    assert sum("fractional" in r for r in aws.rejected_rows) == 31
    assert SNAPSHOT["skypilot-snapshot/mithril"].offers == ()  # placeholder prices rejected
    assert SNAPSHOT["skypilot-snapshot/azure"].total_rejected == 16


def test_aggregator_rows_name_the_cloud_and_the_reseller() -> None:
    shade = SNAPSHOT["skypilot-snapshot/shadeform"]
    assert shade.total_rejected == 0 and len(shade.offers) == 259
    scaleway = [o for o in shade.offers if o.instance_type == "scaleway_H100x2"]
    assert {o.provider for o in scaleway} == {"Scaleway (via Shadeform)"}
    assert {o.region for o in scaleway} == {"warsaw-poland-1", "paris-france-1"}
    assert all(o.price_per_hour == Decimal("6.08") and o.gpu == "H100 SXM5" for o in scaleway)
    assert "the machine is Scaleway's, the price and rental terms are Shadeform's" in (
        scaleway[0].notes)
    # A prefix with no known provider name stays as the aggregator wrote it.
    assert {o.provider for o in shade.offers if o.instance_type.startswith("imwt_")} == {
        "imwt (via Shadeform)"}
    prime = SNAPSHOT["skypilot-snapshot/primeintellect"].offers
    roan = [o for o in prime if o.instance_type.startswith("dc_roan__")]
    assert roan and {o.provider for o in roan} == {"dc_roan (via Prime Intellect)"}
    spheron = SNAPSHOT["skypilot-snapshot/spheron"]
    assert spheron.total_rejected == 0 and len(spheron.offers) == 152
    by_type = {o.instance_type: o for o in spheron.offers}
    # The Provider column names the cloud; "spheron-ai" is Spheron's own machine.
    assert by_type["n3-H100x8__CANADA-1"].provider == "Spheron"
    bare = by_type["H100_668d6762247d03149a4c9468_dallas-usa-1"]  # H100_PCIE_BAREMETAL
    assert (bare.provider, bare.gpu) == ("Sesterce (via Spheron)", "H100 PCIe")
    fin = by_type["1H100.80S.32V_FIN-03_500"]
    assert (fin.provider, fin.gpu, fin.spot_price_per_hour) == (
        "Verda (ex-DataCrunch) (via Spheron)", "H100 SXM5", Decimal("0.8015"))
    assert by_type["gpu_1x_a6000_low_ram_us-central-2"].gpu == "RTX A6000"
    assert by_type["V100_32G_668d6762247d03149a4c946f_newyork-usa-1"].gpu == "V100 PCIe 32GB"
    verda = [o for o in prime if o.instance_type == "datacrunch__8xH100_80GB__176__1480__SPOT"]
    assert [o.provider for o in verda] == ["Verda (ex-DataCrunch) (via Prime Intellect)"]
    assert verda[0].spot_price_per_hour == Decimal("6.84")


def test_resold_provider_names_match_cloud_and_reseller() -> None:
    name = resold_provider_name("paperspace", "shadeform")
    assert name == "Paperspace (DigitalOcean) (via Shadeform)"
    assert split_resold(name) == ("Paperspace (DigitalOcean)", "Shadeform")
    assert split_resold("Paperspace (DigitalOcean)") == ("Paperspace (DigitalOcean)", None)
    assert selling_provider(name) == "Shadeform"
    assert selling_provider("Lambda") == "Lambda"
    assert provider_matches("shadeform", name) and provider_matches("paperspace", name)
    assert provider_matches(name, name)
    assert not provider_matches("digitalocean", name)  # DigitalOcean's own GPU cloud
    assert not provider_matches("lambda", name)


def test_bundled_snapshot_has_h100_offers_from_25_clouds() -> None:
    h100 = [o for r in SNAPSHOT.values() for o in r.offers if o.gpu.startswith("H100")]
    clouds = {split_resold(o.provider)[0] for o in h100}
    assert len(clouds) >= 25, sorted(clouds)
    assert {"Scaleway", "DigitalOcean", "Massed Compute", "Latitude.sh", "Voltage Park",
            "Denvr Dataworks", "Spheron", "Sesterce"} <= clouds
    assert len(clouds) == 29


def test_gcp_gpu_rows_join_their_host_vm_or_are_marked() -> None:
    gcp = SNAPSHOT["skypilot-snapshot/gcp"].offers
    joined = [o for o in gcp if o.instance_type == "a2-highgpu-1g"
              and o.zone == "asia-northeast1-a"]
    assert len(joined) == 1
    assert joined[0].price_per_hour == Decimal("1.70586") + Decimal("0.94803")
    assert joined[0].spot_price_per_hour == Decimal("1.2307") + Decimal("0.41783")
    assert joined[0].vcpus == 12.0 and not joined[0].attachable
    t4 = [o for o in gcp if o.gpu == "T4"]
    assert t4 and all(o.attachable and o.instance_type == "" for o in t4)
    assert all("excludes the host VM" in o.notes for o in t4)


def test_snapshot_quirks() -> None:
    vast = SNAPSHOT["skypilot-snapshot/vast"].offers
    assert all(o.spot_price_per_hour is None for o in vast)  # 0.00 is a placeholder
    v7 = SNAPSHOT["skypilot-snapshot/runpod-v7"].offers
    assert all(o.spot_price_per_hour is None for o in v7)
    assert not any(o.instance_type == "1x_A100-80GB_SECURE" for o in v7)  # v8 has it
    assert {o.gpu for o in SNAPSHOT["skypilot-snapshot/runpod"].offers} == {"A100 80GB PCIe"}
    nd = [o for o in SNAPSHOT["skypilot-snapshot/azure"].offers
          if o.instance_type == "Standard_ND96isr_H100_v5"]
    assert nd and all(o.gpu_count == 8 for o in nd)
    p5 = [o for o in SNAPSHOT["skypilot-snapshot/aws"].offers if o.instance_type == "p5.48xlarge"]
    assert p5 and all(o.gpu == "H100 SXM5" and o.interconnect == "NVLink 4.0" for o in p5)


@pytest.mark.parametrize(("text", "safe"), [
    ("Standard_ND96isr_H100_v5", True),
    ("Zürich · 東京", True),                 # ordinary non-ASCII letters are fine
    ("evil\x1b[31m", False),                # ANSI escape (control)
    ("gpu\u202eexe.nvidia", False),         # right-to-left override disguises text
    ("a\u200bb", False),                    # zero-width space
    ("line\u2028break", False),             # line separator
])
def test_is_safe_text(text: str, safe: bool) -> None:
    assert is_safe_text(text) is safe
