"""The syncer end to end: real nodes (kubelet + containerd) that run slurmd pods
from the slurm image, a real Slurm, the real apiserver.

Why the test bed's own Slurm rather than the charts: the tests stop and
restart slurmctld and slurmrestd, freeze a slurmd, and run the syncer
in-process, started and cancelled at will. That Slurm's SlurmdTimeout (30 s,
the chart's is 300) lets a frozen slurmd show NOT_RESPONDING within the
test's 90 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod
from lightkube.types import PatchType

from plugins.nodes import RealNodes
from plugins.slurm_pods import SlurmBed, create, slurm_bed, wait_for
from sunk.api import LABEL_NODESET, TAINT_NODE_LOCK
from sunk.kube.leader import LeaderElector
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView
from sunk.syncer.controller import CONTROLLER, Syncer
from sunk.syncer.decide import (
    ANNOTATION_SLURM_REASON,
    CORDON_REASON_ANNOTATION,
    LABEL_SLURM_DRAIN,
)
from sunk.syncer.slurm_adapter import SlurmPortForSyncer
from sunk_testbed import slurmpods
from sunk_testbed.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.e2e
log = logging.getLogger(__name__)


@dataclass
class SyncBed:
    bed: SlurmBed
    nodes: list[str]  # the Kubernetes nodes with a slurmd pod
    pods: dict[str, str]  # Kubernetes node → slurmd pod (= Slurm node)
    client: SlurmClient
    view: SlurmView


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sync_bed(kubelet_nodes: RealNodes, kube: AsyncClient) -> AsyncIterator[SyncBed]:
    async with slurm_bed(kubelet_nodes, kube, prefix="t-sync") as bed:
        access = bed.cluster.access()
        ns, port = bed.namespace, bed.ctld_port
        nodes = bed.node_names[:3]
        pods = {}
        owner = await slurmpods.standing_nodeset(kube, ns, "sync")
        for node in nodes:
            name = f"slurmd-{node}"
            body = slurmpods.slurmd_pod(name, ns, port, image=bed.image, node=node)
            await create(kube, slurmpods.owned(body, owner))
            pods[node] = name

        def idle() -> bool:
            out = bed.cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(p) == "idle" for p in pods.values())

        await wait_for("slurmd pods idle in Slurm", lambda: asyncio.to_thread(idle), timeout=60)
        credentials = JwtMinter(FileKey(access.jwt_key), "root")
        async with SlurmClient(access.restd_url, credentials) as client:
            view = SlurmView(client, interval=0.25, watch_jobs=False)
            async with view:
                yield SyncBed(bed, nodes, pods, client, view)


LEASE = "sunk-syncer-test"


@contextlib.asynccontextmanager
async def syncing(
    kube: AsyncClient, sb: SyncBed, *, every_namespace: bool = False
) -> AsyncIterator[Syncer]:
    lease = (sb.bed.namespace, LEASE)
    namespace = None if every_namespace else sb.bed.namespace
    syncer = Syncer(kube, SlurmPortForSyncer(sb.client, sb.view), namespace=namespace, lease=lease)
    task = asyncio.create_task(syncer.run())
    try:
        yield syncer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def scontrol_node(sb: SyncBed, name: str) -> dict[str, str]:
    """The node's fields; none while slurmctld does not answer (callers poll)."""
    out = sb.bed.cluster.run(["scontrol", "-o", "show", "node", name], check=False).stdout
    fields: dict[str, str] = {}
    for part in out.replace("Reason=", "\nReason=").split("\n"):
        if part.startswith("Reason="):
            fields["Reason"] = part.removeprefix("Reason=").rsplit(" [", 1)[0].strip()
        else:
            for item in part.split():
                key, _, value = item.partition("=")
                fields[key] = value
    return fields


async def slurm_reason(sb: SyncBed, name: str) -> tuple[str, str]:
    fields = await asyncio.to_thread(scontrol_node, sb, name)
    return fields.get("State", ""), fields.get("Reason", "")


