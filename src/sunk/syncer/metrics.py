"""The syncer's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "sunk_syncer"


class SyncerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.sync_seconds = Histogram(
            f"{NAMESPACE}_reconcile_seconds",
            "Time to reconcile one node (read both sides, write what differs).",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.actions = Counter(
            f"{NAMESPACE}_actions_total",
            "Writes made, by kind (drain, resume, taint, untaint, annotate, condition).",
            ["kind"],
            registry=self.registry,
        )
        self.errors = Counter(
            f"{NAMESPACE}_errors_total",
            "Reconciles that failed and will be retried.",
            registry=self.registry,
        )
        self.slurm_nodes = Gauge(
            f"{NAMESPACE}_slurm_nodes",
            "Slurm nodes behind Kubernetes nodes, by base state and drain.",
            ["state", "drain"],
            registry=self.registry,
        )
        self.write_wait = Gauge(
            f"{NAMESPACE}_write_wait_seconds",
            "Time writes have waited for the write rate limit, in total, by API.",
            ["api"],
            registry=self.registry,
        )
        self.slurm_requests = Gauge(
            f"{NAMESPACE}_slurm_requests",
            "REST requests sent to slurmrestd since the syncer started (reads and writes).",
            registry=self.registry,
        )
        self.view_fresh = Gauge(
            f"{NAMESPACE}_slurm_view_fresh",
            "1 while the Slurm view is fresh; 0 while stale (the syncer then waits).",
            registry=self.registry,
        )
