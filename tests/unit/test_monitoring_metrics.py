"""What sunk derives for its alerts from the views it keeps (docs/observability.md)."""

from __future__ import annotations

import pytest

from sunk.scheduler.metrics import SchedulerMetrics
from sunk.slurm.models import Node
from sunk.syncer.decide import SlurmState, sunk_drainer
from sunk.syncer.metrics import SyncerMetrics
from sunk.syncer.slurm_adapter import slurm_state


@pytest.mark.parametrize(
    ("drained", "reason", "by"),
    [
        (True, "sunk/syncer: node cordoned", "syncer"),
        (True, "sunk/nodeset: replacing the pod for an update", "nodeset"),
        (True, "healthcheck: gpu: ECC errors", None),  # a health check's
        (True, "disk swap [alice@2026-11-01]", None),  # a person's
        (False, "sunk/syncer: node cordoned", None),  # resumed: the reason outlives it
    ],
)
def test_a_drain_is_sunks_by_its_reason(drained: bool, reason: str, by: str | None) -> None:
    node = SlurmState("n1", "IDLE", drained, reason, responding=True, busy=False)
    assert sunk_drainer(node) == by


def test_the_drain_age_comes_from_slurms_time_of_the_reason() -> None:
    node = Node.model_validate(
        {
            "name": "n1",
            "state": ["IDLE", "DRAIN"],
            "reason": "sunk/syncer: node cordoned",
            "reason_changed_at": {"set": True, "infinite": False, "number": 1_795_000_000},
        }
    )
    assert slurm_state(node).reason_since == 1_795_000_000


def test_the_alerts_series_are_exported() -> None:
    syncer, scheduler = SyncerMetrics(), SchedulerMetrics()
    syncer.sunk_drain_seconds.labels(slurm_node="n1", kube_node="k1", by="syncer").set(5)
    names = {m.name for r in (syncer, scheduler) for m in r.registry.collect()}
    assert {
        "sunk_syncer_sunk_drain_seconds",
        "sunk_scheduler_pods_waiting_on_slurm",
        "sunk_scheduler_slurm_wait_seconds",
        "sunk_syncer_slurm_view_fresh",
        "sunk_scheduler_slurm_view_fresh",
    } <= names
