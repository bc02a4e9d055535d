"""The scheduler's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sunk.metrics import ControllerMetrics

NAMESPACE = "sunk_scheduler"


class SchedulerMetrics(ControllerMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(NAMESPACE, "scheduler", "key (a pod or a gang) and its job", registry)
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
        self.pending_pods = Gauge(
            f"{NAMESPACE}_pending_pods",
            "Pods of this scheduler not bound yet (waiting for Slurm, or refused).",
            registry=self.registry,
        )
        self.waiting_on_slurm = Gauge(
            f"{NAMESPACE}_pods_waiting_on_slurm",
            "Pods not bound yet whose Slurm job is in Slurm's queue (refused pods,"
            " and pods not submitted yet, are not counted).",
            registry=self.registry,
        )
        self.slurm_wait_seconds = Gauge(
            f"{NAMESPACE}_slurm_wait_seconds",
            "Age of the oldest pod waiting on its Slurm job (since the pod was"
            " created); 0 when none waits.",
            registry=self.registry,
        )
