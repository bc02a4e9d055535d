"""Both charts, installed by the real helm into the test bed, run by local nodes.

One module bed: the session's control plane, a local node runtime with four
nodes (three labelled for the NodeSet), the sunk-cluster chart (CRD, RBAC)
and the slurm chart with a backup controller, accounting, slurmrestd and a
login pod. `sunk operator` runs in-process as the chart's ServiceAccount (the
root filesystem has no Python). Everything a user does goes through ssh to
the login pod, as a plain user. The tests run in order and share the release.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.core_v1 import (
    HostPathVolumeSource,
    ObjectReference,
    PersistentVolumeClaimSpec,
    PersistentVolumeSpec,
    VolumeResourceRequirements,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import (
    ConfigMap,
    Namespace,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    Service,
    ServiceAccount,
)
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from plugins.local import runtime_for_tests
from sunk.api import nodeset as nodeset_api
from sunk.local.node import NodeConfig
from sunk.local.runtime import LocalRuntime
from sunk.operator import OperatorConfig, run_operator
from sunk.testbed import charts
from sunk.testbed.helm import Helm, HelmError, ensure_helm
from sunk.testbed.kube import KubeAccess, KubeControlPlane
from sunk.testbed.slurm import ensure_rootfs

pytestmark = pytest.mark.testbed
RELEASE = "hpc"
USER = charts.User("alice", 2000, "")
COMPUTE_NODES = 3
STATE_CLAIM = "ctld-state"
JOBSCRIPTS_LOG = "/home/jobscripts.log"
HEALTH_CHECK = """#!/bin/sh
if [ -e "/home/unhealthy-$(hostname)" ]; then
  echo "GPU 3 fell off the bus"
  exit 1
