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

JobSets and LeaderWorkerSets, made by their real controllers, are shown on
the charts' defaults: tests/acceptance/test_default_install.py.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.batch_v1 import JobSpec
from lightkube.models.core_v1 import PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from plugins.local_cluster import poll_ssh, summary, tenant_pod
from plugins.placed import bound_together, labelled_pods, none_bound
from plugins.slurm_pods import wait_for
from sunk_testbed.control_plane import async_client

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


async def delete_job(kube: AsyncClient, name: str) -> None:
    with contextlib.suppress(ApiError):
        await kube.delete(Job, name, namespace="default", cascade=CascadeType.BACKGROUND)
    for pod in await labelled_pods(kube, "default", "job-name", name):
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
        slurm_job = await bound_together(kube, "default", "job-name", "gang", NODES)
        shown = poll_ssh(
            local_cluster, f"squeue -h -j {slurm_job} -o %D", lambda s: bool(s.strip()), 30
        )
        assert shown.strip() == str(NODES)

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


async def unplaced_job(
    cluster: Path, name: str, parallelism: int, completions: int, says: str
) -> str:
    """Create an indexed Job that cannot be placed; what its pods are told."""
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    try:
        await kube.create(indexed_job(info, name, parallelism, completions))
        return await none_bound(kube, "default", "job-name", name, parallelism, says)
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
