"""The syncer's loop: one key per Kubernetes node, decided by `decide`, applied to both sides.

Events from three places wake a node's key: the node itself (cordon,
conditions, taints), its slurmd pod (ready, terminating), and Slurm (the
view's change events for the Slurm node of the same name as the pod). Each
reconcile reads all three as they are now and applies what `decide` says,
writing only what differs, so repeated or missed events do no harm: first
to Slurm, then (a second queue, with workers of its own) to the node and
its pod, so that a hundred nodes' Slurm writes need not wait behind the
apiserver writes of the nodes before them.

Slurm is reached through a narrow port (`slurm_port.py`). Writes to Slurm
go out at once (a cordon reaches Slurm in one REST call), within the write
rate limits; the same write for many nodes at once (a rack cordoned: drains
with one reason) goes as one request for all of them (`batch.py`). A resume
is made only after a fresh read shows sunk's own reason still in place.
Every action, and every Slurm state that shows up on Kubernetes, is told as
an Event. While Slurm's view is stale nothing is done on either side: the
node and pod get SlurmSynced=False, the syncer's Lease an Event, and the
work resumes by itself once Slurm answers.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple

from lightkube import ApiError, AsyncClient, operators
from lightkube.models.core_v1 import NodeCondition, PodCondition, Taint
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from sunk.api import LABEL_NODESET, TAINT_NODE_LOCK
from sunk.api.nodeset import owning_nodeset
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Event, Informer
from sunk.kube.workqueue import Result, Stale, WorkQueue, run_workers
from sunk.syncer.decide import (
    REASON_PREFIX,
    Condition,
    Decision,
    Drain,
    Resume,
    SetComment,
    decide,
    stale,
    sunk_drainer,
)
from sunk.syncer.kube_state import kube_node_state, pod_state, state_event
from sunk.syncer.metrics import SyncerMetrics
from sunk.syncer.ratelimit import TokenBucket, WriteLimits
from sunk.syncer.slurm_port import ALL_NODES, SyncerSlurm

log = logging.getLogger(__name__)

CONTROLLER = "sunk-syncer"
# The pods informer's indexes.
BY_NAME, BY_NODE = "name", "node"
# While Slurm cannot be read, look again this often: the view can turn stale by
# age alone (a hung poll), and then no state event announces its return.
STALE_RECHECK = 2.0
# Stale for less than this, the syncer holds still without saying so.
STALE_GRACE = 3.0
# The Slurm nodes by state (a gauge) are counted this often, not per reconcile:
# a count reads every node, and Prometheus scrapes every 15-60 s.
COUNT_INTERVAL = 5.0


class SlurmEvent(NamedTuple):
    reason: str
    note: str
    action: str
    type_: Literal["Normal", "Warning"] = "Normal"


class SlurmWrite(NamedTuple):
    """One Slurm write a reconcile decided, made in the background."""

    kind: str  # the actions metric's label
    call: Callable[..., Awaitable[None]]  # the port's method, given the node's name first
    args: tuple[str, ...]
    event: SlurmEvent | None  # told once written


class Syncer:
    def __init__(
        self,
        kube: AsyncClient,
        slurm: SyncerSlurm,
        *,
        watched_conditions: Sequence[str] = (),
        lock_effect: str = "NoExecute",
        namespace: str | None = None,
        # Nodes reconciled at once. Most of a reconcile is waiting on the two APIs
        # (a Slurm write can take seconds on a busy slurmctld); the write limits,
        # not the worker count, bound the load on them.
        workers: int = 16,
        metrics: SyncerMetrics | None = None,
        # The Kubernetes half; the Slurm half bounds the port's writes.
        limits: WriteLimits | None = None,
        lease: tuple[str, str] = ("default", CONTROLLER),
    ) -> None:
        self.metrics = metrics or SyncerMetrics()
        self._kube = kube
        self._slurm = slurm
        self._watched = tuple(watched_conditions)
        self._lock_effect = lock_effect
        self._workers = workers
        # A mass change's Events (a rack drained: a hundred) wait while nodes are
        # being reconciled or mirrored, at most MAX_HOLD: meanwhile the apiserver
        # and this process serve the changes the Events describe.
        self._events = EventRecorder(
            kube, CONTROLLER, busy=lambda: self.queue.busy or self.mirrors.busy
        )
        limits = limits or WriteLimits()
        self.kube_writes = TokenBucket(limits.kube_rate, limits.kube_burst)
        self.metrics.write_wait.labels(api="slurm").set_function(lambda: slurm.write_wait)
        self.metrics.write_wait.labels(api="kube").set_function(lambda: self.kube_writes.waited)
        self.metrics.slurm_requests.set_function(lambda: slurm.requests)
        self.metrics.view_fresh.set_function(lambda: 1 if slurm.fresh else 0)
        slurm.on_write(self.metrics.slurm_write_nodes.observe)
        # Events about the syncer as a whole (Slurm unreachable, back) go on its Lease.
        self._lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"namespace": lease[0], "name": lease[1]},
        }
        self._stale_reason = "Slurm not read yet"
        # Slurm node → when the syncer first saw sunk's drain on it, for a Slurm
        # that does not say when it set the reason (Unix seconds).
        self._drain_seen: dict[str, float] = {}
        self._stale_since: float | None = None  # monotonic; None while fresh
        self._announced = False  # the pause was told (condition and Event)
        self._nodes: Informer[Node] = Informer(kube, Node)
        self._pods: Informer[Pod] = Informer(
            # None is every namespace (lightkube's None would be its default one).
            kube,
            Pod,
            namespace=namespace,
            labels={LABEL_NODESET: operators.exists()},
        )
        self.queue: WorkQueue[str] = WorkQueue()
        # Writes to Kubernetes have workers of their own: a mass change's Slurm
        # writes (a rack uncordoned: a hundred resumes) need not wait behind the
        # apiserver writes of the nodes reconciled before (four or five each).
        self.mirrors: WorkQueue[str] = WorkQueue()
        # Slurm node -> its writes under way (`_apply_slurm`).
        self._writing: dict[str, asyncio.Task[None]] = {}
        # Pods by name (a Slurm node's name) and by node: a reconcile looks its
        # pod up, not through every pod (a rack's worth of reconciles at once
        # would each scan them all).
        self._pods.add_index(BY_NAME, lambda pod: [pod.metadata.name or ""] if pod.metadata else [])
        self._pods.add_index(BY_NODE, lambda pod: [pod.spec.nodeName or ""] if pod.spec else [])
        self._nodes.subscribe(lambda e: self.queue.add(e.key))
        self._pods.subscribe(self._on_pod)

    def _on_pod(self, event: Event[Pod]) -> None:
        for pod in (event.old, event.new):
            if pod is not None and pod.spec and pod.spec.nodeName:
                self.queue.add(pod.spec.nodeName)

    def _slurmd_pods(self, pods: Iterable[Pod] | None = None) -> list[Pod]:
        """The NodeSets' pods (of `pods`, or all): a label alone (anyone's to write)
        makes no pod a slurmd's."""
        candidates = self._pods.items() if pods is None else pods
        return [p for p in candidates if owning_nodeset(p) is not None]

    def _pod_named(self, name: str) -> Pod | None:
        return next(iter(self._slurmd_pods(self._pods.by_index(BY_NAME, name))), None)

    def _slurmd_pod_on(self, node: str) -> Pod | None:
        pods = self._slurmd_pods(self._pods.by_index(BY_NODE, node))
        pods.sort(key=lambda p: bool(p.metadata and p.metadata.deletionTimestamp))
        return pods[0] if pods else None

    def _enqueue_all(self) -> None:
        for key in self._nodes.list_keys():
            self.queue.add(key)

    def _on_slurm_node(self, name: str) -> None:
        """The Slurm node named as a slurmd pod changed: that pod's node is the key."""
        if name == ALL_NODES:
            self._enqueue_all()
            return
        pod = self._pod_named(name)
        if pod is not None and pod.spec and pod.spec.nodeName:
            self.queue.add(pod.spec.nodeName)

    async def _on_slurm_state(self, stale_reason: str | None) -> None:
        if stale_reason is not None:
            self._stale_reason = f"Slurm cannot be read: {stale_reason}"
            if self._stale_since is None:
                self._stale_since = time.monotonic()
        else:
            await self._note_fresh()
        self._enqueue_all()

    async def _note_stale(self) -> float:
        """Seconds the view has been stale; announced once it is STALE_GRACE or more."""
        if self._stale_since is None:  # stale by age alone: no state event said so
            self._stale_since = time.monotonic()
            self._stale_reason = "Slurm cannot be read: no poll has succeeded for a while"
        waited = time.monotonic() - self._stale_since
        if waited >= STALE_GRACE and not self._announced:
            self._announced = True
            log.warning("pausing: %s", self._stale_reason)
            await self._events.emit(
                self._lease,
                "SlurmStale",
                f"{self._stale_reason}; the syncer waits and changes nothing until it can",
                action="Pause",
                type_="Warning",
            )
        return waited

    async def _note_fresh(self) -> None:
        self._stale_since = None
        if self._announced:
            self._announced = False
            log.info("Slurm can be read again: resuming")
            await self._events.emit(
                self._lease, "SlurmFresh", "Slurm can be read again; syncing", action="Resume"
            )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._nodes.run())
            group.create_task(self._pods.run())
            await asyncio.gather(self._nodes.synced.wait(), self._pods.synced.wait())
            group.create_task(self._slurm.follow(self._on_slurm_node, self._on_slurm_state))
            group.create_task(run_workers(self.queue, self.reconcile, self._workers))
            group.create_task(run_workers(self.mirrors, self.mirror, self._workers))
            group.create_task(self._count_slurm_nodes_every(COUNT_INTERVAL))
            try:
                await asyncio.Future()  # until the group is cancelled
            finally:
                for task in self._writing.values():
                    task.cancel()

    async def reconcile(self, name: str) -> Result | None:
        with self.metrics.reconciling():
            return await self._reconcile(name)

    async def mirror(self, name: str) -> Result | None:
        with self.metrics.reconciling():
            return await self._mirror(name)

    async def _count_slurm_nodes_every(self, seconds: float) -> None:
        while True:
            self._count_slurm_nodes()
            await asyncio.sleep(seconds)

    def _count_slurm_nodes(self) -> None:
        if not self._slurm.fresh:
            return
        counts: dict[tuple[str, str], int] = {}
        now = time.time()
        drains: dict[tuple[str, str, str], float] = {}
        for pod in self._slurmd_pods():
            node = self._slurm.node((pod.metadata.name if pod.metadata else None) or "")
            if node is None:
                continue
            key = (node.base_state, "true" if node.drained else "false")
            counts[key] = counts.get(key, 0) + 1
            if (by := sunk_drainer(node)) is not None:
                seen = self._drain_seen.setdefault(node.name, now)
                since = node.reason_since or seen
                kube_node = (pod.spec.nodeName if pod.spec else None) or ""
                drains[(node.name, kube_node, by)] = max(0.0, now - since)
        drained = {slurm_node for slurm_node, _, _ in drains}
        self._drain_seen = {name: t for name, t in self._drain_seen.items() if name in drained}
        self.metrics.slurm_nodes.clear()
        for (state, drain), count in counts.items():
            self.metrics.slurm_nodes.labels(state=state, drain=drain).set(count)
        self.metrics.sunk_drain_seconds.clear()
        for (slurm_node, kube_node, by), seconds in drains.items():
            self.metrics.sunk_drain_seconds.labels(
                slurm_node=slurm_node, kube_node=kube_node, by=by
            ).set(seconds)

    async def _reconcile(self, name: str) -> Result | None:
        node = self._nodes.get(name)
        if node is None:
            return None
        pod = self._slurmd_pod_on(name)
        if pod is None:
            await self._mirror_on_node(
                node, decide(kube_node_state(node, self._watched), None, None)
            )
            return None
        if not self._slurm.fresh:
            # Nothing is done on stale data. A blip (the 24.11 defect can fail a
            # read or two after a change) is not worth a condition on every node.
            waited = await self._note_stale()
            if waited < STALE_GRACE:
                return Result(requeue_after=STALE_GRACE - waited + 0.05)
            decision = stale(self._stale_reason)
            await self._mirror_on_node(node, decision)
            await self._mirror_on_pod(pod, decision)
            return Result(requeue_after=STALE_RECHECK)
        await self._note_fresh()
        decision = self._decide(node, pod)
        await self._apply_slurm(node, pod_state(pod).name, decision)
        self.mirrors.add(name)
        if decision.recheck_after is not None:
            return Result(requeue_after=decision.recheck_after + 0.05)
        return None

    async def _mirror(self, name: str) -> Result | None:
        """What `decide` wants on the node and its pod, written (Slurm's side is
        the reconcile's, which queued this)."""
        node = self._nodes.get(name)
        pod = self._slurmd_pod_on(name)
        if node is None or pod is None or not self._slurm.fresh:
            return None  # the reconcile mirrors these itself
        decision = self._decide(node, pod)
        await self._mirror_on_node(node, decision)
        await self._mirror_on_pod(pod, decision)
        return None

    def _decide(self, node: Node, pod: Pod) -> Decision:
        slurmd = pod_state(pod)
        return decide(
            kube_node_state(node, self._watched),
            slurmd,
            self._slurm.node(slurmd.name),
            lock_effect=self._lock_effect,
        )

    async def _apply_slurm(self, node: Node, slurm_name: str, decision: Decision) -> None:
        """The guard reads here, the writes in the background (`_write_slurm`):
        the worker moves on to its next node while the batch writer gathers a
        mass change's nodes into few requests (waiting for each write held
        every batch to the few reconciles that reached the writer during the
        request before). A node's writes keep their order: its next reconcile
        waits for the ones under way first."""
        if (under_way := self._writing.get(slurm_name)) is not None:
            await asyncio.wait([under_way])
        writes: list[SlurmWrite] = []
        for action in decision.slurm:
            if isinstance(action, Drain):
                # Read the node again first: a drain someone made since the view was
                # read is theirs, and must not be overwritten. (Slurm has no
                # conditional update; this leaves a window of one round trip.)
                fresh = await self._slurm.read_node(slurm_name)
                if fresh is None or (fresh.drained and not fresh.reason.startswith(REASON_PREFIX)):
                    continue
                if fresh.drained and fresh.reason == action.reason:
                    continue
                log.info("drain %s: %s", slurm_name, action.reason)
                if action.put_back:
                    told = SlurmEvent(
                        "SlurmDrainRestored",
                        f"Slurm node {slurm_name}: the drain was removed in Slurm while its "
                        f"cause lasts; drained again: {action.reason}",
                        "Drain",
                        "Warning",
                    )
                else:
                    told = SlurmEvent(
                        "SlurmDrain", f"drained Slurm node {slurm_name}: {action.reason}", "Drain"
                    )
                writes.append(SlurmWrite("drain", self._slurm.drain, (action.reason,), told))
            elif isinstance(action, Resume):
                fresh = await self._slurm.read_node(slurm_name)
                # Resume only what is still ours: someone may have drained it since.
                if fresh is not None and fresh.drained and fresh.reason == action.reason:
                    log.info("resume %s (was: %s)", slurm_name, action.reason)
                    told = SlurmEvent(
                        "SlurmResume",
                        f"resumed Slurm node {slurm_name}: its cause is gone "
                        f"(was: {action.reason})",
                        "Resume",
                    )
                    writes.append(SlurmWrite("resume", self._slurm.resume, (), told))
            elif isinstance(action, SetComment):
                log.info("comment %s: %s", slurm_name, action.comment)
                writes.append(
                    SlurmWrite("comment", self._slurm.set_comment, (action.comment,), None)
                )
        if decision.slurm:
            task = asyncio.create_task(self._write_slurm(node, slurm_name, writes))
            self._writing[slurm_name] = task
            task.add_done_callback(lambda done: self._forget_write(slurm_name, done))

    async def _write_slurm(self, node: Node, slurm_name: str, writes: Sequence[SlurmWrite]) -> None:
        try:
            for write in writes:
                await write.call(slurm_name, *write.args)
                self.metrics.actions.labels(kind=write.kind).inc()
                if write.event is not None:
                    reason, note, action, type_ = write.event
                    self._events.emit_soon(node, reason, note, action=action, type_=type_)
        except Exception as error:  # the node is reconciled again, after a back-off
            log.warning(
                "writing Slurm node %s failed (%s); reconciling it again", slurm_name, error
            )
            if node.metadata is not None and node.metadata.name:
                self.queue.add_rate_limited(node.metadata.name)
        finally:
            self._slurm.poll_now()  # show what was written without waiting for the next poll

    def _forget_write(self, slurm_name: str, task: asyncio.Task[None]) -> None:
        if self._writing.get(slurm_name) is task:
            del self._writing[slurm_name]

    async def slurm_writes_done(self) -> None:
        """Wait for every Slurm write under way (tests, and a clean stop)."""
        if self._writing:
            await asyncio.wait(list(self._writing.values()))

    async def _mirror_on_node(self, node: Node, decision: Decision) -> None:
        await self._write_metadata(node, decision)
        if decision.taint is not None:
            await self._set_lock(node, decision.taint.present, decision.taint.effect)
        await self._set_conditions(node, decision.conditions)

    async def _mirror_on_pod(self, pod: Pod, decision: Decision) -> None:
        await self._write_metadata(pod, decision)
        await self._set_conditions(pod, decision.conditions)

    async def _write_metadata(self, obj: Node | Pod, decision: Decision) -> None:
        assert obj.metadata is not None
        annotations = obj.metadata.annotations or {}
        labels = obj.metadata.labels or {}
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
            await self._patch(obj, {"metadata": metadata}, status=False)
            self.metrics.actions.labels(kind="annotate").inc()

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
        await self.kube_writes.acquire()
        name = node.metadata.name or ""
        try:
            await self._kube.patch(Node, name, patch, patch_type=PatchType.JSON)
        except ApiError as error:
            if error.status.code == 422:  # the resourceVersion test failed
                raise Stale(f"node {name} changed since it was read") from None
            raise
        self.metrics.actions.labels(kind="taint" if present else "untaint").inc()
        if present:
            note = f"a Slurm job runs on this node: taint {TAINT_NODE_LOCK}:{effect} keeps "
            note += "other pods off"
            self._events.emit_soon(node, "SlurmNodeLocked", note, action="Taint")
        else:
            note = f"no Slurm job runs on this node any more: taint {TAINT_NODE_LOCK} removed"
            self._events.emit_soon(node, "SlurmNodeUnlocked", note, action="Untaint")

    async def _patch(self, obj: Node | Pod, body: dict[str, Any], *, status: bool) -> None:
        """Merge `body` into a node or pod (its status with `status`), within the write limit.

        Strategic merge keys conditions by type, so the kubelet's own stay."""
        assert obj.metadata is not None
        name, patch_type = obj.metadata.name or "", PatchType.STRATEGIC
        await self.kube_writes.acquire()
        if isinstance(obj, Node):
            await self._kube.patch(
                Node.Status if status else Node, name, body, patch_type=patch_type
            )
        else:
            namespace = obj.metadata.namespace
            resource = Pod.Status if status else Pod
            await self._kube.patch(resource, name, body, namespace=namespace, patch_type=patch_type)

    async def _set_conditions(self, obj: Node | Pod, conditions: Sequence[Condition]) -> None:
        assert obj.metadata is not None
        have_all: Sequence[NodeCondition | PodCondition] = (
            obj.status.conditions if obj.status else None
        ) or []
        current = {c.type: c for c in have_all}
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        updates = []
        told: list[tuple[str, Literal["Normal", "Warning"], Condition]] = []
        for wanted in conditions:
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
            update = {
                "type": wanted.type,
                "status": wanted.status,
                "reason": wanted.reason,
                "message": wanted.message,
                "lastTransitionTime": since,
            }
            if isinstance(obj, Node):
                update["lastHeartbeatTime"] = now
            updates.append(update)
            if (event := state_event(have, wanted)) is not None:
                told.append((*event, wanted))
        if not updates:
            return
        await self._patch(obj, {"status": {"conditions": updates}}, status=True)
        self.metrics.actions.labels(kind="condition").inc()
        for reason, type_, condition in told:
            note = f"Slurm: {condition.type}={condition.status}"
            note += f" ({condition.message})" if condition.message else ""
            self._events.emit_soon(
                obj,
                reason,
                note,
                action="Mirror",
                type_="Warning" if type_ == "Warning" else "Normal",
            )
