"""jsondoc: one encoding for CLI and web documents."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from tuneplan.service.jsondoc import dumps


def test_money_stays_exact_and_times_are_iso() -> None:
    text = dumps({"usd": Decimal("0.10"), "at": datetime(2026, 11, 30, tzinfo=UTC),
                  "ids": ("a", "b"), "name": "Zürich"})
    assert json.loads(text) == {"usd": "0.10", "at": "2026-11-30T00:00:00+00:00",
                                "ids": ["a", "b"], "name": "Zürich"}
    assert "\\u00fc" in dumps({"name": "Zürich"}, ascii_only=True)


def test_unknown_types_are_refused() -> None:
    with pytest.raises(TypeError, match="object"):
        dumps({"x": object()})
