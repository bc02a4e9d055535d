"""The gres controller: Slurm's gres.conf, kept in a ConfigMap from each node's GPUs.

One key (the ConfigMap). Every change of a Node, a NodeSet pod or the
ConfigMap itself queues it after a short settle time, so nodes that join
at once are one write (and one Slurm reconfigure). Level-triggered: it reads
the caches, plans (`plan.plan`) and replaces the ConfigMap only when its
gres.conf differs, guarded by the resourceVersion it read. The slurm chart
makes the ConfigMap (when its `gresConfig` is empty) and its reconfigure
sidecar applies the file.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time

from lightkube import AsyncClient, operators
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from prometheus_client import CollectorRegistry, Counter, Gauge

from sunk.api import DOMAIN, LABEL_NODESET
from sunk.gres.plan import GRES_FILE, GresLine, lines_since, listed_gpus, node_lines, plan
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Informer
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.metrics import ReconcileMetrics

log = logging.getLogger(__name__)

CONTROLLER = "sunk.dev/gres"
SETTLE_SECONDS = 1.0
# Slurm node -> when its line last changed (epoch seconds), as JSON: the
# NodeSet controller lets a line reach slurmctld before slurmd starts again.
ANNOTATION_SINCE = f"{DOMAIN}/gres-lines-since"


class GresMetrics(ReconcileMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__("sunk_gres", "the gres ConfigMap", registry)
        self.writes = Counter(
            "sunk_gres_writes_total",
            "Changed gres.conf files written to the ConfigMap (each one a Slurm reconfigure).",
            registry=self.registry,
        )
        self.nodes = Gauge(
            "sunk_gres_nodes",
            "Slurm nodes with a GPU line in the last gres.conf written.",
            registry=self.registry,
        )


class GresController:
    def __init__(
        self,
        kube: AsyncClient,
        *,
        namespace: str,
        configmap: str,
        identity: str | None = None,
        metrics: GresMetrics | None = None,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        self._kube = kube
        self._key = f"{namespace}/{configmap}"
        self._settle = settle
        self.metrics = metrics or GresMetrics()
        self._nodes: Informer[Node] = Informer(kube, Node)
        self._pods: Informer[Pod] = Informer(
            kube, Pod, namespace=namespace, labels={LABEL_NODESET: operators.exists()}
        )
        # By name: its RBAC grants this one ConfigMap (a watch by name carries
        # a metadata.name field selector).
        self._configmaps: Informer[ConfigMap] = Informer(
            kube, ConfigMap, namespace=namespace, fields={"metadata.name": configmap}
        )
        self._events = EventRecorder(kube, CONTROLLER, instance=identity)
        self.queue: WorkQueue[str] = WorkQueue()
        for informer in (self._nodes, self._pods, self._configmaps):
            informer.subscribe(lambda _: self.queue.add_after(self._key, self._settle))
        self._reported: tuple[str, ...] = ()  # the problems an Event last told of

    async def run(self) -> None:
        informers = (self._nodes, self._pods, self._configmaps)
        async with asyncio.TaskGroup() as group:
            for informer in informers:
                group.create_task(informer.run())
            await asyncio.gather(*(i.synced.wait() for i in informers))
            self.queue.add(self._key)
            group.create_task(run_workers(self.queue, self.reconcile, 1))

    def listed(self) -> dict[str, GresLine] | None:
        """Slurm node -> its gres.conf line (GPUs named, since when), as last
        written; None before the ConfigMap is known."""
        configmap = self._configmaps.get(self._key)
        if configmap is None:
            return None
        annotations = (configmap.metadata and configmap.metadata.annotations) or {}
        return listed_gpus(
            (configmap.data or {}).get(GRES_FILE, ""), _since(annotations.get(ANNOTATION_SINCE))
        )

    async def reconcile(self, key: str) -> Result | None:
        with self.metrics.reconciling():
            return await self._reconcile(key)

    async def _reconcile(self, key: str) -> Result | None:
        configmap = self._configmaps.get(key)
        if configmap is None:
            log.debug("no ConfigMap %s (the slurm chart makes it): nothing to write", key)
            return None
        nodes = {
            node.metadata.name: node
            for node in self._nodes.items()
            if node.metadata and node.metadata.name
        }
        wanted = plan(self._pods.items(), nodes)
        self._report(configmap, wanted.problems)
        self.metrics.nodes.set(wanted.nodes)
        data = dict(configmap.data or {})
        if data.get(GRES_FILE) == wanted.text:
            return None
        annotations = dict((configmap.metadata and configmap.metadata.annotations) or {})
        since = lines_since(
            node_lines(data.get(GRES_FILE, "")),
            node_lines(wanted.text),
            _since(annotations.get(ANNOTATION_SINCE)),
            time.time(),
        )
        written = copy.deepcopy(configmap)  # the cache's own object stays as the apiserver sent it
        written.data = data | {GRES_FILE: wanted.text}
        assert written.metadata is not None  # an object from the apiserver has metadata
        record = json.dumps(dict(sorted(since.items())), separators=(",", ":"))
        written.metadata.annotations = annotations | {ANNOTATION_SINCE: record}
        # With the resourceVersion read: 409 if it changed meanwhile, and retried.
        await self._kube.replace(written)
        self.metrics.writes.inc()
        note = f"{GRES_FILE}: {wanted.nodes} GPU node(s)"
        log.info("gres %s written: %s", key, note)
        self._events.emit_soon(configmap, "GresWritten", note, action="Write")
        return None

    def _report(self, configmap: ConfigMap, problems: tuple[str, ...]) -> None:
        if problems == self._reported:
            return
        self._reported = problems
        for problem in problems:
            log.warning("gres %s: %s", self._key, problem)
            self._events.emit_soon(
                configmap, "GresInvalid", problem, action="Write", type_="Warning"
            )


def _since(annotation: str | None) -> dict[str, float]:
    """The annotation's map; anything else (absent, edited by hand) counts as
    empty: every line then counts as old."""
    try:
        value = json.loads(annotation or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        k: float(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, int | float)
    }
