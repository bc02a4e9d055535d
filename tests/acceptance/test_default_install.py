"""The users' journey on both charts installed with their defaults.

A platform team installs sunk-cluster and slurm naming only what belongs to
its own cluster (OVERRIDES below, each with the reason no default can hold
it); everything else is the charts' defaults: Slurm's production settings,
KillWait, QOS preemption, multifactor priority, GPU TRES, enforced
associations, two replicas of each sunk component, component policies. The
components act with the credentials the charts give them; the test logs in
as a directory user over ssh and creates pods as a tenant would.

Runs on the session's real nodes (kubelet + containerd each), pulling the
images built here from the bed's registry. Stand-ins, named: the GPUs are
device files shaped like NVIDIA's, a stand-in `libcuda.so.1` and
`nvidia-smi`, and the CDI spec NVIDIA's toolkit would write for them in each
node's containerd (sunk_testbed.gpus; no driver, so gres.conf names them),
and the ReadWriteMany class is the bed's SeaweedFS through an S3 CSI driver
(docs/testbed.md).

The journey's steps, in the order they run: 1 (a directory user builds with
`mpicc` and runs a 3-node job from `$HOME`, its output read back on the
login pod), 4 (`sacct` shows a job's GPU TRES; `sshare` the usage charged to
the job's account), 2 (a Deployment of inference pods scaled from 0
preempts the training job, which is requeued, and resumes and completes once
it is scaled to 0; `sshare` shows the usage charged to each one's account),
3 (a JobSet and a LeaderWorkerSet, made by their real controllers, each one
Slurm job with all its pods bound together; one too wide for the nodes binds
none), 5 (a NodeSet update scheduled into a maintenance window waits for it
and keeps long jobs off, as `sunk-operator`), 6 (a pod with Kubernetes'
default grace period is placed; a gated pod gets no Slurm job until
ungated), 7 (each sunk component with no pod left fires its down alert on a
real Prometheus, and it ends once they are back).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import functools
import json
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import (
    Container,
    PodSchedulingGate,
    PodSpec,
    PodTemplateSpec,
    ResourceRequirements,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Node, Pod, Secret
from lightkube.types import PatchType

from plugins.chart_releases import CLUSTER_RELEASE, remove_both
from plugins.login_shell import LoginShell
from plugins.mpi import HELLO
from plugins.nodes import RealNodes, kubectl_at
from plugins.placed import bound_job, bound_together, labelled_pods, none_bound
from plugins.prometheus import (
    Kubectl,
    each_component_down_fires_its_alert,
    remove_prometheus,
    start_prometheus,
)
from plugins.slurm_pods import node_states, wait_for
from sunk.api import RESOURCE_NODE_GPUS
from sunk.scheduler.request import ANNOTATION_QOS, JOBSET_NAME, LWS_NAME
from sunk_testbed import charts
from sunk_testbed import gpus as stand_in
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.helm import Helm, ensure_helm
from sunk_testbed.workloads import (
    JobSet,
    LeaderWorkerSet,
    ensure_workload_images,
    install_controllers,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(1800)]

# The release names the charts' defaults expect of each other (sunk-cluster's
# `slurm.*` and `componentPolicies.slurmdPods` name `slurm-*` objects).
RELEASE = "slurm"
COMPUTE_NODES = 3
GPUS = 2
USER = "researcher"
UID = 2000
TENANT_NAMESPACE = "inference"
SERVING = "serving"  # the account the inference namespace's pods run in
GRACE = 30  # the chart's QOS GraceTime
NODESET = "compute"  # the chart's first NodeSet

# Every value the module sets, and why a platform team sets it too.
OVERRIDES = {
    "slurm": {
        "image, login.image, identity.ldap.server.image": "the cluster's registry "
        "(the images are built here and served by the bed's registry)",
        "homes.storageClassName": "the cluster's ReadWriteMany class (the bed's `shared`)",
        "controller.persistence, accounting.mariadb.persistence, "
        "identity.ldap.server.persistence: storageClassName": "the cluster's storage "
        "class for Slurm's state, the database and the directory (the bed has no "
        "default class)",
        "nodesets[0].nodeSelector": "which nodes are Slurm's",
        "identity.provider, identity.ldap.server.enabled, identity.users, "
        "identity.groups, login.authorizedKeys": "the identity source: the in-chart "
        "directory, seeded with the team's first user and key",
        "accounting.accounts": "who may preempt: the serving team's account, granted "
        "the chart's inference QOS (the cluster's QOS list is normal alone)",
    },
    "sunk-cluster": {
        "image": "the cluster's registry",
        "componentPolicies.slurmdPods.images": "the slurm image's repository in "
        "that registry (the default names ghcr.io's)",
        "scheduler.tenants": "which namespaces the scheduler serves, as whom (the "
        "serving account, QOS inference)",
        "gpuPlugin.enabled, deviceDir, kubeletRootDir, toolkitConfigDir, cdiSpecDirs": "GPU "
        "nodes run sunk's GPU plugin; the bed's stand-in device files, per-node kubelet roots "
        "and CDI spec directories, and no NVIDIA toolkit (the nodes share this machine, whose "
        "/etc is no node's)",
    },
}


def slurm_values(nodes: RealNodes, homes_class: str, public_key: str) -> dict[str, Any]:
    daemons, login = nodes.images.slurm_pair(charts.DEFAULT_SLURM)
    local = {"storageClassName": charts.STORAGE_CLASS}
    return {
        "image": {"repository": charts.image_repository(daemons.ref), "tag": daemons.tag},
        "login": {
            "image": {"repository": charts.image_repository(login.ref), "tag": login.tag},
            "authorizedKeys": {USER: public_key},
        },
        "homes": {"storageClassName": homes_class},
        "controller": {"persistence": local},
        "accounting": {
            "mariadb": {"persistence": local},
            "accounts": {
                SERVING: {
                    "description": "the inference service",
                    "qos": ["normal", "inference"],
                    "defaultQos": "normal",
                    "users": [USER],
                }
            },
        },
        "nodesets": [
            {"name": NODESET, "nodeSelector": {charts.NODE_POOL_LABEL: charts.COMPUTE_POOL}}
        ],
        "identity": {
            "provider": "ldap",
            "users": [{"name": USER, "uid": UID, "gid": UID}],
            "groups": [{"name": USER, "gid": UID, "members": [USER]}],
            "ldap": {
                "server": {
                    "enabled": True,
                    "image": {
                        "repository": charts.image_repository(nodes.images.ldap.ref),
                        "tag": nodes.images.ldap.tag,
                    },
                    "persistence": local,
                }
            },
        },
    }


def cluster_values(nodes: RealNodes, gpus: Path) -> dict[str, Any]:
    daemons, _ = nodes.images.slurm_pair(charts.DEFAULT_SLURM)
    sunk = nodes.images.sunk
    return {
        "image": {"repository": charts.image_repository(sunk.ref), "tag": sunk.tag},
        "componentPolicies": {"slurmdPods": {"images": [charts.image_repository(daemons.ref)]}},
        # The team's inference namespace runs as the researcher, in the
        # serving account, and its pods may ask for QOS inference.
        "scheduler": {
            "tenants": [
                {
                    "namespaces": [TENANT_NAMESPACE],
                    "uids": str(UID),
                    "user": UID,
                    "accounts": [SERVING],
                    "qos": ["normal", "inference"],
                }
            ]
        },
        "gpuPlugin": {
            "enabled": True,
            "deviceDir": str(gpus),
            "kubeletRootDir": f"{nodes.group.dir}/{{node}}/kubelet",
            "toolkitConfigDir": str(gpus.parent / "nvidia-container-runtime"),
            "cdiSpecDirs": [f"{nodes.group.dir}/{{node}}/cdi"],
        },
    }


@dataclass
class Journey:
    shell: LoginShell
    kube: AsyncClient
    kubectl: Kubectl  # the admin's, for what lightkube has no model of (NodeSets)
    helm: Helm
    namespace: str  # both releases'
    values: dict[str, Any]  # the slurm release's
    state: Path
    image: str  # what the tenant's pods run (the slurm image the nodes hold)
    prometheus_image: str
    compute: list[str]  # the Slurm nodes


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def journey(
    kubelet_nodes: RealNodes, kube_access: KubeAccess, kube: AsyncClient, shared_storage: str
) -> AsyncIterator[Journey]:
    helm_binary = await asyncio.to_thread(ensure_helm, print)
    state = Path(tempfile.mkdtemp(prefix="sunk-acc-", dir="/tmp"))
    helm = Helm(helm_binary, kube_access.admin_kubeconfig, state / "helm")
    namespace = f"acceptance-{secrets.token_hex(2)}"
    names = kubelet_nodes.names[:COMPUTE_NODES]
    before = await node_states(kube, kubelet_nodes.names)
    key = state / "id_ed25519"
    public_key = charts.new_ssh_key(key)
    gpus = stand_in.stand_in_gpus(state / "gpus", GPUS)
    spec_dirs = [kubelet_nodes.group.paths(name).cdi_dir for name in names]
    stand_in.write_cdi_spec(spec_dirs, gpus, stand_in.stand_in_driver(state / "gpu-driver"))
    values = slurm_values(kubelet_nodes, shared_storage, public_key)
    print("overrides of the charts' defaults:")
    for chart, overrides in OVERRIDES.items():
        for value, why in overrides.items():
            print(f"  {chart}: {value} -- {why}")
    started = time.monotonic()
    try:
        for name in names:
            labels = {charts.NODE_POOL_LABEL: charts.COMPUTE_POOL}
            await kube.patch(
                Node, name, {"metadata": {"labels": labels}}, patch_type=PatchType.MERGE
            )
        for name in (namespace, TENANT_NAMESPACE):
            await kube.create(Namespace(metadata=ObjectMeta(name=name)))
        await charts.apply_volumes(kube, state / "volumes")
        await charts.install(
            helm,
            kube,
            CLUSTER_RELEASE,
            "sunk-cluster",
            namespace,
            cluster_values(kubelet_nodes, gpus),
            values_file=state / "cluster-values.yaml",
        )
        # The slurmd pods take every GPU the plugin offers: let it offer them first.
        await charts.wait_until(
            "the GPU plugin serving the compute nodes",
            lambda: charts.nodes_offer(kube, names, RESOURCE_NODE_GPUS),
            180,
            interval=1,
        )
        await charts.install(
            helm, kube, RELEASE, "slurm", namespace, values, values_file=state / "values.yaml"
        )
        shell = LoginShell(kube, namespace, RELEASE, key, USER)
        compute = [f"compute-{n}" for n in names]
        # Jobs need the directory group's account (AccountingStorageEnforce):
        # the accounts loop makes it on its first pass.
        await shell.poll_ssh(
            "a job on every compute node",
            f"srun -N{COMPUTE_NODES} --immediate=10 -t 1 hostname | sort",
            "\n".join(compute),
            600,
        )
        took = time.monotonic() - started
        print(f"both charts installed and a job on every node in {took:.1f} s")
        daemons, _ = kubelet_nodes.images.slurm_pair(charts.DEFAULT_SLURM)
        yield Journey(
            shell=shell,
            kube=kube,
            kubectl=functools.partial(kubectl_at, kube_access.admin_kubeconfig),
            helm=helm,
            namespace=namespace,
            values=values,
            state=state,
            image=daemons.ref,
            prometheus_image=kubelet_nodes.images.prometheus.ref,
            compute=compute,
        )
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(Namespace, TENANT_NAMESPACE)
        await remove_both(helm, kube, namespace, RELEASE, state, before)
        stand_in.remove_cdi_spec(spec_dirs)


async def test_1_a_directory_user_builds_with_mpicc_and_runs_three_nodes_from_home(
    journey: Journey,
) -> None:
    shell = journey.shell
    # The first login made the home, the user's alone, on the shared claim.
    home = (await shell.ssh("cd && pwd && stat -c '%U %a' .")).stdout.split()
    assert home == [f"/home/{USER}", USER, "700"]
    name = f"hello-{time.time_ns()}"
    # mpirun in the job: Debian's Slurm 26.05 has no PMIx plugin (docs/training.md).
    script = (
        f"cd && cat >{name}.c <<'EOF'\n{HELLO}EOF\n"
        f"mpicc -O2 -o {name} {name}.c || exit\n"
        f"sbatch --parsable -N{COMPUTE_NODES} --ntasks-per-node=1 -t 2 -o {name}.out"
        f" --wrap 'mpirun ./{name}'"
    )
    started = time.monotonic()
    job = (await shell.ssh(script)).stdout.strip().split(";")[0]
    state = await shell.poll_ssh(
        f"job {job} ended",
        f"sacct -n -X -P -j {job} -o State",
        r"COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL",
        240,
    )
    print(f"mpicc + a {COMPUTE_NODES}-node job: {time.monotonic() - started:.1f} s")
    # Read back on the login pod: the compute pods wrote it into the shared home.
    out = (await shell.ssh(f"cat ~/{name}.out; rm -f ~/{name} ~/{name}.c ~/{name}.out")).stdout
    assert state.strip() == "COMPLETED", f"{state}{out}"
    ranks = sorted(line.split() for line in out.splitlines() if line.startswith("rank "))
    assert [r[:4] for r in ranks] == [["rank", str(i), "of", "3"] for i in range(3)], out
    assert sorted(r[5] for r in ranks) == journey.compute
    assert {r[7] for r in ranks} == {"6"}


async def test_4_sacct_shows_a_jobs_gpus(journey: Journey) -> None:
    shell = journey.shell
    proc = await shell.ssh(
        "sbatch --parsable --wait -N1 --gres=gpu:1 -t 1 -o /dev/null --wrap 'true'"
    )
    job = proc.stdout.strip().split(";")[0]
    out = await shell.poll_ssh(
        f"job {job}'s TRES in sacct",
        f"sacct -n -X -P -j {job} -o JobID,State,AllocTRES",
        r"COMPLETED\|.*gres/gpu=1",
        60,
    )
    print(f"sacct: {out.strip()}")
    # Slurm charges an ended job's usage to its association at once. (The
    # job ran in the researcher's default account: the first the chart made
    # an association in.)
    account = (await shell.ssh(f"sacct -n -X -P -j {job} -o Account")).stdout.strip()
    await charged(journey, account)


async def raw_usage(journey: Journey) -> dict[str, int]:
    """The researcher's RawUsage in each of their accounts, as sshare shows it."""
    out = (await journey.shell.ssh(f"sshare -n -P -u {USER} -o Account,User,RawUsage")).stdout
    rows = [line.split("|") for line in out.splitlines()]
    return {r[0].strip(): int(r[2]) for r in rows if len(r) == 3 and r[1] == USER}


