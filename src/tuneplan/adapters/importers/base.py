"""What every importer returns: offers plus everything it could not turn into an offer.

``ImportResult`` is shared by all importers (SkyPilot CSV, live APIs, user CSV imports); the
store writes ``offers`` and the CLI reports the unknown GPU names and rejected rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from tuneplan.core.catalog.offers import Offer


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """Offers parsed from one payload.

    ``unknown_gpu_names``: source GPU names no alias maps (their rows are not in ``offers``);
    ``rejected_rows``: one line per row that broke an invariant, ``"where: why"`` (e.g.
    ``"line 12: price_per_hour must be > 0"``), capped by the importer, counted in
    ``rejected_count`` when it knows more than it lists (defaults to the listed number).
    """

    offers: tuple[Offer, ...]
    unknown_gpu_names: tuple[str, ...] = ()
    rejected_rows: tuple[str, ...] = ()
    rejected_count: int | None = None

    @property
    def total_rejected(self) -> int:
        """Rejected rows, counting those not listed."""
        return len(self.rejected_rows) if self.rejected_count is None else self.rejected_count


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (importers stamp ``fetched_at`` with it)."""
    return datetime.now(UTC)
