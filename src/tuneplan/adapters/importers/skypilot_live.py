"""Live SkyPilot catalogs: each cloud's ``vms.csv`` from the public skypilot-catalog repository.

Network only; parsing is ``skypilot.parse_skypilot_csv`` (the same parser as the bundled
snapshot). One store source per cloud (``skypilot/aws``), so one broken cloud file never
touches the others. Schema v8 is what SkyPilot 0.14 reads; no key needed.
"""

from __future__ import annotations

from datetime import datetime

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import HttpCache, fetch_text
from tuneplan.adapters.importers.skypilot import parse_skypilot_csv

SOURCE = "skypilot"
DEFAULT_URL = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs"
SCHEMA = "v8"
#: Clouds with a v8 ``vms.csv`` that lists GPU prices (kubernetes/ssh/slurm have none).
CLOUDS = (
    "aws", "azure", "gcp", "lambda", "oci", "runpod", "vast", "cudo", "nebius", "verda",
    "shadeform", "primeintellect", "hyperstack", "jarvislabs", "seeweb", "lium", "daytona",
    "yotta", "hyperbolic", "mithril", "spheron",
)


def source_name(cloud: str) -> str:
    """Store source of one cloud's live SkyPilot catalog: ``skypilot/<cloud>``."""
    return f"{SOURCE}/{cloud}"


def fetch(client: httpx.Client, *, cloud: str, base_url: str = DEFAULT_URL,
          cache: HttpCache | None = None, fetched_at: datetime | None = None) -> ImportResult:
    """GET ``<base_url>/v8/<cloud>/vms.csv`` (conditional with ``cache``), parse it in memory."""
    text = fetch_text(client, f"{base_url.rstrip('/')}/{SCHEMA}/{cloud}/vms.csv", cache=cache)
    return parse_skypilot_csv(text, cloud, fetched_at or utc_now(), source_name(cloud))
