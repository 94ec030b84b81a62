"""The exception tree. The CLI maps every ``TuneplanError`` to one line on stderr.

    TuneplanError                 anything tuneplan reports to a person (exit 1 unless below)
    ├── BadInputError             the user's input is wrong; exit 2
    │   ├── InvalidValueError     a value out of range or unreadable (flag, size, duration)
    │   ├── ModelConfigError      a config.json that is malformed, hostile or unsupported
    │   ├── UnknownModelError     a name that is neither bundled, a path, nor reachable on the hub
    │   ├── UnsupportedError      a combination the estimator cannot honour (yet), with the reason
    │   └── InfeasibleJobError    a job that cannot fit or run under the given constraints
    ├── CatalogError              the offer catalog is missing, broken or could not be refreshed
    │   ├── InvalidOfferError     an offer that breaks an invariant (price, count, memory, GPU)
    │   └── UnknownGpuError       a GPU name no alias maps to a canonical GPU (reported)
    └── ProbeError                a measuring run failed
"""

from __future__ import annotations


class TuneplanError(Exception):
    """Base of every error tuneplan reports; ``str(exc)`` is the one line shown."""

    exit_code = 1


class BadInputError(TuneplanError):
    """The user's input is wrong; the message says how to fix it."""

    exit_code = 2


class InvalidValueError(BadInputError):
    """A value that cannot be read or is out of range."""


class ModelConfigError(BadInputError):
    """A model configuration that is malformed, hostile or describes an unsupported model.

    ``problems`` holds every problem found, so they can be reported at once.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems

    def __reduce__(self) -> tuple[object, ...]:  # crosses from a worker process intact
        return (type(self), (str(self), self.problems))


class UnknownModelError(BadInputError):
    """A model name that is not bundled, not a path, and not found on the hub."""


class UnsupportedError(BadInputError):
    """A strategy or flag value the estimator cannot honour (yet)."""


class InfeasibleJobError(BadInputError):
    """No strategy fits the job under its constraints."""


class CatalogError(TuneplanError):
    """The catalog is missing, corrupt, or a refresh failed (the previous one is kept)."""


class InvalidOfferError(CatalogError):
    """An offer that breaks an invariant: no or absurd price, count < 1, unknown GPU, no memory."""


class UnknownGpuError(CatalogError):
    """A GPU name from a source that no alias maps to a canonical GPU; ``raw`` is the name."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw


class ProbeError(TuneplanError):
    """A measuring run could not be completed."""
