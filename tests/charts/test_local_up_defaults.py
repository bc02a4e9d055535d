"""What the charts' defaults give, on `sunk local up`'s cluster:

- A pod as Kubernetes writes it by default: its 30 s grace period fits the
  slurm chart's KillWait, so the scheduler places it. KillWait is one value,
  slurm.conf's: a `helm upgrade` of the slurm release that shortens it
  reaches the scheduler without a restart (a default pod is refused, naming
  KillWait), and the upgrade back places the pod it refused. Why the test
  changes a Slurm value: an operator who shortens KillWait (jobs killed
  sooner after their SIGTERM) must see the scheduler follow it, not a
  second value left behind.
- A Deployment's pods (an inference service scaling) are placed through Slurm
  jobs and end them when scaled to zero.
- A pod a queue holds with a scheduling gate gets no Slurm job until the
  gate is removed.
- The slurmd pods are Burstable (memory requests), not BestEffort.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import PodSchedulingGate, PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from plugins.local_cluster import (
    JOB_ID,
    bound_job,
    job_state,
    kubectl,
    scheduler_pods,
    ssh,
    summary,
    tenant_pod,
    upgrade_slurm,
)
from plugins.slurm_pods import wait_for
from sunk_testbed.bed import NAMESPACE
from sunk_testbed.control_plane import async_client

pytestmark = pytest.mark.e2e


def default_pod(info: dict[str, Any], name: str) -> Pod:
    """The tenant pod with Kubernetes' default grace period (none set)."""
    pod = tenant_pod(info, name)
    assert pod.spec is not None
    pod.spec.terminationGracePeriodSeconds = None
    return pod


async def _events(cluster: Path, pod: str) -> str:
    proc = await asyncio.to_thread(
        kubectl, cluster, "get", "events", "-n", "default", "--field-selector",
        f"involvedObject.name={pod},reason=FailedScheduling", "-o", "jsonpath={.items[*].message}",
    )  # fmt: skip
    return proc.stdout


@pytest.mark.timeout(900)
async def test_a_default_pod_is_placed_and_kill_wait_follows_slurm_conf(
    local_cluster: Path,
) -> None:
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    values = yaml.safe_load((cluster / "cluster" / "slurm-values.yaml").read_text())
    assert "KillWait" not in values.get("slurmConfig", {})  # the chart's default
    restarts = scheduler_pods(cluster)
    names = ("default-grace", "after-shorter")
    try:
        await kube.create(default_pod(info, names[0]))
        await bound_job(kube, names[0], within=120)

        shorter = {**values, "slurmConfig": {**values.get("slurmConfig", {}), "KillWait": 20}}
        started = time.monotonic()
        await asyncio.to_thread(upgrade_slurm, cluster, shorter, "slurm-values-killwait.yaml")
        await kube.create(default_pod(info, names[1]))

        async def refused() -> bool:
            return "does not fit Slurm's KillWait (20s" in await _events(cluster, names[1])

        await wait_for("an Event naming KillWait 20", refused, timeout=120)
        print(f"KillWait=20 upgrade -> a default pod refused: {time.monotonic() - started:.1f}s")

        started = time.monotonic()
        await asyncio.to_thread(upgrade_slurm, cluster, values, "slurm-values.yaml")
        await bound_job(kube, names[1], within=180)
        print(f"upgrade back -> the refused pod placed: {time.monotonic() - started:.1f}s")
        assert scheduler_pods(cluster) == restarts  # the same pods, never restarted
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, name, namespace="default", grace_period=0)
        await kube.close()


