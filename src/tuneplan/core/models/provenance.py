"""Where a ModelSpec's structure came from, in words, for the estimates built on it.

tuneplan's own parsers set nothing; the generic path (the module tree transformers builds on
the meta device, ``adapters/probe/meta.py``) sets ``extra["structure"]``,
``extra["confidence"]`` and a note saying what was read and what was assumed.
"""

from __future__ import annotations

from tuneplan.core.models.spec import ModelSpec


def structure_note(model: ModelSpec) -> str | None:
    """The spec's own note on its structure when it was not read by tuneplan's parsers."""
    if not model.extra.get("structure"):
        return None
    return next(iter(model.notes), f"structure: {model.extra['structure']}")
