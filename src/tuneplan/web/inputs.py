"""What the web accepts: bounded, validated inputs (pydantic) and safe model resolution.

Every field has a range or a length and character limit; bad input becomes a 422 naming the
field and the reason. A model is a bundled name/alias or a hub id, or an uploaded config.json
(bytes, size-limited) — never a filesystem path, so no user-chosen file is ever opened.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from tuneplan.core.job.stack import Stack
from tuneplan.core.models import ModelSpec
from tuneplan.errors import BadInputError
from tuneplan.service.jobflags import PLANNER_SEARCHES, PLANNER_SEARCHES_HELP, Flag, flags_for
from tuneplan.service.jobs import JobRequest
from tuneplan.web.capacity import ClientRate, ServerBusyError

MAX_UPLOAD_BYTES = 1_000_000  # a real config.json is a few KB
MAX_BODY_BYTES = 2_000_000   # whole request (JSON body or multipart form)

# Printable ASCII names only: hub ids, aliases, GPU names, lists of module names.
ModelName = Annotated[str, StringConstraints(
    strip_whitespace=True, min_length=1, max_length=160, pattern=r"^[A-Za-z0-9][\w.\-/ ]*$")]
ShortText = Annotated[str, StringConstraints(
    strip_whitespace=True, max_length=64, pattern=r"^[\w.\- ]*$")]
NameList = Annotated[str, StringConstraints(
    strip_whitespace=True, max_length=300, pattern=r"^[\w.,\- ]*$")]
Amount = Annotated[str, StringConstraints(
    strip_whitespace=True, max_length=24, pattern=r"^[0-9][0-9_.,]*\s*[A-Za-z]{0,3}$")]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")


class FieldError(BadInputError):
    """Bad input attributed to one field; the app turns it into a 422 naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from a planning worker intact
        return (type(self), (self.field, str(self)))


class OfferQuery(BaseModel):
    """Filters of ``tuneplan offers`` (same names, same meaning)."""

    model_config = ConfigDict(extra="forbid")

    gpu: ShortText | None = None
    min_gpu_memory: Amount | None = Field(None, description="per GPU: 80GB or 80GiB")
    count: int | None = Field(None, ge=1, le=128, description="GPUs per instance, exactly")
    provider: NameList | None = Field(None, description="comma list of providers")
    region: ShortText | None = Field(None, description="region or zone prefix")
    spot: bool = False
    max_price: float | None = Field(None, ge=0, le=100_000, description="USD/h per instance")
    sort: Literal["price", "price-per-gpu", "memory"] = "price"
    limit: int = Field(500, ge=1, le=5000, description="at most this many offers (one page)")
    offset: int = Field(0, ge=0, le=1_000_000, description="skip this many (the next page: "
                        "offset + limit; the total is in the X-Total-Count header)")


def _form_default(flag: Flag) -> Any:
    """A flag's default as a form shows it (enum value, comma list, on/off)."""
    value = flag.default
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, Stack):
        return str(value)
    return value.value if isinstance(value, StrEnum) else value


def _form_field(flag: Flag, command: str) -> tuple[Any, Any]:
    """(type, pydantic Field) of one job flag, from the registry: its help, choices, bounds
    (and, on the plan form, that a value the planner searches is kept when given)."""
    kind, default = flag.kind, _form_default(flag)
    text = flag.help + (f" {PLANNER_SEARCHES_HELP}"
                        if command == "plan" and flag.name in PLANNER_SEARCHES else "")
    if kind.switch:
        kind_type: Any = bool
    elif kind.choices:
        kind_type = Literal[kind.choices]
    elif kind.number is int:
        return int | None, Field(default, ge=kind.low, le=kind.high, description=text)
    elif kind.number is float:
        kind_type = float
    else:
        kind_type = Annotated[str, StringConstraints(strip_whitespace=True, max_length=300)]
    return kind_type | None, Field(default, description=text)


