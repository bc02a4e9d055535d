"""The topology controller: Slurm's topology file, kept in a ConfigMap from node labels.

One key (the ConfigMap). Every change of a Node, a NodeSet pod or the
ConfigMap itself queues it after a short settle time, so a rack that joins at
once is one write (and one Slurm reconfigure), not one per node. The
reconcile is level-triggered: it reads the caches, plans (`plan.plan`) and
replaces the ConfigMap only when its topology file differs, guarded by the
resourceVersion it read. The slurm chart's reconfigure sidecar applies the file.

Which Kubernetes Node placed each Slurm node is kept on the ConfigMap itself
(annotation `sunk.dev/topology-nodes`), so a restart keeps a node whose pod
is being replaced where it was. Such a node leaves once Slurm no longer has
it: the controller reads the names of Slurm's nodes from the operator's
Slurm view (`SlurmNodeNames`), and looks again every `RECHECK_SECONDS` while
a node is placed without a Ready pod.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Callable, Collection

from lightkube import AsyncClient, operators
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from sunk.api import DOMAIN, LABEL_NODESET
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Informer
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.slurm.view import SlurmView
from sunk.topology.metrics import TopologyMetrics
from sunk.topology.plan import Plan, members, plan, ready_slurmd
from sunk.topology.problems import ConfigError
from sunk.topology.settings import SETTINGS_KEY, TOPOLOGY_FILES, parse_settings

log = logging.getLogger(__name__)

CONTROLLER = "sunk.dev/topology"
SETTLE_SECONDS = 1.0
# Slurm node name -> the Kubernetes Node that placed it, as JSON.
ANNOTATION_PLACED = f"{DOMAIN}/topology-nodes"
# While a node is placed without a Ready pod: how often to ask whether Slurm still has it.
RECHECK_SECONDS = 15.0

# The names of the nodes Slurm has now; None when that is not known.
SlurmNodeNames = Callable[[], Collection[str] | None]


def slurm_node_names(view: SlurmView) -> SlurmNodeNames:
    return lambda: frozenset(view.nodes()) if view.fresh else None


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
        slurm_nodes: SlurmNodeNames = lambda: None,
    ) -> None:
        self._kube = kube
        self._slurm_nodes = slurm_nodes
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
        annotations = dict((configmap.metadata and configmap.metadata.annotations) or {})
        ready = ready_slurmd(self._pods.items())
        placed = members(
            ready, labels, _placed(annotations.get(ANNOTATION_PLACED)), self._slurm_nodes()
        )
        recheck = Result(requeue_after=RECHECK_SECONDS) if placed.keys() - ready.keys() else None
        try:
            settings = parse_settings(data.get(SETTINGS_KEY))
            wanted = plan(settings, {name: labels[node] for name, node in placed.items()})
        except ConfigError as error:
            self.metrics.settings_valid.set(0)
            self._report(configmap, str(error))
            return None  # the file as it was; a change of labels or settings comes back here
        self.metrics.settings_valid.set(1)
        self._reported = None
        self.metrics.placed.set(wanted.placed)
        self.metrics.unplaced.set(len(wanted.unplaced))
        new = {k: v for k, v in data.items() if k not in TOPOLOGY_FILES} | wanted.files
        record = json.dumps(dict(sorted(placed.items())), separators=(",", ":"))
        if new == data and annotations.get(ANNOTATION_PLACED) == record:
            return recheck
        written = copy.deepcopy(configmap)  # the cache's own object stays as the apiserver sent it
        written.data = new
        assert written.metadata is not None  # an object from the apiserver has metadata
        written.metadata.annotations = annotations | {ANNOTATION_PLACED: record}
        # With the resourceVersion read: 409 if it changed meanwhile, and retried.
        await self._kube.replace(written)
        if new == data:
            return recheck
        self.metrics.writes.inc()
        note = _summary(wanted)
        log.info("topology %s written: %s", key, note)
        self._events.emit_soon(configmap, "TopologyWritten", note, action="Write")
        return recheck

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


def _placed(annotation: str | None) -> dict[str, str]:
    """The annotation's map; anything else (absent, or edited by hand into
    something else) counts as empty: the Ready pods then place their nodes again."""
    try:
        value = json.loads(annotation or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
