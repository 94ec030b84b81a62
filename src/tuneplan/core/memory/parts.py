"""A tiny builder for byte-valued terms, so each memory module writes one line per term.

Terms are ``tuneplan.explain.Term`` with unit ``bytes``; nothing else lives here.
"""

from __future__ import annotations

from typing import Any

from tuneplan.explain import Term

UNIT = "bytes"


def part(path: str, value: int, formula: str, source: str = "", **inputs: Any) -> Term:
    """A byte term: ``path`` slash-keyed, ``value`` in bytes (int), formula in words/symbols."""
    return Term(path=path, value=int(value), unit=UNIT, formula=formula, inputs=inputs,
                source=source)


def total(terms: list[Term] | tuple[Term, ...]) -> int:
    return int(sum(t.value for t in terms))
