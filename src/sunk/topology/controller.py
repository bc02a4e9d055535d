"""The topology controller: Slurm's topology file, kept in a ConfigMap from
node labels (the skeleton, settle time and writes: `sunk.kube.node_configmap`).
It plans (`plan.plan`) and replaces the ConfigMap only when its topology file
differs. The slurm chart's reconfigure sidecar applies the file.

Which Kubernetes Node placed each Slurm node is kept on the ConfigMap itself
(annotation `sunk.dev/topology-nodes`), so a restart keeps a node whose pod
is being replaced where it was. Such a node leaves once Slurm no longer has
it: the controller reads the names of Slurm's nodes from the operator's
Slurm view (`SlurmNodeNames`), and looks again every `RECHECK_SECONDS` while
a node is placed without a Ready pod.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from sunk.api import DOMAIN
from sunk.kube.informer import Informer
from sunk.kube.node_configmap import SETTLE_SECONDS, NodeFedConfigMap, json_annotation
from sunk.kube.workqueue import Result
from sunk.slurm.view import SlurmView
from sunk.topology.metrics import TopologyMetrics
from sunk.topology.plan import Plan, members, plan, ready_slurmd
from sunk.topology.problems import ConfigError
from sunk.topology.settings import SETTINGS_KEY, TOPOLOGY_FILES, parse_settings

CONTROLLER = "sunk.dev/topology"
# Slurm node name -> the Kubernetes Node that placed it, as JSON.
ANNOTATION_PLACED = f"{DOMAIN}/topology-nodes"
# While a node is placed without a Ready pod: how often to ask whether Slurm still has it.
RECHECK_SECONDS = 15.0

# The names of the nodes Slurm has now; None when that is not known.
SlurmNodeNames = Callable[[], Collection[str] | None]


def slurm_node_names(view: SlurmView) -> SlurmNodeNames:
    return lambda: frozenset(view.nodes()) if view.fresh else None


class TopologyController(NodeFedConfigMap[TopologyMetrics]):
    controller = CONTROLLER
    label = "topology"

    def __init__(
        self,
        kube: AsyncClient,
        *,
        namespace: str,
        configmap: str,
        nodes: Informer[Node],
        pods: Informer[Pod],
        metrics: TopologyMetrics,
        identity: str | None = None,
        settle: float = SETTLE_SECONDS,
        slurm_nodes: SlurmNodeNames = lambda: None,
    ) -> None:
        super().__init__(
            kube,
            namespace=namespace,
            configmap=configmap,
            nodes=nodes,
            pods=pods,
            metrics=metrics,
            identity=identity,
            settle=settle,
        )
        self._slurm_nodes = slurm_nodes

    async def write(self, configmap: ConfigMap) -> Result | None:
        data = dict(configmap.data or {})
        labels = {
            name: dict((node.metadata and node.metadata.labels) or {})
            for name, node in self.nodes().items()
        }
        annotations = dict((configmap.metadata and configmap.metadata.annotations) or {})
        ready = ready_slurmd(self.pods())
        placed = members(
            ready, labels, _placed(annotations.get(ANNOTATION_PLACED)), self._slurm_nodes()
        )
        recheck = Result(requeue_after=RECHECK_SECONDS) if placed.keys() - ready.keys() else None
        try:
            settings = parse_settings(data.get(SETTINGS_KEY))
            wanted = plan(settings, {name: labels[node] for name, node in placed.items()})
        except ConfigError as error:
            self.metrics.settings_valid.set(0)
            self.report(configmap, (str(error),), "TopologyInvalid")
            return None  # the file as it was; a change of labels or settings comes back here
        self.metrics.settings_valid.set(1)
        self.report(configmap, (), "TopologyInvalid")
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
        await self.replace(written)
        if new == data:
            return recheck
        self.metrics.writes.inc()
        self.written(configmap, _summary(wanted), "TopologyWritten")
        return recheck


def _summary(wanted: Plan) -> str:
    files = ", ".join(sorted(wanted.files)) or "no topology file (plugin none)"
    note = f"{files}: {wanted.placed} node(s) placed"
    if wanted.unplaced:
        shown = ", ".join(wanted.unplaced[:10]) + (" ..." if len(wanted.unplaced) > 10 else "")
        note += f"; {len(wanted.unplaced)} without the topology label(s): {shown}"
    return note


def _placed(annotation: str | None) -> dict[str, str]:
    """The annotation's map; anything else counts as empty: the Ready pods
    then place their nodes again."""
    value = json_annotation(annotation)
    return {k: v for k, v in value.items() if isinstance(v, str)}
