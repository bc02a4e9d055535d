"""A work queue of keys, with client-go's guarantees, for level-triggered controllers.

- A key is queued at most once: ten events about one object mean one
  reconcile, of its latest state.
- A key is never processed by two workers at once: added while being
  processed, it is queued again when the worker calls `done`.
- Failures back off per key, exponentially (`add_rate_limited`), until
  `forget` resets it; `add_after` schedules a key (the earliest wins).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from lightkube import ApiError

from sunk.kube.retry import transient

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down; workers stop."""


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.005, max_delay: float = 60.0) -> None:
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while processing
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._ready = asyncio.Event()
        self._shut_down = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Keys wait or are being worked on."""
        return bool(self._queue or self._processing)

    def add(self, key: K) -> None:
        if self._shut_down:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= when:
                return
            existing[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> None:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self.add_after(key, min(self._base_delay * 2**failures, self._max_delay))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    async def get(self) -> K:
        while not self._queue:
            if self._shut_down:
                raise ShutDown
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shut_down(self) -> None:
        self._shut_down = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._ready.set()


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for besides success: look again after a while."""

    requeue_after: float | None = None


Reconcile = Callable[[K], Awaitable[Result | None]]


class Stale(Exception):
    """A guarded write found its object changed since it was read (a JSON
    patch's resourceVersion test failing answers 422, not 409): the retry
    reads it afresh. Retried quietly."""


def routine_failure(error: Exception) -> str | None:
    """What a failure that any controller meets in ordinary work was (so its
    retry is no news), or None for one worth a traceback: a write refused
    because the object changed since it was read (409), an object deleted
    meanwhile (404), an apiserver away or overloaded for a moment."""
    if isinstance(error, Stale):
        return str(error)
    if isinstance(error, ApiError) and error.status.code == 409:
        return "the object changed meanwhile"
    if isinstance(error, ApiError) and error.status.code == 404:
        return "the object is gone"
    if transient(error):
        return f"apiserver unavailable ({error or type(error).__name__})"
    return None


async def run_workers(queue: WorkQueue[K], reconcile: Reconcile[K], workers: int = 4) -> None:
    """Process keys until the queue shuts down; a failing key backs off, the others go on."""

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            try:
                result = await reconcile(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as error:
                attempt = queue.failures(key) + 1
                routine = routine_failure(error)
                if routine is None:
                    log.exception("reconcile %s failed (attempt %d)", key, attempt)
                else:  # retried as any failure, without a traceback
                    log.info("reconcile %s: %s (attempt %d); again", key, routine, attempt)
                queue.add_rate_limited(key)
            else:
                queue.forget(key)
                if result is not None and result.requeue_after is not None:
                    queue.add_after(key, result.requeue_after)
            queue.done(key)

    async with asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(worker())
