"""The scheduler's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "sunk_scheduler"


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Counter(
            f"{NAMESPACE}_jobs_total",
            "Slurm jobs asked for, by kind: an allocation Slurm started at once, or a"
            " batch placeholder queued after the allocation was refused.",
            ["kind"],
            registry=self.registry,
        )
        self.binds = Counter(
            f"{NAMESPACE}_binds_total",
            "Pods bound to the node of their Slurm job.",
            registry=self.registry,
        )
        self.bind_seconds = Histogram(
            f"{NAMESPACE}_bind_seconds",
            "From when the scheduler first saw a pod pending to its binding.",
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
        )
        self.evictions = Counter(
            f"{NAMESPACE}_evictions_total",
            "Pods evicted because Slurm ended (or is about to end) their job, by job state.",
            ["state"],
            registry=self.registry,
        )
        self.cancels = Counter(
            f"{NAMESPACE}_cancels_total",
            "Slurm jobs cancelled because their pods are gone, finished or incomplete.",
            registry=self.registry,
        )
        self.refusals = Counter(
            f"{NAMESPACE}_refusals_total",
            "Pods refused (bad annotations, or Slurm refused the job); they stay Pending.",
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            f"{NAMESPACE}_reconcile_seconds",
            "Time to reconcile one key (a pod or a gang) and its job.",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.errors = Counter(
            f"{NAMESPACE}_errors_total",
            "Reconciles that failed and will be retried.",
            registry=self.registry,
        )
        self.pending_pods = Gauge(
            f"{NAMESPACE}_pending_pods",
            "Pods of this scheduler not bound yet (waiting for Slurm, or refused).",
            registry=self.registry,
        )
        self.slurm_requests = Gauge(
            f"{NAMESPACE}_slurm_requests",
            "REST requests sent to slurmrestd since the scheduler started.",
            registry=self.registry,
        )
        self.view_fresh = Gauge(
            f"{NAMESPACE}_slurm_view_fresh",
            "1 while the Slurm view is fresh; 0 while stale (the scheduler then waits).",
            registry=self.registry,
        )
