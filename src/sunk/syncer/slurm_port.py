"""What the syncer needs from Slurm, and nothing more.

A narrow port: the syncer's loop and its unit tests depend on this Protocol;
`sunk.syncer.slurm_adapter` implements it over sunk's Slurm REST port.
Nodes come back as the decider's `SlurmState`, not as Slurm's REST model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sunk.syncer.decide import SlurmState

# What an on_node callback gets when every node may have changed (events were
# dropped, or the view closed): look at everything again.
ALL_NODES = "*"


class SyncerSlurm(Protocol):
    @property
    def fresh(self) -> bool:
        """The cached view is up to date; while it is not, the syncer changes nothing."""
        ...

    def node(self, name: str) -> SlurmState | None:
        """The cached node (at most one poll old), with the syncer's own writes
        that Slurm accepted laid over it until the cache has been read since;
        None if Slurm has no such node. Only while `fresh`: raises
        SlurmStaleError otherwise."""
        ...

    async def read_node(self, name: str) -> SlurmState | None:
        """The node as it is now, read right before a write that depends on it.

        Bounded in time: when the read fails or hangs, the cached copy (at most
        one poll old) is returned instead of holding the write back. Slurm
        unreachable, or the token refused, still raises. None if Slurm has no
        such node.
        """
        ...

    async def drain(self, name: str, reason: str) -> None:
        """Set DRAIN with `reason`, whatever the node's state (the caller reads it
        first). Equal updates of many nodes at once go as one request, within the
        Slurm write rate limit; returns when this node's is written, or raises
        the error for this node."""
        ...

    async def resume(self, name: str) -> None:
        """Clear DRAIN, whatever the node's state; batched and limited as `drain` is."""
        ...

    async def set_comment(self, name: str, comment: str) -> None:
        """Set the node's comment; batched and limited as `drain` is."""
        ...

    def poll_now(self) -> None:
        """Cut the view's wait short: show what was just written without waiting
        for the next poll."""
        ...

    async def follow(
        self,
        on_node: Callable[[str], None],
        on_state: Callable[[str | None], Awaitable[None]],
    ) -> None:
        """Until cancelled, tell the view's changes from now on (the cache is not replayed).

        `on_node(name)` when a cached node changes, `on_node(ALL_NODES)` when any
        may have; `await on_state(reason)` when the view turns stale (why Slurm
        cannot be read), `await on_state(None)` when it is fresh again: either
        way, every node may have changed. The view can also turn stale by age
        alone (a hung poll), with no call.
        """
        ...

    @property
    def write_wait(self) -> float:
        """Seconds writes have waited for the write rate limit, in total (a metric)."""
        ...

    def on_write(self, callback: Callable[[int], None]) -> None:
        """Call `callback(nodes)` for each write request sent: how many nodes it
        updated, which shows how well writes coalesce (a metric)."""
        ...

    @property
    def requests(self) -> int:
        """REST requests made so far, the view's polls included (a metric)."""
        ...
