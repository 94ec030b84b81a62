"""explain.py: a breakdown's total is the sum of its terms; units cannot be mixed."""

from __future__ import annotations

import pytest

from tuneplan.explain import Breakdown, Term


def _term(path: str, value: int, unit: str = "bytes") -> Term:
    return Term(path=path, value=value, unit=unit, formula="x", source="test")


def test_total_and_subtotals() -> None:
    breakdown = Breakdown.of("bytes", [
        _term("weights", 100), _term("activations/attention", 30), _term("activations/mlp", 12)])
    assert breakdown.total == 142
    assert breakdown.subtotal("activations") == 42
    assert breakdown.value("missing") == 0
    assert breakdown.as_dict()["total"] == 142


def test_mixed_units_are_refused() -> None:
    with pytest.raises(ValueError, match="GiB"):
        Breakdown.of("bytes", [_term("a", 1), _term("b", 1, unit="GiB")])


def test_duplicate_paths_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Breakdown.of("bytes", [_term("a", 1), _term("a", 2)])
