"""Provider features (billing, spot, storage, egress, access, fabric) and provider names.

Pure: ``parse_providers`` takes the text of ``providers.csv``; raw text is kept beside every
parsed number, and what the text does not say stays None ("unknown"), never invented.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from decimal import Decimal

from tuneplan.errors import CatalogError
from tuneplan.units import GB, HOUR_S, MINUTE_S, GiB

# Lowercase alphanumeric key -> canonical provider name (providers.csv's ``provider`` column, or
# the cloud's own spelling for SkyPilot clouds providers.csv does not describe).
PROVIDER_ALIASES: dict[str, str] = {
    "aws": "AWS", "amazon": "AWS", "gcp": "GCP", "google": "GCP", "azure": "Azure",
    "oci": "Oracle (OCI)", "oracle": "Oracle (OCI)", "oracleoci": "Oracle (OCI)",
    "lambda": "Lambda", "lambdalabs": "Lambda", "runpod": "RunPod", "vast": "Vast.ai",
    "vastai": "Vast.ai", "coreweave": "CoreWeave", "paperspace": "Paperspace (DigitalOcean)",
    "paperspacedigitalocean": "Paperspace (DigitalOcean)", "jarvislabs": "Jarvislabs",
    "tensordock": "TensorDock", "nebius": "Nebius", "crusoe": "Crusoe",
    "verda": "Verda (ex-DataCrunch)", "datacrunch": "Verda (ex-DataCrunch)",
    "verdaexdatacrunch": "Verda (ex-DataCrunch)", "hyperstack": "Hyperstack",
    "fluidstack": "Fluidstack", "modal": "Modal", "together": "Together AI",
    "togetherai": "Together AI", "cudo": "Cudo", "cudocompute": "Cudo", "shadeform": "Shadeform",
    "primeintellect": "Prime Intellect", "seeweb": "Seeweb", "lium": "Lium", "daytona": "Daytona",
    "yotta": "Yotta", "hyperbolic": "Hyperbolic", "mithril": "Mithril", "cloudrift": "CloudRift",
    # Clouds named by the aggregators' instance-name prefixes (Shadeform ``scaleway_H100``,
    # Prime Intellect ``datacrunch__8xH100...``); a prefix not listed here stays as written.
    "massedcompute": "Massed Compute", "scaleway": "Scaleway", "digitalocean": "DigitalOcean",
    "latitude": "Latitude.sh", "latitudesh": "Latitude.sh", "denvr": "Denvr Dataworks",
    "denvrdataworks": "Denvr Dataworks", "voltagepark": "Voltage Park", "vultr": "Vultr",
    "spheron": "Spheron", "spheronai": "Spheron", "sesterce": "Sesterce",
}


def _provider_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def normalise_provider_name(raw: str) -> str:
    """Canonical provider name for a known alias (``aws`` -> ``AWS``); other names unchanged
    (stripped), so a user's own ``on-prem`` provider stays what they wrote."""
    return PROVIDER_ALIASES.get(_provider_key(raw), raw.strip())


_VIA = " (via "


def resold_provider_name(upstream: str, reseller: str) -> str:
    """The provider of an offer an aggregator sells on another cloud's machines:
    ``Scaleway (via Shadeform)``. Both facts stay in the name: the hardware is the upstream
    cloud's; the price, the account and the rental terms are the reseller's."""
    return f"{normalise_provider_name(upstream)}{_VIA}{normalise_provider_name(reseller)})"


def split_resold(provider: str) -> tuple[str, str | None]:
    """(upstream, reseller) of a ``resold_provider_name``; (provider, None) for a direct one."""
    if provider.endswith(")") and _VIA in provider:
        upstream, reseller = provider.rsplit(_VIA, 1)
        return upstream, reseller[:-1]
    return provider, None


def selling_provider(provider: str) -> str:
    """Whom the offer is rented from: the reseller of a resold offer, else the provider."""
    upstream, reseller = split_resold(provider)
    return reseller or upstream


