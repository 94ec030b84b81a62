"""How the web app holds under load: bounded caches, the planning pool with its bounded queue,
and per-client rate limits. The errors here become 503/429 with ``Retry-After`` in the one
error shape (``app._tuneplan_error``).

Nothing here knows what is computed: ``PlanPool`` runs a picklable function of picklable
arguments in worker processes (or any ``concurrent.futures.Executor`` given), at most
``capacity`` distinct jobs at once, identical jobs in flight shared, results kept by key.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

from tuneplan.errors import TuneplanError

PLAN_QUEUE = 16  # plans waiting beyond the workers before new ones get 503 (10 clients fit)
PLAN_CACHE_ENTRIES = 128  # plan results kept (a plan document is ~200 KB of JSON)
PLAN_CACHE_BYTES = 128 * 10**6  # and at most this much of them (a typed result counts 1 MB)
PLAN_CACHE_TTL_S = 300.0  # a kept plan is recomputed after this: its warnings name offer ages
OFFER_CACHE_ENTRIES = 256  # offer responses kept (100 offers are ~55 KB of JSON)
OFFER_CACHE_BYTES = 64 * 10**6  # and at most this much of them (5,000 offers are ~2.7 MB)
_TYPED_RESULT_BYTES = 10**6  # what a kept PlanResult is counted as (its pickle is ~0.9 MB)


class ServerBusyError(TuneplanError):
    """The server is at capacity; ask again after ``retry_after_s`` seconds (HTTP 503)."""

    status = 503

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.retry_after_s))


class RateLimitedError(ServerBusyError):
    """This client asked too often; ask again after ``retry_after_s`` seconds (HTTP 429)."""

    status = 429


class LruCache:
    """A thread-safe mapping of at most ``entries`` items and ``max_bytes`` bytes (each item's
    ``size``), least recently used dropped first."""

    def __init__(self, entries: int, max_bytes: int | None = None,
                 size: Callable[[Any], int] = lambda _value: 0) -> None:
        self.entries, self.max_bytes, self.size = entries, max_bytes, size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self.bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        size = self.size(value)
        with self._lock:
            self.bytes += size - self._sizes.get(key, 0)
            self._items[key], self._sizes[key] = value, size
            self._items.move_to_end(key)
            while len(self._items) > self.entries or (
                    self.max_bytes is not None and self.bytes > self.max_bytes
                    and len(self._items) > 1):
                dropped, _ = self._items.popitem(last=False)
                self.bytes -= self._sizes.pop(dropped)

    def __len__(self) -> int:
        return len(self._items)


class ClientRate:
    """At most ``limit`` events per ``window_s`` seconds per client (a sliding window).

    Tracks at most ``clients`` addresses (the least recently seen are forgotten), so a flood
    of addresses cannot grow it without bound. ``clock`` is injectable for tests.
    """

    def __init__(self, limit: int, window_s: float, *, clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self.clients, self.clock = limit, window_s, clients, clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, client: str, what: str) -> None:
        """Count one event for ``client``; RateLimitedError when it is over its limit."""
        now = self.clock()
        with self._lock:
            times = self._seen.pop(client, None) or deque()
            while times and times[0] <= now - self.window_s:
                times.popleft()
            self._seen[client] = times
            while len(self._seen) > self.clients:
                self._seen.popitem(last=False)
            if len(times) >= self.limit:
                wait = math.ceil(times[0] + self.window_s - now)
                raise RateLimitedError(
                    f"too many {what} from this address (at most {self.limit} per "
                    f"{self.window_s:.0f} s); try again in {max(1, wait)} s", wait)
            times.append(now)


def default_workers() -> int:
    """Planning processes: one per CPU this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class PlanPool:
    """CPU-heavy calls (planning) off the event loop, bounded.

    ``executor``: any Executor (tests pass a thread pool); default a process pool of
    ``workers`` processes started with "spawn" (no fork of a threaded server), created on
    first use. At most ``workers + queue`` distinct keys run or wait at once; one more gets
    ServerBusyError (503) with a Retry-After from the mean run time. A key already running is
    joined, not run twice. Results are kept ``ttl_s`` seconds under the key the function
    returns with them (its catalog stamp), ``entries`` and ``max_bytes`` at most.
    """

    def __init__(self, *, workers: int | None = None, queue: int = PLAN_QUEUE,
                 executor: Executor | None = None, entries: int = PLAN_CACHE_ENTRIES,
                 max_bytes: int = PLAN_CACHE_BYTES, ttl_s: float = PLAN_CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers or default_workers()
        self.capacity = self.workers + queue
        self.ttl_s, self.clock = ttl_s, clock
        self._executor = executor
        self._owned = executor is None
        self._running: dict[Hashable, Future[Any]] = {}
        self._kept = LruCache(entries, max_bytes, _kept_size)
        self._lock = threading.Lock()
        self._mean_s = 1.0

    @property
    def in_flight(self) -> int:
        """Distinct jobs running or queued now."""
        with self._lock:
            return len(self._running)

    def kept(self, key: Hashable) -> Any:
        """A result kept under ``key`` and younger than ``ttl_s``, else None."""
        found = self._kept.get(key)
        if found is None or self.clock() - found[0] > self.ttl_s:
            return None
        return found[1]

    async def run(self, key: Hashable, function: Callable[..., tuple[Hashable, Any]],
                  *args: Any) -> Any:
        """``function(*args)`` -> (result key, result) in the pool, for ``key``; the result.

        A result already kept under ``key`` is returned without running anything.
        """
        found = self.kept(key)
        if found is not None:
            return found
        submitted = False
        with self._lock:
            future = self._running.get(key)
            if future is None:
                if len(self._running) >= self.capacity:
                    wait = math.ceil(self._mean_s * self.capacity / self.workers)
                    raise ServerBusyError(
                        f"the planner is busy ({len(self._running)} plans running or queued, "
                        f"at most {self.capacity}); try again in {max(1, wait)} s", wait)
                future = self._submit(function, *args)
                self._running[key] = future
                submitted = True
        if submitted:  # outside the lock: a job already done calls back at once, here
            started = self.clock()
            future.add_done_callback(lambda done: self._finish(key, done, started))
        # shield: a client that goes away does not cancel a job others may be waiting for
        _, result = await asyncio.shield(asyncio.wrap_future(future))
        return result

    def _submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._executor is None:
            import multiprocessing

            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_exit_with_parent, initargs=(os.getpid(),))
        try:
            return self._executor.submit(function, *args)
        except RuntimeError:  # a broken pool (a worker was killed): start a fresh one
            if not self._owned:
                raise
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
            return self._submit(function, *args)

    def _finish(self, key: Hashable, future: Future[Any], started: float) -> None:
        elapsed = self.clock() - started
        with self._lock:
            self._running.pop(key, None)
            self._mean_s = 0.8 * self._mean_s + 0.2 * elapsed
        if not future.cancelled() and future.exception() is None:
            result_key, result = future.result()
            self._kept.put(result_key, (self.clock(), result))

    def close(self) -> None:
        """Stop the workers this pool started: queued jobs are dropped, running ones (at most
        one per worker) finish, then the workers exit."""
        if self._owned and self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _kept_size(kept: tuple[float, Any]) -> int:
    result = kept[1]
    return len(result) if isinstance(result, bytes) else _TYPED_RESULT_BYTES


def _exit_with_parent(parent: int) -> None:
    """In each planning worker: end when the server process is gone (killed without a
    shutdown), instead of lingering as an orphan holding its pipes."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