async def wait_drain(sb: SyncBed, name: str, reason: str | None, what: str) -> None:
    """Wait until Slurm node `name` is drained with `reason`, or (None) not drained."""

    async def there() -> bool:
        state, now = await slurm_reason(sb, name)
        return "DRAIN" not in state if reason is None else "DRAIN" in state and now == reason

    await wait_for(what, there, timeout=30)


async def scontrol(sb: SyncBed, *args: str) -> None:
    await asyncio.to_thread(sb.bed.cluster.run, ["scontrol", *args])


async def set_cordon(kube: AsyncClient, node: str, on: bool, why: str | None = None) -> None:
    body: dict[str, object] = {"spec": {"unschedulable": on}}
    if why is not None:
        body["metadata"] = {"annotations": {CORDON_REASON_ANNOTATION: why}}
    await kube.patch(Node, node, body, patch_type=PatchType.MERGE)


async def conditions_of(kube: AsyncClient, obj: Node | Pod) -> dict[str, tuple[str, str]]:
    """type → (status, reason) of a node's or pod's conditions, read now."""
    assert obj.metadata is not None
    if isinstance(obj, Node):
        fresh: Node | Pod = await kube.get(Node, obj.metadata.name or "")
    else:
        fresh = await kube.get(Pod, obj.metadata.name or "", namespace=obj.metadata.namespace)
    found = (fresh.status.conditions if fresh.status else None) or []
    return {c.type: (c.status, c.reason or "") for c in found}


async def events_about(kube: AsyncClient, namespace: str, name: str) -> list[str]:
    """Reasons of the syncer's Events about the object `name`.

    Read through core/v1: events.k8s.io/v1 lists fail to decode the other
    components' Events, whose eventTime is null."""
    return [
        e.reason or ""
        async for e in kube.list(Event, namespace=namespace)
        if e.reportingComponent == CONTROLLER and e.involvedObject.name == name
    ]


