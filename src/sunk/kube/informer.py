"""An informer: a local cache of one kind of object, kept current by list and watch.

Semantics follow client-go's reflector:

- start with a paginated list; its resourceVersion is where the watch begins;
- watch with bookmarks, so an idle watch still advances the resourceVersion
  and a reconnect does not replay history;
- a dropped connection resumes the watch from the last resourceVersion seen;
- `410 Gone` (an ERROR event in the stream, or an HTTP 410) means that
  version was compacted away: list again, and tell handlers about every
  difference between the old cache and the new list, so nothing that
  happened in the gap is missed.

Handlers run in the informer's task, in event order, and must be quick
(typically: put a key on a work queue).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.core import decoders
from lightkube.core.generic_client import WatchDriver
from lightkube.core.resource import NamespacedResource

log = logging.getLogger(__name__)

R = TypeVar("R")
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Event(Generic[R]):
    type: EventType
    key: str
    old: R | None
    new: R | None

    @property
    def obj(self) -> R:
        """The object as it is now (for DELETED, as it was last)."""
        found = self.new if self.new is not None else self.old
        assert found is not None
        return found


Handler = Callable[[Event[R]], None]


class ResourceExpired(Exception):
    """The watch's resourceVersion was compacted away: list again."""


def key_of(obj: Any) -> str:
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else str(meta.name)


def _rv(obj: Any) -> str:
    return str(obj.metadata.resourceVersion)


