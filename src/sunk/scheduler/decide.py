"""What the scheduler does for one key, given its pods and its job (pure).

The loop (`controller.py`) reads a key's pods and its Slurm job as they are
now and carries out the actions `decide` returns, in order; a table test
drives `decide` (tests/scheduler/test_scheduler_decide.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.request import ANNOTATION_JOB_ID, Gang, Workload, gang_of, grace_seconds
from sunk.slurm.models import Job

ACTIVE = ("PENDING", "RUNNING", "SUSPENDED")
# A pod told to stop for its job's time limit is gone its grace period plus
# this before the limit: the kubelet's kill and report, the pod's removal and
# the job's cancel take seconds on a busy node (at 1 s, Slurm's limit ended a
# job first, TIMEOUT, in one CI run).
STOP_MARGIN = 5.0


def pod_annotations(pod: Pod) -> dict[str, str]:
    return dict((pod.metadata.annotations if pod.metadata else None) or {})


def terminal(pod: Pod) -> bool:
    return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))


def succeeded(pod: Pod) -> bool:
    return bool(pod.status and pod.status.phase == "Succeeded")


def carries(pod: Pod, job_id: int | None) -> bool:
    """The pod carries `job_id` as its job (written when the job was submitted for it)."""
    return job_id is not None and pod_annotations(pod).get(ANNOTATION_JOB_ID) == str(job_id)


def deleting(pod: Pod) -> bool:
    return bool(pod.metadata and pod.metadata.deletionTimestamp)


def gated(pod: Pod) -> bool:
    """The pod has scheduling gates left (a queue such as Kueue holds it):
    no scheduler may place it, and the apiserver itself says SchedulingGated."""
    return bool(pod.spec and pod.spec.schedulingGates)


def bound(pod: Pod) -> bool:
    return bool(pod.spec and pod.spec.nodeName)


def bound_to(pod: Pod, node: str) -> Pod:
    """A copy of the pod bound to `node` (the pod itself if it is bound already)."""
    if pod.spec is None or bound(pod):
        return pod
    return msgspec.structs.replace(pod, spec=msgspec.structs.replace(pod.spec, nodeName=node))


def active(job: Job | None) -> bool:
    return job is not None and job.state in ACTIVE


def eviction_reason(job_id: int | None, job: Job | None) -> str:
    if job is None:
        return f"Slurm job {job_id} is gone"
    if job.state == "RUNNING" and job.preempt_time:
        return f"Slurm job {job_id} was preempted"
    reason = job.state_reason if job.state_reason not in ("", "None") else ""
    return f"Slurm job {job_id} is {job.state}" + (f" ({reason})" if reason else "")


def time_to_stop(job: Job, pods: Sequence[Pod], now: float) -> float | None:
    """Seconds until the pods must be told to stop so that they are gone before
    Slurm ends their allocation (0: now), or None while it has no end in sight.

    A preempted job runs on for its GraceTime, then ends: the pods go at once,
    and the scheduler cancels the job as soon as they are gone. A time limit
    ends the job: the pods go their grace period, and STOP_MARGIN, before it.
    """
    if job.preempt_time:
        return 0.0
    if job.time_limit is None or not job.end_time:
        return None
    grace = max((grace_seconds(p) for p in pods), default=0)
    return max(0.0, job.end_time - grace - STOP_MARGIN - now)


@dataclass(frozen=True)
class Cancel:
    """End the job (as its owner)."""

    why: str


@dataclass(frozen=True)
class Evict:
    """Delete the pods, with an Event saying why."""

    pods: tuple[Pod, ...]
    why: str


@dataclass(frozen=True)
class Bind:
    """Bind the pods to the nodes of their running job."""

    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class Submit:
    """Ask Slurm for a job for the pods (after looking for one: never twice)."""

    pods: tuple[Pod, ...]
    gang: Gang | None


@dataclass(frozen=True)
class Pending:
    """Tell the pods why they wait (PodScheduled=False and an Event)."""

    pods: tuple[Pod, ...]
    message: str
    job_id: int | None = None


@dataclass(frozen=True)
class Drop:
    """The job is no longer the pods': remember it as dropped, and take its id
    off the pods that carry it (a restarted scheduler would take the ended job
    for theirs and evict them once the gang is whole again)."""

    job_id: int
    carriers: tuple[Pod, ...]


Action = Cancel | Evict | Bind | Submit | Pending | Drop


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None


def decide(
    pods: Sequence[Pod],
    job_id: int | None,
    job: Job | None,
    now: float,
    sizes: Mapping[Workload, int] | None = None,
) -> Decision:
    """The next step for a key whose pods are `pods` and whose job is `job`
    (`job_id` known but `job` None: Slurm no longer knows it); `sizes` are the
    gang sizes of the JobSets and indexed Jobs among the pods' owners."""
    if not pods:
        return Decision((Cancel("its pods are gone"),))
    live = tuple(p for p in pods if not terminal(p) and not deleting(p))
    if (
        live
        and not active(job)
        and not any(map(bound, live))
        and not any(carries(p, job_id) for p in live)
    ):
        # An earlier attempt of the same workload (a Job's or JobSet's pods made
        # anew after a failure): its ended job and finished pods are history,
        # and the new pods get a job of their own.
        pods = [p for p in pods if not terminal(p)]
        job_id, job = None, None
    gang = gang_of(live[0], sizes) if live else None
    if gang is not None and gang.size == 0:
        told = tuple(p for p in live if not gated(p))
        return Decision((Pending(told, f"waiting to read the gang's size from {gang.workload}"),))
    wanted = gang.size if gang is not None else 1
    if any(map(bound, live)) or (
        job is not None and job.state == "RUNNING" and any(map(bound, pods))
    ):
        return _keep_running(pods, live, job_id, job, wanted, now)
    # Nothing bound yet.
    if len(live) < wanted or len(live) < len(pods):
        # Pods of the gang missing or finished (or the pod itself deleted): no job may run.
        actions: list[Action] = []
        if job_id is not None and active(job):
            carriers = tuple(p for p in live if ANNOTATION_JOB_ID in pod_annotations(p))
            actions.append(Drop(job_id, carriers))
        actions.append(Cancel("the pods it was for are not all pending"))
        told = tuple(p for p in live if not gated(p))  # the apiserver tells gated ones
        if told and len(live) < wanted:
            actions.append(Pending(told, f"waiting for the gang: {len(live)} of {wanted} pods"))
        return Decision(tuple(actions))
    if job is not None and not active(job):
        # Cancelled, timed out or failed before it could be bound: the pods go too.
        return Decision((Evict(live, eviction_reason(job_id, job)),))
    if job is None:
        if job_id is not None:  # its job is gone
            return Decision((Evict(live, eviction_reason(job_id, None)),))
        if any(map(gated, live)):
            # No job while any pod of it is gated: removing the last gate is a
            # pod update, which brings the key back here.
            return Decision()
        return Decision((Submit(live, gang),))
    if job.state == "RUNNING":
        if job.preempt_time:  # preempted before the pods ran: they go with it
            return Decision(
                (
                    Cancel("preempted before its pods were bound"),
                    Evict(live, eviction_reason(job_id, job)),
                )
            )
        return Decision((Bind(live),))
    if job.state_reason != "None":  # "None": Slurm has not looked at it yet
        message = f"Slurm job {job_id} {job.state.lower()}: {job.state_reason}"
        return Decision((Pending(live, message, job_id),))
    return Decision()


