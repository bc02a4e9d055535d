"""NodeSetSlurm over sunk's Slurm port: the cached view for planning, fresh reads for acting."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence

from sunk.nodeset.plan import SlurmNodeView
from sunk.nodeset.slurm_port import ALL_NODES
from sunk.slurm.channel import SlurmChannel, tell
from sunk.slurm.client import SlurmClient
from sunk.slurm.errors import (
    SlurmApiError,
    SlurmAuthError,
    SlurmNotFoundError,
    SlurmUnsupportedError,
)
from sunk.slurm.models import Node, ReservationSpec
from sunk.slurm.view import NodeEvent, Resync, SlurmView, StateEvent

# Flags of an update's reservation: MAINT marks the nodes as in maintenance
# (accounting does not count them as idle); IGNORE_JOBS lets it be made while
# jobs run there, which must end before the window (or the update waits).
MAINTENANCE_FLAGS = ("MAINT", "IGNORE_JOBS")
CANNOT_RESERVE = (
    "this Slurm cannot make reservations through its REST API (25.05+ can): "
    "jobs may still start across the maintenance window"
)
# Slurm refuses a reservation that starts more than this far in the past.
_PAST_START_SLACK = 60


def _final(refused: SlurmApiError) -> bool:
    """Slurm's own "no", to report: not a moment's trouble (retried) nor a bad
    token (which fails everything, and is the component's to raise)."""
    return not refused.transient and not isinstance(refused, SlurmAuthError)


def node_view(node: Node) -> SlurmNodeView:
    return SlurmNodeView(
        name=node.name,
        drained=node.draining,
        busy=not node.idle_or_down,
        reason=node.reason,
        responding=node.responding,
        base_state=node.base_state,
        gres=node.gres,
    )


class SlurmPortForNodeSets(SlurmChannel):
    def __init__(self, client: SlurmClient, view: SlurmView) -> None:
        super().__init__(client, view)
        # What this process last made each reservation: (nodes, start, end),
        # or None once it is known not to exist. Absent: unknown (a restart).
        self._reservations: dict[str, tuple[tuple[str, ...], int, int] | None] = {}
        self._cannot_reserve = False

    def nodes_with_feature(self, feature: str) -> Mapping[str, SlurmNodeView] | None:
        if not self._view.fresh:
            return None
        return {
            name: node_view(node)
            for name, node in self._view.nodes().items()
            if feature in node.features
        }

    async def follow(self, on_change: Callable[[str], None]) -> None:
        with contextlib.closing(self._view.subscribe(replay=False)) as subscription:
            async for event in subscription:
                if isinstance(event, NodeEvent):
                    tell(on_change, event.name)
                elif isinstance(event, StateEvent | Resync):
                    tell(on_change, ALL_NODES)

    async def drain_unless_drained(self, name: str, reason: str) -> bool:
        # The view may be a poll old: a drain made since would lose its reason.
        node = await self._view.refresh_node(name)
        if node is None or node.draining:
            return False
        await self._client.drain(name, reason)
        self._view.poll_now()
        return True

    async def drained_and_idle(self, name: str) -> bool:
        node = await self._view.refresh_node(name)
        return node is None or node.drained

    async def resume_if_reason(self, name: str, reason: str) -> bool:
        node = await self._view.refresh_node(name)
        if node is None or not node.draining or node.reason != reason:
            return False
        await self._client.resume(name)
        self._view.poll_now()
        return True

    async def delete_node(self, name: str) -> None:
        # Gone already (a previous reconcile deleted it and the view has not
        # polled since): that is what was wanted.
        with contextlib.suppress(SlurmNotFoundError):
            await self._client.delete_node(name)
        # Read it back rather than wait for a poll: 26.05 drops a deleted node
        # from its table without moving the table's update time, so incremental
        # polls answer "no change" and the view would keep the node (and a
        # deleted NodeSet its finalizer) until the view's next full read.
        await self._view.refresh_node(name)

    async def reconfigure(self) -> None:
        await self._client.reconfigure()

    async def reserve(self, name: str, nodes: Sequence[str], start: int, end: int) -> str | None:
        wanted = (tuple(nodes), start, end)
        if self._reservations.get(name) == wanted:
            return None
        if self._cannot_reserve:
            return CANNOT_RESERVE
        # An open window's start has passed, which Slurm refuses: start now.
        begin = max(start, int(time.time()) - _PAST_START_SLACK)
        spec = ReservationSpec(
            name=name,
            nodes=wanted[0],
            start_time=begin,
            duration_minutes=max(1, math.ceil((end - begin) / 60)),
            flags=MAINTENANCE_FLAGS,
            comment="sunk: NodeSet update window",
        )
        try:
            await self._client.create_reservation(spec)
        except SlurmUnsupportedError:
            self._cannot_reserve = True
            return CANNOT_RESERVE
        except SlurmApiError as refused:
            if not _final(refused):
                raise
            return f"Slurm refused the reservation: {refused}"
        self._reservations[name] = wanted
        return None

    async def unreserve(self, name: str) -> str | None:
        if (name in self._reservations and self._reservations[name] is None) or (
            self._cannot_reserve
        ):
            return None
        # Read first: most sets never had a window, and a read is anyone's to make.
        if await self._client.reservation(name) is not None:
            try:
                await self._client.delete_reservation(name)
            except SlurmNotFoundError:
                pass
            except SlurmApiError as refused:
                if not _final(refused):
                    raise
                return f"Slurm refused to delete the reservation: {refused}"
        self._reservations[name] = None
        return None
