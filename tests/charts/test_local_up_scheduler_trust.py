"""The scheduler against what login users and tenants write, on `sunk local up`'s
cluster (the charts' defaults): a job comment in any script does not stop it,
and a gang name no label could hold is refused, not submitted again and again.

The login user is the cluster's `researcher` over ssh (`sbatch`), the tenant
the pods of `default`, the namespace `sunk local up` grants; the scheduler acts
with the credentials the chart gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod

from plugins.local_cluster import (
    job_state,
    kubectl,
    scheduler_pods,
    ssh,
    summary,
    tenant_pod,
)
from plugins.placed import bound_job, slurm_job_of
from plugins.slurm_pods import wait_for
from sunk_testbed.control_plane import async_client

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
async def test_a_job_comment_in_any_script_leaves_the_scheduler_running(
    local_cluster: Path,
) -> None:
    """A login user's held job whose comment looks sealed but holds non-ASCII
    text (once a TypeError out of the job index that crash-looped every
    scheduler replica): deleted, the scheduler's pods come back and place a new
    pod within 30 s, and the job it placed before is still known as its own
    (deleting that pod ends that job)."""
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    held = ssh(
        cluster, "sbatch --parsable --hold --comment='sunk:x seal=1000:é' --wrap true"
    ).strip()
    try:
        await kube.create(tenant_pod(info, "before-restart"))
        before = await bound_job(kube, "default", "before-restart", within=120)
        deleted = kubectl(
            cluster, "delete", "pods", "-n", "slurm", "--wait=false", *scheduler_pods(cluster)
        )
        assert deleted.returncode == 0, deleted.stderr
        restarted = time.monotonic()
        await kube.create(tenant_pod(info, "after-restart"))
        try:
            after = await bound_job(kube, "default", "after-restart", within=30)
        except AssertionError:
            logs = kubectl(cluster, "logs", "-n", "slurm", "deploy/sunk-scheduler", "--tail=60")
            pods = kubectl(cluster, "get", "pods", "-n", "slurm", "-o", "wide")
            raise AssertionError(f"{pods.stdout}\n{logs.stdout}{logs.stderr}") from None
        print(f"a new pod placed {time.monotonic() - restarted:.1f}s after the deletion")
        assert after != before
        assert all(restarts == 0 for restarts in scheduler_pods(cluster).values())
        # The job index still holds the job placed before the restart: it is the
        # pod's (not cancelled as an orphan, not replaced) and ends with it.
        assert await asyncio.to_thread(job_state, cluster, before) == "RUNNING"
        pod = await kube.get(Pod, "before-restart", namespace="default")
        assert pod.metadata is not None
        assert slurm_job_of(pod) == before
        await kube.delete(Pod, "before-restart", namespace="default")

        async def ended() -> bool:
            state = await asyncio.to_thread(job_state, cluster, before)
            return state not in ("RUNNING", "PENDING")

        await wait_for(f"job {before} to end with its pod", ended, timeout=60)
        assert await asyncio.to_thread(job_state, cluster, held) == "PENDING"
    finally:
        ssh(cluster, f"scancel {held}")
        for name in ("before-restart", "after-restart"):
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, name, namespace="default")
        await kube.close()


@pytest.mark.timeout(300)
async def test_a_gang_name_with_a_space_is_refused_and_submits_nothing(
    local_cluster: Path,
) -> None:
    """Annotations may hold spaces; a gang named so once made a comment the
    scheduler could not read back, and a new job on every look. Now: an Event
    naming the rule, and not one job in Slurm over 60 s."""
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    since = ssh(cluster, "date +%Y-%m-%dT%H:%M:%S").strip()
    gang = {"sunk.dev/gang": "a b", "sunk.dev/gang-size": "2"}
    names = ("spaced-0", "spaced-1")
    try:
        for name in names:
            await kube.create(tenant_pod(info, name, gang))

        async def refused() -> bool:
            events = await asyncio.to_thread(
                kubectl,
                cluster,
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                f"involvedObject.name={names[0]},reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            )
            return "sunk.dev/gang: 'a b' is not a label value" in events.stdout

        await wait_for("an Event naming the gang's rule", refused, timeout=60)
        await asyncio.sleep(60)
        # Jobs submitted since the pods were created (sacct -S also lists older
        # jobs that still ran then).
        listed = ssh(cluster, f"sacct -n -X -a -P -S {since} -o JobID,Submit,JobName")
        submitted = [row for row in listed.splitlines() if row.split("|")[1] >= since]
        assert submitted == [], listed
        for name in names:
            pod = await kube.get(Pod, name, namespace="default")
            assert pod.spec is not None
            assert pod.spec.nodeName is None
            assert not slurm_job_of(pod)
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, name, namespace="default")
        await kube.close()
