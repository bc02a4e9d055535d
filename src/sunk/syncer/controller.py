"""The syncer's loop: one key per Kubernetes node, decided by `decide`, applied to both sides.

Events from three places wake a node's key: the node itself (cordon,
conditions, taints), its slurmd pod (ready, terminating), and Slurm (the
view's change events for the Slurm node of the same name as the pod). Each
reconcile reads all three as they are now and applies what `decide` says,
writing only what differs, so repeated or missed events do no harm.

Writes to Slurm go out at once (a cordon reaches Slurm in one REST call);
a resume is made only after a fresh read shows sunk's own reason still in
place. Nothing is done while Slurm's view is stale.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Sequence
from typing import Any

from lightkube import AsyncClient, operators
from lightkube.models.core_v1 import Taint
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from sunk.api import LABEL_NODESET, TAINT_NODE_LOCK
from sunk.kube.client import pod_ready
from sunk.kube.informer import Event, Informer
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.slurm.client import SlurmClient
from sunk.slurm.models import Node as SlurmNode
from sunk.slurm.view import NodeEvent, Resync, SlurmView, StateEvent
from sunk.syncer.decide import (
    Decision,
    Drain,
    KubeNodeState,
    Resume,
    SlurmdPodState,
    SlurmState,
    decide,
)
from sunk.syncer.metrics import SyncerMetrics

log = logging.getLogger(__name__)


def kube_node_state(node: Node, watched_conditions: Sequence[str]) -> KubeNodeState:
    meta, spec, status = node.metadata, node.spec, node.status
    conditions = (status.conditions if status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    bad = {
        c.type: c.message or ""
        for c in conditions
        if c.type in watched_conditions and c.status == "True"
    }
    return KubeNodeState(
        name=(meta.name if meta else None) or "",
        cordoned=bool(spec and spec.unschedulable),
        ready=ready,
        annotations=(meta.annotations if meta else None) or {},
        bad_conditions=bad,
        labels=(meta.labels if meta else None) or {},
        taints=[(t.key, t.effect) for t in ((spec.taints if spec else None) or [])],
    )


def pod_state(pod: Pod) -> SlurmdPodState:
    return SlurmdPodState(
        name=(pod.metadata.name if pod.metadata else None) or "",
        ready=pod_ready(pod),
        terminating=bool(pod.metadata and pod.metadata.deletionTimestamp),
    )


def slurm_state(node: SlurmNode) -> SlurmState:
    return SlurmState(
        name=node.name,
        base_state=node.base_state,
        drained=node.draining,
        reason=node.reason,
        responding=node.responding,
        busy=not node.idle_or_down,
    )


class Syncer:
    def __init__(
        self,
        kube: AsyncClient,
        slurm: SlurmClient,
        view: SlurmView,
        *,
        watched_conditions: Sequence[str] = (),
        lock_effect: str = "NoExecute",
        namespace: str | None = None,
        workers: int = 4,
        metrics: SyncerMetrics | None = None,
    ) -> None:
        self.metrics = metrics or SyncerMetrics()
        self._kube = kube
        self._slurm = slurm
        self._view = view
        self._watched = tuple(watched_conditions)
        self._lock_effect = lock_effect
        self._workers = workers
        self._nodes: Informer[Node] = Informer(kube, Node)
        self._pods: Informer[Pod] = Informer(
            kube, Pod, namespace=namespace, labels={LABEL_NODESET: operators.exists()}
        )
        self.queue: WorkQueue[str] = WorkQueue()
        self._nodes.subscribe(lambda e: self.queue.add(e.key))
        self._pods.subscribe(self._on_pod)

    def _on_pod(self, event: Event[Pod]) -> None:
        for pod in (event.old, event.new):
            if pod is not None and pod.spec and pod.spec.nodeName:
                self.queue.add(pod.spec.nodeName)

    def _pod_named(self, name: str) -> Pod | None:
        return next((p for p in self._pods.items() if p.metadata and p.metadata.name == name), None)

    def _slurmd_pod_on(self, node: str) -> Pod | None:
        pods = [p for p in self._pods.items() if p.spec and p.spec.nodeName == node]
        pods.sort(key=lambda p: bool(p.metadata and p.metadata.deletionTimestamp))
        return pods[0] if pods else None

    async def _follow_slurm(self) -> None:
        subscription = self._view.subscribe(replay=False)
        try:
            async for event in subscription:
                if isinstance(event, NodeEvent):
                    pod = self._pod_named(event.name)
                    if pod is not None and pod.spec and pod.spec.nodeName:
                        self.queue.add(pod.spec.nodeName)
                elif isinstance(event, StateEvent | Resync):
                    for key in self._nodes.list_keys():
                        self.queue.add(key)
        finally:
            subscription.close()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._nodes.run())
            group.create_task(self._pods.run())
            await asyncio.gather(self._nodes.synced.wait(), self._pods.synced.wait())
            group.create_task(self._follow_slurm())
            group.create_task(run_workers(self.queue, self.reconcile, self._workers))

    async def reconcile(self, name: str) -> Result | None:
        with self.metrics.sync_seconds.time():
            try:
                return await self._reconcile(name)
            except Exception:
                self.metrics.errors.inc()
                raise
            finally:
                self._count_slurm_nodes()

    def _count_slurm_nodes(self) -> None:
        self.metrics.view_fresh.set(1 if self._view.fresh else 0)
        if not self._view.fresh:
            return
        counts: dict[tuple[str, str], int] = {}
        for pod in self._pods.items():
            node = self._view.node(pod_state(pod).name)
            if node is not None:
                key = (node.base_state, "true" if node.draining else "false")
                counts[key] = counts.get(key, 0) + 1
        self.metrics.slurm_nodes.clear()
        for (state, drain), count in counts.items():
            self.metrics.slurm_nodes.labels(state=state, drain=drain).set(count)

    async def _reconcile(self, name: str) -> Result | None:
        node = self._nodes.get(name)
        if node is None:
            return None
        pod = self._slurmd_pod_on(name)
        if pod is None:
            decision = decide(kube_node_state(node, self._watched), None, None)
        else:
            if not self._view.fresh:
                return None  # a StateEvent requeues every node once the view is fresh
            slurm_node = self._view.node(pod_state(pod).name)
            decision = decide(
                kube_node_state(node, self._watched),
                pod_state(pod),
                slurm_state(slurm_node) if slurm_node is not None else None,
                lock_effect=self._lock_effect,
            )
            await self._apply_slurm(pod_state(pod).name, decision)
        await self._apply_kube(node, decision)
        return None

    async def _apply_slurm(self, slurm_name: str, decision: Decision) -> None:
        for action in decision.slurm:
            if isinstance(action, Drain):
                log.info("drain %s: %s", slurm_name, action.reason)
                await self._slurm.drain(slurm_name, action.reason)
                self.metrics.actions.labels(kind="drain").inc()
            elif isinstance(action, Resume):
                fresh = await self._view.refresh_node(slurm_name)
                # Resume only what is still ours: someone may have drained it since.
                if fresh is not None and fresh.draining and fresh.reason == action.reason:
                    log.info("resume %s (was: %s)", slurm_name, action.reason)
                    await self._slurm.resume(slurm_name)
                    self.metrics.actions.labels(kind="resume").inc()
        if decision.slurm:
            await self._view.refresh_node(slurm_name)

    async def _apply_kube(self, node: Node, decision: Decision) -> None:
        assert node.metadata is not None
        name = node.metadata.name or ""
        annotations = node.metadata.annotations or {}
        labels = node.metadata.labels or {}
        metadata: dict[str, Any] = {}
        changed_annotations = {
            k: v for k, v in decision.annotations.items() if annotations.get(k) != v
        }
        changed_labels = {k: v for k, v in decision.labels.items() if labels.get(k) != v}
        if changed_annotations:
            metadata["annotations"] = changed_annotations
        if changed_labels:
            metadata["labels"] = changed_labels
        if metadata:
            await self._kube.patch(Node, name, {"metadata": metadata}, patch_type=PatchType.MERGE)
            self.metrics.actions.labels(kind="annotate").inc()
        if decision.taint is not None:
            await self._set_lock(node, decision.taint.present, decision.taint.effect)
        await self._set_conditions(node, decision)

    async def _set_lock(self, node: Node, present: bool, effect: str) -> None:
        assert node.metadata is not None
        taints = list((node.spec.taints if node.spec else None) or [])
        others = [t for t in taints if t.key != TAINT_NODE_LOCK]
        wanted = [*others, Taint(key=TAINT_NODE_LOCK, effect=effect)] if present else others
        # The taint list is replaced whole: guard it with the resourceVersion we
        # read, so a cordon or another controller's taint is never lost.
        patch = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": node.metadata.resourceVersion,
            },
            {
                "op": "replace" if node.spec and node.spec.taints is not None else "add",
                "path": "/spec/taints",
                "value": [t.to_dict() for t in wanted],
            },
        ]
        await self._kube.patch(Node, node.metadata.name or "", patch, patch_type=PatchType.JSON)
        self.metrics.actions.labels(kind="taint" if present else "untaint").inc()

    async def _set_conditions(self, node: Node, decision: Decision) -> None:
        assert node.metadata is not None
        current = {c.type: c for c in ((node.status.conditions if node.status else None) or [])}
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        updates = []
        for wanted in decision.conditions:
            have = current.get(wanted.type)
            if have is not None and (have.status, have.reason, have.message or "") == (
                wanted.status,
                wanted.reason,
                wanted.message,
            ):
                continue
            since = now
            if have is not None and have.status == wanted.status and have.lastTransitionTime:
                since = have.lastTransitionTime.strftime("%Y-%m-%dT%H:%M:%SZ")
            updates.append(
                {
                    "type": wanted.type,
                    "status": wanted.status,
                    "reason": wanted.reason,
                    "message": wanted.message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": since,
                }
            )
        if updates:
            # Strategic merge keys node conditions by type: the kubelet's own stay.
            await self._kube.patch(
                Node.Status,
                node.metadata.name or "",
                {"status": {"conditions": updates}},
                patch_type=PatchType.STRATEGIC,
            )
            self.metrics.actions.labels(kind="condition").inc()
