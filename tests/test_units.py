"""units.py: GB vs GiB kept apart, parsing is strict, formatting labels its unit."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuneplan.errors import InvalidValueError
from tuneplan.units import (
    GB,
    GiB,
    format_bytes,
    format_count,
    format_duration,
    format_usd,
    parse_count,
    parse_duration,
    parse_size,
    parse_usd,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80_000_000_000),        # decimal gigabytes
        ("80GiB", 85_899_345_920),       # binary gibibytes
        ("80 gib", 80 * 2**30),          # case and spaces
        ("1.5GB", 1_500_000_000),
        ("512MiB", 536_870_912),
        ("1024", 1024),                  # bare number = bytes
        ("2TB", 2 * 10**12),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_gb_and_gib_differ() -> None:
    assert parse_size("80GB") != parse_size("80GiB")
    assert GiB - GB == 73_741_824


@pytest.mark.parametrize("text", ["", "GB", "80 gigs", "-5GB", "1.5", "80XB", "nan GB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(InvalidValueError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("50M", 50_000_000), ("1.2B", 1_200_000_000), ("300000", 300_000), ("2k", 2000), (7, 7)],
)
def test_parse_count(text: str | int, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"), [("12h", 43_200.0), ("30m", 1_800.0), ("90s", 90.0), ("2d", 172_800.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_parse_usd_is_exact_decimal() -> None:
    assert parse_usd("$4.10") == Decimal("4.10")
    with pytest.raises(InvalidValueError):
        parse_usd("-1")
    with pytest.raises(InvalidValueError):
        parse_usd("Infinity")


def test_format_bytes_labels_units() -> None:
    assert format_bytes(80 * GiB) == "80.00 GiB"
    assert format_bytes(80 * GB, binary=False) == "80.00 GB"
    assert format_bytes(80 * GB) == "74.51 GiB"
    assert format_bytes(512) == "512 B"


def test_format_misc() -> None:
    assert format_count(8_030_261_248) == "8.03B"
    assert format_duration(3_900) == "1h 05m"
    assert format_usd(Decimal("1234.5")) == "$1,234.50"


@given(st.integers(min_value=0, max_value=10**15))
def test_size_roundtrip_bytes(value: int) -> None:
    assert parse_size(str(value)) == value
    assert parse_size(f"{value}B") == value
