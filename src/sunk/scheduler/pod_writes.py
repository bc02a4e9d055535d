"""The scheduler's writes to pods, built from the pod as read (pure).

Each builder returns the merge patch to send, or None when the pod already
says it: a reconcile that finds nothing to change writes nothing.
"""

from __future__ import annotations

import datetime
from typing import Any

from lightkube.models.core_v1 import Taint
from lightkube.resources.core_v1 import Pod

from sunk.api import CONDITION_SLURM_GPUS, TAINT_NODE_LOCK
from sunk.kube.matching import tolerates
from sunk.scheduler.decide import carries
from sunk.scheduler.request import ANNOTATION_JOB_ID

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
LOCK_EFFECTS = ("NoSchedule", "NoExecute")


def job_id_patch(job_id: int | None) -> dict[str, Any]:
    """Write the job id on the pod (None: take it off)."""
    value = None if job_id is None else str(job_id)
    return {"metadata": {"annotations": {ANNOTATION_JOB_ID: value}}}


def lock_toleration_patch(pod: Pod, job_id: int) -> dict[str, Any] | None:
    """Let the pod stay on a node Slurm locked for its job (the syncer's taint),
    with the job id; None for a pod that tolerates it already (its job id then
    rides on the Binding)."""
    have = (pod.spec.tolerations if pod.spec else None) or []
    # The syncer's lock is NoExecute or NoSchedule (its choice): both must be tolerated.
    if all(
        any(tolerates(t, Taint(key=TAINT_NODE_LOCK, effect=effect)) for t in have)
        for effect in LOCK_EFFECTS
    ):
        return None
    # Tolerations may only grow, which a merge patch of the whole list does.
    wanted = [*(t.to_dict() for t in have), {"key": TAINT_NODE_LOCK, "operator": "Exists"}]
    return {**job_id_patch(job_id), "spec": {"tolerations": wanted}}


def pending_job_patch(pod: Pod, job_id: int | None) -> dict[str, Any] | None:
    """The pending job's id on the pod, unless it is there already."""
    if job_id is None or carries(pod, job_id):
        return None
    return job_id_patch(job_id)


def unschedulable_patch(pod: Pod, message: str, now: datetime.datetime) -> dict[str, Any] | None:
    """PodScheduled=False, reason Unschedulable, with `message` (Slurm's words),
    for the pod's status (a strategic merge: conditions merge by type); the
    transition time kept while the condition stays False."""
    conditions = (pod.status.conditions if pod.status else None) or []
    have = next((c for c in conditions if c.type == "PodScheduled"), None)
    if have is not None and have.status == "False" and have.message == message:
        return None
    since = now
    if have is not None and have.status == "False" and have.lastTransitionTime:
        since = have.lastTransitionTime
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": since.strftime(TIME_FORMAT),
    }
    return {"status": {"conditions": [condition]}}


def slurm_gpus_patch(indices: tuple[int, ...], now: datetime.datetime) -> dict[str, Any]:
    """The GPUs Slurm allocated to the pod's job on its node, as the pod's
    status condition (strategic merge): the device plugin hands the pod
    exactly these."""
    condition = {
        "type": CONDITION_SLURM_GPUS,
        "status": "True",
        "reason": "AllocatedBySlurm",
        "message": ",".join(str(i) for i in indices),
        "lastTransitionTime": now.strftime(TIME_FORMAT),
    }
    return {"status": {"conditions": [condition]}}