async def charged(journey: Journey, account: str) -> None:
    """Wait until sshare shows usage charged to the researcher in `account`."""

    async def used() -> int:
        return (await raw_usage(journey)).get(account, 0)

    await wait_for(f"usage charged to {account}", used, 60, interval=2)
    shown = (await journey.shell.ssh(f"sshare -u {USER} -o Account,User,RawUsage")).stdout
    print(f"sshare:\n{shown}")


def pod_spec(journey: Journey, command: str = "sleep 3600", cpu: str = "1") -> PodSpec:
    """What Kubernetes users write: sunk's scheduler named, no grace period (30 s)."""
    return PodSpec(
        schedulerName="sunk-scheduler",
        containers=[
            Container(
                name="main",
                image=journey.image,
                command=["sh", "-c", command],
                resources=ResourceRequirements(requests={"cpu": cpu}),
            )
        ],
    )


def tenant_pod(journey: Journey, name: str) -> Pod:
    return Pod(metadata=ObjectMeta(name=name, namespace=TENANT_NAMESPACE), spec=pod_spec(journey))


def ready_since(pod: Pod) -> datetime.datetime | None:
    """When the pod became Ready, if it is."""
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "Ready" and condition.status == "True":
            assert condition.lastTransitionTime is not None
            return condition.lastTransitionTime
    return None


