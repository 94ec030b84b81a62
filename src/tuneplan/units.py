"""Units and the only place where conversions live.

The core holds base units: bytes as ``int``, seconds, FLOPs, FLOP/s, USD as ``Decimal``.
Decimal (GB = 10^9) and binary (GiB = 2^30) sizes are distinct names; a label without its
unit never appears. Rounding happens only in ``format_*``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import NewType

from tuneplan.errors import InvalidValueError

Bytes = NewType("Bytes", int)
Seconds = float
Flops = float
Usd = Decimal

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

MINUTE_S = 60
HOUR_S = 3600
DAY_S = 86_400

TERA = 10**12

_SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": KB, "mb": MB, "gb": GB, "tb": TB,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_COUNT_SUFFIX: dict[str, int] = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_DURATION_UNITS: dict[str, int] = {
    "s": 1, "sec": 1, "m": MINUTE_S, "min": MINUTE_S, "h": HOUR_S, "hr": HOUR_S, "d": DAY_S,
}


def parse_size(text: str) -> int:
    """Parse a memory size into bytes: ``"80GB"`` = 80·10^9, ``"80GiB"`` = 80·2^30.

    A bare number is bytes. Raises InvalidValueError on anything else (no guessing).
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise InvalidValueError(f"cannot read size {text!r}: write e.g. 80GB or 80GiB")
    number, unit = match.group(1), match.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise InvalidValueError(
            f"unknown size unit {unit!r} in {text!r}: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return _to_int(number, _SIZE_UNITS[unit], text)


def parse_count(text: str | int) -> int:
    """Parse a count with an optional decimal suffix: ``"50M"`` = 5·10^7, ``"1.2B"`` = 1.2·10^9."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise InvalidValueError(f"count must not be negative, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    suffix = match.group(2).lower() if match else None
    if not match or suffix not in _COUNT_SUFFIX:
        raise InvalidValueError(f"cannot read count {text!r}: write e.g. 50M, 1.2B or 300000")
    return _to_int(match.group(1), _COUNT_SUFFIX[suffix], str(text))


def parse_duration(text: str) -> float:
    """Parse a duration into seconds: ``"12h"``, ``"30m"``, ``"90s"``, ``"2d"``; bare = seconds."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or (unit and unit not in _DURATION_UNITS):
        raise InvalidValueError(f"cannot read duration {text!r}: write e.g. 30m, 12h or 2d")
    return float(match.group(1)) * _DURATION_UNITS.get(unit or "s", 1)


def parse_usd(text: str | float | int) -> Decimal:
    """Parse money in USD (``"100"``, ``"$4.50"``) into a Decimal."""
    try:
        value = Decimal(str(text).strip().lstrip("$"))
    except InvalidOperation as exc:
        raise InvalidValueError(f"cannot read amount {text!r}: write e.g. 100 or 4.50") from exc
    if not value.is_finite() or value < 0:
        raise InvalidValueError(f"amount must be a finite, non-negative number, got {text!r}")
    return value


#: Largest integer a size or count may reach: SQLite's INTEGER is a signed 64-bit value.
MAX_INT = 2**63 - 1


def _to_int(number: str, scale: int, original: str) -> int:
    shown = original if len(original) <= 40 else original[:40] + "..."
    try:
        value = Decimal(number) * scale
    except ArithmeticError as exc:  # decimal.Overflow past the context's exponent range
        raise InvalidValueError(f"{shown!r} is out of range") from exc
    if value > MAX_INT:
        raise InvalidValueError(f"{shown!r} is too large (at most 2^63 - 1)")
    if value != value.to_integral_value():
        raise InvalidValueError(f"{shown!r} is not a whole number of units")
    return int(value)


def format_bytes(value: int, *, binary: bool = True, digits: int = 2) -> str:
    """Format bytes with its unit: binary (GiB, the default) or decimal (GB), never unlabelled."""
    base, names = (1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) if binary else (
        1000, ["B", "KB", "MB", "GB", "TB", "PB"])
    size = float(value)
    index = 0
    while abs(size) >= base and index < len(names) - 1:
        size /= base
        index += 1
    if index == 0:
        return f"{int(value)} B"
    return f"{size:.{digits}f} {names[index]}"


def format_gib(value: int, digits: int = 2) -> str:
    """Format bytes as GiB (2^30) with the label."""
    return f"{value / GiB:.{digits}f} GiB"


def format_count(value: float) -> str:
    """Format a count with a decimal suffix: 8030261248 -> ``8.03B``."""
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:g}"


def format_duration(seconds: float) -> str:
    """Format seconds as ``1h 05m`` / ``4m 10s`` / ``12.0 s``."""
    if not math.isfinite(seconds):
        return "∞"
    if seconds >= HOUR_S:
        hours, rest = divmod(round(seconds), HOUR_S)
        return f"{hours}h {rest // MINUTE_S:02d}m"
    if seconds >= MINUTE_S:
        minutes, rest = divmod(round(seconds), MINUTE_S)
        return f"{minutes}m {rest:02d}s"
    return f"{seconds:.1f} s"


def format_usd(value: Decimal | float, digits: int = 2) -> str:
    """Format money: ``$12.34``."""
    return f"${Decimal(str(value)):,.{digits}f}"


def format_flops(value: float) -> str:
    """Format FLOP/s or FLOPs with a decimal prefix (``312.0 TFLOP``)."""
    for scale, prefix in ((10**18, "E"), (10**15, "P"), (10**12, "T"), (10**9, "G")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {prefix}FLOP"
    return f"{value:g} FLOP"
