"""What the NodeSet controller needs from Slurm, and nothing more.

A narrow port: the controller and its unit tests depend on this Protocol;
`sunk.nodeset.slurm_adapter` implements it over sunk's Slurm REST port.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from sunk.nodeset.plan import SlurmNodeView

# What on_change gets when every node may have changed.
ALL_NODES = "*"


class NodeSetSlurm(Protocol):
    @property
    def fresh(self) -> bool:
        """The cached view is up to date (a metric; planning asks `nodes_with_feature`)."""
        ...

    @property
    def requests(self) -> int:
        """REST requests made so far, the view's polls included (a metric)."""
        ...

    def nodes_with_feature(self, feature: str) -> Mapping[str, SlurmNodeView] | None:
        """The cached Slurm nodes carrying `feature`, by name; None while the view is stale."""
        ...

    async def follow(self, on_change: Callable[[str], None]) -> None:
        """Until cancelled, call `on_change(node_name)` whenever a cached Slurm
        node changes from now on, and `on_change(ALL_NODES)` when the view as a
        whole changes (stale or fresh again, or changes were dropped)."""
        ...

    async def drain_unless_drained(self, name: str, reason: str) -> bool:
        """Drain with `reason` unless a fresh read (not the cache) finds the node
        gone or drained already, by anyone: a person's drain and its reason are
        never overwritten. True if it drained."""
        ...

    async def drained_and_idle(self, name: str) -> bool:
        """A fresh read (not the cache): DRAIN set and no job running or completing."""
        ...

    async def resume_if_reason(self, name: str, reason: str) -> bool:
        """Resume only if the node is still drained with exactly `reason` (fresh read);
        someone else's drain, set since, is never undone."""
        ...

    async def delete_node(self, name: str) -> None: ...

    async def reconfigure(self) -> None:
        """slurmctld reads its files again (a node that registered anew takes
        its place in the topology)."""
        ...

    async def reserve(self, name: str, nodes: Sequence[str], start: int, end: int) -> str | None:
        """Hold `nodes` in the maintenance reservation `name` from `start` to `end`
        (epoch seconds): no job that would run past `start` begins on them.
        Written only when it differs from what this process last wrote. None
        once held; else why not, for people (this Slurm cannot: reservations
        through REST need 25.05+; or Slurm refused)."""
        ...

    async def unreserve(self, name: str) -> str | None:
        """No reservation `name`: read once after a restart, deleted only if it
        exists. None once gone; else why Slurm refused."""
        ...