fi
"""
# The e2e user is no Slurm admin; this root script on the node stands in for a
# person with scontrol (state=drain or state=resume, when a marker says so).
ADMIN_BY_MARKER = """#!/bin/sh
node=$(hostname)
for marker in /home/admin-*-"$node"; do
  [ -e "$marker" ] || continue
  action=${marker#/home/admin-}
  action=${action%-"$node"}
  rm -f "$marker"
  scontrol update nodename="$node" state="$action" reason="bad DIMM, ticket 42"
done
"""
ADMIN_REASON = "bad DIMM, ticket 42"


@dataclass
class ChartBed:
    kube: AsyncClient
    helm: Helm
    runtime: LocalRuntime
    namespace: str
    state: Path
    key: Path
    values: dict[str, Any]
    compute_nodes: list[str]

    async def login_address(self) -> str:
        return await charts.wait_until(
            "a ready login pod",
            lambda: charts.pod_ip(self.kube, self.namespace, charts.component(RELEASE, "login")),
            120,
        )

    async def ssh(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` in a login shell of the plain user on the login pod."""
        address = await self.login_address()
        argv = charts.ssh_argv(self.key, USER.name, address, [command])
        proc = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=120, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{command!r} failed ({proc.returncode}): {proc.stderr}")
        return proc

    async def poll_ssh(self, what: str, command: str, pattern: str, timeout: float) -> str:
        async def matches() -> str | None:
            proc = await self.ssh(command, check=False)
            return proc.stdout if re.search(pattern, proc.stdout) else None

        out: str = await charts.wait_until(what, matches, timeout, interval=1)
        return out

    def upgrade(self, values: dict[str, Any]) -> str:
        return self.helm.upgrade_install(
            RELEASE, "slurm", self.namespace, values, values_file=self.state / "values.yaml"
        )

    async def restarts(self) -> dict[str, tuple[str, int]]:
        """Every pod of the release: its uid and total restart count."""
        out = {}
        async for pod in self.kube.list(Pod, namespace=self.namespace):
            assert pod.metadata is not None
            assert pod.status is not None
            count = sum(c.restartCount for c in pod.status.containerStatuses or [])
            out[pod.metadata.name or ""] = (pod.metadata.uid or "", count)
        return out


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def bed(
    kube_control_plane: KubeControlPlane, kube_access: KubeAccess, kube: AsyncClient
) -> AsyncIterator[ChartBed]:
    rootfs = await asyncio.to_thread(ensure_rootfs)
    helm_binary = await asyncio.to_thread(ensure_helm, print)
    state = Path(tempfile.mkdtemp(prefix="sunk-ch-", dir="/tmp"))
    tag = secrets.token_hex(2)
    # Compute, two controller nodes (so that one can fail) and one for the rest.
    pools = [charts.COMPUTE_POOL] * COMPUTE_NODES + ["controller"] * 2 + ["services"]
    nodes = [
        NodeConfig(
            f"ch{tag}-{pool[:4]}{i}",
            cpu="8",
            memory="16Gi",
            labels={charts.NODE_POOL_LABEL: pool},
        )
        for i, pool in enumerate(pools, start=1)
    ]
    runtime = runtime_for_tests(state / "nodes", rootfs, nodes, kube_control_plane, kube_access)
    namespace = f"charts-{tag}"
    helm = Helm(helm_binary, kube_access.admin_kubeconfig, state / "helm")
    key = state / "id_ed25519"
    user = charts.User(USER.name, USER.uid, charts.new_ssh_key(key))
    charts.make_homes(state / "home", [user])
    values = charts.slurm_values(users=[user], home=state / "home", backup=True)
    # HA needs a state volume both controllers mount: a host directory here
    # (every local node shares the host's), as ReadWriteMany storage would be.
    values["controller"]["persistence"]["existingClaim"] = STATE_CLAIM
    values["controller"]["nodeSelector"] = {charts.NODE_POOL_LABEL: "controller"}
    for part in ("login", "restapi", "accounting"):
        values.setdefault(part, {})["nodeSelector"] = {charts.NODE_POOL_LABEL: "services"}
    values["accounting"]["mariadb"]["nodeSelector"] = {charts.NODE_POOL_LABEL: "services"}
    # Job scripts run by run-parts on the compute pods, as root; /home is shared.
    values["prolog"] = {"10-record": f"#!/bin/sh\necho prolog $SLURM_JOB_ID >> {JOBSCRIPTS_LOG}\n"}
    values["epilog"] = {"90-record": f"#!/bin/sh\necho epilog $SLURM_JOB_ID >> {JOBSCRIPTS_LOG}\n"}
    # A health check that fails on a node while /home holds a marker naming it.
    values["healthCheck"] = {
        "interval": 2,
        "scripts": {"05-admin": ADMIN_BY_MARKER, "10-marker": HEALTH_CHECK},
    }
    operator: asyncio.Task[None] | None = None
    try:
        await runtime.start()
        await kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        await _shared_state_claim(kube, namespace, state / "ctld-state")
        await asyncio.to_thread(
            helm.upgrade_install,
            "sunk",
            "sunk-cluster",
            namespace,
            charts.cluster_values(RELEASE, replicas=0),
            values_file=state / "cluster-values.yaml",
        )
        await asyncio.to_thread(
            helm.upgrade_install,
            RELEASE,
            "slurm",
            namespace,
            values,
            values_file=state / "values.yaml",
        )
        restd = await charts.wait_until(
            "slurmrestd ready",
            lambda: charts.pod_ip(kube, namespace, charts.component(RELEASE, "slurmrestd")),
            180,
        )
        jwt = await charts.secret_file(
            kube, namespace, f"{RELEASE}-jwt", "jwt_hs256.key", state / "jwt.key"
        )
        account = await charts.service_account_kubeconfig(
            kube,
            kube_access.server,
            kube_access.ca_file,
            namespace,
            "sunk-operator",
            state / "operator.kubeconfig",
        )
        operator = asyncio.create_task(
            run_operator(
                OperatorConfig(
                    slurmrestd_url=f"http://{restd}:{charts.RESTAPI_PORT}",
                    jwt_key_file=jwt,
                    slurm_user="slurm",
                    kubeconfig=account,
                    namespace=namespace,
                    lease_namespace=namespace,
                )
            )
        )
        yield ChartBed(
            kube,
            helm,
            runtime,
            namespace,
            state,
            key,
            values,
            [f"compute-{n.name}" for n in nodes[:COMPUTE_NODES]],
        )
    finally:
        if operator is not None:
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await operator
        for release in (RELEASE, "sunk"):
            with contextlib.suppress(HelmError):
                await asyncio.to_thread(helm.uninstall, release, namespace)
        with contextlib.suppress(Exception):
            await kube.deletecollection(Pod, namespace=namespace, grace_period=0)
        with contextlib.suppress(Exception):
            await kube.delete(Namespace, namespace)
        with contextlib.suppress(Exception):
            await kube.delete(PersistentVolume, namespace)
        await runtime.stop(delete_nodes=True)
        shutil.rmtree(state, ignore_errors=True)


async def _shared_state_claim(kube: AsyncClient, namespace: str, path: Path) -> None:
    await asyncio.to_thread(path.mkdir)
    await kube.create(
        PersistentVolume(
            metadata=ObjectMeta(name=namespace),
            spec=PersistentVolumeSpec(
                capacity={"storage": "1Gi"},
                accessModes=["ReadWriteMany"],
                hostPath=HostPathVolumeSource(path=str(path)),
                storageClassName="",
                persistentVolumeReclaimPolicy="Retain",
                claimRef=ObjectReference(name=STATE_CLAIM, namespace=namespace),
            ),
        )
    )
    await kube.create(
        PersistentVolumeClaim(
            metadata=ObjectMeta(name=STATE_CLAIM, namespace=namespace),
            spec=PersistentVolumeClaimSpec(
                accessModes=["ReadWriteMany"],
                storageClassName="",
                volumeName=namespace,
                resources=VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        )
    )


async def test_sinfo_on_the_login_pod_lists_the_nodeset_nodes_idle(bed: ChartBed) -> None:
    out = await bed.poll_ssh(
        "the NodeSet's nodes idle in sinfo",
        "sinfo -h -N -o '%N %t'",
        "".join([f"(?=[\\s\\S]*{n} idle)" for n in bed.compute_nodes]),
        300,
    )
    listed = dict(line.split() for line in out.splitlines() if line.strip())
    assert listed == dict.fromkeys(bed.compute_nodes, "idle")


async def test_sbatch_runs_to_completion_and_sacct_shows_it(bed: ChartBed) -> None:
    proc = await bed.ssh("cd && sbatch --parsable -N1 --wrap 'echo hello from $(hostname)'")
    job = proc.stdout.strip().split(";")[0]
    await bed.poll_ssh(
        f"job {job} completed in sacct",
        f"sacct -n -X -j {job} -o JobID,State,User -P",
        rf"^{job}\|COMPLETED\|{USER.name}",
        120,
    )
    out = (await bed.ssh(f"cat ~/slurm-{job}.out")).stdout
    assert out.startswith("hello from compute-")
    await bed.poll_ssh(
        "prolog.d and epilog.d ran for the job",
        f"cat {JOBSCRIPTS_LOG}",
        rf"(?s)prolog {job}\n.*epilog {job}\n",
        60,
    )


async def test_srun_on_three_nodes_prints_three_names(bed: ChartBed) -> None:
    out = (await bed.ssh(f"srun -N{COMPUTE_NODES} hostname")).stdout.split()
    assert sorted(out) == sorted(bed.compute_nodes)


async def test_a_failing_health_check_drains_its_idle_node_until_it_passes(bed: ChartBed) -> None:
    node = bed.compute_nodes[0]
    marker = bed.state / "home" / f"unhealthy-{node}"
    marker.touch()
    try:
        await bed.poll_ssh(
            "the health check to drain the node with its reason",
            f"scontrol -o show node {node}",
            r"State=\S*DRAIN.* Reason=healthcheck: 10-marker: GPU 3 fell off the bus \[",
            60,
        )
    except TimeoutError as late:
        shown = (await bed.ssh(f"scontrol -o show node {node}", check=False)).stdout
        logs = sorted(bed.runtime.pods_dir().glob(f"*_{node}_*/logs/slurmd/*"))
        tail = logs[-1].read_text(errors="replace")[-2000:] if logs else "(no slurmd log)"
        raise AssertionError(f"{late}\n{shown}\nslurmd log:\n{tail}") from None
    finally:
        marker.unlink()
    await bed.poll_ssh(
        "the health check to resume the node", f"sinfo -h -n {node} -o %t", r"^idle\n", 60
    )


async def test_the_health_check_leaves_a_persons_drain_alone(bed: ChartBed) -> None:
    node = bed.compute_nodes[1]
    home = bed.state / "home"

    async def reason_stays(seconds: float) -> None:
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            shown = (await bed.ssh(f"scontrol -o show node {node}")).stdout
            assert f"Reason={ADMIN_REASON} [" in shown, shown
            await asyncio.sleep(1)

    (home / f"admin-drain-{node}").touch()
    await bed.poll_ssh(
        "the person's drain", f"scontrol -o show node {node}", rf"Reason={ADMIN_REASON} \[", 60
    )
    marker = home / f"unhealthy-{node}"
    marker.touch()
    try:
        await reason_stays(8)  # four health-check passes: not overwritten
    finally:
        marker.unlink()
    await reason_stays(8)  # and not resumed once the checks pass
    (home / f"admin-resume-{node}").touch()
    await bed.poll_ssh("the person's resume", f"sinfo -h -n {node} -o %t", r"^idle\n", 60)


async def test_a_config_change_reaches_slurm_without_restarting_any_pod(bed: ChartBed) -> None:
    before = await bed.restarts()
    values = dict(bed.values)
    values["slurmConfig"] = {**values["slurmConfig"], "MaxJobCount": 12345}
    await asyncio.to_thread(bed.upgrade, values)
    bed.values = values
    await bed.poll_ssh(
        "MaxJobCount in scontrol show config",
        "scontrol show config | grep -i '^MaxJobCount'",
        r"MaxJobCount\s*=\s*12345",
        120,
    )
    # The slurmd saw it too: jobs still run everywhere.
    out = (await bed.ssh(f"srun -N{COMPUTE_NODES} hostname")).stdout.split()
    assert len(out) == COMPUTE_NODES
    assert await bed.restarts() == before


async def test_a_config_slurm_rejects_is_refused_before_it_reaches_the_cluster(
    bed: ChartBed,
) -> None:
    config = await bed.kube.get(ConfigMap, f"{RELEASE}-config", namespace=bed.namespace)
    values = dict(bed.values)
    values["slurmConfig"] = {**values["slurmConfig"], "SelectType": "select/no-such-plugin"}
    with pytest.raises(HelmError) as failed:
        await asyncio.to_thread(bed.upgrade, values)
    assert "validate-config" in str(failed.value)
    after = await bed.kube.get(ConfigMap, f"{RELEASE}-config", namespace=bed.namespace)
    assert after.data == config.data
    await bed.poll_ssh("the controller still up", "scontrol ping", r"is UP", 30)


async def test_the_backup_controller_serves_squeue_when_the_primary_dies(
    bed: ChartBed,
) -> None:
    await bed.poll_ssh(
        "both controllers up",
        "scontrol ping",
        r"(?s)primary.*is UP.*backup.*is UP",
        180,
    )
    # Queued work that must survive: held jobs stay pending.
    proc = await bed.ssh("cd && sbatch --parsable --hold --wrap 'sleep 1'")
    job = proc.stdout.strip().split(";")[0]
    primary_node = await _node_of(bed, f"{RELEASE}-slurmctld-0")
    await bed.runtime.stop_node(primary_node)
    try:
        out = await bed.poll_ssh(
            "the backup answering squeue",
            f"squeue -h -j {job} -o '%i %T'",
            rf"^{job} PENDING",
            120,
        )
        assert job in out
        ping = (await bed.ssh("scontrol ping", check=False)).stdout
        assert re.search(r"backup\) at \S+ is UP", ping), ping
    finally:
        await bed.runtime.start_node(primary_node)
    # The primary takes its place again once its node is back.
    await bed.poll_ssh(
        "the primary back in charge",
        "scontrol ping",
        r"(?s)primary\) at \S+ is UP.*backup\) at \S+ is UP",
        240,
    )
    await bed.poll_ssh("the held job still queued", f"squeue -h -j {job} -o %T", "PENDING", 60)


@pytest.mark.timeout(600)  # two uninstalls, the pre-delete drain, then the wait
async def test_helm_uninstall_leaves_nothing(bed: ChartBed) -> None:
    await asyncio.to_thread(bed.helm.uninstall, RELEASE, bed.namespace)
    await asyncio.to_thread(bed.helm.uninstall, "sunk", bed.namespace)
    ns = bed.namespace
    leftover_kinds: list[Any] = [
        Pod,
        Deployment,
        StatefulSet,
        Job,
        Service,
        ConfigMap,
        Secret,
        PersistentVolumeClaim,
        nodeset_api.resource(),
    ]

    async def leftovers() -> list[str]:
        found = []
        for kind in leftover_kinds:
            async for obj in bed.kube.list(kind, namespace=ns):
                name = obj.metadata.name if obj.metadata else ""
                # The namespace's own CA bundle; the test's own state claim.
                if name not in ("kube-root-ca.crt", STATE_CLAIM):
                    found.append(f"{kind.__name__}/{name}")
        async for pv in bed.kube.list(PersistentVolume):
            claim = pv.spec.claimRef if pv.spec else None
            if claim is not None and claim.namespace == ns and claim.name != STATE_CLAIM:
                found.append(f"PersistentVolume/{pv.metadata.name if pv.metadata else ''}")
        return found

    try:
        await charts.wait_until("the release's objects gone", lambda: _none(leftovers), 180)
    except TimeoutError as error:
        raise AssertionError(f"left behind: {await leftovers()}") from error
    accounts = [a.metadata.name async for a in bed.kube.list(ServiceAccount, namespace=ns)]
    assert accounts == ["default"]
    helm_made = {"app.kubernetes.io/managed-by": "Helm"}
    for kind in (ClusterRole, ClusterRoleBinding):
        names = [o.metadata.name async for o in bed.kube.list(kind, labels=helm_made) if o.metadata]
        assert not names


async def _none(listing: Callable[[], Awaitable[list[str]]]) -> bool:
    return not await listing()


async def _node_of(bed: ChartBed, pod: str) -> str:
    obj = await bed.kube.get(Pod, pod, namespace=bed.namespace)
    assert obj.spec is not None
    assert obj.spec.nodeName
    return obj.spec.nodeName
