"""The syncer end to end: real nodes that run real slurmd pods, a real Slurm, the real apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from plugins.local import LocalBed, local_bed, wait_for
from sunk.api import LABEL_NODESET, TAINT_NODE_LOCK
from sunk.local import slurmpods
from sunk.local.node import NodeConfig
from sunk.local.port import build
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView
from sunk.syncer.controller import Syncer
from sunk.syncer.decide import (
    ANNOTATION_SLURM_REASON,
    CORDON_REASON_ANNOTATION,
    LABEL_SLURM_DRAIN,
)
from sunk.testbed.kube import KubeAccess, KubeControlPlane

pytestmark = pytest.mark.testbed


@dataclass
class SyncBed:
    bed: LocalBed
    pods: dict[str, str]  # Kubernetes node → slurmd pod (= Slurm node)
    client: SlurmClient
    view: SlurmView


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sync_bed(
    kube_control_plane: KubeControlPlane | None, kube_access: KubeAccess, kube: AsyncClient
) -> AsyncIterator[SyncBed]:
    if kube_control_plane is None:
        pytest.skip("the local runtime needs the bed's own CA")

    def nodes(tag: str) -> list[NodeConfig]:
        return [NodeConfig(f"sy{tag}-{i}") for i in (1, 2)]

    async with local_bed(kube_control_plane, kube_access, kube, nodes, prefix="t-sync") as bed:
        access = bed.cluster.access()
        ns, port = bed.namespace, await bed.serve_slurm_to_pods()
        pods = {}
        for node in bed.nodes:
            name = f"slurmd-{node}"
            body = slurmpods.slurmd_pod(name, ns, port, node=node)
            body["metadata"]["labels"][LABEL_NODESET] = "sync"
            await kube.create(build(Pod, body))
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
                yield SyncBed(bed, pods, client, view)


@contextlib.asynccontextmanager
async def syncing(kube: AsyncClient, sb: SyncBed) -> AsyncIterator[Syncer]:
    syncer = Syncer(kube, sb.client, sb.view, namespace=sb.bed.namespace)
    task = asyncio.create_task(syncer.run())
    try:
        yield syncer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def scontrol_node(sb: SyncBed, name: str) -> dict[str, str]:
    out = sb.bed.cluster.run(["scontrol", "-o", "show", "node", name]).stdout
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


async def test_cordon_drains_with_its_reason_and_uncordon_resumes(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.bed.nodes[0]
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

        async def drained() -> bool:
            state, reason = await slurm_reason(sync_bed, slurm_node)
            return "DRAIN" in state and reason == "sunk/syncer: node cordoned: swap PSU"

        await wait_for("the cordon to drain the Slurm node", drained, timeout=10)
        print(f"cordon → Slurm drain in {time.monotonic() - started:.2f}s")

        await kube.patch(Node, node, {"spec": {"unschedulable": False}}, patch_type=PatchType.MERGE)

        async def resumed() -> bool:
            state, _ = await slurm_reason(sync_bed, slurm_node)
            return "DRAIN" not in state

        await wait_for("the uncordon to resume it", resumed, timeout=10)
        registry = syncer.metrics.registry
        assert (registry.get_sample_value("sunk_syncer_actions_total", {"kind": "drain"}) or 0) >= 1
        assert (
            registry.get_sample_value("sunk_syncer_actions_total", {"kind": "resume"}) or 0
        ) >= 1
        assert registry.get_sample_value("sunk_syncer_slurm_view_fresh") == 1
        assert (registry.get_sample_value("sunk_syncer_reconcile_seconds_count") or 0) > 0


async def test_an_admin_drain_shows_on_the_node_and_is_never_resumed(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.bed.nodes[1]
    slurm_node = sync_bed.pods[node]
    reason = "bad DIMM, ticket 42"
    await asyncio.to_thread(
        sync_bed.bed.cluster.run,
        ["scontrol", "update", f"nodename={slurm_node}", "state=drain", f"reason={reason}"],
    )
    try:
        async with syncing(kube, sync_bed):

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

            await wait_for("the Slurm drain on the Kubernetes node", mirrored, timeout=10)
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
        await asyncio.to_thread(
            sync_bed.bed.cluster.run,
            ["scontrol", "update", f"nodename={slurm_node}", "state=resume"],
        )


async def test_the_node_lock_taint_follows_a_running_job(
    kube: AsyncClient, sync_bed: SyncBed
) -> None:
    node = sync_bed.bed.nodes[0]
    slurm_node = sync_bed.pods[node]

    async def locked() -> bool:
        obj = await kube.get(Node, node)
        return any(t.key == TAINT_NODE_LOCK for t in (obj.spec.taints if obj.spec else []) or [])

    async with syncing(kube, sync_bed):
        out = await asyncio.to_thread(
            sync_bed.bed.cluster.run,
            ["sbatch", "--parsable", "-w", slurm_node, "--wrap", "sleep 3"],
        )
        job = out.stdout.strip()
        await wait_for("the node-lock taint while the job runs", locked, timeout=10)

        async def unlocked() -> bool:
            return not await locked()

        await wait_for("the taint to go once the job ends", unlocked, timeout=20)
        state = (
            await asyncio.to_thread(
                sync_bed.bed.cluster.run,
                ["sacct", "-n", "-X", "-j", job, "-o", "State"],
                check=False,
            )
        ).stdout
        assert "FAILED" not in state
