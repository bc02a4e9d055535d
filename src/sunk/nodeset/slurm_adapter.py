"""NodeSetSlurm over sunk's Slurm port: the cached view for planning, fresh reads for acting."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from sunk.nodeset.plan import SlurmNodeView
from sunk.nodeset.slurm_port import ALL_NODES
from sunk.slurm.channel import SlurmChannel, tell
from sunk.slurm.errors import SlurmNotFoundError
from sunk.slurm.models import Node
from sunk.slurm.view import NodeEvent, Resync, StateEvent


def node_view(node: Node) -> SlurmNodeView:
    return SlurmNodeView(
        name=node.name,
        drained=node.draining,
        busy=not node.idle_or_down,
        reason=node.reason,
        responding=node.responding,
        base_state=node.base_state,
    )


class SlurmPortForNodeSets(SlurmChannel):
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
