"""Both charts, installed by the real helm into the test bed, on real nodes.

One module bed: the session's control plane and its five real nodes (kubelet +
containerd; three labelled for the NodeSet, two for the controllers), the
sunk-cluster chart with the operator from sunk's image, and the slurm chart
(from the slurm and login images, with Slurm's production settings) with a
backup controller, accounting, slurmrestd and a login pod. Everything a user
does goes through ssh to the login pod, as a plain user. The tests run in
order and share the release.
"""

from __future__ import annotations

import asyncio
import re
import secrets
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
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    Service,
    ServiceAccount,
)
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from plugins.chart_releases import install_both, remove_both
from plugins.login_shell import LoginShell
from plugins.nodes import RealNodes
from plugins.slurm_pods import node_states, wait_for
from sunk.api import nodeset as nodeset_api
from sunk_testbed import charts
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.helm import Helm, HelmError, ensure_helm
from sunk_testbed.nodes import nodes_ready

pytestmark = pytest.mark.e2e
RELEASE = "hpc"
USER = charts.User("alice", 2000, "")
COMPUTE_NODES = 3
STATE_CLAIM = "ctld-state"
# Files the test reads and writes on the host, seen by the compute pods (a
# hostPath): the job scripts' record and the markers that stand in for a
# failing GPU and for a person with scontrol. The users' homes are the
# chart's shared claim.
MARKERS = "/var/lib/bed-markers"
JOBSCRIPTS_LOG = f"{MARKERS}/jobscripts.log"
HEALTH_CHECK = f"""#!/bin/sh
if [ -e "{MARKERS}/unhealthy-$(hostname)" ]; then
  echo "GPU 3 fell off the bus"
  exit 1
fi
"""
# The e2e user is no Slurm admin; this root script on the node stands in for a
# person with scontrol (state=drain or state=resume, when a marker says so).
ADMIN_BY_MARKER = f"""#!/bin/sh
node=$(hostname)
for marker in {MARKERS}/admin-*-"$node"; do
  [ -e "$marker" ] || continue
  action=${{marker#{MARKERS}/admin-}}
  action=${{action%-"$node"}}
  rm -f "$marker"
  scontrol update nodename="$node" state="$action" reason="bad DIMM, ticket 42"
done
"""
ADMIN_REASON = "bad DIMM, ticket 42"


