"""`helm upgrade` of a Slurm 24.11 cluster to 26.05, with a job running through it.

The module installs both charts on the session's real nodes with the 24.11
images (Debian trixie's Slurm), starts a job, and upgrades the slurm release
to the default images (Debian forky's 26.05) by nothing but the image tags,
as a user would. Slurm's order is slurmdbd, then slurmctld, then slurmd:
slurmctld's `wait-for-slurmdbd` init container holds the new controller until
the new slurmdbd answers, and the NodeSet controller replaces a slurmd only
once its node is drained and idle, so the running job keeps its 24.11 slurmd
to the end and then the node comes back on 26.05.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import secrets
import shlex
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from plugins.chart_releases import install_both, remove_both
from plugins.login_shell import LoginShell
from plugins.mpi import ALLREDUCE
from plugins.nodes import RealNodes
from plugins.slurm_pods import node_states
from sunk_testbed import charts
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.helm import Helm, ensure_helm
from sunk_testbed.images import DEFAULT_SLURM, ImageSet

pytestmark = pytest.mark.e2e
RELEASE = "up"
USER = charts.User("carol", 2100, "")
COMPUTE_NODES = 3  # the MPI test's ranks, one per slurmd pod
OLD, NEW = "24.11", DEFAULT_SLURM
# Long enough to outlive the controller's upgrade, short enough for CI.
JOB_SECONDS = 90


async def _container_started(
    kube: AsyncClient, namespace: str, component: str, container: str
) -> list[datetime.datetime]:
    """When `container` of each running pod of `component` last started."""
    started = []
    selector = charts.component(RELEASE, component)
    async for pod in kube.list(Pod, namespace=namespace, labels=selector):
        if pod.metadata is None or pod.metadata.deletionTimestamp is not None:
            continue
        for status in (pod.status.containerStatuses if pod.status else None) or []:
            running = status.state.running if status.state else None
            if status.name == container and running is not None and running.startedAt:
                started.append(running.startedAt)
    return started


@dataclass
class Upgrade:
    shell: LoginShell
    helm: Helm
    state: Path
    user: charts.User
    images: ImageSet
    nodes: list[str]  # the Slurm nodes
    homes_class: str

    def values(self, release: str) -> dict[str, object]:
        return charts.slurm_values(
            users=[self.user],
            homes_class=self.homes_class,
            images=self.images,
            slurm_release=release,
        )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(
    kubelet_nodes: RealNodes, kube_access: KubeAccess, kube: AsyncClient, shared_storage: str
) -> AsyncIterator[Upgrade]:
    helm_binary = await asyncio.to_thread(ensure_helm, print)
    state = Path(tempfile.mkdtemp(prefix="sunk-up-", dir="/tmp"))
    helm = Helm(helm_binary, kube_access.admin_kubeconfig, state / "helm")
    namespace = f"upgrade-{secrets.token_hex(2)}"
    names = kubelet_nodes.names[:COMPUTE_NODES]
    before = await node_states(kube, kubelet_nodes.names)
    key = state / "id_ed25519"
    user = charts.User(USER.name, USER.uid, charts.new_ssh_key(key))
    shell = LoginShell(kube, namespace, RELEASE, key, USER.name)
    computes = [f"compute-{n}" for n in names]
    made = Upgrade(shell, helm, state, user, kubelet_nodes.images, computes, shared_storage)
    # The same NodeSet before and after: only the image's tag changes.
    slurmd_pods = charts.render_slurmd_pod_allowance(
        helm, RELEASE, namespace, made.values(OLD), state / "values.yaml"
    )
    cluster_values = charts.cluster_values(
        RELEASE, made.images.sunk, namespace=namespace, slurmd_pods=slurmd_pods
    )
    # The operator alone runs the NodeSet through the upgrade; the syncer and
    # the scheduler have e2e modules of their own.
    cluster_values["syncer"]["replicas"] = cluster_values["scheduler"]["replicas"] = 0
    try:
        for name in names:
            labels = {charts.NODE_POOL_LABEL: charts.COMPUTE_POOL}
            await kube.patch(
                Node, name, {"metadata": {"labels": labels}}, patch_type=PatchType.MERGE
            )
        await kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        await charts.apply_volumes(kube, state / "volumes")
        await install_both(helm, kube, namespace, state, cluster_values, RELEASE, made.values(OLD))
        yield made
    finally:
        await remove_both(helm, kube, namespace, RELEASE, state, before)


async def idle_on(shell: LoginShell, nodes: list[str], version: str, timeout: float) -> None:
    """Every node idle in sinfo, its slurmd of `version`."""
    idle = "".join(f"(?=[\\s\\S]*{n} idle {re.escape(version)})" for n in nodes)
    await shell.poll_ssh(f"{nodes} idle on {version}", "sinfo -h -N -o '%N %t %v'", idle, timeout)


async def test_srun_mpi_pmix_on_24_11_all_reduces_across_three_slurmd_pods(
    cluster: Upgrade,
) -> None:
    """Direct launch of Open MPI by Slurm (`srun --mpi=pmix`), no mpirun: Debian
    builds Slurm's PMIx plugin for 24.11 (trixie) and no longer for 26.05
    (docs/training.md), so it runs here, before the upgrade. One rank per
    slurmd pod; the ranks sum 8 MiB each over the pods' network."""
    shell, nodes = cluster.shell, cluster.nodes
    await idle_on(shell, nodes, OLD, 180)
    run = await shell.ssh(
        f"srun --mpi=pmix -N{len(nodes)} --ntasks-per-node=1 -t 1 "
        f"python3 -c {shlex.quote(ALLREDUCE)} 2>&1",
        check=False,
    )
    assert run.returncode == 0, run.stdout
    result = next(line for line in run.stdout.splitlines() if line.startswith("ranks "))
    assert result.split() == ["ranks", "3", "sum", "6", "buffer", "6.0", "hosts", *nodes]


