"""A local fake of the Hugging Face hub (``/{repo}/resolve/{rev}/config.json``) for tests: it
answers like the hub, with its error headers, counts every request, and has misbehaving repos
that test the download's byte cap. Loopback only; nothing reaches the network. The
``fake_hub`` fixture is registered for every test by ``tests/conftest.py``."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

RECORDED_CONFIG = (Path(__file__).parent / "fixtures" / "hub" / "config.json").read_bytes()
ENDLESS_BYTES = 200_000_000  # what the endless repos would send if the client read it all


class FakeHub(http.server.BaseHTTPRequestHandler):
    """``gated/`` 401, ``missing/`` 404, ``huge/`` a HEAD of 60 MB, ``broken/`` bad JSON;
    ``nolength/`` no Content-Length on HEAD or GET and an endless body; ``headfails/`` a HEAD
    that drops the connection, then an endless body; ``liar/`` a HEAD of 100 bytes, then an
    endless body without a length. Anything else: the recorded Qwen config."""

    requests: ClassVar[list[str]] = []
    streamed: ClassVar[dict[str, int]] = {}  # endless repo path -> bytes written before the cut
    lock: ClassVar[threading.Lock] = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, with_body: bool) -> None:
        with FakeHub.lock:
            FakeHub.requests.append(f"{self.command} {self.path}")
        endless = self.path.startswith(("/nolength/", "/headfails/", "/liar/"))
        if self.path.startswith("/gated/"):
            self._error(401, "GatedRepo", "Access to model gated/model is restricted.")
        elif self.path.startswith("/missing/"):
            self._error(404, "RepoNotFound", "Repository Not Found")
        elif self.path.startswith("/huge/") and not with_body:
            self._send(b"", with_body, length=60_000_000)  # HEAD: a 60 MB config.json
        elif self.path.startswith("/broken/"):
            self._send(b'{"model_type": "llama", "hidden_size": ', with_body)
        elif endless and not with_body:
            if self.path.startswith("/headfails/"):
                self.close_connection = True  # no answer at all
            else:
                self._headers(100 if self.path.startswith("/liar/") else None)
        elif endless:
            self._endless()
        else:
            self._send(RECORDED_CONFIG, with_body)

    def _headers(self, length: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"endless"')
        self.send_header("X-Repo-Commit", "b" * 40)
        self.end_headers()

    def _endless(self) -> None:
        """A config.json that never ends (HTTP/1.0: the body runs until the connection
        closes); records how many bytes got out before the client hung up."""
        self._headers(None)
        chunk = b"x" * 65_536
        written = 0
        try:
            self.wfile.write(b'{"pad": "')
            while written < ENDLESS_BYTES:
                self.wfile.write(chunk)
                written += len(chunk)
        except OSError:  # the client stopped reading and closed
            pass
        with FakeHub.lock:
            FakeHub.streamed[self.path] = written

    def _send(self, body: bytes, with_body: bool, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.send_header("ETag", f'"{abs(hash(body))}"')
        self.send_header("X-Repo-Commit", "a" * 40)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)


def hub_requests(repo: str) -> list[str]:
    """The requests the fake hub got for ``repo`` (``"GET /org/name/resolve/..."``)."""
    with FakeHub.lock:
        return [r for r in FakeHub.requests if r.split()[1].startswith(f"/{repo}/")]


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fake hub on a free loopback port, as the endpoint ``adapters.hub`` asks."""
    from tuneplan.adapters import hub

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(hub, "_hub_endpoint", lambda: endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)   # this hub is asked, offline or not
    with FakeHub.lock:
        FakeHub.requests.clear()
        FakeHub.streamed.clear()
    yield endpoint
    server.shutdown()
    server.server_close()