def provider_matches(query: str, provider: str) -> bool:
    """Case-insensitive match of a ``--provider`` word against a canonical provider name; a
    resold offer (``Scaleway (via Shadeform)``) matches its full name, its upstream cloud and
    its reseller."""
    wanted = _provider_key(normalise_provider_name(query))
    upstream, reseller = split_resold(provider)
    names = (provider, upstream) if reseller is None else (provider, upstream, reseller)
    return any(wanted == _provider_key(name) for name in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """What renting from one provider is like. ``*_raw`` is the text as sourced; the parsed
    numbers beside it are None where that text gives none."""

    name: str
    billing_granularity_raw: str
    billing_granularity_s: int | None
    billing_minimum_raw: str
    billing_minimum_s: int | None
    spot_available: bool | None
    spot_name: str | None
    spot_notice_raw: str | None
    spot_notice_s: int | None
    spot_interruption_data: str | None
    persistent_storage: str | None
    storage_price_raw: str | None
    storage_price_usd_per_gb_month: Decimal | None
    storage_survives_stop: str | None
    instance_can_stop: str | None
    egress_raw: str | None
    egress_usd_per_gb: Decimal | None
    ssh: bool | None
    docker: bool | None
    jupyter: bool | None
    multinode_interconnect: str | None
    #: the same facts as ``multinode_interconnect``, one clause per instance family with a
    #: stated rate: ``SCOPE[, SCOPE] = RATE KIND; ...`` (``parse_stated_fabrics``)
    multinode_fabric: tuple[StatedFabric, ...] = ()
    in_skypilot_catalog: str | None
    in_gpuhunt: str | None
    evidence: str | None
    as_of: str | None
    sources: str | None

    def fabric_for(self, instance_type: str) -> StatedFabric | None:
        """The network between nodes this provider states for ``instance_type``: the clause
        of ``multinode_fabric`` that names it word for word, else the first whose scope
        matches it (``StatedFabric.matches``), else None: not stated."""
        found = [f for f in self.multinode_fabric if f.matches(instance_type)]
        have = set(_words(instance_type))
        exact = [f for f in found if set(_words(f.scope)) <= have]
        best = exact or found
        return best[0] if best else None


@dataclass(frozen=True, slots=True, kw_only=True)
class StatedFabric:
    """A provider's statement of the network between its nodes for some instance types:
    ``bytes_per_s`` per node (decimal, from the stated bits/s), the fabric's ``kind`` as
    written (EFA, InfiniBand, RoCE, GPUDirect-TCPXO, RDMA), and the ``scope`` it was stated
    for (instance-type words, or ``*``: every multi-node offer of the provider)."""

    provider: str
    scope: str
    bytes_per_s: float
    kind: str

    def matches(self, instance_type: str) -> bool:
        """Every word of the scope begins a word of the instance type (``p5.48xlarge``
        matches ``p5.48xlarge`` but not ``p5.4xlarge``; ``ND H100 v5`` matches
        ``Standard_ND96isr_H100_v5``)."""
        if self.scope == "*":
            return True
        have = _words(instance_type)
        return all(any(h.startswith(w) for h in have) for w in _words(self.scope))

    def describe(self) -> str:
        where = "its multi-node offers" if self.scope == "*" else self.scope
        return (f"{self.bytes_per_s * 8 / 1e9:,.0f} Gb/s {self.kind} per node, stated by "
                f"{self.provider} for {where}")


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def parse_stated_fabrics(provider: str, text: str | None) -> tuple[StatedFabric, ...]:
    """``SCOPE[, SCOPE...] = RATE KIND`` clauses separated by ``;`` (``p5.48xlarge,
    p5e.48xlarge = 3200 Gbps EFA``). Raises CatalogError for a clause without a scope, a
    rate in Gbps/Tbps, or a kind."""
    out: list[StatedFabric] = []
    for clause in (text or "").split(";"):
        if not clause.strip():
            continue
        scopes, sep, claim = clause.partition("=")
        rate = parse_fabric_rate(claim)
        kind = _RATE.sub("", claim).strip()
        if not sep or rate is None or not kind or not scopes.strip():
            raise CatalogError(f"providers.csv multinode_fabric of {provider}: {clause.strip()!r}"
                               " is not 'SCOPE[, SCOPE] = RATE KIND'")
        out += [StatedFabric(provider=provider, scope=scope.strip(), bytes_per_s=rate,
                             kind=kind) for scope in scopes.split(",") if scope.strip()]
    return tuple(out)


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(Gbps|Gb/s|Tbps|Tb/s)", re.IGNORECASE)


def parse_fabric_rate(text: str | None) -> float | None:
    """Largest network rate named in a text, in bytes/s: ``3200 Gbps`` -> 4·10^11 B/s.

    Rates are bits per second (decimal prefixes); /8 turns them into bytes.
    """
    rates = [float(n) * (1e12 if u.lower().startswith("t") else 1e9) / 8
             for n, u in _RATE.findall(text or "")]
    return max(rates) if rates else None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*-?\s*(seconds?|s|minutes?|min|hours?|h)\b")
_UNIT_S = {"s": 1, "second": 1, "seconds": 1, "min": MINUTE_S, "minute": MINUTE_S,
           "minutes": MINUTE_S, "h": HOUR_S, "hour": HOUR_S, "hours": HOUR_S}
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])")


