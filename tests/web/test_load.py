"""The web app under load, deterministically: cached offers never stale, pages, the plan cache
and the planner's bounded queue (503), hub lookups limited per client (429). No timing: the
speed is measured in benchmarks/web_load.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from tests.fakehub import hub_requests
from tests.waiting import HANG_GUARD_S, wait_until
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import Offer
from tuneplan.units import GiB
from tuneplan.web import create_app
from tuneplan.web.capacity import PlanPool

QLORA_8B = {"model": "meta-llama/Llama-3.1-8B", "method": "qlora", "tokens": "50M",
            "seq_len": 2048}

def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Wrap ``module.name`` so each call is counted; returns the counter (a one-item list)."""
    calls = [0]
    original = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls

def _cheap_h100(price: str = "0.01") -> Offer:
    return Offer(provider="OnPrem", instance_type="cheap-box", gpu="H100 PCIe", gpu_count=1,
                 gpu_memory_bytes=80 * GiB, vcpus=8.0, ram_bytes=64 * GiB, region="us-lab-1",
                 price_per_hour=Decimal(price), fetched_at=datetime.now(UTC),
                 source="user-import:lab.csv")

@pytest.fixture
def threaded_pool() -> Iterator[PlanPool]:
    """A planning pool of threads (the function under test can be counted or replaced)."""
    executor = ThreadPoolExecutor(2)
    yield PlanPool(workers=2, executor=executor)
    executor.shutdown(wait=True, cancel_futures=True)

# ---- offers -------------------------------------------------------------------------------

