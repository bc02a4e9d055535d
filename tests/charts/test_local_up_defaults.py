"""What the charts' defaults give, on `sunk local up`'s cluster:

- A pod as Kubernetes writes it by default: its 30 s grace period fits the
  slurm chart's KillWait, so the scheduler places it. KillWait is one value,
  slurm.conf's: a `helm upgrade` of the slurm release that shortens it
  reaches the scheduler without a restart (a default pod is refused, naming
  KillWait), and the upgrade back places the pod it refused. Why the test
  changes a Slurm value: an operator who shortens KillWait (jobs killed
  sooner after their SIGTERM) must see the scheduler follow it, not a
  second value left behind.
- The slurmd pods are Burstable (memory requests), not BestEffort.

A Deployment scaled through Slurm and a gated pod held until ungated are
shown on the charts' defaults: tests/acceptance/test_default_install.py.
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
from lightkube.resources.core_v1 import Pod

from plugins.local_cluster import (
    kubectl,
    scheduler_pods,
    summary,
    tenant_pod,
    upgrade_slurm,
)
from plugins.placed import bound_job
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
        await bound_job(kube, "default", names[0], within=120)

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
        await bound_job(kube, "default", names[1], within=180)
        print(f"upgrade back -> the refused pod placed: {time.monotonic() - started:.1f}s")
        assert scheduler_pods(cluster) == restarts  # the same pods, never restarted
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, name, namespace="default", grace_period=0)
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
