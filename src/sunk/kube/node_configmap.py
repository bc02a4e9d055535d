"""A ConfigMap kept from Nodes and NodeSet pods: what the topology and gres
controllers share.

One key (the ConfigMap). Every change of a Node, a NodeSet pod of the
ConfigMap's namespace or the ConfigMap itself queues it after a short settle
time, so nodes that join at once are one write (and one Slurm reconfigure),
not one per node. Level-triggered: `write` reads the caches, plans, and
replaces the ConfigMap only when it differs, guarded by the resourceVersion
it read. The Node and pod caches are handed in (the operator's NodeSet
controller runs them: one watch of each per operator); the ConfigMap's is
its own, watched by name.
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from sunk.kube.events import EventRecorder
from sunk.kube.informer import Informer
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.metrics import ReconcileMetrics

log = logging.getLogger(__name__)

SETTLE_SECONDS = 1.0

M = TypeVar("M", bound=ReconcileMetrics)


class NodeFedConfigMap(ABC, Generic[M]):
    """Subclasses name their Events' `controller` and write the ConfigMap in
    `write`; `nodes()`, `pods()` and `report()` serve them."""

    controller: str  # the Events' reportingController
    label: str  # how the log names it ("topology", "gres")

    def __init__(
        self,
        kube: AsyncClient,
        *,
        namespace: str,
        configmap: str,
        nodes: Informer[Node],
        pods: Informer[Pod],
        metrics: M,
        identity: str | None = None,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self.key = f"{namespace}/{configmap}"
        self._settle = settle
        self.metrics = metrics
        self._nodes = nodes
        self._pods = pods
        # By name: the chart's RBAC grants this one ConfigMap, and a watch is
        # authorized by name only with a metadata.name field selector.
        self._configmaps: Informer[ConfigMap] = Informer(
            kube, ConfigMap, namespace=namespace, fields={"metadata.name": configmap}
        )
        self._events = EventRecorder(kube, self.controller, instance=identity)
        self.queue: WorkQueue[str] = WorkQueue()
        for informer in (nodes, pods, self._configmaps):
            informer.subscribe(lambda _: self.queue.add_after(self.key, self._settle))
        self._reported: tuple[str, ...] = ()  # the problems an Event last told of

    async def run(self) -> None:
        """Watch the ConfigMap and reconcile it; the Node and pod caches are
        run by their owner, and waited for."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._configmaps.run())
            informers = (self._nodes, self._pods, self._configmaps)
            await asyncio.gather(*(i.synced.wait() for i in informers))
            self.queue.add(self.key)
            group.create_task(run_workers(self.queue, self.reconcile, 1))

    def configmap(self) -> ConfigMap | None:
        return self._configmaps.get(self.key)

    def nodes(self) -> dict[str, Node]:
        return {
            node.metadata.name: node
            for node in self._nodes.items()
            if node.metadata and node.metadata.name
        }

    def pods(self) -> list[Pod]:
        """The NodeSet pods of the ConfigMap's namespace (the cache may hold
        every namespace's)."""
        return [
            pod
            for pod in self._pods.items()
            if pod.metadata and pod.metadata.namespace == self._namespace
        ]

    async def reconcile(self, key: str) -> Result | None:
        with self.metrics.reconciling():
            configmap = self._configmaps.get(key)
            if configmap is None:
                log.debug("no ConfigMap %s (the slurm chart makes it): nothing to write", key)
                return None
            return await self.write(configmap)

    @abstractmethod
    async def write(self, configmap: ConfigMap) -> Result | None:
        """Replace the ConfigMap if what it holds is not what the caches say."""

    async def replace(self, written: ConfigMap) -> None:
        # With the resourceVersion read: 409 if it changed meanwhile, and retried.
        await self._kube.replace(written)

    def written(self, configmap: ConfigMap, note: str, reason: str) -> None:
        log.info("%s %s written: %s", self.label, self.key, note)
        self._events.emit_soon(configmap, reason, note, action="Write")

    def report(self, configmap: ConfigMap, problems: tuple[str, ...], reason: str) -> None:
        """A Warning Event per problem, once while they stay the same."""
        if problems == self._reported:
            return
        self._reported = problems
        for problem in problems:
            log.warning("%s %s: %s", self.label, self.key, problem)
            self._events.emit_soon(configmap, reason, problem, action="Write", type_="Warning")


def json_annotation(text: str | None) -> dict[str, object]:
    """An annotation holding a JSON object; anything else (absent, or edited
    by hand into something else) counts as empty."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
