"""The library versions a job runs: ``--stack transformers=4.30,bitsandbytes=0.39,...``.

A ``Stack`` is an input like the batch size: every version-dependent term of the memory
estimate reads its version from here and says which behaviour it assumed
(``core/memory/versions.py``). Libraries not named keep ``DEFAULT_STACK``: the versions a
``pip install`` of each resolved to on the date below, written here as constants (never read from
an installed package: the core imports none of these libraries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from tuneplan.errors import InvalidValueError

Version = tuple[int, ...]

#: When ``DEFAULT_STACK`` was read: the versions ``pip install transformers peft bitsandbytes
#: accelerate deepspeed torch`` resolved to then.
DEFAULT_STACK_DATE = "2026-12"

#: The oldest and newest version of each library the estimate models. Below the oldest the
#: terms were not checked against that library's source (bitsandbytes 0.39.0 is the first with
#: 4-bit weights; transformers 4.30 the first that loads them); above the newest (the pip
#: default) nothing is known yet.
MODELLED: Mapping[str, tuple[Version, Version]] = {
    "transformers": ((4, 30), (5, 24)),
    "peft": ((0, 3), (0, 21, 2)),
    "bitsandbytes": ((0, 39), (0, 50, 2)),
    "accelerate": ((0, 20), (1, 15)),
    "deepspeed": ((0, 9), (0, 19, 8)),
    "torch": ((1, 13), (2, 13)),
}

#: The oldest torch a transformers release installs with, from that release on: a stack
#: below it is not a job anyone runs, so it is refused, not estimated. (4, 51): torch 2.1,
#: the oldest transformers still supported in April 2025
#: (https://github.com/huggingface/transformers/pull/37531: "Torch 2.1, which we're still
#: supporting"); (5, 24): torch>=2.6, its own
#: ``dependency_versions_table.py``. Releases between keep the floor before them (the
#: floors of 5.0 .. 5.23 were not read).
TRANSFORMERS_TORCH_FLOOR: tuple[tuple[Version, Version], ...] = (
    ((4, 51), (2, 1)),
    ((5, 24), (2, 6)),
)


def version_text(version: Version) -> str:
    return ".".join(str(part) for part in version)


def parse_version(text: str) -> Version:
    """``"4.30"`` -> ``(4, 30)``; at most three numeric parts (no dev/rc suffixes)."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise InvalidValueError(f"{text.strip()!r} is not a version such as 4.30 or 0.43.2")
    return tuple(int(p) for p in parts)


def _padded(version: Version) -> Version:
    return version + (0,) * (3 - len(version))


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """Versions of the libraries a job runs (each a tuple such as ``(4, 30)``)."""

    transformers: Version = MODELLED["transformers"][1]
    peft: Version = MODELLED["peft"][1]
    bitsandbytes: Version = MODELLED["bitsandbytes"][1]
    accelerate: Version = MODELLED["accelerate"][1]
    deepspeed: Version = MODELLED["deepspeed"][1]
    torch: Version = MODELLED["torch"][1]

    def __post_init__(self) -> None:
        for name in LIBRARIES:
            low, high = MODELLED[name]
            value = getattr(self, name)
            if not _padded(low) <= _padded(value) <= _padded(high):
                raise InvalidValueError(
                    f"{name} {version_text(value)} is outside the versions the estimate "
                    f"models ({version_text(low)} to {version_text(high)})"
                    + (" - bitsandbytes 4-bit weights start at 0.39"
                       if name == "bitsandbytes" and _padded(value) < _padded(low) else ""))
        floors = [t for since, t in TRANSFORMERS_TORCH_FLOOR
                  if _padded(self.transformers) >= _padded(since)]
        if floors and _padded(self.torch) < _padded(floors[-1]):
            raise InvalidValueError(
                f"transformers {version_text(self.transformers)} needs torch "
                f"{version_text(floors[-1])} or later (stack says torch "
                f"{version_text(self.torch)}): state the transformers version the job "
                "runs with that torch")

    def at_least(self, library: str, version: Version) -> bool:
        return _padded(getattr(self, library)) >= _padded(version)

    def given(self) -> dict[str, str]:
        """The libraries whose version differs from ``DEFAULT_STACK``."""
        return {n: version_text(getattr(self, n)) for n in LIBRARIES
                if getattr(self, n) != getattr(DEFAULT_STACK, n)}

    def as_dict(self) -> dict[str, str]:
        return {name: version_text(getattr(self, name)) for name in LIBRARIES}

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.as_dict().items())

    def describe(self) -> list[str]:
        """One line per library: ``transformers 5.24 (pip default 2026-12)`` or ``(stated)``."""
        return [f"{name} {text} (" + ("stated" if name in self.given() else
                                      f"pip default {DEFAULT_STACK_DATE}") + ")"
                for name, text in self.as_dict().items()]

    @classmethod
    def parse(cls, value: Any) -> Stack:
        """A stack from ``"transformers=4.30,peft=0.4"`` (a job file may give a mapping);
        libraries not named keep the default. Raises InvalidValueError with the reason."""
        if isinstance(value, Stack):
            return value
        if isinstance(value, Mapping):
            pairs = [(str(k), str(v)) for k, v in value.items()]
        else:
            pairs = []
            for item in str(value).split(","):
                if not item.strip():
                    continue
                name, sep, version = item.partition("=")
                if not sep:
                    raise InvalidValueError(f"{item.strip()!r} is not library=version")
                pairs.append((name, version))
        found: dict[str, Version] = {}
        for name, version in pairs:
            key = name.strip().lower()
            if key not in LIBRARIES:
                raise InvalidValueError(f"unknown library {name.strip()!r}; one of "
                                        + ", ".join(LIBRARIES))
            if key in found:
                raise InvalidValueError(f"{key} is given twice")
            found[key] = parse_version(version)
        return replace(DEFAULT_STACK, **found)


LIBRARIES: tuple[str, ...] = tuple(f.name for f in fields(Stack))
#: What ``pip install`` resolved to on ``DEFAULT_STACK_DATE``: transformers 5.24, peft 0.21.2,
#: bitsandbytes 0.50.2, accelerate 1.15, deepspeed 0.19.8, torch 2.13.
DEFAULT_STACK = Stack()
