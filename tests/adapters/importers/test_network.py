"""HTTP by the book, over real sockets: a stdlib server on 127.0.0.1 answers from a script.

Retries (5xx, connection reset, 429 with Retry-After in both forms), exhaustion as one
FetchError line, conditional GETs answered 304 from the on-disk cache, and API keys that
never reach a URL or an error text. The retry policy's sleep is injected: nothing waits.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import FIXTURES
from tuneplan.adapters.importers import lambda_cloud, network, runpod, skypilot_live
from tuneplan.adapters.importers.network import FetchError, HttpCache, RetryPolicy, fetch_bytes

NOW = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)
SECRET = "sk-live-DO-NOT-PRINT-0123456789"


@dataclass
class Reply:
    """One scripted answer: a status, headers and body, or ``reset`` (close with a TCP RST)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class Script:
    """Replies in order (the last one repeats) and every request the server saw."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.seen: list[Seen] = []
        self.lock = threading.Lock()

    def next(self, seen: Seen) -> Reply:
        with self.lock:
            self.seen.append(seen)
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


class _Handler(BaseHTTPRequestHandler):
    script: Script

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        reply = self.script.next(Seen(self.command, self.path, dict(self.headers.items())))
        if reply.reset:
            # SO_LINGER 0: close() sends a TCP RST, the client reads "connection reset".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.close()
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(reply.body)

    do_GET = do_POST = _answer

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()


@pytest.fixture
def served() -> Iterator[tuple[str, Script]]:
    script = Script()
    handler = type("Handler", (_Handler,), {"script": script})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


class Sleeps(list[float]):
    """An injected sleep that records the seconds it was asked to wait."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def policy(sleeps: Sleeps, *, jitter: float = 0.0, attempts: int = 4) -> RetryPolicy:
    return RetryPolicy(sleep=sleeps, jitter=lambda: jitter, now=lambda: NOW, attempts=attempts)


def test_a_5xx_then_200_is_retried_and_succeeds(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(503), Reply(502), Reply(200, b"prices")]
    sleeps = Sleeps()
    with httpx.Client() as client:
        body = fetch_bytes(client, "GET", f"{base}/v", retry=policy(sleeps, jitter=0.0))
    assert body == b"prices" and len(script.seen) == 3
    # Exponential steps 0.5 s, 1 s; jitter 0 scales each by 0.5 (never below half a step).
    assert sleeps == [0.25, 0.5]


def test_a_connection_reset_is_retried(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(reset=True), Reply(200, b"after the reset")]
    sleeps = Sleeps()
    with httpx.Client() as client:
        body = fetch_bytes(client, "GET", f"{base}/v", retry=policy(sleeps, jitter=1.0))
    assert body == b"after the reset" and len(script.seen) == 2
    assert sleeps == [0.5]  # jitter 1.0: the whole first step


@pytest.mark.parametrize(("retry_after", "expected_s"), [
    ("Wed, 02 Dec 2026 01:00:07 GMT", 7.0),        # HTTP-date, 7 s after NOW
    ("Wed, 02 Dec 2026 02:00:00 GMT", network.MAX_RETRY_WAIT_S),  # an hour: capped
    ("Tue, 01 Dec 2026 23:00:00 GMT", 0.0),        # in the past: no wait
    ("3", 3.0),                                    # delay-seconds
    ("86400", network.MAX_RETRY_WAIT_S),
])
def test_429_honours_retry_after_capped(served: tuple[str, Script], retry_after: str,
                                        expected_s: float) -> None:
    base, script = served
    script.replies = [Reply(429, headers={"Retry-After": retry_after}), Reply(200, b"ok")]
    sleeps = Sleeps()
    with httpx.Client() as client:
        assert fetch_bytes(client, "GET", f"{base}/v", retry=policy(sleeps)) == b"ok"
    assert sleeps == [expected_s]


def test_exhausted_retries_are_one_fetch_error_line(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(500, b"upstream exploded\nTraceback ...")]
    sleeps = Sleeps()
    with httpx.Client() as client, pytest.raises(FetchError) as caught:
        fetch_bytes(client, "GET", f"{base}/prices?$filter=x", retry=policy(sleeps, attempts=3))
    assert str(caught.value) == f"HTTP 500 from {base}/prices (3 attempts)"
    assert len(script.seen) == 3 and sleeps == [0.25, 0.5]


def test_a_client_error_is_not_retried(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(404)]
    sleeps = Sleeps()
    with httpx.Client() as client, pytest.raises(FetchError, match=r"^HTTP 404 from .*/v$"):
        fetch_bytes(client, "GET", f"{base}/v", retry=policy(sleeps))
    assert len(script.seen) == 1 and sleeps == []


def test_resets_until_exhausted_are_one_network_error_line(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(reset=True)]
    with httpx.Client() as client, pytest.raises(FetchError) as caught:
        fetch_bytes(client, "GET", f"{base}/v", retry=policy(Sleeps(), attempts=2))
    message = str(caught.value)
    assert message.startswith(f"network error fetching {base}/v: ")
    assert message.endswith("(2 attempts)") and "\n" not in message


