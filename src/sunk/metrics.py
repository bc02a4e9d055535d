"""What every sunk controller exports to Prometheus, under its own prefix."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ReconcileMetrics:
    """Reconcile time and failures."""

    def __init__(self, prefix: str, unit: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconcile_seconds = Histogram(
            f"{prefix}_reconcile_seconds",
            f"Time to reconcile {unit}.",
            registry=self.registry,
            buckets=RECONCILE_BUCKETS,
        )
        self.errors = Counter(
            f"{prefix}_errors_total",
            "Reconciles that failed and will be retried.",
            registry=self.registry,
        )

    @contextlib.contextmanager
    def reconciling(self) -> Iterator[None]:
        """Time one reconcile; count it as failed if it raises."""
        with self.reconcile_seconds.time():
            try:
                yield
            except Exception:
                self.errors.inc()
                raise


class ControllerMetrics(ReconcileMetrics):
    """Reconcile time and failures, and the health of the Slurm channel."""

    def __init__(
        self, prefix: str, component: str, unit: str, registry: CollectorRegistry | None = None
    ) -> None:
        super().__init__(prefix, f"one {unit}", registry)
        self.slurm_requests = Gauge(
            f"{prefix}_slurm_requests",
            f"REST requests sent to slurmrestd since the {component} started.",
            registry=self.registry,
        )
        self.view_fresh = Gauge(
            f"{prefix}_slurm_view_fresh",
            f"1 while the Slurm view is fresh; 0 while stale (the {component} then waits).",
            registry=self.registry,
        )