@dataclass
class ChartBed(LoginShell):
    helm: Helm
    nodes: RealNodes
    state: Path
    values: dict[str, Any]
    compute_nodes: list[str]

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
    kubelet_nodes: RealNodes, kube_access: KubeAccess, kube: AsyncClient, shared_storage: str
) -> AsyncIterator[ChartBed]:
    helm_binary = await asyncio.to_thread(ensure_helm, print)
    state = Path(tempfile.mkdtemp(prefix="sunk-ch-", dir="/tmp"))
    namespace = f"charts-{secrets.token_hex(2)}"
    names = kubelet_nodes.names
    # Three compute nodes, two controller nodes (so that one can be powered off)
    # and the services on the first compute node, which stays on.
    pools = [charts.COMPUTE_POOL] * COMPUTE_NODES + ["controller"] * 2
    assert len(names) >= len(pools)
    before = await node_states(kube, names)
    helm = Helm(helm_binary, kube_access.admin_kubeconfig, state / "helm")
    key = state / "id_ed25519"
    user = charts.User(USER.name, USER.uid, charts.new_ssh_key(key))
    values = charts.slurm_values(
        users=[user], homes_class=shared_storage, images=kubelet_nodes.images, backup=True
    )
    # HA needs a state volume both controllers mount: a host directory here
    # (every node shares the host's), as ReadWriteMany storage would be.
    values["controller"]["persistence"]["existingClaim"] = STATE_CLAIM
    values["controller"]["nodeSelector"] = {charts.NODE_POOL_LABEL: "controller"}
    services = {"kubernetes.io/hostname": names[0]}
    for part in ("login", "restapi", "accounting"):
        values.setdefault(part, {})["nodeSelector"] = services
    values["accounting"]["mariadb"]["nodeSelector"] = services
    markers = state / "markers"
    markers.mkdir()
    values["nodesets"][0]["volumes"] = [
        {"name": "markers", "hostPath": {"path": str(markers), "type": "Directory"}}
    ]
    values["nodesets"][0]["volumeMounts"] = [{"name": "markers", "mountPath": MARKERS}]
    # Job scripts run by run-parts on the compute pods, as root (a site's
    # per-job set-up and clean-up): these record each job.
    values["prolog"] = {"10-record": f"#!/bin/sh\necho prolog $SLURM_JOB_ID >> {JOBSCRIPTS_LOG}\n"}
    values["epilog"] = {"90-record": f"#!/bin/sh\necho epilog $SLURM_JOB_ID >> {JOBSCRIPTS_LOG}\n"}
    # A health check that fails on a node while a marker names it, run every
    # 2 s, not the chart's 300: the test sees the drain and resume in seconds.
    values["healthCheck"] = {
        "interval": 2,
        "scripts": {"05-admin": ADMIN_BY_MARKER, "10-marker": HEALTH_CHECK},
    }
    # The operator runs from sunk's image as the chart deploys it; the syncer and
    # the scheduler have e2e modules of their own.
    slurmd_pods = charts.render_slurmd_pod_allowance(
        helm, RELEASE, namespace, values, state / "values.yaml"
    )
    cluster_values = charts.cluster_values(
        RELEASE,
        kubelet_nodes.images.sunk,
        namespace=namespace,
        replicas=1,
        slurmd_pods=slurmd_pods,
    )
    cluster_values["syncer"]["replicas"] = cluster_values["scheduler"]["replicas"] = 0
    try:
        for name, pool in zip(names, pools, strict=False):
            await kube.patch(
                Node,
                name,
                {"metadata": {"labels": {charts.NODE_POOL_LABEL: pool}}},
                patch_type=PatchType.MERGE,
            )
        await kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        await charts.apply_volumes(kube, state / "volumes")
        await _shared_state_claim(kube, namespace, state / "ctld-state")
        await install_both(helm, kube, namespace, state, cluster_values, RELEASE, values)
        yield ChartBed(
            kube=kube,
            namespace=namespace,
            release=RELEASE,
            key=key,
            user=USER.name,
            helm=helm,
            nodes=kubelet_nodes,
            state=state,
            values=values,
            compute_nodes=[f"compute-{n}" for n in names[:COMPUTE_NODES]],
        )
    finally:
        await remove_both(helm, kube, namespace, RELEASE, state, before, volumes=[namespace])


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
    # Written by the compute pod into the home on the chart's shared claim.
    out = (await bed.ssh(f"cat ~/slurm-{job}.out")).stdout
    assert out.startswith("hello from compute-")
    record = bed.state / "markers" / Path(JOBSCRIPTS_LOG).name

    async def scripts_ran() -> bool:
        text = record.read_text() if record.exists() else ""
        return re.search(rf"(?s)prolog {job}\n.*epilog {job}\n", text) is not None

    await wait_for("prolog.d and epilog.d ran for the job", scripts_ran, 60)


async def test_srun_on_three_nodes_prints_three_names(bed: ChartBed) -> None:
    out = (await bed.ssh(f"srun -N{COMPUTE_NODES} hostname")).stdout.split()
    assert sorted(out) == sorted(bed.compute_nodes)


async def test_no_job_and_no_ssh_user_finds_a_kubernetes_token(bed: ChartBed) -> None:
    """What a login-node user would try: read a ServiceAccount token on the login
    pod, or from a job on every compute node. Neither pod mounts one."""
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    look = f"test -e {token} && echo found || echo none"
    on_login = (await bed.ssh(look)).stdout.split()
    in_jobs = (await bed.ssh(f"srun -N{COMPUTE_NODES} sh -c '{look}'")).stdout.split()
    assert on_login == ["none"]
    assert in_jobs == ["none"] * COMPUTE_NODES


async def test_a_failing_health_check_drains_its_idle_node_until_it_passes(bed: ChartBed) -> None:
    node = bed.compute_nodes[0]
    marker = bed.state / "markers" / f"unhealthy-{node}"
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
        tail = await _slurmd_log_tail(bed, node)
        raise AssertionError(f"{late}\n{shown}\nslurmd log:\n{tail}") from None
    finally:
        marker.unlink()
    await bed.poll_ssh(
        "the health check to resume the node", f"sinfo -h -n {node} -o %t", r"^idle\n", 60
    )