async def test_cordon_drains_with_its_reason_and_uncordon_resumes(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.nodes[0]
    slurm_node = sync_bed.pods[node]
    async with syncing(kube, sync_bed) as syncer:
        started = time.monotonic()
        await kube.patch(
            Node,
            node,
            {
                "metadata": {"annotations": {CORDON_REASON_ANNOTATION: "swap PSU"}},
                "spec": {"unschedulable": True},
            },
            patch_type=PatchType.MERGE,
        )

        ours = "sunk/syncer: node cordoned: swap PSU"
        await wait_drain(sync_bed, slurm_node, ours, "the cordon to drain the Slurm node")
        print(f"cordon → Slurm drain in {time.monotonic() - started:.2f}s")

        await kube.patch(Node, node, {"spec": {"unschedulable": False}}, patch_type=PatchType.MERGE)

        await wait_drain(sync_bed, slurm_node, None, "the uncordon to resume it")

        async def told() -> bool:
            reasons = await events_about(kube, "default", node)
            return "SlurmDrain" in reasons and "SlurmResume" in reasons

        await wait_for("Events about the drain and the resume", told, timeout=30)
        registry = syncer.metrics.registry
        assert (registry.get_sample_value("sunk_syncer_actions_total", {"kind": "drain"}) or 0) >= 1
        assert (
            registry.get_sample_value("sunk_syncer_actions_total", {"kind": "resume"}) or 0
        ) >= 1

        # The gauge is set by each sync: a read that fails right after a change (a
        # 24.11 defect) can leave it at 0 until the next poll's resync.
        async def fresh() -> bool:
            return registry.get_sample_value("sunk_syncer_slurm_view_fresh") == 1

        await wait_for("the view-fresh gauge", fresh, timeout=10)
        assert (registry.get_sample_value("sunk_syncer_reconcile_seconds_count") or 0) > 0
        assert (registry.get_sample_value("sunk_syncer_slurm_requests") or 0) > 0
        assert registry.get_sample_value("sunk_syncer_write_wait_seconds", {"api": "slurm"}) == 0


async def test_an_admin_drain_shows_on_the_node_and_is_never_resumed(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.nodes[1]
    slurm_node = sync_bed.pods[node]
    reason = "bad DIMM, ticket 42"
    cluster = sync_bed.bed.cluster
    await asyncio.to_thread(admin_update, cluster, slurm_node, "state=drain", f"reason={reason}")
    try:
        async with syncing(kube, sync_bed) as syncer:

            async def mirrored() -> bool:
                obj = await kube.get(Node, node)
                assert obj.metadata is not None
                conditions = {
                    c.type: c for c in (obj.status.conditions if obj.status else []) or []
                }
                drain = conditions.get("SlurmDrain")
                return (
                    (obj.metadata.annotations or {}).get(ANNOTATION_SLURM_REASON) == reason
                    and (obj.metadata.labels or {}).get(LABEL_SLURM_DRAIN) == "true"
                    and drain is not None
                    and drain.status == "True"
                    and drain.reason == "SlurmDrain"  # began in Slurm, not made by sunk
                )

            await wait_for("the Slurm drain on the Kubernetes node", mirrored, timeout=30)

            async def on_the_pod() -> bool:
                pod = await kube.get(Pod, slurm_node, namespace=sync_bed.bed.namespace)
                assert pod.metadata is not None
                conditions = await conditions_of(kube, pod)
                return (
                    (pod.metadata.annotations or {}).get(ANNOTATION_SLURM_REASON) == reason
                    and (pod.metadata.labels or {}).get(LABEL_SLURM_DRAIN) == "true"
                    and conditions.get("SlurmDrain") == ("True", "SlurmDrain")
                    and conditions.get("SlurmSynced") == ("True", "InStep")
                    and conditions.get("Ready", ("",))[0] == "True"  # the kubelet's stay
                )

            await wait_for("the Slurm drain on the slurmd pod", on_the_pod, timeout=30)

            async def told() -> bool:
                return "SlurmDrained" in await events_about(kube, "default", node)

            try:
                await wait_for("an Event about the Slurm drain", told, timeout=30)
            except AssertionError as missing:
                raise AssertionError(f"{missing}; recorder {syncer._events.stats}") from None
            # A cordon and uncordon do not take it over, and do not resume it.
            await kube.patch(
                Node, node, {"spec": {"unschedulable": True}}, patch_type=PatchType.MERGE
            )
            await asyncio.sleep(1.5)
            await kube.patch(
                Node, node, {"spec": {"unschedulable": False}}, patch_type=PatchType.MERGE
            )
            await asyncio.sleep(1.5)
        # Nor does a syncer starting afresh.
        async with syncing(kube, sync_bed):
            await asyncio.sleep(1.5)
        state, now = await slurm_reason(sync_bed, slurm_node)
        assert "DRAIN" in state
        assert now == reason
    finally:
        await asyncio.to_thread(admin_update, cluster, slurm_node, "state=resume")


async def test_a_pod_that_only_looks_like_a_slurmd_drains_nothing(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    """A tenant's pod in its own namespace, labelled `sunk.dev/nodeset` and named
    like a Slurm node, on a node with no slurmd: cordoning that node must not
    drain the real Slurm node (a syncer that took labels on trust did). The
    syncer watches every namespace here, the chart's widest setting."""
    slurm_node = sync_bed.pods[sync_bed.nodes[0]]
    elsewhere = sync_bed.bed.node_names[3]  # no slurmd pod of this bed
    tenant = f"t-tenant-{sync_bed.bed.namespace.rsplit('-', 1)[1]}"
    await kube.create(Namespace(metadata=ObjectMeta(name=tenant)))
    impostor = slurmpods.slurmd_pod(slurm_node, tenant, 1, image=sync_bed.bed.image, node=elsewhere)
    impostor["metadata"]["labels"][LABEL_NODESET] = "sync"
    impostor["spec"]["initContainers"] = []
    impostor["spec"]["volumes"] = []
    impostor["spec"]["containers"] = [
        {"name": "main", "image": sync_bed.bed.image, "command": ["sleep", "3600"]}
    ]
    try:
        await create(kube, impostor)
        async with syncing(kube, sync_bed, every_namespace=True):
            await set_cordon(kube, elsewhere, True)
            await asyncio.sleep(3)  # cordon → drain takes about 0.15 s when it is real
            state, reason = await slurm_reason(sync_bed, slurm_node)
            assert "DRAIN" not in state, (state, reason)
    finally:
        await set_cordon(kube, elsewhere, False)
        await kube.delete(Namespace, tenant)


async def test_the_node_lock_taint_follows_a_running_job(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.nodes[0]
    slurm_node = sync_bed.pods[node]

    async def locked() -> bool:
        obj = await kube.get(Node, node)
        return any(t.key == TAINT_NODE_LOCK for t in (obj.spec.taints if obj.spec else []) or [])

    before = await kube.get(Pod, slurm_node, namespace=sync_bed.bed.namespace)
    async with syncing(kube, sync_bed):
        out = await asyncio.to_thread(
            sync_bed.bed.cluster.run,
            ["sbatch", "--parsable", "-w", slurm_node, "--wrap", "sleep 3"],
        )
        job = out.stdout.strip()
        await wait_for("the node-lock taint while the job runs", locked, timeout=60)

        async def unlocked() -> bool:
            return not await locked()

        await wait_for("the taint to go once the job ends", unlocked, timeout=60)
        state = (
            await asyncio.to_thread(
                sync_bed.bed.cluster.run,
                ["sacct", "-n", "-X", "-j", job, "-o", "State"],
                check=False,
            )
        ).stdout
        assert "FAILED" not in state
    # The slurmd pod tolerates the lock, as a NodeSet pod does: the taint-eviction
    # controller must not have removed it under the job.
    after = await kube.get(Pod, slurm_node, namespace=sync_bed.bed.namespace)
    assert before.metadata is not None
    assert after.metadata is not None
    assert after.metadata.uid == before.metadata.uid
    assert after.metadata.deletionTimestamp is None


async def test_the_slurm_node_comment_names_its_pod(kube: AsyncClient, sync_bed: SyncBed) -> None:
    node = sync_bed.nodes[2]
    slurm_node = sync_bed.pods[node]
    wanted = f"k8s pod {sync_bed.bed.namespace}/{slurm_node} on node {node}"
    async with syncing(kube, sync_bed):

        async def commented() -> bool:
            argv = ["scontrol", "show", "node", slurm_node]
            return wanted in (await asyncio.to_thread(sync_bed.bed.cluster.run, argv)).stdout

        await wait_for("the pod's identity in the Slurm node's comment", commented, timeout=30)


async def test_a_drain_removed_in_slurm_while_the_cordon_lasts_is_put_back(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.nodes[2]
    slurm_node = sync_bed.pods[node]
    ours = "sunk/syncer: node cordoned"
    async with syncing(kube, sync_bed):
        await set_cordon(kube, node, True)
        try:
            await wait_drain(sync_bed, slurm_node, ours, "the cordon to drain the node")
            await scontrol(sync_bed, "update", f"nodename={slurm_node}", "state=resume")
            await wait_drain(sync_bed, slurm_node, ours, "the drain to be put back")

            async def told() -> bool:
                return "SlurmDrainRestored" in await events_about(kube, "default", node)

            await wait_for("an Event saying it was put back", told, timeout=30)
        finally:
            await set_cordon(kube, node, False)

        await wait_drain(sync_bed, slurm_node, None, "the uncordon to resume it")


async def test_a_slurmrestd_outage_pauses_the_syncer_until_it_returns(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.nodes[2]
    slurm_node = sync_bed.pods[node]
    cluster = sync_bed.bed.cluster
    obj = await kube.get(Node, node)
    async with syncing(kube, sync_bed) as syncer:

        async def synced(status: str) -> bool:
            return (await conditions_of(kube, obj)).get("SlurmSynced", ("",))[0] == status

        await wait_for("SlurmSynced=True", lambda: synced("True"), timeout=30)
        await asyncio.to_thread(cluster.stop_restd)
        try:
            await wait_for("SlurmSynced=False", lambda: synced("False"), timeout=20)
            assert syncer.metrics.registry.get_sample_value("sunk_syncer_slurm_view_fresh") == 0

            async def told_stale() -> bool:
                return "SlurmStale" in await events_about(kube, sync_bed.bed.namespace, LEASE)

            await wait_for("a SlurmStale Event on the syncer's Lease", told_stale, timeout=30)
            # A cordon while paused is not lost: it drains once Slurm answers.
            await set_cordon(kube, node, True)
            await asyncio.sleep(1)
            state, _ = await slurm_reason(sync_bed, slurm_node)
            assert "DRAIN" not in state
        finally:
            await asyncio.to_thread(cluster.start_restd)
        try:
            await wait_for("SlurmSynced=True again", lambda: synced("True"), timeout=30)
            await wait_drain(
                sync_bed, slurm_node, "sunk/syncer: node cordoned", "the cordon made meanwhile"
            )

            async def told_fresh() -> bool:
                return "SlurmFresh" in await events_about(kube, sync_bed.bed.namespace, LEASE)

            await wait_for("a SlurmFresh Event on the syncer's Lease", told_fresh, timeout=30)
        finally:
            await set_cordon(kube, node, False)

        await wait_drain(sync_bed, slurm_node, None, "the uncordon to resume it")


def slurmd_pids(name: str) -> list[int]:
    """The slurmd processes of the slurmd pod `name` (slurmd -D -Z -N <name> ...)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"slurmd") and name.encode() in argv:
                found.append(int(entry.name))
    return found


def slurmd_pid(name: str) -> int:
    pids = slurmd_pids(name)
    if len(pids) != 1:
        raise AssertionError(f"slurmd processes for {name}: {pids}, not one")
    return pids[0]


def process_state(pid: int) -> str:
    """R, S, T (stopped)… from /proc/<pid>/stat; '?' once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


async def bed_report(kube: AsyncClient, sb: SyncBed, nodes: list[str]) -> str:
    """What a failed test needs to tell a dead slurmd from a lost drain: per node,
    Slurm's view, the pod's phase and restarts, slurmd's processes and its log's tail."""
    lines = []
    for node in nodes:
        name = sb.pods[node]
        fields = await asyncio.to_thread(scontrol_node, sb, name)
        slurm = {k: fields.get(k, "") for k in ("State", "Reason", "NodeAddr", "LastBusyTime")}
        try:
            pod = await kube.get(Pod, name, namespace=sb.bed.namespace)
            statuses = (pod.status.containerStatuses if pod.status else None) or []
            kube_side = (
                f"phase {pod.status.phase if pod.status else '?'}, ip "
                f"{pod.status.podIP if pod.status else '?'}, restarts "
                f"{[s.restartCount for s in statuses]}, deleting "
                f"{bool(pod.metadata and pod.metadata.deletionTimestamp)}"
            )
        except Exception as error:  # a report must not fail
            kube_side = f"pod unreadable: {error}"
        pids = slurmd_pids(name)
        try:
            tail = "\n      ".join((await sb.bed.log(name, "slurmd")).splitlines()[-15:])
        except Exception as error:
            tail = f"(no log: {error})"
        lines.append(
            f"{node}: slurm {slurm}; pod {kube_side}; slurmd "
            f"{[(p, process_state(p)) for p in pids]}\n    log tail:\n      {tail}"
        )
    return "\n".join(lines)


async def test_a_hung_slurmd_shows_as_not_responding_on_kubernetes(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    """slurmd is frozen (SIGSTOP), not killed: a killed container is restarted by the
    node at once and registers again before Slurm notices; a hung slurmd is what
    Slurm marks NOT_RESPONDING, after a failed ping (up to SlurmdTimeout/3 + MessageTimeout)."""
    node = sync_bed.nodes[1]
    slurm_node = sync_bed.pods[node]
    obj = await kube.get(Node, node)
    pod = await kube.get(Pod, slurm_node, namespace=sync_bed.bed.namespace)
    pid = slurmd_pid(slurm_node)
    async with syncing(kube, sync_bed):
        os.kill(pid, signal.SIGSTOP)
        try:

            async def not_responding() -> bool:
                on_node = (await conditions_of(kube, obj)).get("SlurmNotResponding", ("",))
                on_pod = (await conditions_of(kube, pod)).get("SlurmNotResponding", ("",))
                return on_node[0] == "True" and on_pod[0] == "True"

            started = time.monotonic()
            await wait_for("SlurmNotResponding on node and pod", not_responding, timeout=90)
            print(f"slurmd frozen → SlurmNotResponding in {time.monotonic() - started:.1f}s")
            state, _ = await slurm_reason(sync_bed, slurm_node)
            assert "NOT_RESPONDING" in state or "*" in state or "DOWN" in state

            async def told() -> bool:
                return "SlurmNotResponding" in await events_about(kube, "default", node)

            await wait_for("an Event about it", told, timeout=30)
        finally:
            os.kill(pid, signal.SIGCONT)

        async def back() -> bool:
            state, _ = await slurm_reason(sync_bed, slurm_node)
            on_node = (await conditions_of(kube, obj)).get("SlurmNotResponding", ("",))
            return on_node[0] == "False" and "DRAIN" not in state and "DOWN" not in state

        await wait_for("the node to respond and be undrained again", back, timeout=90)


# -- chaos ------------------------------------------------------------------------

CHAOS_SECONDS = 80.0


class SyncerInstance:
    """A syncer as `sunk syncer` runs it (own Slurm client and view, leader-elected),
    restartable: each restart starts from nothing but what both APIs say."""

    def __init__(self, kube: AsyncClient, sb: SyncBed, restd_url: str, jwt_key: Path) -> None:
        self._kube, self._sb = kube, sb
        self._restd_url, self._jwt_key = restd_url, jwt_key
        self._task: asyncio.Task[None] | None = None
        self.generation = 0

    async def _run(self, identity: str) -> None:
        credentials = JwtMinter(FileKey(self._jwt_key), "root")
        async with SlurmClient(self._restd_url, credentials) as client:
            view = SlurmView(client, interval=0.25, watch_jobs=False)
            try:
                # Not `async with`: a restart while the view starts would leave its
                # poll task behind (SlurmView.__aenter__ does not clean up when cancelled).
                await view.start()
                await self._lead(identity, client, view)
            finally:
                await view.stop()

    async def _lead(self, identity: str, client: SlurmClient, view: SlurmView) -> None:
        namespace = self._sb.bed.namespace

        async def lead() -> None:
            slurm = SlurmPortForSyncer(client, view)
            syncer = Syncer(self._kube, slurm, namespace=namespace, lease=(namespace, LEASE))
            await syncer.run()

        elector = LeaderElector(self._kube, namespace=namespace, name=LEASE, identity=identity)
        await elector.run(lead)

    def start(self) -> None:
        self.generation += 1
        self._task = asyncio.create_task(self._run(f"chaos-{self.generation}"))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def restart_slurmctld(cluster: SlurmCluster, down_for: float) -> None:
    """Stop slurmctld (it saves its state), wait, start it again and wait until it answers."""
    cluster.supervisor.stop("slurmctld")
    time.sleep(down_for)
    cluster.supervisor.spawn("slurmctld", cluster.sandbox().argv(["slurmctld", "-D"]))
    deadline = time.monotonic() + 30
    while cluster.run(["scontrol", "ping"], check=False, timeout=30).stdout.count("UP") == 0:
        if time.monotonic() > deadline:
            raise AssertionError("slurmctld did not come back within 30 s")
        time.sleep(0.1)


def admin_update(cluster: SlurmCluster, node: str, *args: str) -> None:
    """`scontrol update` as an admin would, repeated until slurmctld confirms it: right
    after a restart, or on a busy machine, slurmctld can leave a request unanswered
    (MessageTimeout) that it may or may not have applied. Resuming an undrained node
    is refused; a repeat that meets that has done its job."""
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.run(["scontrol", "update", f"nodename={node}", *args], check=False)
        if proc.returncode == 0 or (
            "state=resume" in args and "Invalid node state" in proc.stderr + proc.stdout
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"scontrol update {node} {args}: {proc.stderr}")
        time.sleep(0.5)


def restart_slurmrestd(cluster: SlurmCluster, down_for: float) -> None:
    cluster.stop_restd()
    time.sleep(down_for)
    cluster.start_restd()


async def test_chaos_keeps_the_invariants(kube: AsyncClient, sync_bed: SyncBed) -> None:
    """Restart the syncer, slurmrestd and slurmctld at random while nodes are cordoned
    and uncordoned and admins drain and resume at random; then every cordoned node is
    drained, every admin drain is still there with its reason, and no sunk drain is
    left once its cause is gone. SUNK_CHAOS_SEED replays a run."""
    seed = int(os.environ.get("SUNK_CHAOS_SEED", time.time_ns() % 2**32))
    print(f"chaos seed {seed} (SUNK_CHAOS_SEED={seed} replays it)")
    log.warning("chaos seed %d", seed)
    rng = random.Random(seed)  # noqa: S311 - seeded on purpose, to replay a run
    cluster = sync_bed.bed.cluster
    access = cluster.access()
    cordoned: set[str] = set()
    admin: dict[str, str] = {}  # Kubernetes node → the admin's drain reason
    syncer = SyncerInstance(kube, sync_bed, access.restd_url, access.jwt_key)
    done: list[str] = []

    async def invariants() -> list[str]:
        broken = []
        for node in sync_bed.nodes:
            state, reason = await slurm_reason(sync_bed, sync_bed.pods[node])
            if not state:
                broken.append(f"{node}: slurmctld did not answer")
            elif node in admin:
                if "DRAIN" not in state or reason != admin[node]:
                    broken.append(f"{node}: admin drain {admin[node]!r} lost: {state} {reason!r}")
            elif node in cordoned:
                if "DRAIN" not in state or not reason.startswith("sunk/syncer: node cordoned"):
                    broken.append(f"{node}: cordoned but {state} {reason!r}")
            elif "DRAIN" in state:
                broken.append(f"{node}: drain left behind: {state} {reason!r}")
        return broken

    syncer.start()
    try:
        deadline = time.monotonic() + CHAOS_SECONDS
        step = 0
        while time.monotonic() < deadline:
            step += 1
            node = rng.choice(sync_bed.nodes)
            slurm_node = sync_bed.pods[node]
            kind = rng.choices(
                ["cordon", "admin", "syncer", "slurmrestd", "slurmctld"], [6, 4, 2, 1, 1]
            )[0]
            if kind == "cordon":
                on = node not in cordoned
                await set_cordon(kube, node, on)
                (cordoned.add if on else cordoned.discard)(node)
                done.append(f"{'cordon' if on else 'uncordon'} {node}")
            elif kind == "admin" and node in admin:
                await asyncio.to_thread(admin_update, cluster, slurm_node, "state=resume")
                del admin[node]
                done.append(f"admin resume {node}")
            elif kind == "admin":
                reason = f"admin chaos step {step}"
                drain = ("state=drain", f"reason={reason}")
                await asyncio.to_thread(admin_update, cluster, slurm_node, *drain)
                admin[node] = reason
                done.append(f"admin drain {node}")
            elif kind == "syncer":
                await syncer.stop()
                syncer.start()
                done.append("restart syncer")
            elif kind == "slurmrestd":
                await asyncio.to_thread(restart_slurmrestd, cluster, rng.uniform(0.2, 3))
                done.append("restart slurmrestd")
            else:
                await asyncio.to_thread(restart_slurmctld, cluster, rng.uniform(0.2, 3))
                done.append("restart slurmctld")
            await asyncio.sleep(rng.uniform(0.1, 1.5))
        print(f"chaos: {len(done)} steps: {', '.join(done)}")
        settle_started = time.monotonic()
        broken: list[str] = []
        settle_deadline = time.monotonic() + 120
        while broken := await invariants():
            if time.monotonic() > settle_deadline:
                report = await bed_report(kube, sync_bed, sync_bed.nodes)
                raise AssertionError(
                    f"seed {seed}: invariants broken: {broken}; steps: {done}\n{report}"
                )
            await asyncio.sleep(0.25)
        print(f"chaos: invariants hold {time.monotonic() - settle_started:.1f}s after the end")
    finally:
        await syncer.stop()
        await asyncio.to_thread(cluster.start_restd)
        for node in sync_bed.nodes:
            await set_cordon(kube, node, False)
            if node in admin:
                await asyncio.to_thread(admin_update, cluster, sync_bed.pods[node], "state=resume")
