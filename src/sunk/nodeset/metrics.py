"""The NodeSet controller's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from sunk.metrics import ControllerMetrics

NAMESPACE = "sunk_operator"


class NodeSetMetrics(ControllerMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(NAMESPACE, "operator", "NodeSet (pods, Slurm nodes, status)", registry)
        self.actions = Counter(
            f"{NAMESPACE}_actions_total",
            "Changes made, by kind (pod_create, pod_delete, drain, resume, slurm_delete).",
            ["kind"],
            registry=self.registry,
        )
