"""SyncerSlurm over sunk's Slurm port: the cached view for deciding, a guard
read and batched, rate-limited writes for acting.

The view's copy of a node carries the syncer's own writes from the moment
Slurm accepts them until the view has read its node list again. At 5,000
nodes that list takes over a second to read, and a rack uncordoned right
after its cordon would otherwise wait for it to see the drains it is to
undo. Nothing acts on the written fields alone: every drain and resume reads
the node right before (`read_node`), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from sunk.slurm.channel import SlurmChannel
from sunk.slurm.client import SlurmClient
from sunk.slurm.errors import SlurmApiError, SlurmAuthError, SlurmUnavailableError
from sunk.slurm.models import Node, NodeUpdate
from sunk.slurm.view import NodeEvent, Resync, SlurmView, StateEvent, ViewState
from sunk.syncer.batch import BatchWriter
from sunk.syncer.decide import SlurmState
from sunk.syncer.ratelimit import TokenBucket, WriteLimits
from sunk.syncer.slurm_port import ALL_NODES

# The read right before a write waits this long, then the view's copy is used.
GUARD_READ_TIMEOUT = 0.5
# The map of written nodes is pruned when it reaches this size, or twice the
# size it had after the last pruning.
PRUNE_AT_LEAST = 64


class Written(NamedTuple):
    """Fields of a node as the syncer wrote them, and when (a view read mark)."""

    mark: int
    fields: dict[str, str | bool]


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
        # Slurm node → what the syncer wrote to it that the view may not show yet.
        self._written: dict[str, list[Written]] = {}
        self._prune_at = PRUNE_AT_LEAST

    def node(self, name: str) -> SlurmState | None:
        node = self._view.node(name)
        return None if node is None else self._with_written(slurm_state(node))

    def _with_written(self, state: SlurmState) -> SlurmState:
        """`state` with the writes the view has not read since laid over it."""
        if (written := self._written.get(state.name)) is None:
            return state
        unread = self._unread(written)
        if unread:
            self._written[state.name] = unread
        else:
            del self._written[state.name]
        for write in unread:
            state = dataclasses.replace(state, **write.fields)  # type: ignore[arg-type]
        return state

    def _unread(self, written: list[Written]) -> list[Written]:
        """The writes no node list read begun after them has shown yet."""
        return [w for w in written if not self._view.nodes_read_since(w.mark)]

    def _note_written(self, name: str, **fields: str | bool) -> None:
        if len(self._written) >= self._prune_at:
            # Drop what the view has read since, so the map stays as small as the
            # writes of one read's time; each write pays for this once, on average.
            self._written = {
                n: kept for n, written in self._written.items() if (kept := self._unread(written))
            }
            self._prune_at = max(PRUNE_AT_LEAST, 2 * len(self._written))
        self._written.setdefault(name, []).append(Written(self._view.node_read_mark(), fields))

    async def read_node(self, name: str) -> SlurmState | None:
        """Not through the view's refresh_node: a failed read there marks the whole
        view stale, and slurmrestd 24.11 sometimes fails single-node reads after
        a change ("Unable to query partitions"), or hangs on them until its
        MessageTimeout. Then the view's copy (at most one poll old) has to do,
        rather than holding the write back; an unreachable Slurm still raises.
        Slurm's copy, not the syncer's writes laid over it: what guards a write
        is never what the syncer itself wrote.
        """
        try:
            async with asyncio.timeout(GUARD_READ_TIMEOUT):
                node = await self._client.node(name)
        except (SlurmAuthError, SlurmUnavailableError):
            raise
        except (SlurmApiError, TimeoutError):
            node = self._view.node(name)
        return None if node is None else slurm_state(node)

    async def drain(self, name: str, reason: str) -> None:
        await self._writer.drain(name, reason)
        self._note_written(name, drained=True, reason=reason)

    async def resume(self, name: str) -> None:
        await self._writer.resume(name)
        self._note_written(name, drained=False, reason="")

    async def set_comment(self, name: str, comment: str) -> None:
        await self._writer.comment(name, comment)
        self._note_written(name, comment=comment)

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
