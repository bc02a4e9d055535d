"""A cached, evented view of Slurm's nodes and jobs for controllers.

One poll loop per view keeps every node and job in memory:

- Incremental reads: each poll sends the previous reply's `last_update` as
  `update_time`; an unchanged cluster answers 304 (nodes) or an empty
  "no change" reply (jobs), a few hundred bytes. Slurm's incremental read is
  all-or-nothing, so any change brings the full list, which is diffed
  against the cache into added/changed/removed events.
- Defects survived: 24.11 answers 500 "Unable to query partitions" to an
  incremental node read after a drain, and v0.0.40/41 reject `update_time`
  outright. Any such failure falls back to a full read at once; when they
  keep failing for seconds, incremental reads pause for a while.
- A busy slurmctld: slurmrestd gives up on its own RPC to slurmctld after
  MessageTimeout and answers 500 with Slurm's errno -1 ("Unable to query
  partitions" even for a full read; seen while 100-200 dynamic nodes
  registered on two cores). A full or one-node read that fails with a 5xx is
  tried again a few times with short back-off before the view is declared
  stale; a one-node read that still fails raises to its caller but does not
  mark the whole view stale (the poll loop decides that).
- Stale: when slurmrestd or slurmctld cannot be reached, or no poll has
  succeeded for `stale_after` seconds, the view is STALE and reading it
  raises `SlurmStaleError` (controllers must not act on old data). The loop
  keeps trying with back-off; the first success re-reads everything, emits
  the differences and a FRESH state event. No new client is needed.

Over 500 lines on purpose: the poll loop, its cache and its fallbacks for
Slurm's defects are one state machine, easier to read whole than split.
- `refresh()` / `refresh_node()` force a read now, before a dangerous action.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from sunk.slurm.client import Listing, SlurmClient
from sunk.slurm.errors import SlurmApiError, SlurmAuthError, SlurmError, SlurmStaleError
from sunk.slurm.models import Job, Node

log = logging.getLogger("sunk.slurm.view")

K = TypeVar("K", str, int)
V = TypeVar("V", Node, Job)

# When incremental reads have kept failing for this long, stop trying them for
# `_INCREMENTAL_PAUSE` seconds: a server whose update_time is broken then
# costs one full read per poll instead of a failure plus a full read. The 24.11
# defect alone fails them for about a second after each change (until
# `update_time` passes it), which must not trigger the pause.
_FAILING_BEFORE_PAUSE = 5.0
_INCREMENTAL_PAUSE = 30.0
# A state probe that finds more jobs changed than this reads the list instead:
# one list read then costs less than as many one-job reads.
_PROBE_READS = 32

# A read that slurmctld was too busy to answer in time: tries, and the pause
# before the second (doubling after).
_READ_ATTEMPTS = 3
_READ_BACKOFF = 0.5

T = TypeVar("T")


def _slurmctld_busy(exc: SlurmError) -> bool:
    """slurmrestd answered 5xx for its own RPC to slurmctld: worth a retry, not "stale" yet."""
    return (
        isinstance(exc, SlurmApiError) and not isinstance(exc, SlurmAuthError) and exc.status >= 500
    )


async def _retrying(read: Callable[[], Awaitable[T]], stats: ViewStats) -> T:
    attempt = 0
    while True:
        try:
            return await read()
        except SlurmError as exc:
            attempt += 1
            # Transient errors the client has already retried on its own.
            retried = isinstance(exc, SlurmApiError) and exc.transient
            if attempt >= _READ_ATTEMPTS or not _slurmctld_busy(exc) or retried:
                raise
            stats.retries += 1
            log.info("Slurm read failed (%s); trying again", exc)
            await asyncio.sleep(_READ_BACKOFF * 2 ** (attempt - 1))


class ViewState(enum.Enum):
    STARTING = "starting"  # no successful read yet
    FRESH = "fresh"
    STALE = "stale"
    CLOSED = "closed"


class Change(enum.Enum):
    ADDED = "added"
    CHANGED = "changed"
    REMOVED = "removed"


@dataclass(frozen=True)
class NodeEvent:
    change: Change
    name: str
    old: Node | None
    new: Node | None


@dataclass(frozen=True)
class JobEvent:
    change: Change
    job_id: int
    old: Job | None
    new: Job | None


@dataclass(frozen=True)
class StateEvent:
    """The view became STALE (with the reason) or FRESH again."""

    state: ViewState
    reason: str = ""


@dataclass(frozen=True)
class Resync:
    """The subscriber fell too far behind and events were dropped: re-read the view."""


Event = NodeEvent | JobEvent | StateEvent | Resync


def diff(old: Mapping[K, V], new: Mapping[K, V]) -> list[tuple[Change, K, V | None, V | None]]:
    """Added, changed and removed entries between two snapshots, in `new`'s order."""
    changes: list[tuple[Change, K, V | None, V | None]] = []
    for key, value in new.items():
        before = old.get(key)
        if before is None:
            changes.append((Change.ADDED, key, None, value))
        elif before != value:
            changes.append((Change.CHANGED, key, before, value))
    changes.extend(
        (Change.REMOVED, key, value, None) for key, value in old.items() if key not in new
    )
    return changes