def _keep_running(
    pods: Sequence[Pod],
    live: tuple[Pod, ...],
    job_id: int | None,
    job: Job | None,
    wanted: int,
    now: float,
) -> Decision:
    """Pods are (partly) bound: they stay only while their job runs, all of them."""
    running = job is not None and job.state == "RUNNING"
    # Members that succeeded leave the others running: the job ends once all are done.
    done = sum(1 for p in pods if succeeded(p) and not deleting(p))
    if running and live and len(live) + done == len(pods) == wanted:
        assert job is not None
        left = time_to_stop(job, live, now)
        if left == 0:
            # Slurm ends the allocation soon: the pods go first; the job is
            # cancelled once they are gone (which frees the nodes early).
            soon = "was preempted" if job.preempt_time else "reaches its time limit"
            return Decision((Evict(live, f"Slurm job {job_id} {soon}"),))
        unbound = tuple(p for p in live if not bound(p))
        return Decision((Bind(unbound),) if unbound else (), requeue_after=left)
    if running and not any(map(terminal, pods)) and all(map(deleting, pods)):
        return Decision()  # they are stopping; the job ends once they are gone
    # A member finished or was deleted, or the job ended or was requeued: end it all.
    return Decision(
        (Cancel("its pods no longer all run"), Evict(live, eviction_reason(job_id, job)))
    )
