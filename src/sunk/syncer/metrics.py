"""The syncer's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sunk.metrics import ControllerMetrics

NAMESPACE = "sunk_syncer"


class SyncerMetrics(ControllerMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(
            NAMESPACE, "syncer", "node (read both sides, write what differs)", registry
        )
        self.actions = Counter(
            f"{NAMESPACE}_actions_total",
            "Writes made, by kind (drain, resume, taint, untaint, annotate, condition).",
            ["kind"],
            registry=self.registry,
        )
        self.slurm_nodes = Gauge(
            f"{NAMESPACE}_slurm_nodes",
            "Slurm nodes behind Kubernetes nodes, by base state and drain.",
            ["state", "drain"],
            registry=self.registry,
        )
        self.sunk_drain_seconds = Gauge(
            f"{NAMESPACE}_sunk_drain_seconds",
            "How long each Slurm node that sunk drained has been drained, by the"
            " component whose reason it carries (syncer or nodeset); only such nodes"
            " are listed. From Slurm's own time of the reason, so a restart keeps it.",
            ["slurm_node", "kube_node", "by"],
            registry=self.registry,
        )
        self.write_wait = Gauge(
            f"{NAMESPACE}_write_wait_seconds",
            "Time writes have waited for the write rate limit, in total, by API.",
            ["api"],
            registry=self.registry,
        )
        self.slurm_write_nodes = Histogram(
            f"{NAMESPACE}_slurm_write_nodes",
            "Nodes per Slurm write request: above 1 when one change to many nodes "
            "(a rack cordoned) went as one request.",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
