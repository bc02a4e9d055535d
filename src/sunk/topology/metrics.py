"""The topology controller's Prometheus metrics (in the operator's registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from sunk.metrics import ReconcileMetrics

NAMESPACE = "sunk_topology"


class TopologyMetrics(ReconcileMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(NAMESPACE, "the topology ConfigMap", registry)
        self.writes = Counter(
            f"{NAMESPACE}_writes_total",
            "Changed topologies written to the ConfigMap (each one a Slurm reconfigure).",
            registry=self.registry,
        )
        self.placed = Gauge(
            f"{NAMESPACE}_nodes_placed",
            "Slurm nodes in a switch or block of the last topology written.",
            registry=self.registry,
        )
        self.unplaced = Gauge(
            f"{NAMESPACE}_nodes_unplaced",
            "Slurm nodes whose Kubernetes node lacks a topology label "
            "(the tree's `unlabelled` leaf, or outside every block).",
            registry=self.registry,
        )
        self.settings_valid = Gauge(
            f"{NAMESPACE}_settings_valid",
            "1 while the chart's topology settings and node labels make a topology, else 0.",
            registry=self.registry,
        )