def ready_after(pod: Pod) -> float:
    """Seconds from the pod's creation to its Ready condition (whole seconds)."""
    assert pod.metadata is not None
    assert pod.metadata.creationTimestamp is not None
    ready = ready_since(pod)
    assert ready is not None, f"{pod.metadata.name} not Ready"
    return (ready - pod.metadata.creationTimestamp).total_seconds()


async def test_2_inference_pods_preempt_training_which_resumes_when_they_scale_to_zero(
    journey: Journey,
) -> None:
    """The seeds' headline on the defaults: QOS preemption (PreemptType
    preempt/qos, PreemptMode REQUEUE, inference preempts normal, GraceTime
    30 s). The training job is an ordinary `sbatch --requeue` in the user's
    own account; the inference service a Deployment whose pods ask for QOS
    inference. A requeued job waits Slurm's requeue_delay (120 s, the
    credential lifetime) before it runs again."""
    shell, kube = journey.shell, journey.kube
    # The user's own account comes from the chart's accounts loop, which may
    # still be making it this soon after the install: sbatch says "Invalid
    # account" until then (and submits nothing).
    train = (
        await shell.poll_ssh(
            "the training job submitted",
            f"sbatch --parsable --requeue -A {USER} -N{COMPUTE_NODES} --exclusive -t 5"
            " -o /dev/null --wrap 'sleep 20'",
            r"^[0-9]+",
            120,
        )
    ).strip()
    await shell.poll_ssh(
        f"training job {train} running", f"squeue -h -j {train} -o %T", "RUNNING", 120
    )
    spec = pod_spec(journey, cpu="100m")
    labels = {"app": "inference"}
    template = PodTemplateSpec(
        metadata=ObjectMeta(labels=labels, annotations={ANNOTATION_QOS: "inference"}), spec=spec
    )
    service = Deployment(
        metadata=ObjectMeta(name="inference", namespace=TENANT_NAMESPACE),
        spec=DeploymentSpec(
            replicas=0, selector=LabelSelector(matchLabels=labels), template=template
        ),
    )
    try:
        await kube.create(service)
        started = time.monotonic()
        await kube.patch(
            Deployment,
            "inference",
            {"spec": {"replicas": COMPUTE_NODES}},
            namespace=TENANT_NAMESPACE,
        )
        await shell.poll_ssh(
            f"training job {train} preempted",
            f"squeue -h -j {train} -o %T",
            r"^(PENDING|REQUEUED|REQUEUE_HOLD|PREEMPTED|COMPLETING)",
            GRACE + 15,
        )
        print(
            f"scaled 0 -> {COMPUTE_NODES}: training preempted in {time.monotonic() - started:.1f} s"
        )

        async def ready() -> list[Pod]:
            pods = await labelled_pods(kube, TENANT_NAMESPACE, "app", "inference")
            ok = [p for p in pods if p.status and p.status.phase == "Running"]
            return ok if len(ok) == COMPUTE_NODES and all(ready_since(p) for p in ok) else []

        pods = await charts.wait_until("the inference pods Ready", ready, 120, interval=0.5)
        waits = sorted(ready_after(p) for p in pods)
        print(
            f"inference pods create -> Ready: p50 {statistics.median(waits):.0f} s,"
            f" p99 {waits[-1]:.0f} s (n={len(waits)}, whole seconds)"
        )
        shown = (await shell.ssh(f"scontrol -o show job {train}")).stdout
        assert "Restarts=0 " not in shown, shown  # requeued, not cancelled
        qos = (await shell.ssh(f"squeue -h -t R -A {SERVING} -o %q")).stdout.split()
        assert qos == ["inference"] * COMPUTE_NODES, qos

        await kube.patch(
            Deployment, "inference", {"spec": {"replicas": 0}}, namespace=TENANT_NAMESPACE
        )
        scaled_down = time.monotonic()
        await shell.poll_ssh(
            f"training job {train} completed",
            f"sacct -n -X -P -j {train} -o State",
            "^COMPLETED",
            300,
        )
        took = time.monotonic() - scaled_down
        print(f"scaled to 0 -> training resumed and completed: {took:.1f} s")
        await charged(journey, SERVING)  # the inference pods' jobs
        await charged(journey, USER)  # the training job's
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(Deployment, "inference", namespace=TENANT_NAMESPACE)
        await shell.ssh(f"scancel {train}", check=False)