async def test_the_health_check_leaves_a_persons_drain_alone(bed: ChartBed) -> None:
    node = bed.compute_nodes[1]
    markers = bed.state / "markers"

    async def reason_stays(seconds: float) -> None:
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            shown = (await bed.ssh(f"scontrol -o show node {node}")).stdout
            assert f"Reason={ADMIN_REASON} [" in shown, shown
            await asyncio.sleep(1)

    (markers / f"admin-drain-{node}").touch()
    await bed.poll_ssh(
        "the person's drain", f"scontrol -o show node {node}", rf"Reason={ADMIN_REASON} \[", 60
    )
    marker = markers / f"unhealthy-{node}"
    marker.touch()
    try:
        await reason_stays(8)  # four health-check passes: not overwritten
    finally:
        marker.unlink()
    await reason_stays(8)  # and not resumed once the checks pass
    (markers / f"admin-resume-{node}").touch()
    await bed.poll_ssh("the person's resume", f"sinfo -h -n {node} -o %t", r"^idle\n", 60)


async def _key_secrets(bed: ChartBed) -> dict[str, dict[str, str]]:
    """The Secrets the keys hook made, by name: their data."""
    labels = {"sunk.dev/keys-of": RELEASE}
    return {
        s.metadata.name: dict(s.data or {})
        async for s in bed.kube.list(Secret, namespace=bed.namespace, labels=labels)
        if s.metadata and s.metadata.name
    }


async def test_a_config_change_reaches_slurm_without_restarting_any_pod(bed: ChartBed) -> None:
    """An upgrade, as any config change is. The keys the install made survive it
    (the keys hook runs again and keeps them)."""
    keys = await _key_secrets(bed)
    made = (
        "compute-ssh-host-keys",
        "compute-ssh-public-keys",  # the public halves, for the login pods
        "db",
        "jwks",  # the public halves of the signing keys, for slurmctld and slurmdbd
        "jwt",
        "jwt-signing",
        "login-ssh-public-keys",  # for the compute pods
        "munge",
        "ssh-host-keys",
    )
    assert sorted(keys) == [f"{RELEASE}-{n}" for n in made]
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
    assert await _key_secrets(bed) == keys


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
    try:
        await _fail_over_and_back(bed)
    except (AssertionError, TimeoutError) as error:
        raise AssertionError(f"{error}\n{_controller_logs(bed)}") from None


async def _fail_over_and_back(bed: ChartBed) -> None:
    await bed.poll_ssh(
        "both controllers up",
        "scontrol ping",
        r"(?s)primary.*is UP.*backup.*is UP",
        180,
    )
    # Queued work that must survive: held jobs stay pending.
    job_state = bed.state / "ctld-state" / "job_state"

    def saved_at() -> int:
        return job_state.stat().st_mtime_ns if job_state.exists() else 0

    # slurmctld writes its state in the background: a crash before that loses
    # what came since, in Slurm as anywhere. The failover is what is tested
    # here, so the job is on the shared volume first: a save that began after
    # the submit (a write already under way then may not hold the job), made
    # sure of by a second change to the job once one save is seen. Each mark
    # is read before its change: slurmctld may save before ssh returns.
    before = saved_at()
    proc = await bed.ssh("cd && sbatch --parsable --hold --wrap 'sleep 1'")
    job = proc.stdout.strip().split(";")[0]
    await charts.wait_until("slurmctld to save the job", lambda b=before: _newer(saved_at(), b), 30)
    before = saved_at()
    await bed.ssh(f"scontrol update jobid={job} comment=saved")
    await charts.wait_until(
        "slurmctld to save the job's change", lambda b=before: _newer(saved_at(), b), 30
    )
    primary_node = await _node_of(bed, f"{RELEASE}-slurmctld-0")
    nodes = bed.nodes
    # Powered off: its kubelet, containerd and every container on it stop at once.
    await asyncio.to_thread(nodes.group.stop, [primary_node], nodes.bin_dir)
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
        spec = next(s for s in nodes.specs if s.name == primary_node)
        await asyncio.to_thread(nodes.bed.start, [spec], nodes.bin_dir, nodes.images.pause.ref)
        await charts.wait_until(
            f"{primary_node} Ready again",
            lambda: nodes_ready(bed.kube, [primary_node], nodes.bed.restarted),
            120,
        )
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
    try:
        await asyncio.to_thread(bed.helm.uninstall, RELEASE, bed.namespace)
    except HelmError as failed:
        raise AssertionError(f"{failed}\n{await _uninstall_report(bed)}") from None
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

    # The users' homes are kept on purpose (helm.sh/resource-policy: keep).
    homes = f"{RELEASE}-homes"
    kept = await bed.kube.get(PersistentVolumeClaim, homes, namespace=ns)
    assert kept.metadata is not None
    assert (kept.metadata.annotations or {}).get("helm.sh/resource-policy") == "keep"

    async def leftovers() -> list[str]:
        found = []
        for kind in leftover_kinds:
            async for obj in bed.kube.list(kind, namespace=ns):
                name = obj.metadata.name if obj.metadata else ""
                # The namespace's own CA bundle; the test's own state claim.
                if name not in ("kube-root-ca.crt", STATE_CLAIM, homes):
                    found.append(f"{kind.__name__}/{name}")
        async for pv in bed.kube.list(PersistentVolume):
            claim = pv.spec.claimRef if pv.spec else None
            # The bed's static volumes (reclaim policy Retain) stay, Released, as
            # on any cluster with static provisioning; the bed deletes them.
            static = pv.spec is not None and pv.spec.storageClassName == charts.STORAGE_CLASS
            ours = claim and claim.name not in (STATE_CLAIM, homes)
            if claim and claim.namespace == ns and ours and not static:
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