def _replace(
    items: dict[K, V], key: K, new: V | None
) -> tuple[Change, K, V | None, V | None] | None:
    """Put `new` (None: nothing) under `key`; the change it made, if any."""
    old = items.pop(key, None)
    if new is not None:
        items[key] = new
    if old == new:
        return None
    if old is None:
        return (Change.ADDED, key, old, new)
    return (Change.REMOVED if new is None else Change.CHANGED, key, old, new)


class Subscription:
    """One subscriber's events; iterate with `async for event in subscription`.

    Bounded: a subscriber that stops reading loses events, and then receives
    one `Resync` telling it to re-read the view, instead of the view holding
    an unbounded backlog for it.
    """

    def __init__(self, view: SlurmView, maxsize: int) -> None:
        self._view = view
        # None marks the end: a subscriber blocked in get() wakes up when closed.
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize)
        self._closed = False
        self._resync_pending = False
        self.dropped = 0

    def _put(self, event: Event) -> None:
        if self._closed:
            return
        if self._resync_pending:  # it will re-read everything: later events add nothing
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += self._queue.qsize() + 1
            self._drain()
            self._queue.put_nowait(Resync())
            self._resync_pending = True

    def _drain(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()

    def _taken(self, event: Event | None) -> Event:
        if event is None:
            self._queue.put_nowait(None)  # keep the end visible to the next get()
            raise StopAsyncIteration
        if isinstance(event, Resync):
            self._resync_pending = False
        return event

    async def get(self) -> Event:
        """The next event; raises StopAsyncIteration once the subscription is closed."""
        return self._taken(await self._queue.get())

    def get_nowait(self) -> Event | None:
        """The next event if one is queued, else None (also once closed)."""
        try:
            return self._taken(self._queue.get_nowait())
        except (asyncio.QueueEmpty, StopAsyncIteration):
            return None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        return await self.get()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drain()
        self._queue.put_nowait(None)
        self._view._unsubscribe(self)


@dataclass
class ViewStats:
    polls: int = 0
    unchanged: int = 0  # incremental reads that said "nothing changed"
    changed: int = 0  # incremental reads that brought a (full) new list
    full_reads: int = 0
    fallbacks: int = 0  # incremental reads that failed and fell back to a full read
    failures: int = 0  # polls that failed entirely
    retries: int = 0  # reads tried again because slurmctld answered too late
    probes: int = 0  # job polls answered by the state probe and one-job reads
    probe_reads: int = 0  # one-job reads those probes made
    events: int = 0


@dataclass
class _Table(Generic[K, V]):
    """One cached resource: its items and the `since` for the next incremental read."""

    items: dict[K, V] = field(default_factory=dict)
    since: int | None = None
    failing_since: float | None = None  # when the current run of fallbacks began
    incremental_paused_until: float = 0.0


class SlurmView:
    """Nodes and jobs of one Slurm cluster, kept current by polling `client`."""

    def __init__(
        self,
        client: SlurmClient,
        *,
        interval: float = 1.0,
        watch_jobs: bool = True,
        watch_nodes: bool = True,
        stale_after: float | None = None,
        poll_timeout: float = 10.0,
        max_backoff: float = 5.0,
        read_share: float | None = None,
        full_every: float | None = 60.0,
        job_probe: bool = False,
        detail_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.interval = interval
        self.watch_jobs = watch_jobs
        # A jobs-only view (the scheduler's) never reads nodes: cheaper, and out of
        # reach of 24.11's "Unable to query partitions" on node reads.
        self.watch_nodes = watch_nodes
        # Several missed polls, and at least a slow full read, before "stale".
        self.stale_after = stale_after if stale_after is not None else max(5.0, 3 * interval)
        self.poll_timeout = poll_timeout
        self.max_backoff = max_backoff
        # While things change, every poll is a full read, whose cost grows with
        # the cluster: with `read_share`, polls that read lists are spaced so
        # that reading takes at most this share of the time (slurmrestd's JSON
        # rendering is the cost, and it competes with the requests that act).
        self.read_share = read_share
        # Incremental reads see only what moves a table's update time, and
        # slurmctld does not always move it: 26.05 takes a deleted dynamic node
        # out of its table after the delete's own update, so "no change" hides
        # the removal for as long as nothing else changes. A full read at
        # least this often puts the cache right, whatever was missed.
        self.full_every = full_every
        self._last_full: float | None = None
        # With `job_probe`, most job polls read only every job's state (`GET
        # /jobs/state/`, tens of bytes a job) and then each job whose state moved;
        # the list itself is read at least every `detail_every` seconds (and when
        # many jobs moved), for what a state does not show: a preemption's
        # preempt_time, a pending job's reason.
        if job_probe and watch_nodes:
            raise ValueError("a job state probe is for a jobs-only view (watch_nodes=False)")
        self.job_probe = job_probe
        self.detail_every = detail_every
        self._last_job_list: float | None = None
        self._lists_not_before = 0.0  # `read_share`'s spacing, when probes fill the gaps
        # The last probe's states: a job moved when its state differs from these
        # (or, first, from the list's), so a job whose one-job read words its
        # state otherwise than the probe is read once, not at every poll.
        self._probed: dict[int, tuple[str, ...]] = {}
        # Jobs `refresh_job` is reading (how many reads of each): a probe that
        # finds one moved leaves it to that read, which puts it in the cache.
        self._reading: Counter[int] = Counter()
        self._clock = clock
        self._nodes: _Table[str, Node] = _Table()
        # Node list reads are numbered as they begin; `_nodes_read` is the number
        # of the last one that succeeded (`nodes_read_since`).
        self._node_reads_begun = 0
        self._nodes_read = 0
        self._jobs: _Table[int, Job] = _Table()
        self._state = ViewState.STARTING
        self._stale_reason = "not read yet"
        self._last_success: float | None = None
        self._subscribers: list[Subscription] = []
        self._sync_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.stats = ViewStats()

    def __repr__(self) -> str:
        return f"SlurmView({self.client!r}, state={self._state.value})"

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start polling; returns after the first attempt, fresh or stale."""
        if self._task is not None:
            return
        first = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(first), name="slurm-view")
        try:
            await first
        except BaseException:
            # Cancelled while starting: the poll task must not outlive the caller.
            await self.stop()
            raise

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._set_state(ViewState.CLOSED, "stopped")
        for subscriber in list(self._subscribers):
            subscriber.close()

    async def __aenter__(self) -> SlurmView:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- state ----------------------------------------------------------------------

    @property
    def state(self) -> ViewState:
        """FRESH only while the last successful poll is recent enough."""
        if self._state is ViewState.FRESH and self.age > self.stale_after:
            return ViewState.STALE
        return self._state

    @property
    def fresh(self) -> bool:
        return self.state is ViewState.FRESH

    @property
    def age(self) -> float:
        """Seconds since the last successful poll (inf before the first)."""
        if self._last_success is None:
            return float("inf")
        return self._clock() - self._last_success

    def _require_fresh(self, allow_stale: bool) -> None:
        if allow_stale or self.fresh:
            return
        reason = self._stale_reason if self._state is not ViewState.FRESH else "no recent poll"
        raise SlurmStaleError(
            f"Slurm view is {self.state.value} (last success {self.age:.1f}s ago: {reason})"
        )

    async def wait_fresh(self) -> None:
        """Wait until the view is fresh (bound it with `asyncio.timeout`)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.fresh)

    # -- reading --------------------------------------------------------------------

    def nodes(self, *, allow_stale: bool = False) -> Mapping[str, Node]:
        """All nodes by name (read-only). Raises SlurmStaleError unless fresh."""
        self._require_fresh(allow_stale)
        return MappingProxyType(self._nodes.items)

    def node(self, name: str, *, allow_stale: bool = False) -> Node | None:
        self._require_fresh(allow_stale)
        return self._nodes.items.get(name)

    def node_read_mark(self) -> int:
        """A mark for this moment among the view's node reads (`nodes_read_since`)."""
        return self._node_reads_begun

    def nodes_read_since(self, mark: int) -> bool:
        """Has a node list read begun after `mark` was taken succeeded? Then what
        Slurm held at the mark shows in the cache, or a later change does."""
        return self._nodes_read > mark

    def jobs(self, *, allow_stale: bool = False) -> Mapping[int, Job]:
        self._require_fresh(allow_stale)
        return MappingProxyType(self._jobs.items)

    def job(self, job_id: int, *, allow_stale: bool = False) -> Job | None:
        self._require_fresh(allow_stale)
        return self._jobs.items.get(job_id)

    # -- events -----------------------------------------------------------------------

    def subscribe(self, *, replay: bool = True, maxsize: int = 100_000) -> Subscription:
        """A new event stream; with `replay`, it starts with ADDED for what is cached."""
        subscription = Subscription(self, maxsize)
        if replay:
            for name, node in self._nodes.items.items():
                subscription._put(NodeEvent(Change.ADDED, name, None, node))
            for job_id, job in self._jobs.items.items():
                subscription._put(JobEvent(Change.ADDED, job_id, None, job))
            if self._state is not ViewState.STARTING:
                subscription._put(StateEvent(self._state, self._stale_reason))
        self._subscribers.append(subscription)
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(subscription)

    def _emit(self, events: Iterable[Event]) -> None:
        for event in events:
            self.stats.events += 1
            for subscriber in self._subscribers:
                subscriber._put(event)

    def _set_state(self, state: ViewState, reason: str) -> None:
        changed = state is not self._state
        self._state = state
        self._stale_reason = reason
        if changed:
            level = logging.WARNING if state is ViewState.STALE else logging.INFO
            log.log(level, "Slurm view %s%s", state.value, f": {reason}" if reason else "")
            self._emit([StateEvent(state, reason)])

    # -- forced reads ---------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read everything now (not incrementally); raises if Slurm cannot be read."""
        await self._sync(full=True)

    async def refresh_node(self, name: str) -> Node | None:
        """Read one node now, update the cache (and emit) and return it; None if gone."""
        try:
            node = await _retrying(lambda: self.client.node(name), self.stats)
        except SlurmError as exc:
            if not _slurmctld_busy(exc):
                self._fail(exc)
            raise
        async with self._sync_lock:
            if (change := _replace(self._nodes.items, name, node)) is not None:
                self._emit([NodeEvent(*change)])
        return node

    async def refresh_job(self, job_id: int) -> Job | None:
        """Read one job now, update the cache (and emit) and return it; None if gone.

        A poll runs under the lock taken here, and reads after taking it: it
        sees every job this put in the cache."""
        self._reading[job_id] += 1
        try:
            job = await self.client.job(job_id)
        finally:
            self._reading[job_id] -= 1
            if not self._reading[job_id]:
                del self._reading[job_id]
        async with self._sync_lock:
            if (change := _replace(self._jobs.items, job_id, job)) is not None:
                self._emit([JobEvent(*change)])
        return job

    def poll_now(self) -> None:
        """Cut the current wait short (e.g. right after sunk changed something)."""
        self._wake.set()

    # -- the poll loop -----------------------------------------------------------------------

    async def _run(self, first: asyncio.Future[None]) -> None:
        failures = 0
        while True:
            started = self._clock()
            lists_read = self.stats.changed + self.stats.full_reads
            # Cleared before the read, not after: a poll_now() during it still counts.
            self._wake.clear()
            try:
                await self._sync(full=False)
                failures = 0
            except SlurmError:
                failures += 1
            except Exception:  # a bug must not silently stop the loop for good
                log.exception("Slurm view poll failed unexpectedly")
                self._fail_state("internal error, see log")
                failures += 1
            if not first.done():
                first.set_result(None)
            took = self._clock() - started
            if failures:
                delay = min(self.max_backoff, self.interval * 2 ** (failures - 1))
            else:
                delay = max(0.0, self.interval - took)
                if self.read_share and self.stats.changed + self.stats.full_reads > lists_read:
                    spacing = took / self.read_share - took
                    if self.job_probe:  # the next lists wait; the probes go on
                        self._lists_not_before = self._clock() + spacing
                    else:
                        delay = max(delay, spacing)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def _full_due(self) -> bool:
        if self._last_full is None:  # the first read, or the first after a failure
            return True
        return self.full_every is not None and self._clock() - self._last_full >= self.full_every

    async def _sync(self, *, full: bool) -> None:
        async with self._sync_lock:
            full = full or self._full_due()
            self.stats.polls += 1
            try:
                if self._state is not ViewState.FRESH and self._state is not ViewState.STARTING:
                    # Recovering: slurmrestd may have been upgraded while away.
                    await self.client.negotiate(force=True)
                events = await self._sync_nodes(full) if self.watch_nodes else []
                if self.watch_jobs:
                    events += await self._sync_jobs(full)
            except SlurmError as exc:
                self._fail(exc)
                raise
            self._last_success = self._clock()
            if full:
                self._last_full = self._last_success
            self._emit(events)
            self._set_state(ViewState.FRESH, "")
        async with self._changed:
            self._changed.notify_all()

    def _fail(self, exc: SlurmError) -> None:
        self.stats.failures += 1
        self._last_full = None  # whatever happened meanwhile, re-read all on recovery
        self._fail_state(str(exc))

    def _fail_state(self, reason: str) -> None:
        self._set_state(ViewState.STALE, reason)

    async def _read_nodes(self, since: int | None) -> Listing[Node] | None:
        return await self.client.nodes(since, read_timeout=self.poll_timeout)

    async def _read_jobs(self, since: int | None) -> Listing[Job] | None:
        return await self.client.jobs(since, read_timeout=self.poll_timeout)

    async def _sync_nodes(self, full: bool) -> list[Event]:
        self._node_reads_begun += 1
        begun = self._node_reads_begun
        listing = await self._read(self._nodes, self._read_nodes, full)
        self._nodes_read = begun  # "unchanged" (None) is a read too
        if listing is None:
            return []
        new = {node.name: node for node in listing.items}
        events: list[Event] = [NodeEvent(*change) for change in diff(self._nodes.items, new)]
        self._nodes.items = new
        self._nodes.since = listing.last_update or None
        return events

    async def _sync_jobs(self, full: bool) -> list[Event]:
        if not full and self._probe_due():
            probed = await self._probe_jobs()
            if probed is not None:
                return probed
        listing = await self._read(self._jobs, self._read_jobs, full)
        self._last_job_list = self._clock()
        self._probed = {}
        if listing is None:
            return []
        new = {job.job_id: job for job in listing.items}
        events: list[Event] = [JobEvent(*change) for change in diff(self._jobs.items, new)]
        self._jobs.items = new
        self._jobs.since = listing.last_update or None
        return events

    def _probe_due(self) -> bool:
        if not self.job_probe or self._jobs.since is None or self._last_job_list is None:
            return False
        now = self._clock()
        return now - self._last_job_list < self.detail_every or now < self._lists_not_before

    async def _probe_jobs(self) -> list[Event] | None:
        """Job events from every job's state and a read of each job that moved;
        None when the list must be read instead."""
        try:
            states = await _retrying(
                lambda: self.client.job_states(read_timeout=self.poll_timeout), self.stats
            )
        except SlurmApiError as exc:
            if isinstance(exc, SlurmAuthError) or exc.transient or exc.status >= 500:
                raise
            log.info("no job state probe (%s): reading job lists from now on", exc)
            self.job_probe = False
            return None
        if states is None:  # an array or het job's rows: the list says which job is which
            return None
        cached = self._jobs.items
        moved = [
            i
            for i, state in states.items()
            if (j := cached.get(i)) is None or state != self._probed.get(i, j.job_state)
        ]
        # A job being read by `refresh_job` (the scheduler's own, just allocated)
        # is not read twice. Its probed state is not kept: the next probe compares
        # with what that read put in the cache, and reads the job if it moved since.
        left = {i for i in moved if i in self._reading}
        moved = [i for i in moved if i not in left]
        if len(moved) > _PROBE_READS:
            return None
        read = await asyncio.gather(*(self.client.job(i) for i in moved))
        self.stats.probes += 1
        self.stats.probe_reads += len(moved)
        # Only what moved or vanished is compared: not every cached job at every probe.
        gone = [i for i in cached if i not in states]
        changes = [_replace(cached, i, job) for i, job in zip(moved, read, strict=True)]
        changes.extend(_replace(cached, i, None) for i in gone)
        self._probed = {i: state for i, state in states.items() if i not in left}
        return [JobEvent(*change) for change in changes if change is not None]

    async def _read(
        self,
        table: _Table[Any, V],
        read: Callable[[int | None], Awaitable[Listing[V] | None]],
        full: bool,
    ) -> Listing[V] | None:
        """The full list, or None when an incremental read says nothing changed."""
        incremental = (
            not full and table.since is not None and self._clock() >= table.incremental_paused_until
        )
        if not incremental:
            return await self._full(read)
        try:
            listing = await read(table.since)
        except SlurmApiError as exc:
            if isinstance(exc, SlurmAuthError) or exc.transient:
                raise
            # 24.11's "Unable to query partitions", or an update_time the
            # version cannot parse: a full read still works.
            self.stats.fallbacks += 1
            now = self._clock()
            if table.failing_since is None:
                table.failing_since = now
            elif now - table.failing_since >= _FAILING_BEFORE_PAUSE:
                table.incremental_paused_until = now + _INCREMENTAL_PAUSE
                table.failing_since = None
            log.debug("incremental read failed (%s); reading everything", exc)
            return await self._full(read)
        table.failing_since = None
        if listing is None:
            self.stats.unchanged += 1
        else:
            self.stats.changed += 1
        return listing

    async def _full(self, read: Callable[[int | None], Awaitable[Listing[V] | None]]) -> Listing[V]:
        self.stats.full_reads += 1
        listing = await _retrying(lambda: read(None), self.stats)
        assert listing is not None  # without `since` there is always a list
        return listing
