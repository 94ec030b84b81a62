"""Render plain data (dicts, lists, str, int, float, bool, None) as block-style YAML text.

The core may not import PyYAML, and launch files are read by people as well as by SkyPilot,
dstack and accelerate: block mappings, ``|`` literals for multi-line scripts, and every other
string double-quoted with JSON escapes (a subset of YAML's), so no value is ever re-typed by a
YAML reader ("no" stays a string, "1e3" stays text). Does not handle anchors or tags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_INDENT = "  "


def render_yaml(document: Mapping[str, Any], *, header: str = "") -> str:
    """``document`` as YAML text; ``header`` lines become ``#`` comments at the top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines.extend(_mapping(document, 0))
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = json.dumps(value)
        # YAML 1.1 (PyYAML, what axolotl and LLaMA-Factory read with) takes an exponent
        # without a dot as a string: 2e-05 -> "2e-05". Write 2.0e-05.
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return json.dumps(str(value), ensure_ascii=False)


def _is_block_text(value: Any) -> bool:
    """Multi-line text a ``|`` literal keeps exactly: at most one final newline, no first line
    starting with a space (it would set the indentation), no trailing blanks, no CR or tab."""
    if not isinstance(value, str) or "\n" not in value.rstrip("\n"):
        return False
    lines = value.rstrip("\n").split("\n")
    return (not value.endswith("\n\n") and not lines[0].startswith(" ")
            and all(line == line.rstrip() and line.isprintable() for line in lines))


def _block_text(value: str, depth: int) -> list[str]:
    pad = _INDENT * depth
    return [f"{pad}{line}".rstrip() for line in value.rstrip("\n").split("\n")]


def _mapping(data: Mapping[str, Any], depth: int) -> list[str]:
    pad = _INDENT * depth
    out: list[str] = []
    for key, value in data.items():
        name = _scalar(str(key)) if not str(key).replace("_", "").replace("-", "").isalnum() \
            else str(key)
        out.extend(_entry(f"{pad}{name}:", value, depth))
    return out


def _entry(prefix: str, value: Any, depth: int) -> list[str]:
    if _is_block_text(value):
        chomp = "|" if value.endswith("\n") else "|-"  # keep or drop the one final newline
        return [f"{prefix} {chomp}", *_block_text(value, depth + 1)]
    if isinstance(value, Mapping):
        return [f"{prefix} {{}}"] if not value else [prefix, *_mapping(value, depth + 1)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [f"{prefix} []"] if not value else [prefix, *_sequence(value, depth + 1)]
    return [f"{prefix} {_scalar(value)}"]


def _sequence(items: Sequence[Any], depth: int) -> list[str]:
    pad = _INDENT * depth
    out: list[str] = []
    for item in items:
        if isinstance(item, Mapping) and item:
            inner = _mapping(item, depth + 1)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out.extend(inner[1:])
        else:
            out.extend(_entry(f"{pad}-", item, depth))
    return out
