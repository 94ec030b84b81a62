"""`tuneplan offers`, `gpus`, `providers`, `catalog status|history|import` as a shell sees them."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import OFFER_RECORD_FIELDS, OfferFilter
from tuneplan.units import GB

Run = Callable[..., CliResult]
CLI_MD_KEYS = {"provider", "instance_type", "gpu", "gpu_count", "gpu_memory_bytes", "vcpus",
               "ram_bytes", "region", "zone", "price_per_hour", "spot_price_per_hour",
               "currency", "interconnect", "fetched_at", "source"}


def test_offers_h100_json_spans_many_providers_with_dates_and_sources(run_cli: Run) -> None:
    result = run_cli("offers", "--gpu", "H100", "--json")
    assert result.code == 0, result.stderr
    offers = result.json()
    assert len({o["provider"] for o in offers}) >= 8
    assert {o["gpu"] for o in offers} == {"H100 SXM5", "H100 PCIe", "H100 NVL"}
    for record in offers:
        assert set(record) >= CLI_MD_KEYS
        assert datetime.fromisoformat(record["fetched_at"]).tzinfo is not None
        assert record["source"].startswith("skypilot-snapshot/")
    both = [o for o in offers if o["price_per_hour"] and o["spot_price_per_hour"]]
    assert len({o["provider"] for o in both}) >= 3  # spot where the source has it
    aws = next(o for o in both if o["instance_type"] == "p5.48xlarge")
    assert Decimal(aws["price_per_gpu_hour"]) * 8 == Decimal(aws["price_per_hour"])


def test_offers_h100_come_from_25_clouds_and_resold_ones_match_both_names(run_cli: Run) -> None:
    offers = run_cli("offers", "--gpu", "H100", "--format", "csv")
    assert offers.code == 0, offers.stderr
    providers = {row["provider"] for row in csv.DictReader(io.StringIO(offers.stdout))}
    clouds = {name.split(" (via ")[0] for name in providers}
    assert len(clouds) >= 25 and "Scaleway (via Shadeform)" in providers
    sold = run_cli("offers", "--gpu", "H100", "--provider", "shadeform", "--json").json()
    assert sold and all(o["provider"].endswith(" (via Shadeform)") for o in sold)
    assert all("sold through Shadeform" in o["notes"] for o in sold)
    scaleway = run_cli("offers", "--gpu", "H100", "--provider", "scaleway", "--json").json()
    assert {o["provider"] for o in scaleway} == {"Scaleway (via Shadeform)"}
    assert {o["instance_type"] for o in scaleway} == {"scaleway_H100", "scaleway_H100x2"}


def test_big_nodes_sorted_by_price(run_cli: Run) -> None:
    result = run_cli("offers", "--min-gpu-memory", "80GB", "--count", "8", "--sort", "price",
                     "--json")
    assert result.code == 0, result.stderr
    offers = result.json()
    prices = [Decimal(o["price_per_hour"]) for o in offers]
    assert len(offers) > 50 and prices == sorted(prices)
    assert all(o["gpu_count"] == 8 and o["gpu_memory_bytes"] >= 80 * GB for o in offers)


def test_spot_max_price_provider_region_filters(run_cli: Run) -> None:
    spot = run_cli("offers", "--spot", "--max-price", "4", "--sort", "price-per-gpu", "--json")
    records = spot.json()
    assert records and all(Decimal(o["spot_price_per_hour"]) <= 4 for o in records)
    per_gpu = [Decimal(o["spot_price_per_gpu_hour"]) for o in records]
    assert per_gpu == sorted(per_gpu)
    chosen = run_cli("offers", "--provider", "aws,runpod", "--region", "us-", "--json").json()
    assert {o["provider"] for o in chosen} == {"AWS", "RunPod"}
    assert all(o["region"].lower().startswith("us-") or (o["zone"] or "").lower()
               .startswith("us-") for o in chosen)


def test_offers_csv_and_table(run_cli: Run) -> None:
    result = run_cli("offers", "--gpu", "B200", "--csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert tuple(rows[0]) == OFFER_RECORD_FIELDS
    assert rows and all(r["gpu"] == "B200 (HGX)" for r in rows)
    table = run_cli("offers", "--gpu", "A100", "--provider", "gcp")
    assert table.code == 0 and "catalog: 22 sources" in table.stdout and "ago" in table.stdout


def test_bad_flag_values_are_exit_2(run_cli: Run) -> None:
    result = run_cli("offers", "--min-gpu-memory", "80 parsecs")
    assert result.code == 2 and result.stderr.count("\n") == 1


def test_gpus_and_providers(run_cli: Run) -> None:
    gpus = run_cli("gpus", "--min-memory", "141GB", "--json").json()
    names = [g["name"] for g in gpus]
    assert "H200 SXM" in names and "H100 SXM5" not in names
    h200 = gpus[names.index("H200 SXM")]
    assert h200["driver_memory_bytes"] == 143_771 * 2**20 < h200["memory_bytes"]  # nvidia-smi
    # torch's total, read on a lent H200 (139.80 GiB, as whole MiB rounded down), not the
    # rule's driver total less 900 MiB (which would say 142,871 MiB)
    assert h200["usable_memory_bytes"] == 143_155 * 2**20
    assert h200["usable_memory"]["basis"] == "reported"
    assert "mem_get_info" in h200["usable_memory"]["source"]
    providers = {p["name"]: p for p in run_cli("providers", "--json").json()}
    assert providers["AWS"]["spot_notice_s"] == 120
    assert providers["TensorDock"]["billing_granularity_s"] is None
    table = run_cli("providers")
    assert table.code == 0 and "AWS" in table.stdout


def test_catalog_status_warns_when_older_than_a_week(run_cli: Run) -> None:
    status = run_cli("catalog", "status", "--json").json()
    assert len(status["sources"]) == 22
    old = datetime.now(UTC) - timedelta(days=10)
    with CatalogStore.open() as store:
        lambda_offers = store.offers(OfferFilter(providers=("lambda",)))
        store.replace_source("skypilot-snapshot/lambda",
                             [replace(o, fetched_at=old) for o in lambda_offers], old)
    stale = {s["source"]: s["stale"]
             for s in run_cli("catalog", "status", "--json").json()["sources"]}
    assert stale["skypilot-snapshot/lambda"] is True and stale["skypilot-snapshot/aws"] is False
    assert "older than 7 days" in run_cli("catalog", "status").stdout


def test_catalog_history(run_cli: Run) -> None:
    points = run_cli("catalog", "history", "H100", "--json").json()
    assert {p["gpu"] for p in points} == {"H100 SXM5", "H100 PCIe", "H100 NVL"}
    assert all(Decimal(p["min_price_per_gpu_hour"] or "1") > 0 for p in points)


def test_catalog_import_adds_a_users_prices(run_cli: Run, tmp_path: Path) -> None:
    file = tmp_path / "lab.csv"
    file.write_text("provider,gpu,gpu_count,region,price_per_hour,ram\n"
                    "my-lab,H100 SXM,8,onprem-1,12.00,2TiB\n"
                    "my-lab,A100-80GB,4,onprem-1,3.20,\n")
    result = run_cli("catalog", "import", str(file), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["offers"] == 2 and result.json()["source"] == "user-import:lab.csv"
    mine = run_cli("offers", "--provider", "my-lab", "--json").json()
    assert [(o["gpu"], o["price_per_hour"], o["ram_bytes"]) for o in mine] == [
        ("A100 80GB SXM4", "3.20", None), ("H100 SXM5", "12.00", 2 * 2**40)]


def test_catalog_import_of_a_bad_file_writes_nothing(run_cli: Run, tmp_path: Path) -> None:
    run_cli("catalog", "status")  # seed
    before = os.path.getsize(os.environ["TUNEPLAN_HOME"] + "/catalog.sqlite")
    file = tmp_path / "bad.csv"
    file.write_text("provider,gpu,gpu_count,region,price_per_hour\n"
                    "lab,H100,1,r,2.0\n"
                    "lab,H100,1,r,-4\n"
                    "lab,TPU-v9,1,r,2.0\n")
    result = run_cli("catalog", "import", str(file))
    assert result.code == 2 and result.stderr.count("\n") == 1
    assert "line 3" in result.stderr and "TPU-v9" in result.stderr
    status = run_cli("catalog", "status", "--json").json()
    assert not any(s["source"].startswith("user-import") for s in status["sources"])
    assert os.path.getsize(os.environ["TUNEPLAN_HOME"] + "/catalog.sqlite") == before


@pytest.mark.parametrize("header", ["provider,gpu,region,price_per_hour", "gpu,gpu_count,x"])
def test_catalog_import_bad_header(run_cli: Run, tmp_path: Path, header: str) -> None:
    file = tmp_path / "h.csv"
    file.write_text(header + "\n")
    result = run_cli("catalog", "import", str(file))
    assert result.code == 2 and "header must have" in result.stderr


def test_a_corrupt_catalog_is_one_line_exit_1(run_cli: Run) -> None:
    Path(os.environ["TUNEPLAN_HOME"], "catalog.sqlite").write_bytes(b"\x00garbage" * 512)
    result = run_cli("offers", "--gpu", "H100")
    assert result.code == 1 and result.stderr.startswith("error: catalog ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
