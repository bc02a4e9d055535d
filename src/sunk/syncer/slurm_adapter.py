"""SyncerSlurm over sunk's Slurm port: the cached view for deciding, a guard
read and batched, rate-limited writes for acting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from sunk.slurm.channel import SlurmChannel
from sunk.slurm.client import SlurmClient
from sunk.slurm.errors import SlurmApiError, SlurmAuthError, SlurmError, SlurmUnavailableError
from sunk.slurm.models import Node, NodeUpdate
from sunk.slurm.view import NodeEvent, Resync, SlurmView, StateEvent, ViewState
from sunk.syncer.batch import BatchWriter
from sunk.syncer.decide import SlurmState
from sunk.syncer.ratelimit import TokenBucket, WriteLimits
from sunk.syncer.slurm_port import ALL_NODES

# The read right before a write waits this long, then the view's copy is used.
GUARD_READ_TIMEOUT = 0.5
# Written nodes are read back into the view once no write has gone out for
# READ_BACK_AFTER (at most READ_BACK_WAIT), a few at a time: read back at once,
# they held the client's connections ahead of the same mass change's guard
# reads and writes (measured: a hundred resumes in 15-29 requests, not 6-7).
# More than READ_BACK_MAX nodes: one poll reads them all instead.
READ_BACK_AFTER = 0.05
READ_BACK_WAIT = 1.0
READ_BACK_AT_ONCE = 2
READ_BACK_MAX = 256
_PAUSE_STEP = 0.01


def slurm_state(node: Node) -> SlurmState:
    return SlurmState(
        name=node.name,
        base_state=node.base_state,
        drained=node.draining,
        reason=node.reason,
        responding=node.responding,
        busy=not node.idle_or_down,
        comment=node.comment,
        reason_since=node.reason_changed_at,
    )


class SlurmPortForSyncer(SlurmChannel):
    def __init__(
        self, client: SlurmClient, view: SlurmView, *, limits: WriteLimits | None = None
    ) -> None:
        """`limits`: the Slurm half bounds the writes here (the Kubernetes half is the syncer's)."""
        super().__init__(client, view)
        limits = limits or WriteLimits()
        self._writes = TokenBucket(limits.slurm_rate, limits.slurm_burst)
        self._writer = BatchWriter(self._update_nodes, self._writes.acquire)
        self._write_callbacks: list[Callable[[int], None]] = []
        self._written: set[str] = set()
        self._reading_back: asyncio.Task[None] | None = None
        self._read_back_gate = asyncio.Semaphore(READ_BACK_AT_ONCE)

    def node(self, name: str) -> SlurmState | None:
        node = self._view.node(name)
        return None if node is None else slurm_state(node)

    async def read_node(self, name: str) -> SlurmState | None:
        """Not through the view's refresh_node: a failed read there marks the whole
        view stale, and slurmrestd 24.11 sometimes fails single-node reads after
        a change ("Unable to query partitions"), or hangs on them until its
        MessageTimeout. Then the view's copy (at most one poll old) has to do,
        rather than holding the write back; an unreachable Slurm still raises.
        """
        try:
            async with asyncio.timeout(GUARD_READ_TIMEOUT):
                node = await self._client.node(name)
        except (SlurmAuthError, SlurmUnavailableError):
            raise
        except (SlurmApiError, TimeoutError):
            return self.node(name)
        return None if node is None else slurm_state(node)

    async def show_written(self, name: str) -> None:
        """At thousands of nodes a poll after a change reads every node (about a
        second of slurmrestd's CPU); one node's read takes a few ms."""
        self._written.add(name)
        if self._reading_back is None or self._reading_back.done():
            self._reading_back = asyncio.create_task(self._read_back())

    async def _read_back(self) -> None:
        while self._written:
            for _ in range(round(READ_BACK_WAIT / _PAUSE_STEP)):
                if self._writer.quiet_for() >= READ_BACK_AFTER:
                    break
                await asyncio.sleep(_PAUSE_STEP)
            names = sorted(self._written)
            self._written.clear()
            if len(names) > READ_BACK_MAX:
                self._view.poll_now()
                continue
            await asyncio.gather(*(self._read_back_one(name) for name in names))

    async def _read_back_one(self, name: str) -> None:
        async with self._read_back_gate:
            try:
                async with asyncio.timeout(GUARD_READ_TIMEOUT):
                    await self._view.refresh_node(name, keep_fresh=True)
            except (SlurmError, TimeoutError):
                self._view.poll_now()  # the next poll brings it

    async def drain(self, name: str, reason: str) -> None:
        await self._writer.drain(name, reason)

    async def resume(self, name: str) -> None:
        await self._writer.resume(name)

    async def set_comment(self, name: str, comment: str) -> None:
        await self._writer.comment(name, comment)

    async def _update_nodes(self, names: Sequence[str], update: NodeUpdate) -> None:
        """One request of the batch writer."""
        for callback in self._write_callbacks:
            callback(len(names))
        await self._client.update_nodes(names, update)

    async def follow(
        self,
        on_node: Callable[[str], None],
        on_state: Callable[[str | None], Awaitable[None]],
    ) -> None:
        with contextlib.closing(self._view.subscribe(replay=False)) as subscription:
            async for event in subscription:
                if isinstance(event, NodeEvent):
                    on_node(event.name)
                elif isinstance(event, StateEvent) and event.state is ViewState.STALE:
                    await on_state(event.reason)
                elif isinstance(event, StateEvent) and event.state is ViewState.FRESH:
                    await on_state(None)
                elif isinstance(event, StateEvent | Resync):
                    on_node(ALL_NODES)  # events dropped, or the view closed

    @property
    def write_wait(self) -> float:
        return self._writes.waited

    def on_write(self, callback: Callable[[int], None]) -> None:
        self._write_callbacks.append(callback)
