"""Kubernetes Events for every action a controller takes, and why, without flooding the apiserver.

Like client-go's event correlator, for events.k8s.io/v1:

- **Series.** Repeats of the same event (same object, reason, action, type and
  note) within `series_window` of the last one update one Event: its `series`
  (count, lastObservedTime) grows instead of a new object being created. Later,
  or once that Event is gone (Events expire after an hour), a new one starts.
- **Spam filter.** Every object has a token bucket (`burst` writes, one more
  every `refill_every` seconds; client-go's defaults are 25 and 5 minutes).
  A write without a token is skipped, not queued: a flapping object costs the
  apiserver at most `burst` writes and then one per `refill_every`. A skipped
  repeat is still counted, so the next write of that series carries the true
  count.

Both caches are bounded (least recently used entries go first). Emitting never
raises: an Event that cannot be written must not stop the action it describes.

**Held while busy.** With `busy`, `emit_soon` holds its Events until `busy()`
has said for `quiet` seconds that the controller has no work waiting, for at
most `max_hold` seconds: during a burst the apiserver and this process spend
their time on what the Events describe (a bind) rather than on the Events, and
a moment between two pods of a burst does not let them out.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import secrets
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.events_v1 import EventSeries
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.events_v1 import Event
from lightkube.types import PatchType

log = logging.getLogger(__name__)

SERIES_WINDOW = 6 * 60.0  # client-go's events/v1 finishTime
SPAM_BURST = 25
SPAM_REFILL_EVERY = 5 * 60.0
CACHE_SIZE = 4096  # client-go's maxLruCacheEntries
MAX_HOLD = 5.0
QUIET = 0.25
# Held Events are written this many at a time once the controller is idle.
HELD_WRITES = 8


@dataclass
class _Series:
    """One Event and how often it has happened."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    name: str | None = None  # the Event object, once written
    count: int = 0  # occurrences, written or not
    last_seen: float = 0.0


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class RecorderStats:
    created: int = 0
    updated: int = 0  # series writes
    skipped: int = 0  # writes the spam filter held back
    failed: int = 0


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def touch(self, key: Any, default: Callable[[], Any]) -> Any:
        value = self.get(key)
        if value is None:
            value = self[key] = default()
            while len(self) > self.size:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return value


