"""The scheduler end to end: real nodes running real slurmd pods, a real Slurm, the real apiserver.

One module bed: three of the session's real nodes (kubelet + containerd), each
advertising two `nvidia.com/gpu` as a device plugin would (there are no GPUs
here: the extended resource is patched onto the node's status), its own Slurm
with a NodeSet-style node set `k8s` (slurmd pods from the slurm image register
as dynamic nodes with 2 CPUs and `Gres=gpu:2`, two character devices standing
in for the GPUs' files), partitions `k8s` (the
scheduler's default), `low` and `high` over the same nodes with partition
priority preemption, and the scheduler in-process with a real `SlurmClient`
and `SlurmView`, started and killed like a process.

Why this module configures Slurm itself rather than install the charts: it
tests the scheduler's machinery (kills between submit and bind, restarts,
stale views) against a Slurm it can stop and inspect, with no slurmdbd, so
QOS preemption (the slurm chart's default, which needs accounting) is not
available; partition-priority preemption is the other mode sites choose
(`PreemptType=preempt/partition_prio`). The chart's defaults, QOS preemption
included, are shown on `sunk local up`'s cluster
(tests/charts/test_local_up_preemption.py, test_local_up_workloads.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod

from plugins.nodes import RealNodes
from plugins.slurm_pods import SlurmBed, create, set_capacity, slurm_bed, wait_for
from sunk.api import CONDITION_SLURM_GPUS, GPU_RESOURCE
from sunk.scheduler.controller import Scheduler
from sunk.scheduler.decide import STOP_MARGIN
from sunk.scheduler.metrics import SchedulerMetrics
from sunk.scheduler.request import (
    ANNOTATION_ACCOUNT,
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_JOB_ID,
    ANNOTATION_PARTITION,
    ANNOTATION_TIME_LIMIT,
    ANNOTATION_USER_ID,
    GANG_NAME,
    GANG_SIZE,
    SCHEDULER_NAME,
    Options,
)
from sunk.scheduler.run import VIEW_STALE_AFTER
from sunk.scheduler.seal import JobSeal
from sunk.scheduler.slurm_adapter import SlurmPortForScheduler
from sunk.scheduler.tenancy import Grant, Tenancy
from sunk.slurm.auth import FileKey, JwtMinter, TenantMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.models import Job
from sunk.slurm.view import SlurmView
from sunk_testbed import slurmpods
from sunk_testbed.slurm_cluster import PLAIN_UID, PLAIN_USER, SlurmCommandError

pytestmark = pytest.mark.e2e

# KillWait and the low partition's GraceTime: shorter than the chart's 35 s
# (Kubernetes' default 30 s grace and a margin), as this module's pods ask for
# a few seconds; a test waits at most this long for a preempted pod's eviction.
KILL_WAIT = 10
# The in-process scheduler's own Slurm user has no Slurm privilege (an
# ordinary system user every Debian root filesystem has): it reads jobs and
# nodes, and submits, signals and cancels each job as its tenant.
SCHEDULER_USER = "bin"
SEAL = JobSeal(b"the scheduler e2e's job seal....", SCHEDULER_USER)
# Its tenant's jobs run as the bed's plain user: the Slurm sandboxes' passwd
# has it, and the slurmd pods add it to theirs (as the chart's static users
# reach its pods). Not nobody: that uid is reserved, never a tenant's.
TENANT_USER, TENANT_UID = PLAIN_USER, PLAIN_UID


def tenancy(namespace: str) -> Tenancy:
    return Tenancy(
        tenants=[
            Grant(
                namespaces=[namespace],
                uids=str(TENANT_UID),
                user=TENANT_UID,
                partitions=["k8s", "low", "high"],
            )
        ]
    )


SLURM_CONF = [
    "GresTypes=gpu",
    f"KillWait={KILL_WAIT}",
    "PreemptType=preempt/partition_prio",
    "PreemptMode=REQUEUE",
    "NodeSet=k8s Feature=k8s",
    "PartitionName=k8s Nodes=k8s MaxTime=INFINITE State=UP PriorityTier=5",
    # A preempted job runs on for GraceTime: the pod's window to stop (allocations
    # have no processes for KillWait to wait on).
    f"PartitionName=low Nodes=k8s MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={KILL_WAIT}",
    "PartitionName=high Nodes=k8s MaxTime=INFINITE State=UP PriorityTier=10",
]


@dataclass
class SchedBed:
    bed: SlurmBed
    slurmd: dict[str, str]  # Slurm node → Kubernetes node
    url: str
    key: Any

    def slurm(self, *argv: str, check: bool = True) -> str:
        return self.bed.cluster.run(list(argv), check=check, timeout=30).stdout

    async def aslurm(self, *argv: str, check: bool = True) -> str:
        return await asyncio.to_thread(self.slurm, *argv, check=check)

    async def job_fields(self, job_id: str) -> dict[str, str]:
        out = await self.aslurm("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    async def our_jobs(self) -> list[dict[str, str]]:
        """Pending or running jobs the scheduler sealed: id, state, nodes, key, name."""
        out = await self.aslurm("squeue", "-h", "-o", "%i|%T|%N|%u|%U|%j|%k")
        jobs = []
        for line in out.splitlines():
            job_id, state, nodes, user, uid, name, comment = line.split("|", 6)
            job = Job(job_id=int(job_id), comment=comment, user_name=user, user_id=int(uid))
            key = SEAL.key_of(job)
            if key is not None and state in ("PENDING", "RUNNING"):
                jobs.append(
                    {"id": job_id, "state": state, "nodes": nodes, "key": key, "name": name}
                )
        return jobs


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sched_bed(kubelet_nodes: RealNodes, kube: AsyncClient) -> AsyncIterator[SchedBed]:
    async with slurm_bed(
        kubelet_nodes,
        kube,
        prefix="t-sched",
        extra_conf=SLURM_CONF,
        # Slurm ignores file-less GPUs: two existing character devices stand in.
        etc_files={"gres.conf": "Name=gpu File=/dev/null,/dev/zero\n"},
    ) as bed:
        access = bed.cluster.access()
        ns, port = bed.namespace, bed.ctld_port
        slurmd = {}
        owner = await slurmpods.standing_nodeset(kube, ns, "k8s")
        for node in bed.node_names[:3]:
            await set_capacity(kube, node, {GPU_RESOURCE: "2"})
            name = f"slurmd-{node}"
            body = slurmpods.slurmd_pod(
                name, ns, port, image=bed.image, node=node, cpus=2, feature="k8s"
            )
            slurmd_container = body["spec"]["containers"][0]
            command = slurmd_container["command"]
            command[-1] += " Gres=gpu:2"
            add_tenant = (
                f"echo '{TENANT_USER}:x:{TENANT_UID}:{TENANT_UID}::/tmp:/bin/sh' >> /etc/passwd"
                f" && echo '{TENANT_USER}:x:{TENANT_UID}:' >> /etc/group"
                ' && exec "$0" "$@"'
            )
            slurmd_container["command"] = ["sh", "-c", add_tenant, *command]
            await create(kube, slurmpods.owned(body, owner))
            slurmd[name] = node

        async def gpus_allocatable() -> bool:
            for node in slurmd.values():
                got = await kube.get(Node, node)
                allocatable = (got.status.allocatable if got.status else None) or {}
                if allocatable.get(GPU_RESOURCE) != "2":
                    return False
            return True

        await wait_for("the nodes' GPUs allocatable", gpus_allocatable, timeout=30)

        def idle() -> bool:
            out = bed.cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
            return all(states.get(p) == "idle" for p in slurmd)

        await wait_for("slurmd pods idle in Slurm", lambda: asyncio.to_thread(idle), timeout=60)
        yield SchedBed(bed, slurmd, access.restd_url, access.jwt_key)


class SchedulerProcess:
    """The scheduler with its own Slurm client and view; killed like a process."""

    def __init__(self, kube: AsyncClient, sb: SchedBed, *, every_namespace: bool = False) -> None:
        self.kube, self.sb = kube, sb
        self.namespace = None if every_namespace else sb.bed.namespace
        self.task: asyncio.Task[None] | None = None
        self.scheduler: Scheduler | None = None
        # One registry across restarts, as `sunk scheduler` keeps across leadership terms.
        self.metrics = SchedulerMetrics()

    async def _run(self) -> None:
        credentials = JwtMinter(FileKey(self.sb.key), SCHEDULER_USER)
        async with (
            SlurmClient(self.sb.url, credentials) as client,
            SlurmView(
                client, interval=0.25, stale_after=VIEW_STALE_AFTER, watch_nodes=False
            ) as view,
        ):
            port = SlurmPortForScheduler(client, view, TenantMinter(FileKey(self.sb.key)))
            self.scheduler = Scheduler(
                self.kube,
                port,
                seal=SEAL,
                tenancy=lambda: tenancy(self.sb.bed.namespace),
                tenancy_source="the test's tenancy",
                options=Options(partition="k8s", kill_wait=KILL_WAIT),
                namespace=self.namespace,
                slurmd_namespace=self.sb.bed.namespace,
                metrics=self.metrics,
            )
            await self.scheduler.run()

    @property
    def submits(self) -> int:
        """Jobs asked for by every run of this process, allocations and placeholders."""
        return int(sum(self.jobs_of_kind(kind) for kind in ("allocation", "batch")))

    def jobs_of_kind(self, kind: str) -> float:
        labels = {"kind": kind}
        return self.metrics.registry.get_sample_value("sunk_scheduler_jobs_total", labels) or 0.0

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def kill(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.task = None


@contextlib.asynccontextmanager
async def scheduling(
    kube: AsyncClient, sb: SchedBed, *, every_namespace: bool = False
) -> AsyncIterator[SchedulerProcess]:
    process = SchedulerProcess(kube, sb, every_namespace=every_namespace)
    process.start()
    try:
        yield process
    finally:
        await process.kill()


def pod_body(
    sb: SchedBed,
    name: str,
    *,
    cpu: str = "100m",  # one Slurm CPU (rounded up); little of the node's real two
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    grace: int = 2,
) -> Pod:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {GPU_RESOURCE: str(gpus)}
    return Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": sb.bed.namespace,
                "annotations": annotations or {},
                "labels": labels or {},
            },
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "terminationGracePeriodSeconds": grace,
                "containers": [
                    {
                        "name": "main",
                        "image": sb.bed.image,
                        "command": ["sleep", "3600"],
                        "resources": resources,
                    }
                ],
            },
        },
    )


async def get_pod(kube: AsyncClient, sb: SchedBed, name: str) -> Pod | None:
    try:
        return await kube.get(Pod, name, namespace=sb.bed.namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


async def bound_node(kube: AsyncClient, sb: SchedBed, name: str) -> str:
    pod = await get_pod(kube, sb, name)
    return (pod.spec.nodeName if pod and pod.spec else None) or ""


def scheduled_condition(pod: Pod | None) -> tuple[str, str]:
    for c in (pod.status.conditions if pod and pod.status else None) or []:
        if c.type == "PodScheduled":
            return c.status, c.message or ""
    return "", ""


async def delete_and_wait(kube: AsyncClient, sb: SchedBed, *names: str) -> None:
    for name in names:
        with contextlib.suppress(ApiError):
            await kube.delete(Pod, name, namespace=sb.bed.namespace, grace_period=0)

    async def gone() -> bool:
        return all([await get_pod(kube, sb, n) is None for n in names])

    await wait_for(f"pods {names} to be gone", gone, timeout=30)


async def sbatch(sb: SchedBed, *args: str, user: str | None = None) -> str:
    """`sbatch --parsable ARGS` (as `user`), its job id. A submission slurmctld
    was too busy to answer ("Socket timed out") may still have been taken: it
    is looked up by its own job name before it is sent again, never twice."""
    name = f"t-{secrets.token_hex(4)}"
    runas = ("runuser", "-u", user, "--") if user else ()
    for attempt in range(3):
        try:
            out = await sb.aslurm(*runas, "sbatch", "--parsable", f"--job-name={name}", *args)
            return out.strip().split(";")[0]
        except SlurmCommandError as error:
            if "Socket timed out" not in (error.stderr or "") or attempt == 2:
                raise
        await asyncio.sleep(2)
        if found := (await sb.aslurm("squeue", "-h", "-n", name, "-o", "%i")).split():
            return found[0]
    raise AssertionError("unreachable")


async def no_live_jobs(sb: SchedBed) -> bool:
    return not await sb.our_jobs()


async def test_a_gpu_pod_lands_where_slurm_has_two_free_gpus(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    sb = sched_bed
    names = sorted(sb.slurmd)
    # Batch jobs hold one GPU on each of the first two nodes: only the third has two free.
    batch = [
        (
            await sb.aslurm(
                "sbatch", "--parsable", "-p", "k8s", "-w", n, "--gres=gpu:1", "--wrap", "sleep 600"
            )
        ).strip()
        for n in names[:2]
    ]
    try:
        async with scheduling(kube, sb):
            await kube.create(pod_body(sb, "gpu2", gpus=2))
            node = await wait_for_bound(kube, sb, "gpu2")
            assert node == sb.slurmd[names[2]]
            pod = await get_pod(kube, sb, "gpu2")
            job_id = job_of(pod)
            fields = await sb.job_fields(job_id)
            assert fields["JobState"] == "RUNNING"
            assert fields["NodeList"] == names[2]
            assert "gpu:2" in fields.get("TresPerNode", "")

            async def pod_running() -> bool:
                got = await get_pod(kube, sb, "gpu2")
                return bool(got and got.status and got.status.phase == "Running")

            await wait_for("the pod to run on its node", pod_running, timeout=30)
            await delete_and_wait(kube, sb, "gpu2")
            # Pod deletion ends the job.
            await wait_for("the job to end", lambda: job_ended(sb, job_id), timeout=20)
    finally:
        await sb.aslurm("scancel", *batch)


async def gpu_indices(sb: SchedBed, job_id: str) -> str:
    """The GPU indices `scontrol show job -d` lists for the job ("0", "0-1")."""
    out = await sb.aslurm("scontrol", "-d", "-o", "show", "job", job_id)
    found = re.findall(r"GRES=gpu[^ ]*\(IDX:([0-9,-]+)\)", out)
    assert len(found) == 1, out
    return str(found[0])


async def test_a_gpu_pod_is_told_the_gpu_indices_its_slurm_job_holds(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    """Before binding, the scheduler writes on the pod's status the GPU indices
    Slurm allocated to its job on its node (what sunk's device plugin hands
    the pod): those `scontrol show job -d` lists, not the one a batch job
    beside it holds. (The bed's two GPUs per node are stand-in character
    devices; no GPU exists here.)"""
    sb = sched_bed
    names = sorted(sb.slurmd)
    # One GPU of every node is a batch job's: the pod gets the other one.
    batch = {
        n: (
            await sb.aslurm(
                "sbatch", "--parsable", "-p", "k8s", "-w", n, "--gres=gpu:1", "--wrap", "sleep 600"
            )
        ).strip()
        for n in names
    }
    try:
        for job in batch.values():
            await wait_for(f"batch job {job} to run", lambda j=job: running(sb, j), timeout=30)
        async with scheduling(kube, sb):
            await kube.create(pod_body(sb, "gpu1", gpus=1))
            node = await wait_for_bound(kube, sb, "gpu1")
            pod = await get_pod(kube, sb, "gpu1")
            slurm_node = next(n for n in names if sb.slurmd[n] == node)
            held = await gpu_indices(sb, job_of(pod))
            beside = await gpu_indices(sb, batch[slurm_node])
            assert held != beside
            assert pod is not None
            assert pod.status is not None
            told = [c for c in pod.status.conditions or [] if c.type == CONDITION_SLURM_GPUS]
            assert len(told) == 1, pod.status.conditions
            assert (told[0].status, told[0].reason, told[0].message) == (
                "True",
                "AllocatedBySlurm",
                held,
            )
            await delete_and_wait(kube, sb, "gpu1")
    finally:
        await sb.aslurm("scancel", *batch.values())


async def wait_for_bound(kube: AsyncClient, sb: SchedBed, name: str, timeout: float = 30) -> str:
    async def bound() -> bool:
        return bool(await bound_node(kube, sb, name))

    await wait_for(f"{name} to be bound", bound, timeout=timeout)
    return await bound_node(kube, sb, name)


async def job_ended(sb: SchedBed, job_id: str) -> bool:
    state = (await sb.job_fields(job_id)).get("JobState", "")
    return state in ("", "CANCELLED", "COMPLETED", "FAILED", "PREEMPTED", "TIMEOUT")


def job_of(pod: Pod | None) -> str:
    assert pod is not None
    assert pod.metadata is not None
    return (pod.metadata.annotations or {}).get(ANNOTATION_JOB_ID, "")


async def fill_pool(sb: SchedBed, partition: str = "k8s") -> list[str]:
    """One exclusive batch job on every node."""
    return [
        (
            await sb.aslurm(
                "sbatch",
                "--parsable",
                "-p",
                partition,
                "-w",
                n,
                "--exclusive",
                "--wrap",
                "sleep 600",
            )
        ).strip()
        for n in sorted(sb.slurmd)
    ]


async def running(sb: SchedBed, job_id: str) -> bool:
    return (await sb.job_fields(job_id)).get("JobState") == "RUNNING"


async def events_for(
    kube: AsyncClient, sb: SchedBed, name: str, namespace: str | None = None
) -> list[Event]:
    return [
        e
        async for e in kube.list(Event, namespace=namespace or sb.bed.namespace)
        if e.involvedObject.name == name
    ]


async def test_a_pod_waits_with_slurms_reason_and_binds_when_a_job_ends(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    sb = sched_bed
    batch = await fill_pool(sb)
    try:
        await wait_for("the batch jobs to run", lambda: running(sb, batch[-1]))
        async with scheduling(kube, sb) as process:
            await kube.create(pod_body(sb, "waiter"))

            async def says_why() -> bool:
                status, message = scheduled_condition(await get_pod(kube, sb, "waiter"))
                return status == "False" and ("Resources" in message or "Priority" in message)

            await wait_for("PodScheduled=False with Slurm's reason", says_why)
            assert await bound_node(kube, sb, "waiter") == ""
            ended = sorted(sb.slurmd)[1]
            await sb.aslurm("scancel", batch[1])
            started = asyncio.get_running_loop().time()
            node = await wait_for_bound(kube, sb, "waiter")
            print(
                f"batch job ended → pod bound in {asyncio.get_running_loop().time() - started:.2f}s"
            )
            assert node == sb.slurmd[ended]
            # It had to wait: Slurm refused the allocation and queued a placeholder.
            assert process.jobs_of_kind("batch") == 1
            assert process.jobs_of_kind("allocation") == 0
            job_id = job_of(await get_pod(kube, sb, "waiter"))
            assert (await sb.job_fields(job_id)).get("NodeList") == ended
            await delete_and_wait(kube, sb, "waiter")
            await wait_for("the job to end", lambda: job_ended(sb, job_id))
    finally:
        await sb.aslurm("scancel", *batch)


async def test_scancel_evicts_the_pod(kube: AsyncClient, sched_bed: SchedBed) -> None:
    sb = sched_bed
    async with scheduling(kube, sb) as process:
        await kube.create(pod_body(sb, "victim"))
        await wait_for_bound(kube, sb, "victim")
        job_id = job_of(await get_pod(kube, sb, "victim"))
        # The tenant's own job, asked with the tenant's token: an allocation (it
        # runs as the token's user), by a scheduler with no Slurm privilege.
        assert (await sb.job_fields(job_id))["UserId"] == f"{TENANT_USER}({TENANT_UID})"
        assert process.jobs_of_kind("allocation") == 1
        await sb.aslurm("scancel", job_id)
        started = asyncio.get_running_loop().time()

        async def evicted() -> bool:
            pod = await get_pod(kube, sb, "victim")
            return pod is None or bool(pod.metadata and pod.metadata.deletionTimestamp)

        await wait_for("the pod to be evicted", evicted, timeout=10)
        print(f"scancel → pod deleted in {asyncio.get_running_loop().time() - started:.2f}s")
        assert any(e.reason == "Evicted" for e in await events_for(kube, sb, "victim"))
        registry = process.metrics.registry
        assert registry.get_sample_value("sunk_scheduler_binds_total") == 1
        assert registry.get_sample_value("sunk_scheduler_bind_seconds_count") == 1
        # Bound once: the job event that follows the bind finds the pod bound,
        # even before the informer shows it (a second Binding would fail, 409).
        assert registry.get_sample_value("sunk_scheduler_errors_total") == 0
        evicted = {"state": "CANCELLED"}
        assert registry.get_sample_value("sunk_scheduler_evictions_total", evicted) == 1
        await delete_and_wait(kube, sb, "victim")


async def test_invalid_annotations_give_an_event_and_no_binding(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    """Pods that ask what the scheduler cannot express or their namespace is not
    granted (as a tenant would try: root, another account, a partition outside
    the grant, a namespace the tenancy does not list) get an Event naming the
    rule, and no job."""
    sb = sched_bed
    unserved = f"t-unserved-{sb.bed.namespace.rsplit('-', 1)[1]}"
    stranger = pod_body(sb, "stranger")
    assert stranger.metadata is not None
    stranger.metadata.namespace = unserved
    asks = {  # pod name → (annotations, what the Event must say)
        "bad-partition": (
            {ANNOTATION_PARTITION: "nope"},
            "sunk.dev/partition: 'nope' is not granted (granted: k8s, low, high)",
        ),
        "bad-time": ({ANNOTATION_TIME_LIMIT: "soon"}, "invalid time limit"),
        "as-root": ({ANNOTATION_USER_ID: "0"}, "sunk.dev/user-id: uid 0 is not granted"),
        "other-account": (
            {ANNOTATION_ACCOUNT: "finance"},
            "sunk.dev/account: 'finance' is not granted",
        ),
    }
    cases = {
        name: (pod_body(sb, name, annotations=annotations), text)
        for name, (annotations, text) in asks.items()
    }
    cases["bad-grace"] = (pod_body(sb, "bad-grace", grace=60), "KillWait")
    cases["stranger"] = (stranger, f"namespace {unserved} is not served")
    await kube.create(Namespace(metadata=ObjectMeta(name=unserved)))
    try:
        async with scheduling(kube, sb, every_namespace=True):
            for pod, _ in cases.values():
                await kube.create(pod)

            async def reported() -> bool:
                for name, (pod, text) in cases.items():
                    namespace = pod.metadata.namespace if pod.metadata else None
                    notes = [
                        e.message or ""
                        for e in await events_for(kube, sb, name, namespace)
                        if e.reason == "FailedScheduling"
                    ]
                    if not any(text in note for note in notes):
                        return False
                return True

            await wait_for("an Event with the reason for every pod", reported)
            await asyncio.sleep(2)
            for name in set(cases) - {"stranger"}:
                pod = await get_pod(kube, sb, name)
                assert await bound_node(kube, sb, name) == ""
                assert scheduled_condition(pod)[0] == "False"
                assert job_of(pod) == ""
            assert not await sb.our_jobs()
            await delete_and_wait(kube, sb, *(set(cases) - {"stranger"}))
    finally:
        await kube.delete(Namespace, unserved)


async def test_a_gang_of_three_binds_all_or_nothing(kube: AsyncClient, sched_bed: SchedBed) -> None:
    sb = sched_bed
    labels = {GANG_NAME: "trio", GANG_SIZE: "3"}
    blocker = (
        await sb.aslurm("sbatch", "--parsable", "-p", "k8s", "--exclusive", "--wrap", "sleep 600")
    ).strip()
    try:
        await wait_for("the blocking job to run", lambda: running(sb, blocker))
        async with scheduling(kube, sb):
            for i in (0, 1):
                await kube.create(pod_body(sb, f"trio-{i}", labels=labels))

            async def waiting_for_gang() -> bool:
                status, message = scheduled_condition(await get_pod(kube, sb, "trio-0"))
                return status == "False" and "2 of 3" in message

            await wait_for("the two pods to wait for their gang", waiting_for_gang)
            assert not await sb.our_jobs()
            await kube.create(pod_body(sb, "trio-2", labels=labels))

            async def one_pending_job() -> bool:
                jobs = await sb.our_jobs()
                return len(jobs) == 1 and jobs[0]["state"] == "PENDING"

            await wait_for("one pending Slurm job for the gang", one_pending_job)
            first = (await sb.our_jobs())[0]["id"]
            # A member leaves before the allocation: the job goes, the others wait again.
            await delete_and_wait(kube, sb, "trio-2")
            await wait_for("the gang's job to be cancelled", lambda: no_live_jobs(sb))
            await wait_for("the two pods to wait for their gang again", waiting_for_gang)
            await kube.create(pod_body(sb, "trio-2", labels=labels))
            await wait_for("a new pending Slurm job for the gang", one_pending_job)
            assert (await sb.our_jobs())[0]["id"] != first
            await asyncio.sleep(1.5)
            names = [f"trio-{i}" for i in range(3)]
            assert [await bound_node(kube, sb, n) for n in names] == ["", "", ""]
            await sb.aslurm("scancel", blocker)

            async def all_bound() -> bool:
                return all([await bound_node(kube, sb, n) for n in names])

            await wait_for("all three to bind", all_bound)
            nodes = {await bound_node(kube, sb, n) for n in names}
            assert nodes == set(sb.slurmd.values())
            jobs = await sb.our_jobs()
            assert len(jobs) == 1
            assert jobs[0]["state"] == "RUNNING"
            assert {job_of(await get_pod(kube, sb, n)) for n in names} == {jobs[0]["id"]}
            await delete_and_wait(kube, sb, *names)
            await wait_for("the gang's job to end", lambda: no_live_jobs(sb))
    finally:
        await sb.aslurm("scancel", blocker)


async def test_a_high_priority_pod_preempts_a_batch_job(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    sb = sched_bed
    batch = await fill_pool(sb, partition="low")
    try:
        await wait_for("the batch jobs to run", lambda: running(sb, batch[-1]))
        async with scheduling(kube, sb):
            await kube.create(pod_body(sb, "vip", annotations={ANNOTATION_PARTITION: "high"}))
            node = await wait_for_bound(kube, sb, "vip", timeout=60)
            slurm_node = next(s for s, k in sb.slurmd.items() if k == node)
            victim = batch[sorted(sb.slurmd).index(slurm_node)]
            fields = await sb.job_fields(victim)
            assert fields.get("JobState") in ("PENDING", "REQUEUED", "PREEMPTED"), fields
            await delete_and_wait(kube, sb, "vip")
    finally:
        await sb.aslurm("scancel", *batch)


async def test_a_high_priority_batch_job_preempts_a_pod(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    sb = sched_bed
    async with scheduling(kube, sb):
        annotations = {ANNOTATION_PARTITION: "low", ANNOTATION_EXCLUSIVE: "none"}
        await kube.create(pod_body(sb, "humble", annotations=annotations))
        node = await wait_for_bound(kube, sb, "humble")
        slurm_node = next(s for s, k in sb.slurmd.items() if k == node)
        job_id = job_of(await get_pod(kube, sb, "humble"))
        vip = (
            await sb.aslurm(
                "sbatch",
                "--parsable",
                "-p",
                "high",
                "-w",
                slurm_node,
                "--exclusive",
                "--wrap",
                "sleep 600",
            )
        ).strip()
        try:
            started = asyncio.get_running_loop().time()

            async def evicted() -> bool:
                pod = await get_pod(kube, sb, "humble")
                return pod is None or bool(pod.metadata and pod.metadata.deletionTimestamp)

            await wait_for("the pod to be evicted", evicted, timeout=KILL_WAIT)
            print(f"preemption → pod deleted in {asyncio.get_running_loop().time() - started:.2f}s")
            await wait_for("the batch job to run", lambda: running(sb, vip), timeout=30)
            took = asyncio.get_running_loop().time() - started
            print(f"preemption → batch job running in {took:.2f}s")
            # The node was held for the pod's grace: the batch job ran only once its
            # containers had stopped (the kubelet then reports the pod terminal, and
            # removes it a moment later).
            pod = await get_pod(kube, sb, "humble")
            assert pod is None or (pod.status and pod.status.phase in ("Succeeded", "Failed")), pod
            assert (await sb.job_fields(job_id)).get("JobState") != "RUNNING"
            await delete_and_wait(kube, sb, "humble")
        finally:
            await sb.aslurm("scancel", vip)


async def test_a_scheduler_killed_between_submit_and_bind_never_double_submits(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    sb = sched_bed
    rng = random.Random(8)  # noqa: S311 - kill points, not secrets
    names = [f"crash-{i}" for i in range(6)]
    process = SchedulerProcess(kube, sb)
    try:
        for name in names:
            process.start()
            await kube.create(pod_body(sb, name))
            await asyncio.sleep(rng.uniform(0.0, 0.6))  # somewhere before, during or after submit
            await process.kill()
            process.start()
            await wait_for_bound(kube, sb, name)
            await process.kill()
        jobs = await sb.our_jobs()
        pods = {name: await get_pod(kube, sb, name) for name in names}
        uids = {p.metadata.uid for p in pods.values() if p and p.metadata}
        assert len(jobs) == len(names), jobs  # one job per pod, no more
        assert {j["key"].split("/", 1)[1] for j in jobs} == uids
        assert {j["id"] for j in jobs} == {job_of(p) for p in pods.values()}
        print(
            f"{process.submits} submits for {len(names)} pods over {2 * len(names)} scheduler runs"
        )
        assert process.submits == len(names)
        process.start()
        await delete_and_wait(kube, sb, *names)
        await wait_for("every job to end", lambda: no_live_jobs(sb))
    finally:
        await process.kill()


async def test_an_orphan_job_is_cancelled(kube: AsyncClient, sched_bed: SchedBed) -> None:
    """A sealed job whose pod is gone (its scheduler died before binding) is
    cancelled; a job that only looks like one (its comment written by a Slurm
    user) is not the scheduler's to cancel."""
    sb = sched_bed
    key = f"{sb.bed.namespace}/00000000-0000-0000-0000-000000000000"
    submit = ("-p", "k8s", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 600")
    # The tenant's job, as the scheduler would have submitted it: it ends it as the tenant.
    orphan = await sbatch(
        sb, f"--comment={SEAL.comment(key, TENANT_UID)}", *submit, user=TENANT_USER
    )
    lookalike = await sbatch(sb, f"--comment=sunk:{key}", *submit)
    try:
        async with scheduling(kube, sb):
            await wait_for("the orphan to be cancelled", lambda: job_ended(sb, orphan), timeout=30)
            await asyncio.sleep(2)
            assert (await sb.job_fields(lookalike)).get("JobState") == "RUNNING"
    finally:
        await sb.aslurm("scancel", orphan, lookalike)


async def test_a_job_id_written_on_a_pod_claims_no_one_elses_job(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    """A pod author writes someone's running job id into the annotation the
    scheduler uses: the pod gets its own job, and the victim's job runs on after
    the pod is gone (it used to be bound into it, then cancelled with it)."""
    sb = sched_bed
    victim = await sbatch(sb, "-p", "k8s", "--wrap", "sleep 600")
    try:
        await wait_for("the victim's job to run", lambda: running(sb, victim))
        async with scheduling(kube, sb):
            await kube.create(pod_body(sb, "forger", annotations={ANNOTATION_JOB_ID: victim}))
            await wait_for_bound(kube, sb, "forger")
            own = job_of(await get_pod(kube, sb, "forger"))
            assert own
            assert own != victim
            assert [j["id"] for j in await sb.our_jobs()] == [own]
            await delete_and_wait(kube, sb, "forger")
            await wait_for("the forger's own job to end", lambda: job_ended(sb, own))
            await asyncio.sleep(2)
            assert (await sb.job_fields(victim)).get("JobState") == "RUNNING"
    finally:
        await sb.aslurm("scancel", victim)


async def test_a_crafted_job_comment_takes_no_gang(kube: AsyncClient, sched_bed: SchedBed) -> None:
    """Gang keys are predictable, and comments are anyone's to write and read.
    A Slurm user submits jobs for a gang before its pods exist: one with a
    made-up comment that ended, one running, and one carrying the seal the
    scheduler's own job for the gang would carry (as read from `squeue`), but
    submitted by another user. None of them is taken
    for the gang's job: the gang gets its own, and the impostors are left alone."""
    sb = sched_bed
    key = f"{sb.bed.namespace}/gang:duo"
    made_up = f"--comment=sunk:{key}"
    copied = f"--comment={SEAL.comment(key, TENANT_UID)}"
    submit = ("-p", "k8s", "--chdir=/tmp", "-o", "/dev/null")
    ended = await sbatch(sb, *submit, made_up, "--wrap", "true")
    impostors = [
        await sbatch(sb, *submit, made_up, "--wrap", "sleep 600"),
        await sbatch(sb, *submit, copied, "--wrap", "sleep 600", user="daemon"),
    ]
    labels = {GANG_NAME: "duo", GANG_SIZE: "2"}
    names = ["duo-0", "duo-1"]
    try:
        await wait_for("the made-up job to end", lambda: job_ended(sb, ended))
        for job in impostors:
            await wait_for(f"impostor {job} to run", lambda j=job: running(sb, j))
        async with scheduling(kube, sb):
            for name in names:
                await kube.create(pod_body(sb, name, labels=labels))
            for name in names:
                await wait_for_bound(kube, sb, name)
            jobs = await sb.our_jobs()
            assert [j["key"] for j in jobs] == [key]
            assert {job_of(await get_pod(kube, sb, n)) for n in names} == {jobs[0]["id"]}
            await delete_and_wait(kube, sb, *names)
            await wait_for("the gang's job to end", lambda: no_live_jobs(sb))
            await asyncio.sleep(2)
            for job in impostors:
                assert (await sb.job_fields(job)).get("JobState") == "RUNNING", job
    finally:
        await sb.aslurm("scancel", *impostors)


async def test_a_pod_stops_its_grace_period_before_its_time_limit(
    kube: AsyncClient, sched_bed: SchedBed
) -> None:
    """An allocation ends at its time limit with nothing to wait for: the pod is
    evicted its grace period (and a margin) before, and the job is ended once the pod is gone,
    never by the limit (TIMEOUT) while the pod may still run."""
    sb = sched_bed
    grace = 8
    async with scheduling(kube, sb):
        body = pod_body(sb, "timed", annotations={ANNOTATION_TIME_LIMIT: "1"}, grace=grace)
        await kube.create(body)
        await wait_for_bound(kube, sb, "timed")
        job_id = job_of(await get_pod(kube, sb, "timed"))
        fields = await sb.job_fields(job_id)
        assert fields["TimeLimit"] == "00:01:00"
        started = asyncio.get_running_loop().time()

        async def evicted() -> bool:
            pod = await get_pod(kube, sb, "timed")
            return pod is None or bool(pod.metadata and pod.metadata.deletionTimestamp)

        await wait_for("the pod to be evicted before the time limit", evicted, timeout=75)
        took = asyncio.get_running_loop().time() - started
        print(f"bound → evicted for the time limit in {took:.1f}s (limit 60 s, grace {grace} s)")
        assert took < 60 - grace - STOP_MARGIN + 3
        assert any("time limit" in (e.message or "") for e in await events_for(kube, sb, "timed"))
        await wait_for("the pod to be gone", lambda: pod_gone(kube, sb, "timed"), timeout=30)
        # Gone: the scheduler ends the job before Slurm's limit would.
        await wait_for("the job to end", lambda: job_ended(sb, job_id), timeout=20)
        assert (await sb.job_fields(job_id)).get("JobState") == "CANCELLED"


async def pod_gone(kube: AsyncClient, sb: SchedBed, name: str) -> bool:
    return await get_pod(kube, sb, name) is None
