"""The scheduler's writes to pods (pure): what each patch says, and no write
when the pod says it already."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.api import CONDITION_SLURM_GPUS, TAINT_NODE_LOCK
from sunk.scheduler.pod_writes import (
    job_id_patch,
    lock_toleration_patch,
    pending_job_patch,
    slurm_gpus_patch,
    unschedulable_patch,
)
from sunk.scheduler.request import ANNOTATION_JOB_ID
from sunk.slurm.models import Job

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 25, 3, 0, 0, tzinfo=datetime.UTC)
EARLIER = "2026-11-25T02:00:00Z"


def pod(
    *,
    tolerations: list[dict[str, Any]] | None = None,
    job_id: int | None = None,
    scheduled: dict[str, Any] | None = None,
) -> Pod:
    return Pod.from_dict(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "annotations": {ANNOTATION_JOB_ID: str(job_id)} if job_id else {},
            },
            "spec": {"containers": [], "tolerations": tolerations or []},
            "status": {"conditions": [{"type": "PodScheduled", **scheduled}] if scheduled else []},
        }
    )


def test_the_job_id_is_written_and_taken_off() -> None:
    assert job_id_patch(7) == {"metadata": {"annotations": {ANNOTATION_JOB_ID: "7"}}}
    assert job_id_patch(None) == {"metadata": {"annotations": {ANNOTATION_JOB_ID: None}}}


@pytest.mark.parametrize(
    ("tolerations", "writes"),
    [
        ([], True),
        ([{"key": "other", "operator": "Exists"}], True),
        ([{"key": TAINT_NODE_LOCK, "operator": "Exists"}], False),
        ([{"operator": "Exists"}], False),  # tolerates every taint
        # Only one of the lock's two possible effects: the syncer may use the other.
        ([{"key": TAINT_NODE_LOCK, "operator": "Exists", "effect": "NoSchedule"}], True),
    ],
)
def test_the_lock_toleration_is_added_once(tolerations: list[dict[str, Any]], writes: bool) -> None:
    patch = lock_toleration_patch(pod(tolerations=tolerations), 7)
    if not writes:
        assert patch is None
        return
    assert patch is not None
    assert patch["metadata"]["annotations"] == {ANNOTATION_JOB_ID: "7"}
    # The whole list, the pod's own tolerations kept: a merge patch replaces lists.
    assert patch["spec"]["tolerations"] == [
        *tolerations,
        {"key": TAINT_NODE_LOCK, "operator": "Exists"},
    ]


def test_a_pending_jobs_id_is_written_only_when_it_differs() -> None:
    assert pending_job_patch(pod(), None) is None
    assert pending_job_patch(pod(job_id=7), 7) is None
    assert pending_job_patch(pod(job_id=6), 7) == job_id_patch(7)


def test_unschedulable_keeps_its_transition_time_while_it_stays_false() -> None:
    fresh = unschedulable_patch(pod(), "waiting", NOW)
    assert fresh == {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "waiting",
                    "lastTransitionTime": "2026-11-25T03:00:00Z",
                }
            ]
        }
    }
    was = {"status": "False", "message": "waiting", "lastTransitionTime": EARLIER}
    assert unschedulable_patch(pod(scheduled=was), "waiting", NOW) is None
    changed = unschedulable_patch(pod(scheduled=was), "Slurm job 7 pending: Priority", NOW)
    assert changed is not None
    assert changed["status"]["conditions"][0]["lastTransitionTime"] == EARLIER
    scheduled = {"status": "True", "lastTransitionTime": EARLIER}
    again = unschedulable_patch(pod(scheduled=scheduled), "waiting", NOW)
    assert again is not None
    assert again["status"]["conditions"][0]["lastTransitionTime"] == "2026-11-25T03:00:00Z"


def test_the_gpus_slurm_allocated_are_the_pods_condition() -> None:
    assert slurm_gpus_patch((1, 3), NOW) == {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_SLURM_GPUS,
                    "status": "True",
                    "reason": "AllocatedBySlurm",
                    "message": "1,3",
                    "lastTransitionTime": "2026-11-25T03:00:00Z",
                }
            ]
        }
    }


@pytest.mark.parametrize(
    ("nodes", "detail", "expected"),
    [
        ("n[1-2]", ("gpu:h100:2(IDX:0-1)", "gpu:1(IDX:3)"), {"n1": (0, 1), "n2": (3,)}),
        ("n1", ("gpu:h100:3(IDX:0,2-3),nic:1",), {"n1": (0, 2, 3)}),
        ("n1", ("nic:1(IDX:0)",), {}),  # not a GPU
        ("n[1-2]", ("", "gpu:1(IDX:1)"), {"n2": (1,)}),  # no GPU on n1
        ("n1", (), {}),  # a job with no GRES
    ],
)
def test_a_jobs_gpu_indices_per_node(
    nodes: str, detail: tuple[str, ...], expected: dict[str, tuple[int, ...]]
) -> None:
    assert Job(job_id=1, nodes=nodes, gres_detail=detail).gpu_indices() == expected