async def bound_as_one_job(journey: Journey, label: str, value: str) -> None:
    """The pods labelled so, one on each compute node, bound together through
    one Slurm job that holds every compute node."""
    job = await bound_together(journey.kube, TENANT_NAMESPACE, label, value, COMPUTE_NODES)
    nodes = await journey.shell.poll_ssh(
        f"job {job} in squeue", f"squeue -h -j {job} -o %D", r"\d", 30
    )
    assert nodes.strip() == str(COMPUTE_NODES)


async def test_3_a_jobset_and_a_leaderworkerset_run_as_gangs(journey: Journey) -> None:
    """Made by the real JobSet and LeaderWorkerSet controllers (built from
    their Go modules, installed from their own charts beside sunk, as a
    platform team runs them), each is one Slurm job, all its pods bound
    together; a JobSet wider than the nodes (a driver and two Jobs of two
    workers: five pods on three nodes) binds none of its pods."""
    images = await asyncio.to_thread(ensure_workload_images, print)
    values = journey.state / "workloads"
    await install_controllers(journey.helm, journey.kube, images, values, print)
    kube = journey.kube
    job_spec = pod_spec(journey, "sleep 5", "100m")
    job_spec.restartPolicy = "Never"

    def replicated(name: str, replicas: int, parallelism: int) -> dict[str, Any]:
        job = {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0}
        return {
            "name": name,
            "replicas": replicas,
            "template": {"spec": {**job, "template": {"spec": job_spec.to_dict()}}},
        }

    def jobset(name: str, worker_jobs: int) -> JobSet:
        replicated_jobs = [replicated("driver", 1, 1), replicated("workers", worker_jobs, 2)]
        return JobSet(
            metadata=ObjectMeta(name=name, namespace=TENANT_NAMESPACE),
            spec={"replicatedJobs": replicated_jobs},
        )

    serve_spec = pod_spec(journey, "sleep 3600", "100m")
    serve = LeaderWorkerSet(
        metadata=ObjectMeta(name="serve", namespace=TENANT_NAMESPACE),
        spec={
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": COMPUTE_NODES,
                "workerTemplate": {"spec": serve_spec.to_dict()},
            },
        },
    )
    try:
        await kube.create(jobset("wide", 2))
        told = await none_bound(kube, TENANT_NAMESPACE, JOBSET_NAME, "wide", 5, "Slurm")
        print(f"a JobSet of 5 pods on {COMPUTE_NODES} nodes: {told}")
        await kube.delete(JobSet, "wide", namespace=TENANT_NAMESPACE)
        await kube.create(jobset("train", 1))
        await bound_as_one_job(journey, JOBSET_NAME, "train")

        async def completed() -> bool:
            got = await kube.get(JobSet, "train", namespace=TENANT_NAMESPACE)
            conditions = (got.status or {}).get("conditions") or []
            return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

        await wait_for("the JobSet Completed", completed, 180)
        await kube.create(serve)
        await bound_as_one_job(journey, LWS_NAME, "serve")
    finally:
        for kind, name in ((JobSet, "wide"), (JobSet, "train"), (LeaderWorkerSet, "serve")):
            with contextlib.suppress(ApiError):
                await kube.delete(kind, name, namespace=TENANT_NAMESPACE)


