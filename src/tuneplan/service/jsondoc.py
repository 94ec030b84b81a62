"""JSON documents exactly as the CLI prints them and the web serves them.

Money stays exact (Decimal as a string), times are ISO 8601, tuples and sets become lists.
Shared by ``cli/app.py`` and ``web/`` so neither face imports the other.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback for the values tuneplan documents hold."""
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def dumps(document: Any, *, indent: int | None = None, ascii_only: bool = False) -> str:
    """One JSON document as text; ``ascii_only`` escapes non-ASCII (safe on any terminal)."""
    return json.dumps(document, indent=indent, default=json_default, ensure_ascii=ascii_only)
