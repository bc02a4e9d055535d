"""Kubernetes workloads as users submit them, placed through Slurm as gangs on
`sunk local up`'s cluster with the charts' defaults: the pods come from
Kubernetes' own Job controller (kube-controller-manager), and the scheduler
reads each Job's spec for its gang's size with the chart's credentials.

- An indexed Job of three (parallelism = completions = 3) is one Slurm job
  over the three nodes: all three pods bound together, each on its own node;
  members that finish first leave the others running, and the Job completes.
- An indexed Job of four on three nodes: none of its pods is bound (Slurm
  cannot place four nodes), and they say why.
- An indexed Job that would run in waves (completions above parallelism) is
  refused, naming the fields.
- A JobSet (a driver and two workers) and a LeaderWorkerSet group of three,
  made by the real JobSet and LeaderWorkerSet controllers (built from their
  Go modules, installed from their own charts: sunk_testbed.workloads), are
  each one Slurm job over three nodes, all pods bound together; a JobSet of
  five on three nodes binds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.models.batch_v1 import JobSpec
from lightkube.models.core_v1 import PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from plugins.local_cluster import JOB_ID, cluster_helm, poll_ssh, summary, tenant_pod
from plugins.slurm_pods import wait_for
from sunk.scheduler.request import JOBSET_NAME, LWS_NAME
from sunk_testbed.control_plane import async_client
from sunk_testbed.workloads import (
    JobSet,
    LeaderWorkerSet,
    ensure_workload_images,
    install_controllers,
)

pytestmark = pytest.mark.e2e

NODES = 3  # sunk local up's compute nodes


def indexed_job(info: dict[str, Any], name: str, parallelism: int, completions: int) -> Job:
    """An indexed Job for sunk's scheduler: each pod asks a tenth of a CPU (Slurm
    allocates a whole node's share) and runs a little longer the higher its
    index, so the members finish one after another."""
    template = tenant_pod(info, "unused")
    assert template.spec is not None
    container = template.spec.containers[0]
    container.command = ["sh", "-c", "sleep $((4 + 3 * JOB_COMPLETION_INDEX))"]
    container.resources = ResourceRequirements(requests={"cpu": "100m"})
    template.spec.restartPolicy = "Never"
    return Job(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=JobSpec(
            completionMode="Indexed",
            parallelism=parallelism,
            completions=completions,
            backoffLimit=0,
            template=PodTemplateSpec(spec=template.spec),
        ),
    )


async def labelled_pods(kube: AsyncClient, label: str, value: str) -> list[Pod]:
    return [p async for p in kube.list(Pod, namespace="default", labels={label: value})]


def scheduled_at(pod: Pod) -> float | None:
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "True":
            return (
                condition.lastTransitionTime.timestamp() if condition.lastTransitionTime else None
            )
    return None


def waiting_message(pod: Pod) -> str:
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or ""
    return ""


async def delete_job(kube: AsyncClient, name: str) -> None:
    with contextlib.suppress(ApiError):
        await kube.delete(Job, name, namespace="default", cascade=CascadeType.BACKGROUND)
    for pod in await labelled_pods(kube, "job-name", name):
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        with contextlib.suppress(ApiError):
            await kube.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)


@pytest.mark.timeout(400)
async def test_an_indexed_job_is_one_slurm_job_bound_all_together(local_cluster: Path) -> None:
    info = summary(local_cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    try:
        started = time.monotonic()
        await kube.create(indexed_job(info, "gang", NODES, NODES))
        slurm_job = await bound_as_one_job(local_cluster, kube, "job-name", "gang", NODES)

        async def complete() -> bool:
            job = await kube.get(Job, "gang", namespace="default")
            return bool(job.status and job.status.succeeded == NODES)

        # Index 0 finishes six seconds before index 2: the others run on.
        await wait_for("the Job complete, every index succeeded", complete, timeout=120)
        print(f"created -> Job complete {time.monotonic() - started:.1f}s")
        poll_ssh(
            local_cluster,
            f"squeue -h -j {slurm_job} -o %T 2>/dev/null || true",
            lambda s: s.strip() in ("", "COMPLETING"),
            60,
        )
    finally:
        await delete_job(kube, "gang")
        await kube.close()


async def none_bound(kube: AsyncClient, label: str, value: str, count: int, says: str) -> str:
    """What the `count` pods labelled so are told, once each says `says`, none
    of them bound."""

    async def all_told() -> bool:
        pods = await labelled_pods(kube, label, value)
        return len(pods) == count and all(says in waiting_message(p) for p in pods)

    await wait_for(f"every pod of {value} told {says!r}", all_told, timeout=120)
    await asyncio.sleep(10)  # a gang placed in part would show by now
    pods = await labelled_pods(kube, label, value)
    assert not [p for p in pods if p.spec and p.spec.nodeName], "a pod was bound"
    return waiting_message(pods[0])


async def unplaced_job(
    cluster: Path, name: str, parallelism: int, completions: int, says: str
) -> str:
    """Create an indexed Job that cannot be placed; what its pods are told."""
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    try:
        await kube.create(indexed_job(info, name, parallelism, completions))
        return await none_bound(kube, "job-name", name, parallelism, says)
    finally:
        await delete_job(kube, name)
        await kube.close()


@pytest.mark.timeout(300)
async def test_an_indexed_job_larger_than_the_cluster_binds_none(local_cluster: Path) -> None:
    told = await unplaced_job(local_cluster, "too-big", NODES + 1, NODES + 1, "Slurm")
    print(f"4 pods on 3 nodes: {told}")


@pytest.mark.timeout(300)
async def test_an_indexed_job_in_waves_is_refused_naming_its_fields(local_cluster: Path) -> None:
    told = await unplaced_job(local_cluster, "waves", 2, 6, "completions (6)")
    print(f"completions above parallelism: {told}")
    assert "exceed parallelism (2)" in told


_INSTALLED: set[Path] = set()  # clusters the controllers are on


@pytest_asyncio.fixture
async def workload_controllers(local_cluster: Path) -> AsyncIterator[AsyncClient]:
    """JobSet's and LeaderWorkerSet's controllers on the cluster, as a platform
    team installs them beside sunk (once per cluster, left there: the cluster
    goes after the last local-up module); a client of the cluster's admin."""
    info = summary(local_cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    if local_cluster not in _INSTALLED:
        helm = cluster_helm(local_cluster)
        images = await asyncio.to_thread(ensure_workload_images, print)
        started = time.monotonic()
        values = local_cluster / "cluster" / "workloads"
        await install_controllers(helm, kube, images, values, print)
        print(f"JobSet and LWS controllers installed: {time.monotonic() - started:.1f}s")
        _INSTALLED.add(local_cluster)
    try:
        yield kube
    finally:
        await kube.close()


def sunk_pod_spec(info: dict[str, Any], command: str, restart: str) -> dict[str, Any]:
    template = tenant_pod(info, "unused")
    assert template.spec is not None
    container = template.spec.containers[0]
    container.command = ["sh", "-c", command]
    container.resources = ResourceRequirements(requests={"cpu": "100m"})
    template.spec.restartPolicy = restart
    return template.spec.to_dict()


def replicated_job(
    info: dict[str, Any], name: str, replicas: int, parallelism: int
) -> dict[str, Any]:
    spec = sunk_pod_spec(info, "sleep 5", "Never")
    job = {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0}
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {**job, "template": {"spec": spec}}},
    }


