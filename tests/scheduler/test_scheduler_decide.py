"""The scheduler's decision for one key (pure): a table of pods and job states
and the actions that follow, in order."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.decide import (
    STOP_MARGIN,
    Bind,
    Cancel,
    Decision,
    Drop,
    Evict,
    Pending,
    Submit,
    bound_to,
    decide,
)
from sunk.scheduler.request import (
    ANNOTATION_JOB_ID,
    GANG_NAME,
    GANG_SIZE,
    JOB_COMPLETION_INDEX,
    Gang,
    Workload,
)
from sunk.slurm.models import Job

NOW = 10_000.0
GANG = {GANG_NAME: "g", GANG_SIZE: "2"}


def pod(
    name: str = "p",
    *,
    node: str = "",
    phase: str = "Pending",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    job_id: int | None = None,
    gates: tuple[str, ...] = (),
    job: str = "",
) -> Pod:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": {ANNOTATION_JOB_ID: str(job_id)} if job_id else {},
    }
    if job:  # a pod of an indexed Job
        metadata["annotations"][JOB_COMPLETION_INDEX] = name
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job,
            "uid": "j",
            "controller": True,
        }
        metadata["ownerReferences"] = [owner]
    if deleting:
        metadata["deletionTimestamp"] = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    spec["terminationGracePeriodSeconds"] = 10
    if node:
        spec["nodeName"] = node
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return Pod.from_dict({"metadata": metadata, "spec": spec, "status": {"phase": phase}})


def job(state: str, **fields: Any) -> Job:
    return Job.model_validate({"job_id": 7, "job_state": [state], **fields})


PENDING, BOUND = pod(), pod(node="n1", phase="Running")
CARRIER = pod(job_id=7)  # a pending pod that carries its job's id
RUNNING = job("RUNNING", state_reason="None")
GANG_A, GANG_B = pod("a", labels=GANG), pod("b", labels=GANG)

CASES: dict[str, tuple[list[Pod], int | None, Job | None, Decision]] = {
    "pods gone: the job goes": ([], 7, RUNNING, Decision((Cancel("its pods are gone"),))),
    "a new pod: a job is asked for": ([PENDING], None, None, Decision((Submit((PENDING,), None),))),
    "its job runs: bound": ([PENDING], 7, RUNNING, Decision((Bind((PENDING,)),))),
    "its job waits: the pod says why": (
        [PENDING],
        7,
        job("PENDING", state_reason="Resources"),
        Decision((Pending((PENDING,), "Slurm job 7 pending: Resources", 7),)),
    ),
    "not looked at by Slurm yet: nothing said": (
        [PENDING],
        7,
        job("PENDING", state_reason="None"),
        Decision(),
    ),
    "its job forgotten by Slurm: evicted": (
        [CARRIER],
        7,
        None,
        Decision((Evict((CARRIER,), "Slurm job 7 is gone"),)),
    ),
    "its job cancelled before the bind: evicted": (
        [CARRIER],
        7,
        job("CANCELLED"),
        Decision((Evict((CARRIER,), "Slurm job 7 is CANCELLED"),)),
    ),
    "an ended job no live pod carries is history: a new job": (
        [pod("old", node="n1", phase="Failed", job_id=7), PENDING],
        7,
        job("CANCELLED"),
        Decision((Submit((PENDING,), None),)),
    ),
    "preempted before the bind: cancelled and evicted": (
        [PENDING],
        7,
        job("RUNNING", preempt_time=NOW - 1),
        Decision(
            (
                Cancel("preempted before its pods were bound"),
                Evict((PENDING,), "Slurm job 7 was preempted"),
            )
        ),
    ),
    "half a gang: its job dropped, the other waits": (
        [GANG_A, pod("b", labels=GANG, phase="Failed")],
        7,
        job("PENDING"),
        Decision(
            (
                Drop(7, ()),
                Cancel("the pods it was for are not all pending"),
                Pending((GANG_A,), "waiting for the gang: 1 of 2 pods"),
            )
        ),
    ),
    "a whole gang, no job yet": (
        [GANG_A, GANG_B],
        None,
        None,
        Decision((Submit((GANG_A, GANG_B), Gang("g", 2)),)),
    ),
    "a gated pod: no job until its gates are gone": (
        [pod(gates=("kueue.x-k8s.io/admission",))],
        None,
        None,
        Decision(),
    ),
    "a gang with one member gated: no job, the ungated one not told": (
        [GANG_A, pod("b", labels=GANG, gates=("example.com/quota",))],
        None,
        None,
        Decision(),
    ),
    "half a gang, the present one gated: nothing said over the apiserver": (
        [pod("a", labels=GANG, gates=("example.com/quota",))],
        None,
        None,
        Decision((Cancel("the pods it was for are not all pending"),)),
    ),
    "bound, no end in sight: nothing to do": ([BOUND], 7, RUNNING, Decision()),
    "bound, a time limit ahead: looked at again in time": (
        [BOUND],
        7,
        job("RUNNING", time_limit=60, end_time=NOW + 100),
        Decision(requeue_after=100 - 10 - STOP_MARGIN),
    ),
    "bound, the time limit near: evicted first": (
        [BOUND],
        7,
        job("RUNNING", time_limit=60, end_time=NOW + 10),
        Decision((Evict((BOUND,), "Slurm job 7 reaches its time limit"),)),
    ),
    "bound, its job ended: cancelled and evicted": (
        [BOUND],
        7,
        job("TIMEOUT"),
        Decision((Cancel("its pods no longer all run"), Evict((BOUND,), "Slurm job 7 is TIMEOUT"))),
    ),
    "a gang member succeeded: the others run on": (
        [pod("a", labels=GANG, node="n1", phase="Succeeded"), pod("b", labels=GANG, node="n2")],
        7,
        RUNNING,
        Decision(),
    ),
    "a gang member succeeded, one failed: the job ends": (
        [
            pod("a", labels=GANG, node="n1", phase="Succeeded"),
            pod("b", labels=GANG, node="n2", phase="Failed"),
        ],
        7,
        RUNNING,
        Decision((Cancel("its pods no longer all run"), Evict((), "Slurm job 7 is RUNNING"))),
    ),
    "bound and stopping: the job ends once they are gone": (
        [pod(node="n1", phase="Running", deleting=True)],
        7,
        RUNNING,
        Decision(),
    ),
}


JOB_A, JOB_B = pod("0", job="train"), pod("1", job="train")
TRAIN = Workload("Job", "train")

WORKLOAD_CASES: dict[str, tuple[list[Pod], dict[Workload, int], Decision]] = {
    "an indexed Job's pods, all there: one job for them": (
        [JOB_A, JOB_B],
        {TRAIN: 2},
        Decision((Submit((JOB_A, JOB_B), Gang("job-train", 2, TRAIN)),)),
    ),
    "an indexed Job's pods, one missing: they wait": (
        [JOB_A],
        {TRAIN: 2},
        Decision(
            (
                Cancel("the pods it was for are not all pending"),
                Pending((JOB_A,), "waiting for the gang: 1 of 2 pods"),
            )
        ),
    ),
    "its Job not read: they wait": (
        [JOB_A, JOB_B],
        {},
        Decision((Pending((JOB_A, JOB_B), "waiting to read the gang's size from Job train"),)),
    ),
}


@pytest.mark.parametrize("case", WORKLOAD_CASES)
def test_decide_for_workloads(case: str) -> None:
    pods, sizes, expected = WORKLOAD_CASES[case]
    assert decide(pods, None, None, NOW, sizes) == expected


@pytest.mark.parametrize("case", CASES)
def test_decide(case: str) -> None:
    pods, job_id, slurm_job, expected = CASES[case]
    assert decide(pods, job_id, slurm_job, NOW) == expected


def test_a_dropped_jobs_id_comes_off_the_pods_that_carry_it() -> None:
    carrier = pod("a", labels=GANG, job_id=7)
    decision = decide([carrier], 7, job("RUNNING"), NOW)
    assert decision.actions[0] == Drop(7, (carrier,))


def test_a_pod_this_process_bound_is_decided_as_bound() -> None:
    """A job event right after the bind, before the informer shows it: the pod
    as bound (`bound_to`) asks for nothing more, so no second Binding goes out."""
    pending = pod(job_id=7)
    assumed = bound_to(pending, "n1")
    assert assumed.spec is not None
    assert assumed.spec.nodeName == "n1"
    assert pending.spec is not None
    assert pending.spec.nodeName is None
    assert decide([pending], 7, RUNNING, NOW).actions
    assert decide([assumed], 7, RUNNING, NOW).actions == ()
    assert bound_to(BOUND, "n2") is BOUND
