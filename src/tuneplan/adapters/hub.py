"""Resolve a model name to a ModelSpec: bundled name or alias, local folder, config.json, hub id.

All reading of config files happens here (size-limited, strict UTF-8, strict JSON); the
parsing of keys into dimensions is ``core.models.parse_model_config``. Hub downloads go through
``huggingface_hub``'s HTTP session, streamed and capped (``fetch_hub_config``), and are kept in
tuneplan's own cache; offline (``HF_HUB_OFFLINE=1`` or the web without --allow-hub) that cache and
huggingface_hub's are read.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from tuneplan.core.models import ModelSpec, count_parameters, parse_model_config
from tuneplan.errors import ModelConfigError, UnknownModelError

MAX_CONFIG_BYTES = 2_000_000  # real config.json files are a few KB; this bounds hostile input
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$")
_TRUTHY = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BundledModel:
    """One row of the bundled registry (``data/models/INDEX.csv``)."""

    hf_id: str
    file: str
    model_type: str
    published_params: int | None
    alias: str


def alias_for(hf_id: str) -> str:
    """Short alias of a hub id: ``meta-llama/Llama-3.1-8B`` -> ``llama-3.1-8b``."""
    return hf_id.rsplit("/", 1)[-1].lower()


@cache
def bundled_models() -> tuple[BundledModel, ...]:
    """The bundled registry, in INDEX.csv order."""
    text = (resources.files("tuneplan.data") / "models" / "INDEX.csv").read_text("utf-8")
    rows = csv.DictReader(io.StringIO(text))
    return tuple(
        BundledModel(
            hf_id=row["hf_id"],
            file=row["file"],
            model_type=row["model_type"],
            published_params=int(row["published_params"]) if row["published_params"] else None,
            alias=alias_for(row["hf_id"]),
        )
        for row in rows
    )


def _bundled_lookup() -> dict[str, BundledModel]:
    table: dict[str, BundledModel] = {}
    for model in bundled_models():
        table[model.hf_id.lower()] = model
        table.setdefault(model.alias, model)
    return table


def find_bundled(name: str) -> BundledModel | None:
    """A bundled model by hub id or alias, case-insensitive."""
    return _bundled_lookup().get(name.strip().lower())


def load_bundled_config(model: BundledModel) -> dict[str, Any]:
    data = (resources.files("tuneplan.data") / "models" / model.file).read_bytes()
    return parse_config_bytes(data, origin=model.hf_id)


def resolve_model(name: str) -> ModelSpec:
    """Resolve ``name`` to a ModelSpec (the config as ``load_model_config`` finds it).

    Raises UnknownModelError (with the closest bundled names) or ModelConfigError (malformed,
    hostile or unsupported config).
    """
    config, label = load_model_config(name)
    return spec_from_config(config, name=label)


def spec_from_config(config: dict[str, Any], *, name: str) -> ModelSpec:
    """The ModelSpec of a config.json dict: tuneplan's own parser for its ``model_type``, else
    (a type the installed transformers knows) the module tree transformers builds on the meta
    device (``adapters.probe.meta``; the spec says so). Raises ModelConfigError."""
    try:
        return parse_model_config(config, name=name)
    except ModelConfigError as exc:
        from tuneplan.core.models import SUPPORTED_MODEL_TYPES

        model_type = config.get("model_type") if isinstance(config, dict) else None
        if not isinstance(model_type, str) or model_type in SUPPORTED_MODEL_TYPES:
            raise
        from tuneplan.adapters.probe.meta import spec_from_transformers, transformers_knows

        if not transformers_knows(model_type):
            if "auto_map" in config:
                raise ModelConfigError(
                    f"{exc}; its config asks for remote code (auto_map), which tuneplan never "
                    "runs", problems=exc.problems) from exc
            raise
        return spec_from_transformers(config, name=name)


def load_model_config(name: str) -> tuple[dict[str, Any], str]:
    """The config.json dict for ``name`` and the name the spec should carry.

    Order: bundled name/alias; a local folder holding ``config.json``; a path to a JSON file;
    a hub id fetched with ``huggingface_hub``. Raises UnknownModelError or ModelConfigError.
    """
    name = name.strip()
    if not name:
        raise UnknownModelError("no model given: name a bundled model (see `tuneplan models`)")
    bundled = find_bundled(name)
    if bundled is not None:
        return load_bundled_config(bundled), bundled.hf_id
    path = Path(name).expanduser()
    if path.suffix == ".json" or path.exists():   # a folder, a config file, or a missing .json
        return load_config_path(path), str(path)
    if _HUB_ID.match(name):
        return fetch_hub_config(name), name
    raise UnknownModelError(f"unknown model {name!r}{_suggestions(name)}")


def load_config_path(path: Path) -> dict[str, Any]:
    """Read a config.json from a file or a folder holding one (size-limited, strict)."""
    target = path / "config.json" if path.is_dir() else path
    if not target.is_file():
        where = f"folder {path} has no config.json" if path.is_dir() else f"no file {path}"
        raise UnknownModelError(f"{where}: give a folder with config.json or a path to one")
    size = target.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"{target} is {size:,} bytes; a config.json is at most {MAX_CONFIG_BYTES:,} bytes")
    with target.open("rb") as handle:
        return parse_config_bytes(handle.read(MAX_CONFIG_BYTES + 1), origin=str(target))


def parse_config_bytes(data: bytes, *, origin: str) -> dict[str, Any]:
    """Strict JSON object from bytes: UTF-8, no NaN/Infinity, bounded size and nesting."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"{origin}: config larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(
            f"{origin}: not UTF-8 text (byte {exc.start}); a config.json is UTF-8 JSON") from exc
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_bounded_int,
                           parse_float=_finite_float)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{origin}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{origin}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except RecursionError as exc:
        raise ModelConfigError(f"{origin}: JSON nested too deeply") from exc
    if not isinstance(value, dict):
        raise ModelConfigError(
            f"{origin}: a config.json holds a JSON object, got {type(value).__name__}")
    return value


