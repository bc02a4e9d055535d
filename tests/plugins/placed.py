"""Pods as sunk's scheduler places them, read from Kubernetes: which are
bound, when, through which Slurm job, and what the unplaced ones are told.
Every helper names the namespace: `sunk local up` serves `default`, the
acceptance module its tenant's namespace."""

from __future__ import annotations

import asyncio
import time

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from plugins.slurm_pods import wait_for
from sunk.scheduler.request import ANNOTATION_JOB_ID

# The clock a pod's conditions carry whole seconds of: two pods bound in the
# same instant may read one second apart, so "together" allows one more.
BOUND_TOGETHER_S = 2


async def labelled_pods(kube: AsyncClient, namespace: str, label: str, value: str) -> list[Pod]:
    return [p async for p in kube.list(Pod, namespace=namespace, labels={label: value})]


def scheduled_at(pod: Pod) -> float | None:
    """When the pod was bound (its PodScheduled condition), if it was."""
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "True":
            return (
                condition.lastTransitionTime.timestamp() if condition.lastTransitionTime else None
            )
    return None


def waiting_message(pod: Pod) -> str:
    """What the scheduler told an unbound pod (its PodScheduled=False message)."""
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or ""
    return ""


def slurm_job_of(pod: Pod) -> str:
    return ((pod.metadata.annotations if pod.metadata else None) or {}).get(ANNOTATION_JOB_ID, "")


async def bound_job(kube: AsyncClient, namespace: str, name: str, within: float) -> str:
    """The Slurm job of pod `name`, once the scheduler bound it (within `within` s)."""
    found: dict[str, str] = {}

    async def bound() -> bool:
        pod = await kube.get(Pod, name, namespace=namespace)
        if pod.spec and pod.spec.nodeName:
            found["job"] = slurm_job_of(pod)
        return bool(found.get("job"))

    await wait_for(f"pod {name} bound through Slurm", bound, timeout=within)
    return found["job"]


async def bound_together(
    kube: AsyncClient, namespace: str, label: str, value: str, count: int, within: float = 180
) -> str:
    """Wait until `count` pods labelled so are bound; the one Slurm job they
    share, after checking each is on a node of its own and that they were
    bound together. (The caller asks Slurm how many nodes the job holds.)"""
    started = time.monotonic()

    async def all_bound() -> bool:
        pods = await labelled_pods(kube, namespace, label, value)
        return len(pods) == count and all(p.spec and p.spec.nodeName for p in pods)

    await wait_for(f"{count} pods of {value} bound", all_bound, timeout=within)
    pods = await labelled_pods(kube, namespace, label, value)
    times = [t for p in pods if (t := scheduled_at(p)) is not None]
    print(
        f"{value}: {count} pods bound {time.monotonic() - started:.1f} s after it was made,"
        f" spread {max(times) - min(times):.0f} s"
    )
    assert len({p.spec.nodeName for p in pods if p.spec}) == count  # one node each
    assert max(times) - min(times) <= BOUND_TOGETHER_S
    jobs = {slurm_job_of(p) for p in pods}
    assert len(jobs) == 1, jobs  # one Slurm job for all of them
    (job,) = jobs
    assert job
    return job


async def none_bound(
    kube: AsyncClient, namespace: str, label: str, value: str, count: int, says: str
) -> str:
    """What the `count` pods labelled so are told, once each says `says`, none
    of them bound."""

    async def all_told() -> bool:
        pods = await labelled_pods(kube, namespace, label, value)
        return len(pods) == count and all(says in waiting_message(p) for p in pods)

    await wait_for(f"every pod of {value} told {says!r}", all_told, timeout=120)
    await asyncio.sleep(10)  # a gang placed in part would show by now
    pods = await labelled_pods(kube, namespace, label, value)
    assert not [p for p in pods if p.spec and p.spec.nodeName], "a pod was bound"
    return waiting_message(pods[0])
