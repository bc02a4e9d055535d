"""The gres controller: Slurm's gres.conf, kept in a ConfigMap from each
node's GPUs (the skeleton, settle time and writes: `sunk.kube.node_configmap`).
It plans (`plan.plan`) and replaces the ConfigMap only when its gres.conf
differs. The slurm chart makes the ConfigMap (when its `gresConfig` is empty)
and its reconfigure sidecar applies the file.
"""

from __future__ import annotations

import copy
import json
import time

from lightkube.resources.core_v1 import ConfigMap
from prometheus_client import CollectorRegistry, Counter, Gauge

from sunk.api import DOMAIN
from sunk.gres.plan import GRES_FILE, GresLine, lines_since, listed_gpus, node_lines, plan
from sunk.kube.node_configmap import NodeFedConfigMap, json_annotation
from sunk.kube.workqueue import Result
from sunk.metrics import ReconcileMetrics

CONTROLLER = "sunk.dev/gres"
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


class GresController(NodeFedConfigMap[GresMetrics]):
    controller = CONTROLLER
    label = "gres"

    def listed(self) -> dict[str, GresLine] | None:
        """Slurm node -> its gres.conf line (GPUs named, since when), as last
        written; None before the ConfigMap is known."""
        configmap = self.configmap()
        if configmap is None:
            return None
        annotations = (configmap.metadata and configmap.metadata.annotations) or {}
        return listed_gpus(
            (configmap.data or {}).get(GRES_FILE, ""), _since(annotations.get(ANNOTATION_SINCE))
        )

    async def write(self, configmap: ConfigMap) -> Result | None:
        wanted = plan(self.pods(), self.nodes())
        self.report(configmap, wanted.problems, "GresInvalid")
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
        await self.replace(written)
        self.metrics.writes.inc()
        self.written(configmap, f"{GRES_FILE}: {wanted.nodes} GPU node(s)", "GresWritten")
        return None


def _since(annotation: str | None) -> dict[str, float]:
    """The annotation's map; anything else counts as empty: every line then
    counts as old."""
    value = json_annotation(annotation)
    return {k: float(v) for k, v in value.items() if isinstance(v, int | float)}
