"""Preemption and QOS access as the slurm chart's defaults give them, on
`sunk local up`'s cluster (slurmdbd, the chart's accounting hook, real
kubelets):

- The chart made its QOS (inference preempts normal; high preempts both;
  GraceTime 30 s) and the account `research` granting them.
- The researcher's `sbatch --qos=high` preempts a running pod's job (in
  `normal`): the pod is evicted within the QOS's GraceTime (30 s) and the
  batch job runs.
- `sbatch --qos=high` in an account whose association lacks it is refused.

Inference pods preempting a training job, which is requeued and resumes,
and GPU TRES in sacct: tests/acceptance/test_default_install.py.

The bed's users run in the chart account `research` (sunk_testbed.charts,
`RESEARCH_ACCOUNT`), which grants normal, inference and high; the served
namespace's tenancy names it and those QOS. Their own accounts (the
directory group's; `users` with static identity) keep the cluster's QOS
list, normal alone. The hook itself: tests/unit/test_accounting_setup.py.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import ResourceRequirements
from lightkube.resources.core_v1 import Pod

from plugins.local_cluster import poll_ssh, ssh, summary, tenant_pod
from plugins.placed import bound_job
from plugins.slurm_pods import wait_for
from sunk_testbed.bed import USER_NAME
from sunk_testbed.charts import RESEARCH_ACCOUNT
from sunk_testbed.control_plane import async_client

pytestmark = pytest.mark.e2e

NODES = 3  # sunk local up's compute nodes
QOS_ANNOTATION = "sunk.dev/qos"
GRACE = 30  # the chart's QOS graceTime


def small_pod(info: dict[str, Any], name: str, qos: str | None = None) -> Pod:
    """A tenant pod asking a tenth of a CPU (Slurm allocates a whole one)."""
    pod = tenant_pod(info, name, {QOS_ANNOTATION: qos} if qos else None)
    assert pod.spec is not None
    pod.spec.containers[0].resources = ResourceRequirements(requests={"cpu": "100m"})
    return pod


def whole_cluster_job(cluster: Path, qos: str, requeue: bool = True) -> str:
    """A batch job of the researcher on every node, exclusively."""
    flags = "--requeue" if requeue else "--no-requeue"
    out = ssh(
        cluster,
        f"sbatch --parsable {flags} --account={RESEARCH_ACCOUNT} --qos={qos}"
        f" -N{NODES} --exclusive -t 10 --wrap 'sleep 600'",
    )
    return out.strip().split(";")[0]


async def pod_gone(kube: AsyncClient, name: str) -> bool:
    try:
        await kube.get(Pod, name, namespace="default")
    except ApiError as error:
        return error.status.code == 404
    return False


def test_the_chart_made_its_qos_and_the_research_account(local_cluster: Path) -> None:
    listed = ssh(local_cluster, "sacctmgr -n -P show qos format=name,preempt,gracetime")
    qos = {row.split("|")[0]: row.split("|")[1:] for row in listed.splitlines() if row}
    assert qos["inference"][0] == "normal"
    assert set(qos["high"][0].split(",")) == {"normal", "inference"}
    assert {qos[name][1] for name in ("normal", "inference", "high")} == {"00:00:30"}
    assoc = ssh(
        local_cluster,
        f"sacctmgr -n -P show assoc where user={USER_NAME} account={RESEARCH_ACCOUNT}"
        " format=account,qos",
    )
    assert set(assoc.strip().split("|")[1].split(",")) == {"normal", "inference", "high"}


@pytest.mark.timeout(600)
async def test_a_high_job_preempts_a_pods_job_and_the_pod_goes_within_grace(
    local_cluster: Path,
) -> None:
    cluster = local_cluster
    info = summary(cluster)
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    job = ""
    try:
        await kube.create(small_pod(info, "training-pod"))  # the tenancy's first QOS: normal
        pod_job = await bound_job(kube, "default", "training-pod", within=120)
        assert ssh(cluster, f"squeue -h -j {pod_job} -o %q").strip() == "normal"
        started = time.monotonic()
        job = whole_cluster_job(cluster, "high", requeue=False)
        await wait_for(
            "the preempted pod evicted", lambda: pod_gone(kube, "training-pod"), timeout=120
        )
        evicted = time.monotonic() - started
        print(f"high job submitted -> pod evicted: {evicted:.1f}s")
        assert evicted < GRACE + 10
        poll_ssh(cluster, f"squeue -h -j {job} -o %T", lambda s: s.strip() == "RUNNING", 60)
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(Pod, "training-pod", namespace="default", grace_period=0)
        if job:
            ssh(cluster, f"scancel {job} || true")
        await kube.close()


def test_high_is_refused_where_the_association_lacks_it(local_cluster: Path) -> None:
    """The researcher's own account (the directory group's) inherits the
    cluster's QOS list, normal alone: asking for high there is refused."""
    listed = ssh(
        local_cluster, f"sacctmgr -n -P show assoc where user={USER_NAME} format=account,qos"
    )
    others = [
        row.split("|")[0]
        for row in listed.splitlines()
        if row and row.split("|")[0] != RESEARCH_ACCOUNT
    ]
    if not others:
        pytest.skip("the researcher has no account besides research (static identity)")
    account = others[0]
    out = ssh(
        local_cluster,
        f"sbatch --account={account} --qos=high --wrap true 2>&1 || true",
    )
    assert "Invalid qos" in out or "invalid qos" in out.lower(), out
