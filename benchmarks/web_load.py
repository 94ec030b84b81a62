"""Load on the web app's JSON API over loopback: N concurrent clients for T seconds per endpoint.

Starts ``uvicorn tuneplan.web:create_app`` (one worker, as ``tuneplan serve`` does) on
127.0.0.1 with a private catalog, then drives ``GET /api/offers`` and ``POST /api/plan`` in
turn and prints requests/s, p50/p99 latency and errors. Loopback only; clients and seconds are
bounded (at most 64 clients, 120 s per endpoint).

    python benchmarks/web_load.py [--clients 20] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

HOST = "127.0.0.1"  # never anything else: this benchmark must not leave the machine
OFFERS = ("GET", "/api/offers", {"params": {"gpu": "H100", "sort": "price", "limit": 100}})
PLAN = ("POST", "/api/plan", {"json": {"model": "meta-llama/Llama-3.1-8B", "method": "qlora",
                                       "tokens": "50M", "seq_len": 2048}})


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


async def _client(http: httpx.AsyncClient, request: tuple[str, str, dict[str, Any]],
                  stop_at: float, latencies: list[float], errors: list[str]) -> None:
    method, path, kwargs = request
    while time.monotonic() < stop_at:
        start = time.perf_counter()
        try:
            response = await http.request(method, path, **kwargs)
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}")
        except httpx.HTTPError as exc:
            errors.append(type(exc).__name__)
        latencies.append(time.perf_counter() - start)


async def _drive(base: str, request: tuple[str, str, dict[str, Any]], clients: int,
                 seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as http:
        begin = time.monotonic()
        await asyncio.gather(*(_client(http, request, begin + seconds, latencies, errors)
                               for _ in range(clients)))
        elapsed = time.monotonic() - begin
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {"endpoint": f"{request[0]} {request[1]}", "clients": clients,
            "seconds": round(elapsed, 1), "requests": len(latencies),
            "requests_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": round(pct(0.50) * 1000, 1), "p99_ms": round(pct(0.99) * 1000, 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
            "errors": len(errors), "error_kinds": sorted(set(errors))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    clients = max(1, min(args.clients, 64))
    seconds = max(1.0, min(args.seconds, 120.0))
    port = _free_port()
    with tempfile.TemporaryDirectory() as home:
        server = _start_server(port, home)
        try:
            base = f"http://{HOST}:{port}"
            httpx.request(PLAN[0], base + PLAN[1], timeout=300, **PLAN[2]).raise_for_status()
            results = [asyncio.run(_drive(base, request, clients, seconds))
                       for request in (OFFERS, PLAN)]
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