async def slurmd_memory(journey: Journey) -> dict[str, str]:
    """Each running slurmd pod's memory request."""
    requests = {}
    labels = {"sunk.dev/nodeset": NODESET}
    async for pod in journey.kube.list(Pod, namespace=journey.namespace, labels=labels):
        assert pod.metadata is not None
        assert pod.spec is not None
        if pod.metadata.deletionTimestamp or not pod.status or pod.status.phase != "Running":
            continue
        (slurmd,) = [c for c in pod.spec.containers if c.name == "slurmd"]
        assert slurmd.resources is not None
        assert slurmd.resources.requests is not None
        requests[pod.metadata.name or ""] = slurmd.resources.requests["memory"]
    return requests


async def operator_slurm_user(journey: Journey) -> str:
    """The Slurm user in the token the operator's pods mount (the chart's
    token minter keeps it)."""
    secret = await journey.kube.get(
        Secret, f"{CLUSTER_RELEASE}-operator-token", namespace=journey.namespace
    )
    assert secret.data is not None
    payload = base64.b64decode(secret.data["token"]).decode().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sun"])


async def slurm_nodes(journey: Journey) -> dict[str, str]:
    """Slurm node -> state."""
    out = (await journey.shell.ssh("sinfo -h -N -o '%N %T'")).stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


