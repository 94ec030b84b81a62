"""Load on the web app's JSON API over loopback: N concurrent clients for T seconds per run.

Starts ``uvicorn tuneplan.web:create_app`` (one server process, as ``tuneplan serve`` does, with
its planning pool) on 127.0.0.1 with a private catalog, then drives in turn ``GET /api/offers``
(``--clients``), ``POST /api/plan`` with one repeated job and ``POST /api/plan`` with a new job
every request (``--plan-clients``), and prints requests/s, p50/p99 latency, errors and the
1-minute load average before and after each run (the machine may be shared). Loopback only;
clients and seconds are bounded (at most 64 clients, 120 s per run).

    python benchmarks/web_load.py [--clients 20] [--plan-clients 10] [--seconds 30]
        [--only offers,plan-repeated,plan-new]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

HOST = "127.0.0.1"  # never anything else: this benchmark must not leave the machine
OFFERS = ("GET", "/api/offers", {"params": {"gpu": "H100", "sort": "price", "limit": 100}})
PLAN = ("POST", "/api/plan", {"json": {"model": "meta-llama/Llama-3.1-8B", "method": "qlora",
                                       "tokens": "50M", "seq_len": 2048}})
_fresh = itertools.count(1)


def _new_plan() -> tuple[str, str, dict[str, Any]]:
    """A job never asked before in this run (another token count): the server must plan it."""
    body = dict(PLAN[2]["json"], tokens=f"{100 + next(_fresh)}M")
    return ("POST", "/api/plan", {"json": body})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _start_server(port: int, home: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TUNEPLAN_HOME=home, HF_HUB_OFFLINE="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "tuneplan.web:create_app", "--host", HOST,
         "--port", str(port), "--log-level", "warning"], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{HOST}:{port}/api/catalog", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("server did not start")


Request = tuple[str, str, dict[str, Any]]


class _Connection:
    """One keep-alive HTTP/1.1 connection, as lean as a load generator must be: on a small
    shared machine a full client library would spend the CPU the server is measured on."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, method: str, path: str, kwargs: dict[str, Any]) -> int:
        if self.streams is None:
            self.streams = await asyncio.open_connection(HOST, self.port)
        reader, writer = self.streams
        if "params" in kwargs:
            path = f"{path}?{urllib.parse.urlencode(kwargs['params'])}"
        body = json.dumps(kwargs["json"]).encode() if "json" in kwargs else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()
        header = await reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, v in
                  (line.split(":", 1) for line in lines[1:] if ":" in line)}
        if "content-length" not in fields:
            raise ConnectionError("response without Content-Length")
        await reader.readexactly(int(fields["content-length"]))
        if fields.get("connection", "").lower() == "close":
            await self.close()
        return status

    async def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def _client(port: int, request: Request | Callable[[], Request], stop_at: float,
                  latencies: list[float], errors: list[str]) -> None:
    connection = _Connection(port)
    while time.monotonic() < stop_at:
        method, path, kwargs = request() if callable(request) else request
        start = time.perf_counter()
        try:
            status = await connection.request(method, path, kwargs)
            if status != 200:
                errors.append(f"HTTP {status}")
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            errors.append(type(exc).__name__)
            await connection.close()
        latencies.append(time.perf_counter() - start)
    await connection.close()


async def _drive(base: str, name: str, request: Request | Callable[[], Request], clients: int,
                 seconds: float) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    latencies: list[float] = []
    errors: list[str] = []
    port = int(base.rsplit(":", 1)[1])
    begin = time.monotonic()
    await asyncio.gather(*(_client(port, request, begin + seconds, latencies, errors)
                           for _ in range(clients)))
    elapsed = time.monotonic() - begin
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {"run": name, "clients": clients,
            "seconds": round(elapsed, 1), "requests": len(latencies),
            "requests_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": round(pct(0.50) * 1000, 1), "p99_ms": round(pct(0.99) * 1000, 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
            "errors": len(errors), "error_kinds": sorted(set(errors)),
            "load_1min_before": round(load_before, 2),
            "load_1min_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--plan-clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--only", default="offers,plan-repeated,plan-new")
    args = parser.parse_args()
    clients = max(1, min(args.clients, 64))
    plan_clients = max(1, min(args.plan_clients, 64))
    seconds = max(1.0, min(args.seconds, 120.0))
    runs: dict[str, tuple[Request | Callable[[], Request], int]] = {
        "offers": (OFFERS, clients), "plan-repeated": (PLAN, plan_clients),
        "plan-new": (_new_plan, plan_clients)}
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in runs]
    if unknown:
        raise SystemExit(f"--only: unknown run(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(runs)}")
    port = _free_port()
    with tempfile.TemporaryDirectory() as home:
        server = _start_server(port, home)
        try:
            base = f"http://{HOST}:{port}"
            # warm: the planning workers start, the catalog is read once
            httpx.request(PLAN[0], base + PLAN[1], timeout=300, **PLAN[2]).raise_for_status()
            results = [asyncio.run(_drive(base, name, runs[name][0], runs[name][1], seconds))
                       for name in chosen]
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