class JobForm(BaseModel):
    """What every job form has beside the job flags: the model, by name or as a config."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        None, description="bundled name or alias, or a hub id (org/name); never a path")
    config: dict[str, Any] | None = Field(
        None, description="a config.json object, instead of a model name")


class PlanForm(JobForm):
    top: int = Field(10, ge=1, le=50, description="how many ranked plans to return")


def _job_model(name: str, base: type[JobForm], command: str, doc: str) -> type[JobForm]:
    """``base`` plus a field for each of ``command``'s job flags (``service.jobflags.FLAGS``:
    names, help, choices, bounds and defaults all come from there)."""
    fields = {flag.key: _form_field(flag, command) for flag in flags_for(command)}
    model: type[JobForm] = create_model(  # type: ignore[call-overload]
        name, __base__=base, __doc__=doc, **fields)
    return model


if TYPE_CHECKING:  # the generated classes have these bases; their flag fields are dynamic
    JobInput = JobForm
    PlanInput = PlanForm
else:
    JobInput = _job_model("JobInput", JobForm, "memory",
                          "A job as the CLI's job flags; every default is the CLI's.")
    PlanInput = _job_model("PlanInput", PlanForm, "plan",
                           "A job plus the planner's data and constraints (`tuneplan plan`).")
_WEB_ONLY = {"model", "config", "top"}


def job_request(form: BaseModel, command: str, model_name: str) -> JobRequest:
    """The service's request for a validated form: the flags that differ from their default
    (a default left as it is was not asked for; the CLI sends nothing for it either)."""
    values: dict[str, Any] = {}
    flags = {flag.key: flag for flag in flags_for(command)}
    for key, value in form.model_dump().items():
        flag = flags.get(key)
        if key in _WEB_ONLY or flag is None or value is None:
            continue
        if value != _form_default(flag):
            values[flag.name] = value
    return JobRequest(model=model_name, command=command, values=values)


HUB_CONCURRENCY = 4  # hub lookups in flight at once when --allow-hub; more get 503
HUB_TIMEOUT_S = 10.0  # seconds per hub request: a config.json is a few KB; slower means a stuck hub
HUB_PER_CLIENT = 20  # hub lookups per client address per HUB_WINDOW_S; more get 429
HUB_WINDOW_S = 60.0


class HubBusyError(ServerBusyError):
    """Too many hub lookups in flight (the app answers 503 in the one error shape)."""


class HubGate:
    """The bounds on hub lookups (``--allow-hub``): ``per_client`` per address per
    ``window_s`` (429), then ``concurrency`` in flight at once (503), each Retry-After."""

    def __init__(self, *, concurrency: int = HUB_CONCURRENCY, per_client: int = HUB_PER_CLIENT,
                 window_s: float = HUB_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.concurrency = concurrency
        self._slots = threading.BoundedSemaphore(concurrency)
        self.rate = ClientRate(per_client, window_s, clock=clock)

    @contextlib.contextmanager
    def lookup(self, client: str) -> Iterator[None]:
        """Hold one lookup slot for ``client``; raises RateLimitedError or HubBusyError."""
        self.rate.take(client, "hub lookups")
        if not self._slots.acquire(blocking=False):
            raise HubBusyError(f"too many hub lookups in flight (at most {self.concurrency}); "
                               "try again shortly", 2)
        try:
            yield
        finally:
            self._slots.release()


_DEFAULT_GATE = HubGate()


def resolve_web_model(name: str | None, config: dict[str, Any] | None,
                      upload: bytes | None = None, *, allow_hub: bool = False,
                      client: str = "", gate: HubGate | None = None) -> ModelSpec:
    """A ModelSpec from an upload, a config object, a bundled name or a hub id — never a path.

    A hub id is read from the local cache only unless ``allow_hub`` (``tuneplan serve
    --allow-hub``): then ``gate`` (the app's; default one per process) bounds the lookups per
    ``client`` address and in flight, and each has a timeout and a byte cap on the download.
    Raises FieldError naming ``config`` or ``model``, RateLimitedError or HubBusyError.
    """
    from tuneplan.adapters.hub import find_bundled, load_bundled_config, parse_config_bytes
    from tuneplan.core.models import parse_model_config

    try:
        if upload is not None:
            if len(upload) > MAX_UPLOAD_BYTES:
                raise FieldError("config", f"config.json is larger than {MAX_UPLOAD_BYTES:,} "
                                 "bytes")
            raw = parse_config_bytes(upload, origin="uploaded config.json")
            return parse_model_config(raw, name=_config_name(raw, name))
        if config is not None:
            return parse_model_config(config, name=_config_name(config, name))
    except BadInputError as exc:
        raise _attributed("config", exc) from exc
    if not name:
        raise FieldError("model", "give a model name or upload a config.json")
    try:
        bundled = find_bundled(name)
        if bundled is not None:
            return parse_model_config(load_bundled_config(bundled), name=bundled.hf_id)
        if ".." in name or not _HUB_ID.match(name):
            raise FieldError("model", f"unknown model {name!r}: use a bundled name (see "
                             "/api/models) or a hub id such as org/name")
        from tuneplan.adapters.hub import fetch_hub_config

        if not allow_hub:
            return parse_model_config(fetch_hub_config(name, local_only=True), name=name)
        with (gate or _DEFAULT_GATE).lookup(client):
            raw = fetch_hub_config(name, timeout_s=HUB_TIMEOUT_S)
        return parse_model_config(raw, name=name)
    except BadInputError as exc:
        raise _attributed("model", exc) from exc


def _config_name(raw: dict[str, Any], name: str | None) -> str:
    declared = raw.get("_name_or_path")
    label = name or (declared if isinstance(declared, str) else "") or "uploaded config.json"
    return label[:160]


def _attributed(field: str, exc: BadInputError) -> FieldError:
    return exc if isinstance(exc, FieldError) else FieldError(field, str(exc))