def test_cached_offers_are_never_staler_than_the_catalog(
        client: TestClient, store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneplan.web import documents

    builds = _counting(monkeypatch, documents, "offers_json")
    query = {"gpu": "H100 PCIe", "min_gpu_memory": "80GB", "limit": 5}
    first = client.get("/api/offers", params=query)
    again = client.get("/api/offers", params=query | {"min_gpu_memory": "80 GB"})  # same meaning
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and builds[0] == 1  # the second came from memory
    assert all(o["provider"] != "OnPrem" for o in first.json())
    with CatalogStore.open(store_path) as store:  # an import, as `tuneplan catalog import` does
        store.replace_source("user-import:lab.csv", [_cheap_h100()], datetime.now(UTC))
    after_import = client.get("/api/offers", params=query)
    assert after_import.json()[0]["provider"] == "OnPrem" and builds[0] == 2
    assert int(after_import.headers["x-total-count"]) == int(first.headers["x-total-count"]) + 1
    with CatalogStore.open(store_path) as store:
        store.remove_source("user-import:lab.csv")
    after_remove = client.get("/api/offers", params=query)
    assert after_remove.content == first.content and builds[0] == 3

def test_offers_come_in_pages_that_add_up_to_the_whole_list(client: TestClient) -> None:
    query = {"gpu": "A100", "sort": "price-per-gpu"}
    whole = client.get("/api/offers", params=query | {"limit": 5000})
    total = int(whole.headers["x-total-count"])
    assert total == len(whole.json()) > 150 and "link" not in whole.headers
    seen: list[dict[str, Any]] = []
    url: str | None = "/api/offers?gpu=A100&sort=price-per-gpu&limit=64"
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200 and len(page.json()) <= 64
        assert int(page.headers["x-total-count"]) == total
        seen += page.json()
        link = page.headers.get("link")
        url = None if link is None else link.split(";")[0].strip("<>")
    assert seen == whole.json()
    past_the_end = client.get("/api/offers", params=query | {"offset": total + 10})
    assert past_the_end.json() == [] and past_the_end.headers["x-total-count"] == str(total)
    assert client.get("/api/offers", params={"offset": -1}).status_code == 422

# ---- plans --------------------------------------------------------------------------------

def test_plans_are_kept_by_their_canonical_job_and_the_catalog(
        store_path: Path, threaded_pool: PlanPool, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneplan.service import planning as service_planning
    from tuneplan.web import planning

    runs = _counting(monkeypatch, planning, "plan_document_bytes")
    reads = _counting(monkeypatch, service_planning, "plan_job_stamped")
    with TestClient(create_app(store_path, plan_pool=threaded_pool)) as client:
        first = client.post("/api/plan", json=QLORA_8B)
        # the alias of the same model, a default given explicitly: the same job
        same = client.post("/api/plan", json=QLORA_8B | {"model": "llama-3.1-8b", "epochs": 1})
        assert first.status_code == same.status_code == 200, same.text
        assert same.content == first.content and runs[0] == reads[0] == 1
        other = client.post("/api/plan", json=QLORA_8B | {"top": 3})
        assert len(other.json()["plans"]) == 3 and runs[0] == 2
        with CatalogStore.open(store_path) as store:
            store.replace_source("user-import:lab.csv", [_cheap_h100("0.05")],
                                 datetime.now(UTC))
        fresh = client.post("/api/plan", json=QLORA_8B)
        assert runs[0] == 3  # a new catalog: planned again
        assert "OnPrem" in {p["offer"]["provider"] for p in fresh.json()["plans"]}

def test_a_full_planner_answers_503_with_retry_after(
        store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, no queue, held by a job that waits: a second job is refused, not queued."""
    from tuneplan.web import planning

    release, started = threading.Event(), threading.Event()

    def held(job: Any, model: Any, top: int, store: Any) -> tuple[Any, bytes]:
        started.set()
        release.wait(HANG_GUARD_S)
        return planning.plan_key("json", job, model, top, ("held", 0)), b'{"held": true}'

    monkeypatch.setattr(planning, "plan_document_bytes", held)
    executor = ThreadPoolExecutor(1)
    pool = PlanPool(workers=1, queue=0, executor=executor)
    answers: dict[str, Any] = {}
    try:
        with TestClient(create_app(store_path, plan_pool=pool)) as client:
            first = threading.Thread(
                target=lambda: answers.update(first=client.post("/api/plan", json=QLORA_8B)))
            first.start()
            wait_until(lambda: started.is_set() and pool.in_flight == 1, "the first plan")
            busy = client.post("/api/plan", json=QLORA_8B | {"tokens": "60M"})
            assert busy.status_code == 503
            assert int(busy.headers["retry-after"]) >= 1
            (problem,) = busy.json()["detail"]
            assert set(problem) == {"loc", "msg", "type"} and problem["type"] == "busy"
            assert "at most 1" in problem["msg"]
            release.set()
            first.join(HANG_GUARD_S)
            assert answers["first"].status_code == 200
            assert answers["first"].json() == {"held": True}
            assert pool.in_flight == 0
            assert client.post("/api/plan", json=QLORA_8B | {"tokens": "60M"}).status_code == 200
    finally:
        release.set()
        executor.shutdown(wait=True)

# ---- hub lookups --------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

def _hub_client(app: Any, address: str) -> TestClient:
    return TestClient(app, client=(address, 40000))

def test_hub_lookups_are_rate_limited_per_client_address(fake_hub: str) -> None:
    from tuneplan.web.inputs import HubGate

    clock = _Clock()
    app = create_app(allow_hub=True, hub_gate=HubGate(per_client=2, window_s=60, clock=clock))
    one, two = _hub_client(app, "10.0.0.1"), _hub_client(app, "10.0.0.2")
    body = {"model": "someone/rated"}
    assert [one.post("/api/memory", json=body).status_code for _ in range(2)] == [200, 200]
    asked = len(hub_requests("someone/rated"))
    assert [r.split()[0] for r in hub_requests("someone/rated")].count("GET") == 2
    limited = one.post("/api/memory", json=body)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "60"
    (problem,) = limited.json()["detail"]
    assert set(problem) == {"loc", "msg", "type"} and problem["type"] == "rate_limited"
    assert len(hub_requests("someone/rated")) == asked  # refused before any request
    assert one.post("/api/memory", json={"model": "qwen2.5-0.5b"}).status_code == 200  # bundled
    assert two.post("/api/memory", json=body).status_code == 200  # another address
    clock.now += 61
    assert one.post("/api/memory", json=body).status_code == 200  # the window has passed

def test_hub_lookups_beyond_the_concurrency_cap_get_503(fake_hub: str) -> None:
    from tuneplan.web.inputs import HubGate

    app = create_app(allow_hub=True, hub_gate=HubGate(concurrency=0))
    response = _hub_client(app, "10.0.0.3").post("/api/plan", json={"model": "someone/busy"})
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert response.json()["detail"][0]["type"] == "busy"
    assert hub_requests("someone/busy") == []

def test_a_hub_config_past_the_byte_cap_is_a_422_on_the_model(
        fake_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http.time, "sleep", lambda _seconds: None)
    app = create_app(allow_hub=True)
    response = _hub_client(app, "10.0.0.4").post("/api/memory",
                                                 json={"model": "nolength/model"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "model"]
    assert "download was stopped" in response.json()["detail"][0]["msg"]


def test_the_catalog_watch_follows_a_deleted_and_rebuilt_file(tmp_path: Path) -> None:
    from tuneplan.service.catalog import CatalogWatch

    path = tmp_path / "catalog.sqlite"
    with CatalogStore.open(path, seed=False):
        pass
    watch = CatalogWatch(path)
    token = watch.stamp()[0]
    for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)
    with CatalogStore.open(path, seed=False) as rebuilt:
        new_token = rebuilt.stamp()[0]
    assert new_token != token and watch.stamp()[0] == new_token  # not the deleted file's
    watch.close()


def test_the_caches_are_bounded_by_entries_and_by_bytes() -> None:
    from tuneplan.web.capacity import LruCache

    cache = LruCache(3, max_bytes=10, size=len)
    for key, value in (("a", b"1234"), ("b", b"1234"), ("c", b"12")):
        cache.put(key, value)
    assert (len(cache), cache.bytes) == (3, 10)
    assert cache.get("a") == b"1234"  # now the most recently used
    cache.put("d", b"123")  # 13 bytes: the least recently used (b) goes
    assert cache.get("b") is None and (len(cache), cache.bytes) == (3, 9)
    cache.put("e", b"")  # a fourth entry: c (least recent now) goes
    assert cache.get("c") is None and sorted(k for k in "ade" if cache.get(k) is not None) == [
        "a", "d", "e"]
    cache.put("a", b"1")  # replacing an entry counts its new size only
    assert cache.bytes == 4


def _refuse(field: str) -> tuple[Any, Any]:
    from tuneplan.web.inputs import FieldError

    raise FieldError(field, f"{field} is refused in the worker")


def _echo(value: int) -> tuple[Any, int]:
    return ("echo", value), value


def test_an_error_raised_in_a_planning_process_reaches_the_caller_intact() -> None:
    """Errors with extra fields (the field a 422 names) cross the process boundary whole, and
    the pool keeps working after one."""
    import asyncio
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tuneplan.web.inputs import FieldError

    executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    pool = PlanPool(workers=1, executor=executor)
    try:
        with pytest.raises(FieldError, match="refused in the worker") as info:
            asyncio.run(pool.run("refused", _refuse, "seq_len"))
        assert info.value.field == "seq_len"
        assert asyncio.run(pool.run(("echo", 7), _echo, 7)) == 7
        assert pool.in_flight == 0
    finally:
        executor.shutdown(wait=True)


def test_the_offers_page_links_its_next_page(client: TestClient) -> None:
    import re

    first = client.get("/offers", params={"gpu": "H100", "limit": 50})
    assert first.text.count("<tr data-offer=") == 50 and "showing the first 50" in first.text
    link = re.search(r'<a href="([^"]+)" id="next-page">', first.text)
    assert link is not None and "offset=50" in link.group(1)
    second = client.get(link.group(1).replace("&amp;", "&"))
    assert second.status_code == 200 and "showing 50 from number 51" in second.text
    firsts = re.findall(r'<tr data-offer="([0-9a-f]+)"', first.text)
    seconds = re.findall(r'<tr data-offer="([0-9a-f]+)"', second.text)
    assert len(seconds) == 50 and not set(firsts) & set(seconds)