async def test_metrics_on_24_11_are_refused_naming_the_value(
    cluster: Upgrade, kube: AsyncClient
) -> None:
    """`metrics.enabled` (on by default) needs Slurm 25.11: on 24.11 images the
    chart's config check refuses the upgrade naming the value, before
    anything changes, instead of slurmctld's own error at start."""
    values = cluster.values(OLD)
    values["metrics"] = {"enabled": True}
    with pytest.raises(RuntimeError) as refused:
        await charts.install(
            cluster.helm,
            kube,
            RELEASE,
            "slurm",
            cluster.shell.namespace,
            values,
            values_file=cluster.state / "values-metrics.yaml",
        )
    said = re.search(r"metrics\.enabled: (\S+ \S+) has no OpenMetrics", str(refused.value))
    assert said is not None, refused.value
    assert said[1].split()[1].startswith("24.11."), said[1]
    assert "set metrics.enabled=false for this image" in str(refused.value)
    await cluster.shell.poll_ssh("the controller still up", "scontrol ping", r"is UP", 30)


async def test_a_running_job_survives_helm_upgrade_from_24_11_to_26_05(
    cluster: Upgrade, kube: AsyncClient
) -> None:
    shell, nodes = cluster.shell, cluster.nodes
    await idle_on(shell, nodes, OLD, 180)
    submitted = await shell.ssh(f"sbatch --parsable -N1 -w {nodes[0]} --wrap 'sleep {JOB_SECONDS}'")
    job = submitted.stdout.strip()
    await shell.poll_ssh("the job running", f"squeue -h -j {job} -o %T", r"RUNNING", 60)

    await charts.install(
        cluster.helm,
        kube,
        RELEASE,
        "slurm",
        shell.namespace,
        cluster.values(NEW),
        values_file=cluster.state / "values-upgraded.yaml",
    )
    # The controller answers on 26.05 while the job still runs on its 24.11 slurmd.
    await shell.poll_ssh(
        f"slurmctld on {NEW}",
        "scontrol show config | grep -E '^SLURM_VERSION'",
        rf"SLURM_VERSION\s*=\s*{re.escape(NEW)}\.",
        240,
    )
    # Still running, unless a slow upgrade outlasted it (sacct below says how it ended).
    # Asked until squeue answers: the StatefulSet may still be replacing the
    # other controller, and a client can meet neither for a moment (seen in CI).
    answer = await shell.poll_ssh(
        "squeue answering",
        f"squeue -h -j {job} -o '%T %N' && echo squeue-answered",
        r"squeue-answered",
        60,
    )
    running = answer.replace("squeue-answered", "").split()
    assert running in ([], ["RUNNING", nodes[0]], ["COMPLETING", nodes[0]])
    # Slurm's order: the new slurmctld started after the new slurmdbd.
    [dbd] = await _container_started(kube, shell.namespace, "slurmdbd", "slurmdbd")
    [ctld] = await _container_started(kube, shell.namespace, "slurmctld", "slurmctld")
    assert ctld >= dbd, (ctld, dbd)

    await shell.poll_ssh(
        "the job completed, in sacct",
        f"sacct -n -X -P -j {job} -o JobID,State,ExitCode",
        rf"^{job}\|COMPLETED\|0:0",
        JOB_SECONDS + 120,
    )
    await idle_on(shell, nodes, NEW, 240)
    slurmds = await _container_started(kube, shell.namespace, "slurmd", "slurmd")
    assert len(slurmds) == len(nodes)
    for started in slurmds:
        assert started >= ctld, (started, ctld)