async def _newer(now: int, before: int) -> bool:
    return now > before


async def _none(listing: Callable[[], Awaitable[list[str]]]) -> bool:
    return not await listing()


async def _uninstall_report(bed: ChartBed) -> str:
    """What a stuck uninstall needs: the NodeSets left, and the logs of the hook
    and the operator."""
    lines = []
    async for obj in bed.kube.list(nodeset_api.resource(), namespace=bed.namespace):
        lines.append(f"NodeSet {obj['metadata']['name']}: {obj.get('status')}")
    async for pod in bed.kube.list(Pod, namespace=bed.namespace):
        name = pod.metadata.name if pod.metadata else ""
        if name and ("uninstall" in name or "operator" in name):
            phase = pod.status.phase if pod.status else "?"
            try:
                log = "".join(
                    [
                        line
                        async for line in bed.kube.log(name, namespace=bed.namespace, tail_lines=30)
                    ]
                )
            except Exception as error:  # a report must not fail
                log = f"(no log: {error})"
            lines.append(f"--- pod {name} ({phase}):\n{log}")
    return "\n".join(lines)


def _controller_logs(bed: ChartBed, lines: int = 80) -> str:
    """The end of every slurmctld container log, read from the nodes' log
    directories: a powered-off node's kubelet serves none."""
    out = []
    for name in bed.nodes.names:
        logs = bed.nodes.group.paths(name).pod_logs
        for path in sorted(logs.glob(f"{bed.namespace}_{RELEASE}-slurmctld-*/slurmctld/*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {name}: {path.relative_to(logs)}")
            out.extend(tail)
    return "\n".join(out) or "(no slurmctld logs)"


async def _slurmd_log_tail(bed: ChartBed, slurm_node: str) -> str:
    """The end of the slurmd log of the NodeSet pod behind `slurm_node`."""
    k8s_node = slurm_node.removeprefix("compute-")
    async for pod in bed.kube.list(
        Pod, namespace=bed.namespace, fields={"spec.nodeName": k8s_node}
    ):
        name = pod.metadata.name if pod.metadata else ""
        if name and name.startswith("compute"):
            lines = [
                line
                async for line in bed.kube.log(
                    name, namespace=bed.namespace, container="slurmd", tail_lines=40
                )
            ]
            return "".join(lines)
    return "(no slurmd pod)"


async def _node_of(bed: ChartBed, pod: str) -> str:
    obj = await bed.kube.get(Pod, pod, namespace=bed.namespace)
    assert obj.spec is not None
    assert obj.spec.nodeName
    return obj.spec.nodeName