@pytest.mark.timeout(300)
async def test_a_gated_pod_gets_no_job_until_its_last_gate_is_removed(local_cluster: Path) -> None:
    """A pod held by a queue (Kueue's admission gate, as Kueue writes it): no
    Slurm job and no status written by the scheduler while gated; placed once
    the gate is removed."""
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    pod = tenant_pod(info, "gated")
    assert pod.spec is not None
    pod.spec.schedulingGates = [PodSchedulingGate(name="kueue.x-k8s.io/admission")]
    since = ssh(cluster, "date +%Y-%m-%dT%H:%M:%S").strip()
    try:
        await kube.create(pod)
        await asyncio.sleep(20)
        listed = ssh(cluster, f"sacct -n -X -a -P -S {since} -o JobID,Submit,JobName")
        submitted = [row for row in listed.splitlines() if row.split("|")[1] >= since]
        assert submitted == [], listed
        held = await kube.get(Pod, "gated", namespace="default")
        assert held.spec is not None
        assert held.spec.nodeName is None
        conditions = (
            {c.type: c.reason for c in (held.status.conditions or [])} if held.status else {}
        )
        assert conditions.get("PodScheduled") == "SchedulingGated", conditions
        assert not await _events(cluster, "gated")

        ungated = time.monotonic()
        await kube.patch(
            Pod,
            "gated",
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            namespace="default",
            patch_type=PatchType.JSON,
        )
        await bound_job(kube, "gated", within=60)
        print(f"gate removed -> placed: {time.monotonic() - ungated:.1f}s")
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(Pod, "gated", namespace="default", grace_period=0)
        await kube.close()


def test_slurmd_pods_are_burstable(local_cluster: Path) -> None:
    """The chart's memory requests make them Burstable, not BestEffort. (The
    bed's NodeSet sets RealMemory itself, the nodes sharing one host's
    memory, so the subtraction of the pod's requests from allocatable is
    shown by tests/unit/test_nodeset_pure.py.)"""
    listed = kubectl(
        local_cluster, "get", "pods", "-n", NAMESPACE, "-l", "sunk.dev/nodeset", "-o", "json"
    )
    pods = json.loads(listed.stdout)["items"]
    assert pods
    for pod in pods:
        assert pod["status"]["qosClass"] == "Burstable", pod["metadata"]["name"]


@pytest.mark.timeout(400)
async def test_a_deployment_scales_up_through_slurm_and_down_ending_its_jobs(
    local_cluster: Path,
) -> None:
    """An inference service as platform teams deploy one: a Deployment whose
    pods name sunk's scheduler, with Kubernetes' default grace period. Scaled
    to two, each pod is placed through its own Slurm job; scaled to zero, the
    pods go and so do their jobs."""
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    template = default_pod(info, "unused")
    assert template.spec is not None
    # A tenth of a CPU in Kubernetes (Slurm allocates a whole one): on this
    # bed Slurm's daemons run on the compute nodes too, and their requests
    # leave less than two CPUs there for pods, which Slurm does not see.
    template.spec.containers[0].resources = ResourceRequirements(requests={"cpu": "100m"})
    labels = {"app": "inference"}
    deployment = Deployment(
        metadata=ObjectMeta(name="inference", namespace="default"),
        spec=DeploymentSpec(
            replicas=2,
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=template.spec),
        ),
    )
    jobs: set[str] = set()
    try:
        started = time.monotonic()
        await kube.create(deployment)

        async def placed() -> bool:
            pods = [p async for p in kube.list(Pod, namespace="default", labels=labels)]
            for pod in pods:
                job = ((pod.metadata.annotations if pod.metadata else None) or {}).get(JOB_ID)
                if job and pod.spec and pod.spec.nodeName:
                    jobs.add(job)
            return len(pods) == 2 and len(jobs) == 2

        await wait_for("both replicas placed through Slurm", placed, timeout=180)
        print(f"0 -> 2 replicas placed: {time.monotonic() - started:.1f}s")
        for job in jobs:  # asked until squeue answers (a busy controller can time out)

            async def running(job: str = job) -> bool:
                return await asyncio.to_thread(job_state, cluster, job) == "RUNNING"

            await wait_for(f"job {job} RUNNING in squeue", running, timeout=30)

        await kube.patch(Deployment, "inference", {"spec": {"replicas": 0}}, namespace="default")

        async def ended() -> bool:
            pods = [p async for p in kube.list(Pod, namespace="default", labels=labels)]
            states = [await asyncio.to_thread(job_state, cluster, job) for job in jobs]
            return not pods and not {"RUNNING", "PENDING"} & set(states)

        await wait_for("the replicas and their jobs gone", ended, timeout=120)
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(Deployment, "inference", namespace="default")
        async for pod in kube.list(Pod, namespace="default", labels=labels):
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, pod.metadata.name or "", namespace="default", grace_period=0)  # type: ignore[union-attr]
        await kube.close()
