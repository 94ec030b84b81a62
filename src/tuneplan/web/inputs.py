"""What the web accepts: bounded, validated inputs (pydantic) and safe model resolution.

Every field has a range or a length and character limit; bad input becomes a 422 naming the
field and the reason. A model is a bundled name/alias or a hub id, or an uploaded config.json
(bytes, size-limited) — never a filesystem path, so no user-chosen file is ever opened.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    Attention,
    Interconnect,
    Offload,
    Optimizer,
    Precision,
    Sharding,
)
from tuneplan.core.models import ModelSpec
from tuneplan.errors import BadInputError

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
    limit: int = Field(500, ge=1, le=5000)


class JobInput(BaseModel):
    """A job as the CLI's job flags (CLI.md); defaults are the CLI's defaults."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        None, description="bundled name or alias, or a hub id (org/name); never a path")
    config: dict[str, Any] | None = Field(
        None, description="a config.json object, instead of a model name")
    method: Method = Method.LORA
    lora_rank: int = Field(16, ge=1, le=1024)
    lora_alpha: int = Field(32, ge=1, le=8192)
    lora_targets: NameList = "all-linear"
    quant: Quant = Quant.NF4
    double_quant: bool = True
    precision: Precision = Precision.BF16_MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    recipe: Recipe = Recipe.HF
    batch_size: int = Field(1, ge=1, le=1024)
    grad_accum: int = Field(1, ge=1, le=4096)
    seq_len: int = Field(2048, ge=1, le=1_048_576)
    gradient_checkpointing: bool = True
    packing: bool = False
    attention: Attention = Attention.SDPA
    gpus: int = Field(1, ge=1, le=64)
    nodes: int = Field(1, ge=1, le=64)
    sharding: Sharding | None = None
    offload: Offload = Offload.NONE
    gpu: ShortText | None = Field(None, description="a GPU name (/api/gpus): memory adds fits "
                                  "and headroom on it; plan keeps only its offers")

    def args(self) -> list[str]:
        """The job as the CLI's job flags (``--method qlora --lora-rank 16 ...``), so the
        web goes through exactly the CLI's parsing (``jobflags``)."""
        out = ["--method", self.method.value, "--lora-rank", str(self.lora_rank),
               "--lora-alpha", str(self.lora_alpha),
               "--lora-targets", self.lora_targets or "all-linear",
               "--precision", self.precision.value, "--optimizer", self.optimizer.value,
               "--recipe", self.recipe.value, "--batch-size", str(self.batch_size),
               "--grad-accum", str(self.grad_accum), "--seq-len", str(self.seq_len),
               "--attention", self.attention.value, "--gpus", str(self.gpus),
               "--nodes", str(self.nodes), "--offload", self.offload.value,
               _switch("double-quant", self.double_quant),
               _switch("gradient-checkpointing", self.gradient_checkpointing),
               _switch("packing", self.packing)]
        if self.method is Method.QLORA:  # lora8bit implies int8; other methods ignore it
            out += ["--quant", self.quant.value]
        if self.sharding is not None:
            out += ["--sharding", self.sharding.value]
        if self.gpu:
            out += ["--gpu", self.gpu]
        return out


def _switch(name: str, on: bool) -> str:
    return f"--{name}" if on else f"--no-{name}"


class PlanInput(JobInput):
    """A job plus the planner's data and constraints (``tuneplan plan`` flags)."""

    tokens: Amount | None = Field(None, description="training tokens per epoch (50M, 1.2B)")
    epochs: int = Field(1, ge=1, le=100)
    budget: float | None = Field(None, gt=0, le=10_000_000, description="USD, whole job")
    deadline: Amount | None = Field(None, description="wall time, e.g. 12h, 3d")
    provider: NameList | None = None
    region: ShortText | None = None
    spot: bool | None = Field(None, description="true: spot may win the ranking; false: no "
                              "spot prices; null: spot shown, ranked on-demand (the CLI's)")
    max_gpus: int | None = Field(None, ge=1, le=512, description="GPUs in total")
    multi_node: bool = False
    min_interconnect: Interconnect = Interconnect.ANY
    top: int = Field(10, ge=1, le=50)
    objective: Literal["cost", "time", "pareto"] = "cost"

    @field_validator("tokens")
    @classmethod
    def _count(cls, value: str | None) -> str | None:
        from tuneplan.units import parse_count

        return None if value is None else _checked(parse_count, value)

    @field_validator("deadline")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        from tuneplan.units import parse_duration

        return None if value is None else _checked(parse_duration, value)

    def args(self) -> list[str]:
        """Job flags plus ``tuneplan plan``'s own flags, as the CLI takes them."""
        out = [*super().args(), "--epochs", str(self.epochs), "--min-interconnect",
               self.min_interconnect.value, "--objective", self.objective,
               "--top", str(self.top), _switch("multi-node", self.multi_node)]
        if self.spot is not None:
            out.append(_switch("spot", self.spot))
        for name, value in (("tokens", self.tokens), ("budget", self.budget),
                            ("deadline", self.deadline), ("max-gpus", self.max_gpus),
                            ("provider", self.provider), ("region", self.region)):
            if value is not None and value != "":
                out += [f"--{name}", str(value)]
        return out


def _checked(parse: Any, value: str) -> str:
    """``value`` if ``parse`` reads it; a ValueError (pydantic's field error) if not."""
    try:
        if parse(value) <= 0:
            raise ValueError("must be more than zero")
    except BadInputError as exc:
        raise ValueError(str(exc)) from exc
    return value


def resolve_web_model(name: str | None, config: dict[str, Any] | None,
                      upload: bytes | None = None) -> ModelSpec:
    """A ModelSpec from an upload, a config object, a bundled name or a hub id — never a path.

    Raises FieldError naming ``config`` or ``model``.
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

        return parse_model_config(fetch_hub_config(name), name=name)
    except BadInputError as exc:
        raise _attributed("model", exc) from exc


def _config_name(raw: dict[str, Any], name: str | None) -> str:
    declared = raw.get("_name_or_path")
    label = name or (declared if isinstance(declared, str) else "") or "uploaded config.json"
    return label[:160]


def _attributed(field: str, exc: BadInputError) -> FieldError:
    return exc if isinstance(exc, FieldError) else FieldError(field, str(exc))