async def test_5_an_update_in_a_maintenance_window_waits_for_it_as_sunk_operator(
    journey: Journey,
) -> None:
    """The platform team schedules a NodeSet update (a new memory request for
    slurmd, as after resizing it) into a window with `helm upgrade`. The
    chart's operator, acting in Slurm as `sunk-operator` with the token the
    chart mints for it, holds the nodes in a maintenance reservation before
    the window and drains nothing: a job that ends before the window runs, one
    that would run across its start (no time limit; the partition's MaxTime is
    INFINITE) waits. In the window the update rolls, one node at a time, and
    the reservation goes when it is done."""
    shell = journey.shell
    reservation = f"sunk-update-{journey.namespace}-{NODESET}"
    before = await slurmd_memory(journey)
    assert len(before) == COMPUTE_NODES
    assert await operator_slurm_user(journey) == "sunk-operator"
    # Time for the upgrade, the reservation and a one-minute job before it opens.
    opens = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=140
    )
    windowed = copy.deepcopy(journey.values)
    (nodeset,) = windowed["nodesets"]
    nodeset["podResources"] = {"requests": {"memory": "300Mi"}}
    nodeset["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
        "maintenanceWindow": {"start": opens.strftime("%Y-%m-%dT%H:%M:%SZ"), "duration": "20m"},
    }
    long_job = ""
    try:
        started = time.monotonic()
        await charts.install(
            journey.helm, journey.kube, RELEASE, "slurm", journey.namespace, windowed,
            values_file=journey.state / "values-window.yaml",
        )  # fmt: skip
        shown = await shell.poll_ssh(
            "the update's reservation",
            f"scontrol show reservation {reservation} 2>&1 || true",
            "Flags=",
            90,
        )
        print(f"helm upgrade -> reservation made: {time.monotonic() - started:.1f} s")
        assert "MAINT" in shown, shown
        assert "IGNORE_JOBS" in shown, shown
        held = shown.split("Nodes=", 1)[1].split()[0]
        hosts = (await shell.ssh(f"scontrol show hostnames {held}")).stdout.split()
        assert sorted(hosts) == journey.compute, shown
        progressing = await asyncio.to_thread(
            journey.kubectl, "get", "nodeset", NODESET, "-n", journey.namespace, "-o",
            "jsonpath={.status.conditions[?(@.type=='Progressing')].message}",
        )  # fmt: skip
        assert "maintenance window" in progressing.stdout, progressing

        left = (opens - datetime.datetime.now(datetime.UTC)).total_seconds()
        assert left > 75, f"the window opens in {left:.0f} s: too soon for a one-minute job"
        short = (await shell.ssh("sbatch --parsable -t 1 --wrap 'sleep 5'")).stdout.strip()
        long_job = (await shell.ssh("sbatch --parsable --wrap 'sleep 600'")).stdout.strip()
        await shell.poll_ssh(
            f"the short job {short} done", f"sacct -n -X -P -j {short} -o State", "COMPLETED", 60
        )
        reason = (await shell.ssh(f"squeue -h -j {long_job} -o '%T %r'")).stdout.strip()
        assert reason.startswith("PENDING"), reason
        states = await slurm_nodes(journey)
        assert not [s for s in states.values() if "drain" in s], states
        assert await slurmd_memory(journey) == before, "a pod was replaced before the window"

        async def rolled() -> bool:
            memory = await slurmd_memory(journey)
            return len(memory) == COMPUTE_NODES and set(memory.values()) == {"300Mi"}

        await wait_for("the update rolled", rolled, 600, interval=2)
        assert datetime.datetime.now(datetime.UTC) >= opens
        await shell.poll_ssh(
            "the reservation gone",
            f"scontrol show reservation {reservation} 2>&1 || true",
            "not found|No reservations",
            60,
        )
        print(f"window open -> rolled, unreserved: {datetime.datetime.now(datetime.UTC) - opens}")
        await shell.poll_ssh(
            f"the held job {long_job} running", f"squeue -h -j {long_job} -o %T", "RUNNING", 120
        )
    finally:
        if long_job:
            await shell.ssh(f"scancel {long_job}", check=False)
        # The window taken out, the new request kept: no second roll.
        kept = copy.deepcopy(journey.values)
        kept["nodesets"][0]["podResources"] = nodeset["podResources"]
        await charts.install(
            journey.helm, journey.kube, RELEASE, "slurm", journey.namespace, kept,
            values_file=journey.state / "values.yaml",
        )  # fmt: skip
        journey.values = kept

        async def idle() -> bool:
            return set((await slurm_nodes(journey)).values()) == {"idle"}

        await wait_for("every node idle", idle, 300, interval=2)


