"""The NodeSet controller against the real apiserver, with Slurm replaced by an in-memory port.

What this proves: pod creation, ownership and conflicts, status, conditions,
finalizers and the rolling-update order, as the real apiserver sees them.
What it does not: slurmd really registering, jobs really running. Those are
tested with the local node runtime and the real Slurm.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.core_v1 import NodeSpec, Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from sunk.api import LABEL_NODESET, LABEL_TEMPLATE_HASH
from sunk.api import nodeset as api
from sunk.api.install import install_crds
from sunk.nodeset.controller import FINALIZER, NodeSetController
from sunk.nodeset.plan import REASON_UPDATE, SlurmNodeView

pytestmark = pytest.mark.contract
NodeSet = api.resource()


class MemorySlurm:
    """Slurm as the NodeSet controller sees it, in memory (a port fake, not a Slurm)."""

    def __init__(self) -> None:
        self.nodes: dict[str, SlurmNodeView] = {}
        self.features: dict[str, str] = {}
        self.callbacks: list[Callable[[str], None]] = []
        self.log: list[tuple[str, str]] = []
        self.stale = False
        self.reservations: dict[str, tuple[tuple[str, ...], int, int]] = {}

    def register(self, name: str, feature: str, busy: bool = False) -> None:
        self.nodes[name] = SlurmNodeView(name, drained=False, busy=busy)
        self.features[name] = feature
        self._changed(name)

    def set(self, name: str, **changes: Any) -> None:
        old = self.nodes[name]
        self.nodes[name] = SlurmNodeView(**{**old.__dict__, **changes})
        self._changed(name)

    def _changed(self, name: str) -> None:
        for callback in self.callbacks:
            callback(name)

    @property
    def fresh(self) -> bool:
        return not self.stale

    @property
    def requests(self) -> int:
        return len(self.log)

    def nodes_with_feature(self, feature: str) -> Mapping[str, SlurmNodeView] | None:
        if self.stale:
            return None
        return {n: v for n, v in self.nodes.items() if self.features.get(n) == feature}

    async def follow(self, on_change: Callable[[str], None]) -> None:
        self.callbacks.append(on_change)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            self.callbacks.remove(on_change)

    async def drain_unless_drained(self, name: str, reason: str) -> bool:
        node = self.nodes.get(name)
        if node is None or node.drained:
            return False
        self.log.append(("drain", name))
        self.set(name, drained=True, reason=reason)
        return True

    async def drained_and_idle(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is None or (node.drained and not node.busy)

    async def resume_if_reason(self, name: str, reason: str) -> bool:
        node = self.nodes.get(name)
        if node is None or not node.drained or node.reason != reason:
            return False
        self.log.append(("resume", name))
        self.set(name, drained=False)
        return True

    async def reconfigure(self) -> None:
        pass

    async def delete_node(self, name: str) -> None:
        self.log.append(("delete", name))
        self.nodes.pop(name, None)

    async def reserve(self, name: str, nodes: Sequence[str], start: int, end: int) -> str | None:
        self.reservations[name] = (tuple(nodes), start, end)
        return None

    async def unreserve(self, name: str) -> str | None:
        self.reservations.pop(name, None)
        return None


@pytest_asyncio.fixture(scope="module")
async def crds(kube: AsyncClient) -> None:
    await install_crds(kube)


@pytest_asyncio.fixture
async def pool(kube: AsyncClient) -> AsyncIterator[Callable[..., Any]]:
    """Make Node objects (no kubelet) labelled for this test only."""
    tag = secrets.token_hex(3)
    made: list[str] = []

    async def make(count: int, taints: list[Taint] | None = None, **labels: str) -> list[str]:
        names = []
        for _ in range(count):
            name = f"n-{tag}-{len(made)}"
            await kube.create(
                Node(
                    metadata=ObjectMeta(name=name, labels={"pool": tag, **labels}),
                    spec=NodeSpec(taints=taints),
                )
            )
            made.append(name)
            names.append(name)
        return names

    make.tag = tag  # type: ignore[attr-defined]
    yield make
    for name in made:
        with contextlib.suppress(Exception):
            await kube.delete(Node, name)


@contextlib.asynccontextmanager
async def controller(
    kube: AsyncClient, slurm: MemorySlurm, namespace: str
) -> AsyncIterator[NodeSetController]:
    running = NodeSetController(kube, slurm, namespace=namespace)
    task = asyncio.create_task(running.run())
    try:
        yield running
        # Deleting a NodeSet drains its nodes out and then drops the
        # finalizer: the controller must see it through.
        async for obj in kube.list(NodeSet, namespace=namespace):
            await kube.delete(NodeSet, obj["metadata"]["name"], namespace=namespace)
        await eventually(lambda: _gone(kube, namespace), timeout=30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def nodeset(name: str, selector: dict[str, str], image: str = "slurmd:1") -> Any:
    return NodeSet(
        {
            "metadata": {"name": name},
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": selector,
                        "containers": [{"name": "slurmd", "image": image}],
                    }
                }
            },
        }
    )


async def eventually(check: Callable[[], Any], timeout: float = 20) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.1)


async def pods_of(kube: AsyncClient, namespace: str, nodeset: str) -> list[Pod]:
    return [p async for p in kube.list(Pod, namespace=namespace, labels={LABEL_NODESET: nodeset})]


async def mark_ready(kube: AsyncClient, namespace: str, pod: Pod) -> None:
    assert pod.metadata is not None
    await kube.patch(
        Pod.Status,
        pod.metadata.name or "",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )


async def test_one_pod_per_matching_node_and_a_new_node_gets_one(
    kube: AsyncClient, namespace: str, crds: None, pool: Any
) -> None:
    nodes = await pool(4)
    slurm = MemorySlurm()
    async with controller(kube, slurm, namespace) as running:
        await kube.create(nodeset("cpu", {"pool": pool.tag}), namespace=namespace)
        pods = await eventually(lambda: _count(pods_of(kube, namespace, "cpu"), 4))
        registry = running.metrics.registry

        async def creates_counted() -> bool:
            # Counted when the create's reply is read: the list may show the
            # pod a moment before (3 of 4 once in CI).
            labels = {"kind": "pod_create"}
            return registry.get_sample_value("sunk_operator_actions_total", labels) == 4

        await eventually(creates_counted, timeout=5)
        assert registry.get_sample_value("sunk_operator_reconcile_seconds_count")
        assert registry.get_sample_value("sunk_operator_slurm_view_fresh") == 1
        assert sorted(p.metadata.name for p in pods) == sorted(f"cpu-{n}" for n in nodes)
        env = {e.name: e.value for e in pods[0].spec.containers[0].env}
        assert env["SLURMD_NODENAME"] == pods[0].metadata.name
        assert env["SLURMD_CONF"].startswith("Feature=cpu")
        stored = await kube.get(NodeSet, "cpu", namespace=namespace)
        assert FINALIZER in stored["metadata"]["finalizers"]
        await eventually(lambda: _status(kube, namespace, "cpu", desired=4, scheduled=4))

        (fifth,) = await pool(1)
        await eventually(lambda: _count(pods_of(kube, namespace, "cpu"), 5))
        assert f"cpu-{fifth}" in {p.metadata.name for p in await pods_of(kube, namespace, "cpu")}


async def test_two_nodesets_on_one_node_yield_one_pod_and_a_condition(
    kube: AsyncClient, namespace: str, crds: None, pool: Any
) -> None:
    (shared,) = await pool(1)
    slurm = MemorySlurm()
    async with controller(kube, slurm, namespace):
        await kube.create(nodeset("first", {"pool": pool.tag}), namespace=namespace)
        await eventually(lambda: _count(pods_of(kube, namespace, "first"), 1))
        await kube.create(nodeset("second", {"pool": pool.tag}), namespace=namespace)

        async def conflict() -> bool:
            obj = await kube.get(NodeSet, "second", namespace=namespace)
            conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            c = conditions.get("NodeConflict")
            return bool(
                c and c["status"] == "True" and shared in c["message"] and "first" in c["message"]
            )

        await eventually(conflict)
        assert await pods_of(kube, namespace, "second") == []
        assert len(await pods_of(kube, namespace, "first")) == 1


async def test_a_no_schedule_taint_keeps_the_pod_a_no_execute_taint_drains_it_out(
    kube: AsyncClient, namespace: str, crds: None, pool: Any
) -> None:
    """As for a DaemonSet: a node lifecycle taint (heartbeats lagging) must not remove slurmd."""
    lagging, evicted = await pool(2)
    slurm = MemorySlurm()
    async with controller(kube, slurm, namespace):
        await kube.create(nodeset("cpu", {"pool": pool.tag}), namespace=namespace)
        for pod in await eventually(lambda: _count(pods_of(kube, namespace, "cpu"), 2)):
            await mark_ready(kube, namespace, pod)
            slurm.register(pod.metadata.name, "cpu")
        # Not a node.kubernetes.io key: the node lifecycle controller would
        # take it off again, these nodes having no kubelet.
        await taint(kube, lagging, "example.com/lagging", "NoSchedule")
        await taint(kube, evicted, "maintenance", "NoExecute")
        await eventually(lambda: _count(pods_of(kube, namespace, "cpu"), 1))
        (left,) = await pods_of(kube, namespace, "cpu")
        assert left.metadata.name == f"cpu-{lagging}"
        assert ("drain", f"cpu-{lagging}") not in slurm.log
        assert ("drain", f"cpu-{evicted}") in slurm.log

        await pool(1, taints=[Taint(key="example.com/lagging", effect="NoSchedule")])
        await asyncio.sleep(2)  # a wrong pod would have been created by now
        assert {p.metadata.name for p in await pods_of(kube, namespace, "cpu")} == {
            f"cpu-{lagging}"
        }

        # Its pod replaced (as by an update) while the taint lasts: the Slurm
        # record, which may carry an admin's drain, stays; the pod comes back.
        await kube.delete(Pod, left.metadata.name, namespace=namespace, grace_period=0)

        async def recreated() -> bool:
            pods = await pods_of(kube, namespace, "cpu")
            return [p.metadata.name for p in pods] == [left.metadata.name] and (
                pods[0].metadata.uid != left.metadata.uid
            )

        await eventually(recreated)
        assert ("delete", left.metadata.name) not in slurm.log


async def taint(kube: AsyncClient, node: str, key: str, effect: str) -> None:
    patch = {"spec": {"taints": [{"key": key, "effect": effect}]}}
    await kube.patch(Node, node, patch, patch_type=PatchType.MERGE)


async def test_a_pod_that_cannot_be_built_is_reported_by_field(
    kube: AsyncClient, namespace: str, crds: None, pool: Any
) -> None:
    await pool(1)
    body = nodeset("odd", {"pool": pool.tag})
    body["spec"]["slurm"] = {"slurmdContainer": "daemon"}
    async with controller(kube, MemorySlurm(), namespace):
        await kube.create(body, namespace=namespace)

        async def reported() -> bool:
            obj = await kube.get(NodeSet, "odd", namespace=namespace)
            conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            c = conditions.get("SpecValid")
            return bool(
                c and c["status"] == "False" and "spec.slurm.slurmdContainer" in c["message"]
            )

        await eventually(reported)
        assert await pods_of(kube, namespace, "odd") == []


async def test_a_rolling_update_waits_for_jobs_and_resumes_its_own_drains(
    kube: AsyncClient, namespace: str, crds: None, pool: Any
) -> None:
    nodes = await pool(3)
    slurm = MemorySlurm()
    async with controller(kube, slurm, namespace):
        await kube.create(nodeset("gpu", {"pool": pool.tag}), namespace=namespace)
        pods = await eventually(lambda: _count(pods_of(kube, namespace, "gpu"), 3))
        for pod in pods:
            await mark_ready(kube, namespace, pod)
            slurm.register(pod.metadata.name, "gpu", busy=pod.metadata.name == f"gpu-{nodes[0]}")
        old = pods[0].metadata.labels[LABEL_TEMPLATE_HASH]

        patch = {
            "spec": {
                "template": {"spec": {"containers": [{"name": "slurmd", "image": "slurmd:2"}]}}
            }
        }
        await kube.patch(NodeSet, "gpu", patch, namespace=namespace, patch_type=PatchType.MERGE)

        # Each pod is replaced in turn: drained, deleted once idle, recreated,
        # and (our stand-in for slurmd) registers and becomes ready again.
        busy = f"gpu-{nodes[0]}"
        seen_new: set[str] = set()

        async def roll() -> bool:
            for pod in await pods_of(kube, namespace, "gpu"):
                name = pod.metadata.name
                if pod.metadata.labels[LABEL_TEMPLATE_HASH] != old and name not in seen_new:
                    seen_new.add(name)
                    await mark_ready(kube, namespace, pod)
            drains = [n for kind, n in slurm.log if kind == "drain"]
            resumes = [n for kind, n in slurm.log if kind == "resume"]
            # Never more than one node out at a time (maxUnavailable 1).
            assert len(drains) - len(resumes) <= 1
            if busy in drains and slurm.nodes[busy].busy and busy in seen_new:
                pytest.fail("the busy node's pod was replaced while its job ran")
            if busy in drains and slurm.nodes[busy].drained and slurm.nodes[busy].busy:
                slurm.set(busy, busy=False)  # the job ends
            return len(seen_new) == 3 and all(not v.drained for v in slurm.nodes.values())

        await eventually(roll, timeout=40)
        assert [n for kind, n in slurm.log if kind == "drain"] == [
            n for kind, n in slurm.log if kind == "resume"
        ]
        assert all(v.reason in ("", REASON_UPDATE) for v in slurm.nodes.values())


async def _count(pods: Any, n: int) -> list[Pod] | None:
    found = await pods
    return found if len(found) == n else None


async def _status(kube: AsyncClient, namespace: str, name: str, **expected: int) -> bool:
    obj = await kube.get(NodeSet, name, namespace=namespace)
    status = obj.get("status") or {}
    return all(status.get(k) == v for k, v in expected.items())


async def _gone(kube: AsyncClient, namespace: str) -> bool:
    left = [o async for o in kube.list(NodeSet, namespace=namespace)]
    pods = [p async for p in kube.list(Pod, namespace=namespace)]
    return not left and not pods
