"""The topology controller: Slurm's topology file, kept in a ConfigMap from node labels.

One key (the ConfigMap). Every change of a Node, a NodeSet pod or the
ConfigMap itself queues it after a short settle time, so a rack that joins at
once is one write (and one Slurm reconfigure), not one per node. The
reconcile is level-triggered: it reads the caches, plans (`plan.plan`) and
replaces the ConfigMap only when its topology file differs, guarded by the
resourceVersion it read. It needs no Slurm access: the slurm chart's
reconfigure sidecar applies the file.
"""

from __future__ import annotations

import asyncio
import copy
import logging

from lightkube import AsyncClient, operators
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from sunk.api import LABEL_NODESET
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Informer
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.topology.metrics import TopologyMetrics
from sunk.topology.plan import Plan, members, plan
from sunk.topology.problems import ConfigError
from sunk.topology.settings import SETTINGS_KEY, TOPOLOGY_FILES, parse_settings

log = logging.getLogger(__name__)

CONTROLLER = "sunk.dev/topology"
SETTLE_SECONDS = 1.0


class TopologyController:
    def __init__(
        self,
        kube: AsyncClient,
        *,
        namespace: str,
        configmap: str,
        identity: str | None = None,
        metrics: TopologyMetrics | None = None,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        self._kube = kube
        self._key = f"{namespace}/{configmap}"
        self._settle = settle
        self.metrics = metrics or TopologyMetrics()
        self._nodes: Informer[Node] = Informer(kube, Node)
        self._pods: Informer[Pod] = Informer(
            kube, Pod, namespace=namespace, labels={LABEL_NODESET: operators.exists()}
        )
        # By name: its RBAC grants this one ConfigMap, and a watch is
        # authorized by name only with a metadata.name field selector.
        self._configmaps: Informer[ConfigMap] = Informer(
            kube, ConfigMap, namespace=namespace, fields={"metadata.name": configmap}
        )
        self._events = EventRecorder(kube, CONTROLLER, instance=identity)
        self.queue: WorkQueue[str] = WorkQueue()
        for informer in (self._nodes, self._pods, self._configmaps):
            informer.subscribe(lambda _: self.queue.add_after(self._key, self._settle))
        self._reported: str | None = None  # the last problem an Event told of

    async def run(self) -> None:
        informers = (self._nodes, self._pods, self._configmaps)
        async with asyncio.TaskGroup() as group:
            for informer in informers:
                group.create_task(informer.run())
            await asyncio.gather(*(i.synced.wait() for i in informers))
            self.queue.add(self._key)
            group.create_task(run_workers(self.queue, self.reconcile, 1))

    async def reconcile(self, key: str) -> Result | None:
        with self.metrics.reconciling():
            return await self._reconcile(key)

    async def _reconcile(self, key: str) -> Result | None:
        configmap = self._configmaps.get(key)
        if configmap is None:
            log.debug("no ConfigMap %s (the slurm chart makes it): nothing to write", key)
            return None
        data = dict(configmap.data or {})
        labels = {
            node.metadata.name: dict(node.metadata.labels or {})
            for node in self._nodes.items()
            if node.metadata and node.metadata.name
        }
        try:
            settings = parse_settings(data.get(SETTINGS_KEY))
            wanted = plan(settings, members(self._pods.items(), labels))
        except ConfigError as error:
            self.metrics.settings_valid.set(0)
            self._report(configmap, str(error))
            return None  # the file as it was; a change of labels or settings comes back here
        self.metrics.settings_valid.set(1)
        self._reported = None
        self.metrics.placed.set(wanted.placed)
        self.metrics.unplaced.set(len(wanted.unplaced))
        new = {k: v for k, v in data.items() if k not in TOPOLOGY_FILES} | wanted.files
        if new == data:
            return None
        written = copy.deepcopy(configmap)  # the cache's own object stays as the apiserver sent it
        written.data = new
        # With the resourceVersion read: 409 if it changed meanwhile, and retried.
        await self._kube.replace(written)
        self.metrics.writes.inc()
        note = _summary(wanted)
        log.info("topology %s written: %s", key, note)
        self._events.emit_soon(configmap, "TopologyWritten", note, action="Write")
        return None

    def _report(self, configmap: ConfigMap, problem: str) -> None:
        if problem == self._reported:
            return
        self._reported = problem
        log.warning("topology %s not written: %s", self._key, problem)
        self._events.emit_soon(
            configmap, "TopologyInvalid", problem, action="Write", type_="Warning"
        )


def _summary(wanted: Plan) -> str:
    files = ", ".join(sorted(wanted.files)) or "no topology file (plugin none)"
    note = f"{files}: {wanted.placed} node(s) placed"
    if wanted.unplaced:
        shown = ", ".join(wanted.unplaced[:10]) + (" ..." if len(wanted.unplaced) > 10 else "")
        note += f"; {len(wanted.unplaced)} without the topology label(s): {shown}"
    return note