async def test_6_a_default_pod_is_placed_and_a_gated_one_waits_for_its_gate(
    journey: Journey,
) -> None:
    kube = journey.kube
    try:
        started = time.monotonic()
        await kube.create(tenant_pod(journey, "default-grace"))
        job = await bound_job(kube, TENANT_NAMESPACE, "default-grace", within=120)
        print(f"a default pod bound through Slurm job {job} in {time.monotonic() - started:.1f} s")

        since = (await journey.shell.ssh("date +%Y-%m-%dT%H:%M:%S")).stdout.strip()
        gated = tenant_pod(journey, "gated")
        assert gated.spec is not None
        gated.spec.schedulingGates = [PodSchedulingGate(name="kueue.x-k8s.io/admission")]
        await kube.create(gated)
        await asyncio.sleep(15)
        listed = (await journey.shell.ssh(f"sacct -n -X -a -P -S {since} -o JobID,JobName")).stdout
        # The scheduler names a pod's job <namespace>/<pod>.
        assert not [row for row in listed.splitlines() if row.endswith("/gated")], listed
        held = await kube.get(Pod, "gated", namespace=TENANT_NAMESPACE)
        assert held.spec is not None
        assert held.spec.nodeName is None
        ungated = time.monotonic()
        await kube.patch(
            Pod,
            "gated",
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            namespace=TENANT_NAMESPACE,
            patch_type=PatchType.JSON,
        )
        await bound_job(kube, TENANT_NAMESPACE, "gated", within=60)
        print(f"gate removed -> placed: {time.monotonic() - ungated:.1f} s")
    finally:
        for name in ("default-grace", "gated"):
            with contextlib.suppress(ApiError):
                await kube.delete(Pod, name, namespace=TENANT_NAMESPACE, grace_period=0)


async def test_7_each_sunk_component_down_fires_its_alert(journey: Journey) -> None:
    """Debian's Prometheus in `monitoring`, finding the charts' targets by
    their annotations and loading the charts' rules (plus a copy at zero
    thresholds, so that an alert shows in seconds: plugins/prometheus.py).
    The operator, syncer, scheduler and token minter scaled to zero in turn,
    the GPU plugin's pods sent nowhere: each one's SunkComponentDown fires,
    and no other; back, it ends."""
    kubectl = journey.kubectl

    def walk() -> None:
        prometheus = start_prometheus(
            kubectl,
            journey.prometheus_image,
            journey.namespace,
            (CLUSTER_RELEASE, RELEASE),
            (journey.state / "cluster-values.yaml", journey.state / "values.yaml"),
        )
        try:
            each_component_down_fires_its_alert(
                prometheus, kubectl, journey.namespace, CLUSTER_RELEASE
            )
        finally:
            prometheus.http.close()

    try:
        await asyncio.to_thread(walk)
    finally:
        await asyncio.to_thread(remove_prometheus, kubectl)