MAX_CONFIG_INT_DIGITS = 19
"""Longest integer literal read from a config.json (2**63 has 19 digits); longer is refused
before it is converted, so a 5,000-digit number never reaches int() (whose 4,300-digit limit
raises ValueError)."""


def _bounded_int(token: str) -> int:
    digits = token.lstrip("-")
    if len(digits) > MAX_CONFIG_INT_DIGITS:
        shown = token if len(token) <= 40 else f"{token[:20]}...({len(digits):,} digits)"
        raise ModelConfigError(
            f"integer {shown} is too large for a config value "
            f"(at most {MAX_CONFIG_INT_DIGITS} digits)")
    return int(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if value != value or value in (float("inf"), float("-inf")):
        shown = token if len(token) <= 40 else f"{token[:20]}..."
        raise ModelConfigError(f"number {shown} is not a finite float")
    return value


def _reject_constant(token: str) -> Any:
    raise ModelConfigError(f"{token} is not a valid config value (JSON has no {token})")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def _hub_endpoint() -> str | None:
    """The hub to ask: ``HF_ENDPOINT`` when set (mirrors, tests), else huggingface_hub's default."""
    return os.environ.get("HF_ENDPOINT") or None


def fetch_hub_config(repo_id: str, *, local_only: bool = False,
                     timeout_s: float = 10.0) -> dict[str, Any]:
    """Download (or read from a local cache) ``config.json`` of a hub repository.

    ``local_only``: the caches only, never a network request (the web app without
    --allow-hub). Online, the file's size is first asked with a metadata (HEAD) request (a
    file over MAX_CONFIG_BYTES is refused unread); then the GET is streamed and stopped past
    MAX_CONFIG_BYTES and past ``timeout_s`` in all, so the download is bounded even when the
    HEAD fails, gives no size, or lies. A fetched config is kept in tuneplan's own cache
    (``hub_cache_dir``); offline, that cache is read, then huggingface_hub's.
    """
    try:
        from huggingface_hub import errors as hub_errors
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise UnknownModelError(f"{repo_id}: huggingface_hub is not installed") from exc
    offline = hub_offline() or local_only
    if offline:
        why = ("it is not cached and hub lookups are off" if local_only
               else "HF_HUB_OFFLINE is set and it is not cached")
        return _cached_config(repo_id, why)
    endpoint = _hub_endpoint()
    try:
        _check_remote_size(repo_id, endpoint, timeout_s)
        data = _download_capped(repo_id, endpoint, timeout_s)
    except hub_errors.GatedRepoError as exc:
        raise UnknownModelError(
            f"{repo_id} is gated on the hub: accept its licence and set HF_TOKEN, or pass a local "
            f"config.json{_suggestions(repo_id)}") from exc
    except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as exc:
        raise UnknownModelError(
            f"{repo_id} is not on the hub (or is private){_suggestions(repo_id)}") from exc
    except hub_errors.EntryNotFoundError as exc:
        raise UnknownModelError(f"{repo_id} has no config.json on the hub") from exc
    except hub_errors.HfHubHTTPError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnknownModelError(f"cannot fetch {repo_id} from the hub: {first_line}") from exc
    except _Unreachable as exc:  # the cached copy, if any, rather than nothing
        return _cached_config(repo_id, f"the hub is unreachable ({exc})")
    config = parse_config_bytes(data, origin=f"{repo_id} config.json from the hub")
    _keep_config(repo_id, data)
    return config


class _Unreachable(Exception):
    """The hub could not be reached (connection, timeout): not an answer from it."""


def _download_capped(repo_id: str, endpoint: str | None, timeout_s: float) -> bytes:
    """GET the hub's config.json through huggingface_hub's HTTP session (its headers, token,
    proxies and redirects), reading at most MAX_CONFIG_BYTES + 1 bytes (decoded) and for at
    most ``timeout_s`` seconds in all. Raises ModelConfigError past the cap, the hub's own
    errors (``hf_raise_for_status``), or _Unreachable."""
    import time

    from huggingface_hub import errors as hub_errors
    from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    url = hf_hub_url(repo_id, "config.json", endpoint=endpoint)
    deadline = time.monotonic() + timeout_s
    received = bytearray()
    try:
        with get_session().stream("GET", url, headers=build_hf_headers(), timeout=timeout_s,
                                  follow_redirects=True) as response:
            if response.status_code >= 400:
                response.read()  # the hub's error headers and body, for hf_raise_for_status
                hf_raise_for_status(response)
            for chunk in response.iter_bytes():
                received += chunk
                if len(received) > MAX_CONFIG_BYTES:
                    raise ModelConfigError(
                        f"{repo_id}: config.json on the hub is larger than "
                        f"{MAX_CONFIG_BYTES:,} bytes; the download was stopped there")
                if time.monotonic() > deadline:
                    raise _Unreachable(f"download slower than {timeout_s:g} s in all")
    except (ModelConfigError, hub_errors.HfHubHTTPError, _Unreachable):
        raise
    except Exception as exc:  # connection refused, reset, timeout: the transport's errors
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _Unreachable(first_line[:200]) from exc
    return bytes(received)


def hub_cache_dir() -> Path:
    """Where fetched hub configs are kept: ``hub-configs/`` beside the catalog."""
    from tuneplan.adapters.store import default_path

    return default_path().parent / "hub-configs"


def _cache_file(repo_id: str) -> Path:
    # repo_id passed _HUB_ID (or the web's stricter check): org/name of [\w.-] only
    return hub_cache_dir() / (repo_id.replace("/", "--") + ".json")


def _keep_config(repo_id: str, data: bytes) -> None:
    """Write a fetched config to the cache, atomically; a cache that cannot be written is
    skipped (the fetch itself succeeded)."""
    target = _cache_file(repo_id)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(data)
        partial.replace(target)
    except OSError:
        return


def _cached_config(repo_id: str, why: str) -> dict[str, Any]:
    """A config.json from tuneplan's cache, else huggingface_hub's (no network request);
    UnknownModelError saying ``why`` when neither has it."""
    from huggingface_hub import errors as hub_errors
    from huggingface_hub import hf_hub_download

    kept = _cache_file(repo_id)
    if kept.is_file():
        return load_config_path(kept)
    try:
        local = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except (hub_errors.LocalEntryNotFoundError, hub_errors.HfHubHTTPError, OSError,
            ValueError) as exc:
        raise UnknownModelError(f"cannot fetch {repo_id}: {why}{_suggestions(repo_id)}"
                                ) from exc
    return load_config_path(Path(local))


def _check_remote_size(repo_id: str, endpoint: str | None, timeout_s: float) -> None:
    """Refuse a hub config.json larger than MAX_CONFIG_BYTES before downloading it."""
    from huggingface_hub import errors as hub_errors
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, "config.json", endpoint=endpoint)
    try:
        size = get_hf_file_metadata(url, timeout=timeout_s).size
    except hub_errors.HfHubHTTPError:
        raise  # gated, missing, ...: reported by the caller like a download's error
    except Exception:  # unreachable: the download reports it (or the cache serves it)
        return
    if size is not None and size > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"{repo_id}: config.json is {size:,} bytes on the hub, larger "
                               f"than {MAX_CONFIG_BYTES:,}; refused without downloading it")


def _suggestions(name: str) -> str:
    candidates = {m.hf_id.lower(): m.hf_id for m in bundled_models()}
    candidates.update({m.alias: m.hf_id for m in bundled_models()})
    key = name.lower()
    matches = difflib.get_close_matches(key, list(candidates), n=6, cutoff=0.5)
    matches += difflib.get_close_matches(key.rsplit("/", 1)[-1], list(candidates), n=6, cutoff=0.5)
    names = list(dict.fromkeys(candidates[m] for m in matches))[:3]
    hint = f"; closest bundled: {', '.join(names)}" if names else ""
    return f"{hint} (`tuneplan models` lists all bundled models)"


def list_bundled_models() -> list[dict[str, Any]]:
    """Rows for ``tuneplan models``: name, alias, type, exact total and active parameters."""
    rows = []
    for model in bundled_models():
        spec = spec_from_config(load_bundled_config(model), name=model.hf_id)
        counts = count_parameters(spec)
        rows.append({
            "name": model.hf_id,
            "alias": model.alias,
            "model_type": spec.model_type,
            "total_params": counts.total,
            "active_params": counts.active_per_token,
            "published_params": model.published_params,
            "structure": spec.extra.get("structure", "analytic"),
        })
    return rows