class Informer(Generic[R]):
    def __init__(
        self,
        client: AsyncClient,
        resource: type[R],
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        read_timeout: float = 90.0,
        retry_delay: float = 1.0,
    ) -> None:
        self._client = client
        self._resource = resource
        # No namespace means every namespace, as with kubectl's -A; lightkube's
        # None would be the client's default namespace instead.
        namespaced = issubclass(resource, NamespacedResource)
        self._namespace = ALL_NS if namespace is None and namespaced else namespace
        self._labels = labels
        self._fields = fields
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._read_timeout = read_timeout
        self._retry_delay = retry_delay
        self._store: dict[str, R] = {}
        # Indexes, as client-go's Indexer: name → value → keys of the objects
        # whose index function gives that value.
        self._index_funcs: dict[str, Callable[[R], Iterable[str]]] = {}
        self._indexes: dict[str, dict[str, set[str]]] = {}
        self._handlers: list[Handler[R]] = []
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0  # how many lists it took, for tests and metrics

    # -- the cache

    def get(self, key: str) -> R | None:
        return self._store.get(key)

    def items(self) -> list[R]:
        return list(self._store.values())

    def list_keys(self) -> list[str]:
        return list(self._store)

    def subscribe(self, handler: Handler[R]) -> None:
        self._handlers.append(handler)

    def add_index(self, name: str, values: Callable[[R], Iterable[str]]) -> None:
        """Make objects findable by `by_index(name, value)` for each value that
        `values(obj)` gives (an empty value is not indexed). Kept current before
        any handler hears of a change."""
        self._index_funcs[name] = values
        self._indexes[name] = {}
        for key, obj in self._store.items():
            self._index(name, key, None, obj)

    def by_index(self, name: str, value: str) -> list[R]:
        return [self._store[key] for key in self._indexes[name].get(value, ())]

    def _index(self, name: str, key: str, old: R | None, new: R | None) -> None:
        values = self._indexes[name]
        before = set(self._index_funcs[name](old)) if old is not None else set()
        after = set(self._index_funcs[name](new)) if new is not None else set()
        for value in before - after:
            keys = values.get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del values[value]
        for value in after - before:
            if value:
                values.setdefault(value, set()).add(key)

    def _reindex(self, key: str, old: R | None, new: R | None) -> None:
        for name in self._index_funcs:
            self._index(name, key, old, new)

    # -- the loop

    async def run(self) -> None:
        """List, then watch, forever; cancel the task to stop."""
        needs_list = True
        failures = 0
        while True:
            try:
                if needs_list:
                    await self._relist()
                    needs_list = False
                await self._watch()
                failures = 0
            except ResourceExpired:
                log.info("%s: resourceVersion expired, listing again", self._name)
                needs_list = True
            except httpx2.ReadTimeout:
                # Nothing came, not even a bookmark: the connection may be dead
                # without either end knowing. Watch again from where it was.
                log.info("%s: watch silent for %.0fs, again", self._name, self._read_timeout)
            except (httpx2.HTTPError, ApiError) as error:
                # The apiserver is away or refuses for now (5xx, 429): keep the
                # cache as it is and try again, backing off up to 30 s.
                failures += 1
                delay = min(self._retry_delay * 2 ** (failures - 1), 30.0)
                log.warning("%s: %s, retrying in %.0fs", self._name, error, delay)
                await asyncio.sleep(delay)

    @property
    def _name(self) -> str:
        return getattr(self._resource, "__name__", str(self._resource))

    async def _relist(self) -> None:
        resource: Any = self._resource  # lightkube types list() per resource scope
        listing = self._client.list(
            resource,
            namespace=self._namespace,
            labels=self._labels,
            fields=self._fields,
            chunk_size=self._page_size,
        )
        fresh: dict[str, R] = {}
        async for obj in listing:
            fresh[key_of(obj)] = obj
        self.resource_version = listing.resourceVersion
        self.relists += 1
        old = self._store
        self._store = fresh
        for name in self._index_funcs:
            self._indexes[name] = {}
            for key, obj in fresh.items():
                self._index(name, key, None, obj)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit(Event("ADDED", key, None, obj))
            elif _rv(before) != _rv(obj):
                self._emit(Event("MODIFIED", key, before, obj))
        for key, obj in old.items():
            if key not in fresh:
                self._emit(Event("DELETED", key, obj, None))
        self.synced.set()

    async def _watch(self) -> None:
        generic = self._client._client  # lightkube's request builder; its watch() has no bookmarks
        request = generic.prepare_request(
            "list",
            res=self._resource,  # type: ignore[arg-type]
            namespace=self._namespace,
            watch=True,
            params={
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": self._watch_timeout,
                "labelSelector": _selector(self._labels, fields=False),
                "fieldSelector": _selector(self._fields, fields=True),
            },
        )
        # One watch request, read line by line. lightkube's own watch() decodes
        # every event as the resource, and a BOOKMARK (an empty object with only
        # a resourceVersion) fails that for Pods (`spec.containers: null`):
        # bookmarks are taken apart here instead. The caller watches again when
        # the request ends (timeoutSeconds).
        driver = WatchDriver(request, generic._client.build_request)
        # lightkube's watch timeout has no read limit; the apiserver sends a
        # bookmark at least every minute, so a longer silence means a dead path.
        timeout = httpx2.Timeout(generic._watch_timeout.connect, read=self._read_timeout)
        http_request = driver.get_request(timeout=timeout)  # type: ignore[no-untyped-call]
        reply = await generic.send(http_request, stream=True)  # type: ignore[no-untyped-call]
        try:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                event = decoders.decode_watch_event(line)
                if event.type == "BOOKMARK":
                    self.resource_version = _bookmark_version(event.object)
                    continue
                kind, obj = driver.process_one_line(line)  # type: ignore[no-untyped-call]
                self._apply(kind, obj)
        except ApiError as error:
            if error.status.code == 410:
                raise ResourceExpired from error
            raise
        finally:
            await reply.aclose()

    def _apply(self, kind: str, obj: Any) -> None:
        self.resource_version = _rv(obj)
        if kind == "BOOKMARK":
            return
        key = key_of(obj)
        old = self._store.get(key)
        if kind == "DELETED":
            self._store.pop(key, None)
            self._reindex(key, old, None)
            self._emit(Event("DELETED", key, old, None))
        elif kind in ("ADDED", "MODIFIED"):
            self._store[key] = obj
            self._reindex(key, old, obj)
            self._emit(Event("ADDED" if old is None else "MODIFIED", key, old, obj))

    def _emit(self, event: Event[R]) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                # One bad handler must not stop the cache or the other handlers.
                log.exception("%s: handler failed on %s %s", self._name, event.type, event.key)


def _selector(spec: dict[str, Any] | None, *, fields: bool) -> str | None:
    if not spec:
        return None
    from lightkube.core.selector import build_selector

    selector: str = build_selector(spec, for_fields=fields)
    return selector


class _BookmarkMeta(msgspec.Struct):
    resourceVersion: str = ""


class _Bookmark(msgspec.Struct):
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


def _bookmark_version(raw: msgspec.Raw) -> str:
    return msgspec.json.decode(raw, type=_Bookmark).metadata.resourceVersion