@contextlib.asynccontextmanager
async def created(kube: AsyncClient, obj: Any) -> AsyncIterator[None]:
    """`obj` made in `default` for the block, deleted after it."""
    await kube.create(obj)
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(type(obj), obj.metadata.name, namespace="default")


def jobset(info: dict[str, Any], name: str, worker_jobs: int) -> Any:
    """A JobSet of a driver (one pod) and `worker_jobs` Jobs of two workers."""
    replicated = [
        replicated_job(info, "driver", 1, 1),
        replicated_job(info, "workers", worker_jobs, 2),
    ]
    spec = {"replicatedJobs": replicated}
    return JobSet(metadata=ObjectMeta(name=name, namespace="default"), spec=spec)


async def bound_as_one_job(
    cluster: Path, kube: AsyncClient, label: str, value: str, count: int
) -> str:
    """Wait until `count` pods labelled so are bound; the one Slurm job they
    share, after checking each is on a node of its own, that they were bound
    together and that the job holds `count` nodes."""
    started = time.monotonic()

    async def all_bound() -> bool:
        pods = await labelled_pods(kube, label, value)
        return len(pods) == count and all(p.spec and p.spec.nodeName for p in pods)

    await wait_for(f"{count} pods of {value} bound", all_bound, timeout=180)
    print(f"{value}: all {count} pods bound {time.monotonic() - started:.1f}s after it was made")
    pods = await labelled_pods(kube, label, value)
    assert len({p.spec.nodeName for p in pods if p.spec}) == count  # one node each
    times = [t for p in pods if (t := scheduled_at(p)) is not None]
    print(f"{value}: bind spread across the gang {max(times) - min(times):.1f}s")
    assert max(times) - min(times) <= 2  # bound together (conditions carry whole seconds)
    jobs = {(p.metadata.annotations or {}).get(JOB_ID, "") for p in pods if p.metadata}
    assert len(jobs) == 1, jobs  # one Slurm job for all of them
    (slurm_job,) = jobs
    assert slurm_job
    shown = poll_ssh(cluster, f"squeue -h -j {slurm_job} -o %D", lambda s: bool(s.strip()), 30)
    assert shown.strip() == str(count)
    return slurm_job


@pytest.mark.timeout(600)
async def test_a_jobset_is_one_slurm_job_bound_all_together(
    local_cluster: Path, workload_controllers: AsyncClient
) -> None:
    kube = workload_controllers
    async with created(kube, jobset(summary(local_cluster), "train", 1)):
        await bound_as_one_job(local_cluster, kube, JOBSET_NAME, "train", NODES)

        async def completed() -> bool:
            got = await kube.get(JobSet, "train", namespace="default")
            conditions = (got.status or {}).get("conditions") or []
            return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

        await wait_for("the JobSet Completed", completed, 180)


@pytest.mark.timeout(300)
async def test_a_jobset_larger_than_the_cluster_binds_none(
    local_cluster: Path, workload_controllers: AsyncClient
) -> None:
    kube = workload_controllers
    async with created(kube, jobset(summary(local_cluster), "wide", 2)):
        told = await none_bound(kube, JOBSET_NAME, "wide", 5, "Slurm")
    print(f"a JobSet of 5 on 3 nodes: {told}")


@pytest.mark.timeout(600)
async def test_a_leaderworkerset_group_is_one_slurm_job_bound_all_together(
    local_cluster: Path, workload_controllers: AsyncClient
) -> None:
    kube = workload_controllers
    info = summary(local_cluster)
    template = {
        "size": NODES,
        "workerTemplate": {"spec": sunk_pod_spec(info, "sleep 3600", "Always")},
    }
    spec = {"replicas": 1, "leaderWorkerTemplate": template}
    serve = LeaderWorkerSet(metadata=ObjectMeta(name="serve", namespace="default"), spec=spec)
    async with created(kube, serve):
        await bound_as_one_job(local_cluster, kube, LWS_NAME, "serve", NODES)