def test_etag_round_trip_serves_the_cached_body_on_304(
        served: tuple[str, Script], tmp_path: Path) -> None:
    base, script = served
    csv_text = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
                "GpuInfo,SpotPrice\ngpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.49,us-east-1,,\n")
    script.replies = [
        Reply(200, csv_text.encode(), {"ETag": '"v8-abc"',
                                       "Last-Modified": "Mon, 30 Nov 2026 12:00:00 GMT"}),
        Reply(304, headers={"ETag": '"v8-abc"'}),
    ]
    cache = HttpCache(tmp_path / "http")
    with httpx.Client() as client:
        first = skypilot_live.fetch(client, cloud="lambda", base_url=base, cache=cache)
        second = skypilot_live.fetch(client, cloud="lambda", base_url=base, cache=cache)
    assert "If-None-Match" not in script.seen[0].headers
    assert script.seen[1].headers["If-None-Match"] == '"v8-abc"'
    assert script.seen[1].headers["If-Modified-Since"] == "Mon, 30 Nov 2026 12:00:00 GMT"
    assert [o.price_per_hour for o in second.offers] == [o.price_per_hour
                                                         for o in first.offers]
    assert len(second.offers) == 1
    assert len(list((tmp_path / "http").glob("*.body"))) == 1


def test_a_304_without_a_cached_body_is_a_fetch_error(
        served: tuple[str, Script], tmp_path: Path) -> None:
    base, script = served
    script.replies = [Reply(200, b"v1", {"ETag": '"1"'}), Reply(304)]
    cache = HttpCache(tmp_path)
    with httpx.Client() as client:
        assert fetch_bytes(client, "GET", f"{base}/v", cache=cache) == b"v1"
        for body in tmp_path.glob("*.body"):
            body.unlink()  # the validators stay, the body is gone: nothing to revalidate
        with pytest.raises(FetchError, match=r"HTTP 304 from .* but no cached copy is left"):
            fetch_bytes(client, "GET", f"{base}/v", cache=cache)  # a server answering 304 anyway
    assert script.seen[0].headers.get("If-None-Match") is None
    assert "If-None-Match" not in script.seen[1].headers  # sent unconditionally


@pytest.mark.parametrize("reply", [
    Reply(500, f"echo: Authorization: Bearer {SECRET}".encode()),
    Reply(401, b'{"error": "bad key"}'),
    Reply(reset=True),
    Reply(200, f'{{"echo": "{SECRET}", "truncat'.encode()),
], ids=["500-echoing-the-key", "401", "reset", "bad-json-echoing-the-key"])
def test_a_key_from_the_environment_never_appears_in_a_fetch_error(
        served: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, reply: Reply) -> None:
    base, script = served
    monkeypatch.setenv(runpod.KEY_ENV, SECRET)
    monkeypatch.setenv(lambda_cloud.KEY_ENV, SECRET)
    script.replies = [reply]
    messages = []
    with httpx.Client() as client:
        for fetch in (lambda: runpod.fetch(client, base_url=f"{base}/graphql"),
                      lambda: lambda_cloud.fetch(client, base_url=base)):
            with pytest.raises(FetchError) as caught:
                fetch()
            messages.append(str(caught.value))
            assert SECRET not in repr(caught.value) and "\n" not in str(caught.value)
    assert all(SECRET not in m and base in m for m in messages)
    assert script.seen, "the server was asked"
    for seen in script.seen:
        assert SECRET not in seen.path  # never in a URL
    runpod_auth = [s.headers.get("Authorization") for s in script.seen if s.method == "POST"]
    assert set(runpod_auth) == {f"Bearer {SECRET}"}


def test_a_key_in_a_url_query_is_cut_from_the_error(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(503)]
    with httpx.Client() as client, pytest.raises(FetchError) as caught:
        fetch_bytes(client, "GET", f"{base}/v?api_key={SECRET}",
                    retry=policy(Sleeps(), attempts=2))
    assert SECRET not in str(caught.value) and str(caught.value).endswith("/v (2 attempts)")


def test_runpod_sends_no_authorization_without_a_key(
        served: tuple[str, Script], monkeypatch: pytest.MonkeyPatch) -> None:
    base, script = served
    monkeypatch.delenv(runpod.KEY_ENV, raising=False)
    types = (FIXTURES / "importers" / "runpod_gpu_types.json").read_text()
    script.replies = [Reply(200, f'{{"data": {{"gpuTypes": {types}}}}}'.encode())]
    with httpx.Client() as client:
        assert len(runpod.fetch(client, base_url=f"{base}/graphql").offers) == 83
    assert "Authorization" not in script.seen[0].headers
    assert script.seen[0].path == "/graphql"


def test_a_redirect_loop_is_one_fetch_error_without_the_query(served: tuple[str, Script]) -> None:
    base, script = served
    script.replies = [Reply(302, headers={"Location": f"/loop?api_key={SECRET}"})]
    with httpx.Client(follow_redirects=True, max_redirects=3) as client, pytest.raises(
            FetchError) as caught:
        fetch_bytes(client, "GET", f"{base}/v?api_key={SECRET}", retry=policy(Sleeps()))
    assert str(caught.value).startswith(f"error fetching {base}/v: ")
    assert SECRET not in str(caught.value) and len(script.seen) == 4


def test_a_body_without_validators_replaces_the_cached_one(
        served: tuple[str, Script], tmp_path: Path) -> None:
    base, script = served
    script.replies = [Reply(200, b"old", {"ETag": '"1"'}), Reply(200, b"new"),
                      Reply(200, b"newest")]
    cache = HttpCache(tmp_path)
    with httpx.Client() as client:
        bodies = [fetch_bytes(client, "GET", f"{base}/v", cache=cache) for _ in range(3)]
    assert bodies == [b"old", b"new", b"newest"]
    assert script.seen[1].headers.get("If-None-Match") == '"1"'
    assert "If-None-Match" not in script.seen[2].headers  # "old" can no longer answer a 304
    assert list(tmp_path.iterdir()) == []