def parse_duration_text(text: str | None) -> int | None:
    """Seconds named in prose: ``per-second`` 1, ``1-minute increments`` 60, ``hourly`` 3600,
    ``2 minutes (...)`` 120, ``none: ...`` 0; None when the text names no duration."""
    if not text:
        return None
    lowered = text.lower()
    match = _DURATION.search(lowered)
    if match:
        return round(float(match.group(1)) * _UNIT_S[match.group(2)])
    for word, seconds in (("per-second", 1), ("per-minute", MINUTE_S), ("hourly", HOUR_S)):
        if lowered.startswith(word):
            return seconds
    return 0 if lowered.startswith("none:") else None


def parse_price_text(text: str | None) -> Decimal | None:
    """USD per GB in prose: the first standalone number (after "then" when a free tier comes
    first); a price per GiB is converted to per GB. None when there is none."""
    if not text:
        return None
    tail = text.split("then", 1)[1] if "then" in text else text
    match = _NUMBER.search(tail)
    if not match:
        return None
    value = Decimal(match.group(1))
    if "per GiB" in tail or "GiB-month" in tail:
        value = value * GB / GiB
    return value


def _yes_no(text: str | None) -> bool | None:
    lowered = (text or "").strip().lower()
    if lowered.startswith("yes"):
        return True
    if lowered.startswith("no"):
        return False
    return None


def _text(row: dict[str, str], column: str) -> str | None:
    value = (row.get(column) or "").strip()
    return value or None


def _provider_from_row(row: dict[str, str]) -> Provider:
    get = row.get
    return Provider(
        name=(get("provider") or "").strip(),
        billing_granularity_raw=get("billing_granularity") or "",
        billing_granularity_s=parse_duration_text(get("billing_granularity")),
        billing_minimum_raw=get("billing_minimum") or "",
        billing_minimum_s=parse_duration_text(get("billing_minimum")),
        spot_available=_yes_no(get("spot_available")),
        spot_name=_text(row, "spot_name"),
        spot_notice_raw=_text(row, "spot_notice"),
        spot_notice_s=parse_duration_text(get("spot_notice")),
        spot_interruption_data=_text(row, "spot_interruption_data"),
        persistent_storage=_text(row, "persistent_storage"),
        storage_price_raw=_text(row, "storage_price_usd_gb_month"),
        storage_price_usd_per_gb_month=parse_price_text(get("storage_price_usd_gb_month")),
        storage_survives_stop=_text(row, "storage_survives_stop"),
        instance_can_stop=_text(row, "instance_can_stop"),
        egress_raw=_text(row, "egress_usd_per_gb"),
        egress_usd_per_gb=parse_price_text(get("egress_usd_per_gb")),
        ssh=_yes_no(get("ssh")), docker=_yes_no(get("docker")), jupyter=_yes_no(get("jupyter")),
        multinode_interconnect=_text(row, "multinode_interconnect"),
        multinode_fabric=parse_stated_fabrics((get("provider") or "").strip(),
                                              _text(row, "multinode_fabric")),
        in_skypilot_catalog=_text(row, "skypilot_v8_catalog"), in_gpuhunt=_text(row, "gpuhunt"),
        evidence=_text(row, "evidence"), as_of=_text(row, "as_of"), sources=_text(row, "sources"),
    )


def parse_providers(text: str) -> tuple[Provider, ...]:
    """Parse providers.csv text. Raises CatalogError on a missing column or an empty name."""
    reader = csv.DictReader(io.StringIO(text))
    needed = {"provider", "billing_granularity", "billing_minimum", "spot_available"}
    missing = needed - set(reader.fieldnames or ())
    if missing:
        raise CatalogError(f"providers.csv lacks columns {sorted(missing)}")
    providers = tuple(_provider_from_row(row) for row in reader)
    if any(not p.name for p in providers):
        raise CatalogError("providers.csv has a row without a provider name")
    return providers
