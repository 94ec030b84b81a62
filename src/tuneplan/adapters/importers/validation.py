"""Row-by-row checks shared by the importers: read prices and counts, collect offers and rejects.

A hostile or malformed row (negative, NaN, absurd or non-numeric price, wrong type, unknown
GPU) never stops an import: it is rejected with a reason or reported as an unknown GPU name.
A payload whose overall shape is wrong raises ``PayloadError`` and the whole source fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.adapters.importers.base import ImportResult
from tuneplan.core.catalog.offers import Offer, is_safe_text
from tuneplan.errors import CatalogError, InvalidOfferError, InvalidValueError, UnknownGpuError

#: Longest name (instance type, region) an importer keeps; longer ones are hostile or garbage.
MAX_NAME_CHARS = 200
#: Longest free text (an offer's notes) an importer keeps.
MAX_NOTES_CHARS = 4_000
#: Longest text a number may be written with ("2.49", "8", "1e3"); longer is not a price.
MAX_NUMBER_CHARS = 40
#: Largest count (GPUs, vCPUs) and plainest price exponent a row may hold: far above any real
#: instance, far below what SQLite (signed 64-bit INTEGER) or Decimal/float could overflow on.
MAX_COUNT = 1_000_000
#: How many reject reasons are kept verbatim (the count is always exact).
MAX_REJECT_REASONS = 50


class PayloadError(CatalogError):
    """The payload as a whole has the wrong shape (not the JSON/CSV the source documents)."""


class RowRejected(ValueError):
    """One row has a value that cannot be trusted; the message says which and why."""


def read_price(value: Any, label: str) -> Decimal | None:
    """A price in USD/h as Decimal, or None for an absent one (None or empty string).

    Rejects booleans, non-numbers, NaN/inf, zero and negative values (RowRejected). Floats go
    through ``repr`` so 2.49 stays Decimal("2.49"), not its binary expansion.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise RowRejected(f"{label} has type {type(value).__name__}, expected a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise RowRejected(f"{label} is {value!r}")
    text = repr(value) if isinstance(value, float) else _number_text(value, label)
    try:
        price = Decimal(text)
    except InvalidOperation as exc:
        raise RowRejected(f"{label} {text[:40]!r} is not a number") from exc
    if not price.is_finite():
        raise RowRejected(f"{label} is {text[:40]}, not a finite number")
    if price <= 0:
        raise RowRejected(f"{label} must be > 0, got {text[:40]}")
    if not -9 <= price.adjusted() <= 9:
        raise RowRejected(f"{label} {text[:40]} is out of range (1e-9 .. 1e9 USD/h)")
    return price


def _number_text(value: Any, label: str) -> str:
    """``value`` as the short text of a number; RowRejected when it is too long to be one
    (a 5,000-digit count would also trip Python's int/str conversion limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        raise RowRejected(f"{label} is out of range")
    text = str(value).strip()
    if len(text) > MAX_NUMBER_CHARS:
        raise RowRejected(f"{label} {text[:20]!r}... is {len(text)} characters, "
                          f"longer than a number ({MAX_NUMBER_CHARS})")
    return text


def require_price(value: Any, label: str) -> Decimal:
    """``read_price`` for a price the row cannot do without: absent is RowRejected too."""
    price = read_price(value, label)
    if price is None:
        raise RowRejected(f"{label} is missing")
    return price


def read_count(value: Any, label: str) -> int:
    """A whole, positive count (GPUs); ``8``, ``8.0`` and ``"8"`` are 8; 0.25 is rejected."""
    if isinstance(value, bool):
        raise RowRejected(f"{label} is a boolean")
    text = _number_text(value, label)
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        raise RowRejected(f"{label} {text!r} is not a number") from exc
    if not number.is_finite() or number < 1 or number > MAX_COUNT:
        raise RowRejected(f"{label} must be a whole number 1..{MAX_COUNT}, got {text}")
    if number != number.to_integral_value():
        raise RowRejected(f"{label} must be a whole number >= 1, got {text}")
    return int(number)


def read_number(value: Any, label: str) -> float | None:
    """An optional non-negative quantity (vCPUs, GiB); None when absent."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise RowRejected(f"{label} is a boolean")
    if not isinstance(value, (int, float, str, Decimal)):
        raise RowRejected(f"{label} has type {type(value).__name__}, expected a number")
    text = repr(value) if isinstance(value, float) else _number_text(value, label)
    try:
        number = float(text)
    except (TypeError, ValueError) as exc:
        raise RowRejected(f"{label} {text[:40]!r} is not a number") from exc
    if not math.isfinite(number) or not 0 <= number <= MAX_COUNT:
        raise RowRejected(f"{label} must be finite and 0..{MAX_COUNT}, got {text[:40]}")
    return number


def read_name(value: Any, label: str) -> str:
    """A short printable name (instance type, region); rejects control characters and huge text."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise RowRejected(f"{label} has type {type(value).__name__}, expected text")
    text = str(value).strip()
    if not text or len(text) > MAX_NAME_CHARS or not is_safe_text(text):
        raise RowRejected(f"{label} {text[:40]!r} is empty, too long or has control characters")
    return text


def read_text(value: Any, label: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    """Optional printable text (zone, interconnect, notes): "" when absent; RowRejected when it
    is not text, longer than ``max_chars`` or holds control, escape or bidi characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RowRejected(f"{label} has type {type(value).__name__}, expected text")
    text = value.strip()
    if len(text) > max_chars:
        raise RowRejected(f"{label} is {len(text)} characters, more than {max_chars}")
    if not is_safe_text(text):
        raise RowRejected(f"{label} {text[:40]!r} has control characters")
    return text


class OfferCollector:
    """Builds offers one row at a time, keeping every failure with its reason."""

    def __init__(self) -> None:
        self.offers: list[Offer] = []
        self.unknown_gpu_names: dict[str, None] = {}  # ordered set
        self.rejected: list[str] = []
        self.rejected_count = 0

    def add(self, where: str, build: Callable[[], Offer | None]) -> None:
        """Run ``build`` for one row; None means "not a GPU offer, skip" (not a reject)."""
        try:
            offer = build()
        except UnknownGpuError as exc:
            self.unknown_gpu_names[exc.raw or str(exc)] = None
            return
        except (RowRejected, InvalidOfferError, InvalidValueError, KeyError, TypeError,
                AttributeError, ValueError, ArithmeticError) as exc:
            # ValueError/ArithmeticError: an int() of a 5,000-digit string, a Decimal overflow
            self.reject(where, exc)
            return
        if offer is not None:
            self.offers.append(offer)

    def reject(self, where: str, reason: object) -> None:
        """Record one rejected row."""
        self.rejected_count += 1
        if len(self.rejected) < MAX_REJECT_REASONS:
            text = f"{type(reason).__name__}: {reason}" if isinstance(reason, KeyError) else reason
            self.rejected.append(f"{where}: {text}")

    def result(self) -> ImportResult:
        """The offers, unknown GPU names and rejected rows collected so far."""
        return ImportResult(
            offers=tuple(self.offers),
            unknown_gpu_names=tuple(self.unknown_gpu_names),
            rejected_rows=tuple(self.rejected),
            rejected_count=self.rejected_count,
        )


def merge_results(results: Iterable[ImportResult]) -> ImportResult:
    """One result from several payloads of one source (AWS regions, gpuhunt provider files):
    offers in order, unknown names once each, reject reasons capped at MAX_REJECT_REASONS."""
    parts = list(results)
    return ImportResult(
        offers=tuple(o for r in parts for o in r.offers),
        unknown_gpu_names=tuple(dict.fromkeys(n for r in parts for n in r.unknown_gpu_names)),
        rejected_rows=tuple(row for r in parts for row in r.rejected_rows)[:MAX_REJECT_REASONS],
        rejected_count=sum(r.total_rejected for r in parts),
    )


def spec_memory_bytes(gpu: str) -> int:
    """Memory per GPU of a canonical GPU, from the bundled specs (vram_gb x 2^30).

    Every offer carries the spec's figure so the same card has one memory size whatever a
    source writes (RunPod "80", vast.ai 81,559 MiB, gpuhunt 80.0): the source's own number only
    picks a variant (A100 40 vs 80 GB) in ``normalise_gpu_name``.
    """
    return load_gpu_spec(gpu).memory_bytes