class EventRecorder:
    def __init__(
        self,
        client: AsyncClient,
        controller: str,
        *,
        instance: str | None = None,
        burst: int = SPAM_BURST,
        refill_every: float = SPAM_REFILL_EVERY,
        series_window: float = SERIES_WINDOW,
        cache_size: int = CACHE_SIZE,
        busy: Callable[[], bool] | None = None,
        max_hold: float = MAX_HOLD,
        quiet: float = QUIET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._controller = controller
        # Which replica wrote it: client-go uses the host name (a pod's name).
        self._instance = instance or f"{controller}-{socket.gethostname()}"
        self._burst = burst
        self._refill_every = refill_every
        self._series_window = series_window
        self._clock = clock
        self._series = _Lru(cache_size)
        self._buckets = _Lru(cache_size)
        self.stats = RecorderStats()
        self._writing: set[asyncio.Task[None]] = set()  # emit_soon's, held till done
        self._busy = busy
        self._max_hold = max_hold
        self._quiet = quiet
        self._held: deque[tuple[float, Callable[[], Awaitable[None]]]] = deque()
        self._releasing: asyncio.Task[None] | None = None

    def emit_soon(
        self,
        regarding: Any,
        reason: str,
        note: str,
        *,
        action: str,
        type_: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """`emit` without waiting for it: a reconcile's next write need not wait
        for the Event of its last one (nor, with `busy`, for the next reconciles)."""
        write = functools.partial(self.emit, regarding, reason, note, action=action, type_=type_)
        if self._busy is None:
            task = asyncio.create_task(write())
            self._writing.add(task)
            task.add_done_callback(self._writing.discard)
            return
        self._held.append((self._clock(), write))
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.create_task(self._release_held(self._busy))

    async def _release_held(self, busy: Callable[[], bool]) -> None:
        idle_since: float | None = None
        while self._held:
            now = self._clock()
            if busy():
                idle_since = None
            elif idle_since is None:
                idle_since = now
            quiet = idle_since is not None and now - idle_since >= self._quiet
            if not quiet and now - self._held[0][0] < self._max_hold:
                await asyncio.sleep(0.05)
                continue
            batch = [self._held.popleft()[1] for _ in range(min(HELD_WRITES, len(self._held)))]
            await asyncio.gather(*(write() for write in batch))

    async def emit(
        self,
        regarding: Any,
        reason: str,
        note: str,
        *,
        action: str,
        type_: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """Record an Event about `regarding` (a lightkube object or a dict). Never raises."""
        obj: dict[str, Any] = regarding if isinstance(regarding, dict) else _reference(regarding)
        meta: dict[str, Any] = obj.get("metadata", {})
        namespace: str = meta.get("namespace") or "default"
        kind = obj.get("kind") or type(regarding).__name__
        target = (kind, namespace, meta.get("name"), meta.get("uid"))
        note = note[:1024]
        series: _Series = self._series.touch((target, reason, action, type_, note), _Series)
        async with series.lock:
            now = self._clock()
            if now - series.last_seen > self._series_window:
                series.name, series.count = None, 0  # too old: a new Event
            series.count += 1
            series.last_seen = now
            if not self._take_token(target, now):
                self.stats.skipped += 1
                log.debug("event %s on %s/%s held back", reason, namespace, meta.get("name"))
                return
            try:
                if series.name is not None and await self._update(namespace, series):
                    self.stats.updated += 1
                    return
                series.name = await self._create(
                    obj, meta, namespace, kind, reason, note, action, type_, series.count
                )
                self.stats.created += 1
            except Exception:
                self.stats.failed += 1
                log.warning(
                    "could not record event %s on %s/%s", reason, namespace, meta.get("name")
                )

    def _take_token(self, target: tuple[Any, ...], now: float) -> bool:
        bucket: _Bucket = self._buckets.touch(target, lambda: _Bucket(self._burst, now))
        refill = (now - bucket.updated) / self._refill_every if self._refill_every else self._burst
        bucket.tokens = min(float(self._burst), bucket.tokens + refill)
        bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    async def _update(self, namespace: str, series: _Series) -> bool:
        """Write the series' count on its Event; False if that Event is gone."""
        assert series.name is not None
        # The apiserver wants a series to count at least 2 (a first Event has none).
        patch = {
            "series": {
                "count": max(2, series.count),
                "lastObservedTime": _now().isoformat(timespec="microseconds"),
            }
        }
        try:
            await self._client.patch(
                Event, series.name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )
        except ApiError as error:
            if error.status.code == 404:
                return False
            raise
        return True

    async def _create(
        self,
        obj: dict[str, Any],
        meta: dict[str, Any],
        namespace: str,
        kind: str,
        reason: str,
        note: str,
        action: str,
        type_: str,
        count: int,
    ) -> str:
        now = _now()
        name = f"{meta.get('name')}.{secrets.token_hex(8)}"
        event = Event(
            # As client-go names them: `<object>.<unique hex>`. (A generateName
            # ending in "." is refused: the prefix itself must be a valid name.)
            metadata=ObjectMeta(name=name, namespace=namespace),
            eventTime=now,
            reportingController=self._controller,
            reportingInstance=self._instance[:128],
            action=action,
            reason=reason,
            note=note,
            type=type_,
            # Occurrences the spam filter held back before this first write.
            series=EventSeries(count=count, lastObservedTime=now) if count > 1 else None,
            regarding=ObjectReference(
                apiVersion=obj.get("apiVersion"),
                kind=kind,
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                resourceVersion=meta.get("resourceVersion"),
            ),
        )
        await self._client.create(event)
        return name


def _reference(regarding: Any) -> dict[str, Any]:
    """What an Event needs of a lightkube object. Cheaper than `to_dict()` of the
    whole object, which cost the scheduler more than the Event's write in bursts."""
    meta = regarding.metadata
    return {
        "apiVersion": getattr(regarding, "apiVersion", None),
        "kind": getattr(regarding, "kind", None),
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
            "resourceVersion": meta.resourceVersion,
        },
    }


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
