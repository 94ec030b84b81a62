"""Typed reads of one config.json mapping that collect problems and applied defaults.

Reading never raises: a bad or missing value is recorded as a problem and a harmless
placeholder (1) is returned, so one pass finds every problem. The caller raises
``ModelConfigError`` with all of them. Pure: no files, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Upper bounds beyond which a value is not a real model but a typo or a hostile file.
MAX_SIZE = 1_000_000          # hidden, intermediate, head_dim, ranks
MAX_LAYERS = 10_000
MAX_HEADS = 100_000
MAX_EXPERTS = 100_000
MAX_VOCAB = 10_000_000
MAX_POSITIONS = 1_000_000_000


def describe_int(value: int) -> str:
    """``value`` with thousands separators, or its size when it has more than 40 digits.

    Never converts a huge int to text whole: that is slow and, past 4,300 digits, a ValueError.
    """
    if abs(value) < 10**40:
        return f"{value:,}"
    digits = int(abs(value).bit_length() * 0.30103)  # log10(2) digits per bit
    return f"{'-' if value < 0 else ''}an integer of about {digits:,} digits"


def describe(value: Any) -> str:
    """A short, non-recursive description of a JSON value for an error message."""
    if isinstance(value, int) and not isinstance(value, bool):
        return describe_int(value)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)[:40]
    if isinstance(value, str):
        return f"the string {value[:30]!r}"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


class ConfigReader:
    """Reads keys of ``config`` (``where`` prefixes messages, e.g. ``text_config.``).

    ``problems``, ``defaults`` and ``bad`` may be shared with a parent reader so that
    nested configs (Gemma 3's ``text_config``) report into one list.
    """

    def __init__(
        self,
        config: Mapping[Any, Any],
        *,
        family: str,
        where: str = "",
        problems: list[str] | None = None,
        defaults: list[str] | None = None,
    ) -> None:
        self.config = config
        self.family = family
        self.where = where
        self.problems: list[str] = [] if problems is None else problems
        self.defaults: list[str] = [] if defaults is None else defaults
        self.bad: set[str] = set()

    def child(self, key: str, *, family: str, why: str) -> ConfigReader:
        """A reader for a nested object. When it is absent (default recorded with ``why``) or
        not an object (a problem), the reader is empty, so the nested family's defaults apply."""
        value = self.config.get(key)
        if value is None:
            self.default(key, {}, why)
            value = {}
        elif not isinstance(value, Mapping):
            self.problem(key, f"must be an object, got {describe(value)}")
            value = {}
        return ConfigReader(value, family=family, where=f"{self.where}{key}.",
                            problems=self.problems, defaults=self.defaults)

    def problem(self, key: str, text: str) -> None:
        self.bad.add(key)
        self.problems.append(f"{self.where}{key}: {text}")

    def default(self, key: str, value: Any, why: str = "") -> None:
        self.defaults.append(f"{self.where}{key}={value!r} ({why or self.family + ' default'})")

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def raw(self, *keys: str) -> tuple[str, Any]:
        """The first key present with a non-null value, and its value; (keys[0], None) if none."""
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return key, value
        return keys[0], None

    def get_int(self, *keys: str, default: int | None = None, why: str = "", lo: int = 1,
            hi: int = MAX_SIZE) -> int:
        """An integer in [lo, hi]; ``default`` (recorded) when absent, else a problem."""
        key, value = self.raw(*keys)
        if value is None:
            if default is None:
                others = ", ".join(repr(k) for k in keys[1:])
                self.problem(key, "missing required key" + (
                    f" (also accepted: {others})" if others else ""))
                return max(lo, 1)
            self.default(key, default, why)
            return default
        return self._check_int(key, value, lo, hi)

    def opt_int(self, *keys: str, lo: int = 1, hi: int = MAX_SIZE) -> int | None:
        """An optional integer in [lo, hi]; None when absent or null (nothing recorded)."""
        key, value = self.raw(*keys)
        return None if value is None else self._check_int(key, value, lo, hi)

    def _check_int(self, key: str, value: Any, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(key, f"must be an integer, got {describe(value)}")
            return max(lo, 1)
        if not lo <= value <= hi:
            self.problem(key, f"must be between {lo:,} and {hi:,}, got {describe_int(value)}")
            return max(lo, 1)
        return value

    def get_bool(self, *keys: str, default: bool, why: str = "", note: bool = True) -> bool:
        """A boolean; ``default`` when absent (recorded unless ``note`` is False)."""
        key, value = self.raw(*keys)
        if value is None:
            if note:
                self.default(key, default, why)
            return default
        if not isinstance(value, bool):
            self.problem(key, f"must be true or false, got {describe(value)}")
            return default
        return value

    def get_rate(self, key: str, default: float) -> float:
        """A dropout probability in [0, 1); ``default`` (recorded) when absent or null."""
        key, value = self.raw(key)
        if value is None:
            self.default(key, default)
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            self.problem(key, f"must be a number in [0, 1), got {describe(value)}")
            return default
        return float(value)

    def get_str(self, *keys: str, default: str) -> str:
        """A string; ``default`` when absent (not recorded: strings here are descriptive)."""
        key, value = self.raw(*keys)
        if value is None:
            return default
        if not isinstance(value, str):
            self.problem(key, f"must be a string, got {describe(value)}")
            return default
        return value

    def int_list(self, key: str, *, hi: int = MAX_LAYERS) -> tuple[int, ...]:
        """A list of integers in [0, hi]; () when absent."""
        value = self.config.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or any(
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi for v in value):
            self.problem(key, f"must be a list of integers in [0, {hi:,}], got {describe(value)}")
            return ()
        return tuple(value)

    def ok(self, *keys: str) -> bool:
        """True when none of ``keys`` had a problem (so consistency checks are meaningful)."""
        return not self.bad.intersection(keys)

    def check(self, condition: bool, keys: tuple[str, ...], text: str) -> None:
        """Record ``text`` as a problem unless ``condition`` holds or a key was already bad."""
        if not condition and self.ok(*keys):
            self.problems.append(f"{self.where}{text}")
            self.bad.update(keys)
