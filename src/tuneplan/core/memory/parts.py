"""A tiny builder for byte-valued terms, so each memory module writes one line per term.

A ``Piece`` is a term before it is explained: path, value, formula, inputs and source, as
cheap to make as a tuple. An estimate composes many moments of the step and keeps only the
peak's pieces; those become ``tuneplan.explain.Term`` (unit ``bytes``) when its breakdown is
read (``breakdown``). Nothing else lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tuneplan.explain import Breakdown, LazyBreakdown, Term

UNIT = "bytes"


class Piece:
    """One byte term, not yet a ``Term``: ``path`` slash-keyed, ``value`` in bytes (int)."""

    __slots__ = ("formula", "inputs", "path", "source", "value")

    def __init__(self, path: str, value: int, formula: str, source: str = "",
                 **inputs: Any) -> None:
        self.path = path
        self.value = int(value)
        self.formula = formula
        self.source = source
        self.inputs = inputs

    def term(self) -> Term:
        return Term(path=self.path, value=self.value, unit=UNIT, formula=self.formula,
                    inputs=self.inputs, source=self.source)

    def __repr__(self) -> str:
        return f"Piece({self.path!r}, {self.value})"


class Group:
    """Pieces made only when needed (a moment that is not the peak never shows them);
    ``value`` is their sum, known up front."""

    __slots__ = ("make", "value")

    def __init__(self, value: int, make: Callable[[], list[Piece]]) -> None:
        self.value = value
        self.make = make


Item = Piece | Group


def flatten(items: Iterable[Item]) -> list[Piece]:
    """The pieces of ``items``, groups expanded in place."""
    out: list[Piece] = []
    for item in items:
        if isinstance(item, Group):
            out += item.make()
        else:
            out.append(item)
    return out


#: A byte term: ``part(path, value, formula, source="", **inputs)``, ``path`` slash-keyed,
#: ``value`` in bytes (made an int), formula in words/symbols. The class itself (one call
#: less per piece: an estimate makes a score of them).
part = Piece


def total(terms: Sequence[Item]) -> int:
    value = 0
    for t in terms:   # a plain loop: the estimate sums a few short lists per call
        value += t.value
    return int(value)


def breakdown(items: Iterable[Item]) -> Breakdown:
    """A bytes Breakdown of ``items`` (groups expanded in place) whose Terms are made (and
    checked) when first read; its total, the items' sum, is known up front."""
    found = tuple(items)
    return LazyBreakdown(UNIT, lambda: tuple(p.term() for p in flatten(found)), total(found))
