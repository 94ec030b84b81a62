"""Model resolution: bundled names, aliases, paths, hub ids through a local fake hub, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakehub import RECORDED_CONFIG, FakeHub
from tuneplan.adapters import hub
from tuneplan.errors import ModelConfigError, UnknownModelError


def test_bundled_name_and_alias_resolve_to_the_same_spec() -> None:
    by_id = hub.resolve_model("meta-llama/Llama-3.1-8B")
    by_alias = hub.resolve_model("LLAMA-3.1-8b")
    assert by_id == by_alias
    assert by_id.hidden_size == 4096 and by_id.num_kv_heads == 8
    assert by_id.name == hub.load_model_config("LLAMA-3.1-8b")[1] == "meta-llama/Llama-3.1-8B"


def test_every_bundled_model_resolves() -> None:
    rows = hub.list_bundled_models()
    assert len(rows) == 81
    assert {row["name"] for row in rows} >= {"Qwen/Qwen3-30B-A3B", "openai-community/gpt2"}


def test_local_folder_and_json_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(RECORDED_CONFIG)
    from_folder = hub.resolve_model(str(tmp_path))
    from_file = hub.resolve_model(str(tmp_path / "config.json"))
    assert from_folder.vocab_size == from_file.vocab_size == 151_936


def test_folder_without_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match=r"has no config\.json"):
        hub.resolve_model(str(tmp_path))


def test_unknown_name_suggests_closest_bundled() -> None:
    with pytest.raises(UnknownModelError, match=r"closest bundled: .*Llama-3\.1-8B"):
        hub.resolve_model("llama-3.1-8")


def test_hub_id_is_fetched_through_huggingface_hub_and_cached(fake_hub: str) -> None:
    spec = hub.resolve_model("someone/tiny-qwen")
    assert spec.model_type == "qwen2" and spec.num_layers == 24
    assert any("/someone/tiny-qwen/resolve/main/config.json" in r for r in FakeHub.requests)


def test_offline_mode_uses_cache_and_refuses_network(
        fake_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.resolve_model("someone/cached")
    FakeHub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve_model("someone/cached").hidden_size == 896
    assert FakeHub.requests == []
    with pytest.raises(UnknownModelError, match="HF_HUB_OFFLINE is set"):
        hub.resolve_model("someone/never-seen")


@pytest.mark.parametrize(
    ("repo", "error", "message"),
    [
        ("gated/model", UnknownModelError, "gated"),        # 401 GatedRepo
        ("missing/model", UnknownModelError, "not on the hub"),  # 404 RepoNotFound
        ("broken/model", ModelConfigError, "not valid JSON"),    # truncated body
    ],
)
def test_hub_errors_are_one_clear_line(
        fake_hub: str, repo: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        hub.resolve_model(repo)
    assert "\n" not in str(info.value)


def test_unreachable_hub_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "_hub_endpoint", lambda: "http://127.0.0.1:9")  # discard port
    # huggingface_hub retries a refused connection with back-off; skip the waiting, not the tries.
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http.time, "sleep", lambda _seconds: None)
    with pytest.raises(UnknownModelError, match="cannot fetch"):
        hub.resolve_model("org/unreachable")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[1, 2, 3]", "holds a JSON object"),
        (b'{"model_type": "llama", "hidden_size": NaN}', "NaN is not a valid"),
        (b"{" * 100_000, "nested too deeply|not valid JSON"),
        (b'{"model_type": "llama",', "not valid JSON"),
        (b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}",
         r"integer 9{20}\.\.\.\(5,000 digits\) is too large"),
        (b'{"model_type": "llama", "rope_theta": 1e999}', "1e999 is not a finite"),
    ],
)
def test_malformed_files_are_model_config_errors(
        tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelConfigError, match=message):
        hub.resolve_model(str(path))


def test_huge_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as handle:
        handle.truncate(hub.MAX_CONFIG_BYTES + 1)
    with pytest.raises(ModelConfigError, match="at most"):
        hub.resolve_model(str(path))


def test_a_huge_int_passed_as_a_mapping_is_one_line_not_a_value_error() -> None:
    from tuneplan.core.models.config import ConfigReader, describe

    reader = ConfigReader({"hidden_size": 10**5000}, family="llama")
    reader.get_int("hidden_size")
    assert describe(10**5000) == "an integer of about 5,000 digits"
    assert any("about 5,000 digits" in p for p in reader.problems)


def test_local_only_reads_the_cache_and_makes_no_request(fake_hub: str) -> None:
    with pytest.raises(UnknownModelError, match="hub lookups are off"):
        hub.fetch_hub_config("someone/never-fetched", local_only=True)
    assert FakeHub.requests == []


def test_a_huge_hub_config_is_refused_before_its_download(fake_hub: str) -> None:
    with pytest.raises(ModelConfigError, match="60,000,000 bytes on the hub"):
        hub.fetch_hub_config("huge/model")
    assert {r.split()[0] for r in FakeHub.requests} == {"HEAD"}  # never a GET of the body


def test_the_web_app_reaches_the_hub_only_with_allow_hub(fake_hub: str) -> None:
    from fastapi.testclient import TestClient

    from tuneplan.web import create_app

    closed = TestClient(create_app())
    response = closed.post("/api/memory", json={"model": "someone/web-unknown"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "model"]
    assert "hub lookups are off" in response.json()["detail"][0]["msg"]
    assert FakeHub.requests == []
    opened = TestClient(create_app(allow_hub=True))
    response = opened.post("/api/memory", json={"model": "someone/web-unknown"})
    assert response.status_code == 200, response.text
    assert any("/someone/web-unknown/" in r for r in FakeHub.requests)


@pytest.mark.parametrize("repo", ["nolength/model", "headfails/model", "liar/model"])
def test_the_download_stops_at_the_byte_cap_whatever_the_head_said(
        fake_hub: str, repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No size (HEAD without Content-Length), no HEAD answer at all, or a HEAD that says 100
    bytes: the GET of an endless config.json is still cut just past MAX_CONFIG_BYTES."""
    from huggingface_hub.utils import _http

    from tests.fakehub import ENDLESS_BYTES, hub_requests
    from tests.waiting import wait_until

    monkeypatch.setattr(_http.time, "sleep", lambda _seconds: None)  # HEAD retries, no waits
    with pytest.raises(ModelConfigError, match="larger than 2,000,000 bytes; the download was "
                                               "stopped"):
        hub.fetch_hub_config(repo)
    path = f"/{repo}/resolve/main/config.json"
    wait_until(lambda: path in FakeHub.streamed, "the fake hub's endless answer to end")
    assert hub.MAX_CONFIG_BYTES < FakeHub.streamed[path] < ENDLESS_BYTES // 10
    assert [r.split()[0] for r in hub_requests(repo)].count("GET") == 1
    assert not hub.hub_cache_dir().exists() or not any(hub.hub_cache_dir().iterdir())


def test_a_fetched_config_is_kept_and_read_back_offline(
        fake_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakehub import hub_requests

    first = hub.fetch_hub_config("someone/kept")
    assert (hub.hub_cache_dir() / "someone--kept.json").read_bytes() == RECORDED_CONFIG
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.fetch_hub_config("someone/kept") == first
    assert len(hub_requests("someone/kept")) == 2  # the HEAD and the GET of the first fetch
