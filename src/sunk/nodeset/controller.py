"""The NodeSet controller: informers → work queue → reconcile, one NodeSet key at a time.

Each reconcile follows the same ordered steps, from current state only:
read the NodeSet; validate its spec; work out which nodes it owns (across all
NodeSets); plan; act; write the status. Every action is recorded as an Event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient, operators
from lightkube.models.core_v1 import PodTemplateSpec
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType
from pydantic import ValidationError

from sunk.api import (
    ANNOTATION_NODE_GPUS,
    ANNOTATION_SLURMD_CONF,
    ANNOTATION_SLURMD_GPUS,
    ANNOTATION_SLURMD_RECONFIGURED,
    ANNOTATION_SLURMD_REGISTRATION,
    DOMAIN,
    LABEL_NODESET,
    LABEL_TEMPLATE_HASH,
)
from sunk.api import nodeset as api
from sunk.api.conditions import same_conditions, set_condition
from sunk.gres.plan import GresLine
from sunk.kube.client import pod_ready
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Event, Informer, key_of
from sunk.kube.raw import delete_pod
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.nodeset.feasibility import feasible
from sunk.nodeset.metrics import NodeSetMetrics
from sunk.nodeset.ownership import Assignment, Claimant, assign
from sunk.nodeset.plan import (
    REASON_PREFIX,
    CreatePod,
    DeletePod,
    DeleteSlurmNode,
    Drain,
    GiveGpus,
    Plan,
    PodView,
    Reconfigure,
    Reregister,
    Reserve,
    Resume,
    Unreserve,
    plan,
)
from sunk.nodeset.pods import (
    DAEMON_TOLERATIONS,
    NodeSetRef,
    SpecError,
    build_pod,
    gpu_plugin_not_serving,
    node_gres,
    slurm_node_name,
    template_hash,
)
from sunk.nodeset.slurm_port import ALL_NODES, NodeSetSlurm

log = logging.getLogger(__name__)

CONTROLLER = "sunk-nodeset"
FINALIZER = f"{DOMAIN}/slurm-nodes"
POD_NAME = "name"
# While something waits (jobs to end, a pod to become ready), look again this
# often even without an event; events usually come first.
WAIT_REQUEUE = 5.0
# The least time between two resumes of a node Slurm drained itself.
SLURM_DRAIN_RESUME_SECONDS = 15.0


def _format_validation(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        path = ".".join(str(p) for p in ("spec", *item["loc"]))
        parts.append(f"{path}: {item['msg']}")
    return "; ".join(parts)


def _pod_view(pod: Pod) -> PodView:
    assert pod.metadata is not None
    labels = pod.metadata.labels or {}
    node = (pod.spec.nodeName if pod.spec else None) or labels.get(f"{DOMAIN}/node", "")
    return PodView(
        name=pod.metadata.name or "",
        node=node,
        revision=labels.get(LABEL_TEMPLATE_HASH, ""),
        ready=pod_ready(pod),
        terminating=pod.metadata.deletionTimestamp is not None,
        failed=(pod.status.phase if pod.status else None) in ("Failed", "Succeeded"),
        conf=(pod.metadata.annotations or {}).get(ANNOTATION_SLURMD_CONF, ""),
        gpus=(pod.metadata.annotations or {}).get(ANNOTATION_SLURMD_GPUS),
        registration=(pod.metadata.annotations or {}).get(ANNOTATION_SLURMD_REGISTRATION, ""),
        reconfigured=(pod.metadata.annotations or {}).get(ANNOTATION_SLURMD_RECONFIGURED, ""),
    )


def reservation_name(ref: NodeSetRef) -> str:
    """The Slurm reservation that holds a NodeSet's nodes for its update window."""
    return f"sunk-update-{ref.namespace}-{ref.name}"


def _slurm_name(spec: api.NodeSetSpec, nodeset: str, node: Node) -> str | None:
    try:
        return slurm_node_name(spec.slurm.node_name, nodeset, node)
    except SpecError:
        return None


class NodeSetController:
    def __init__(
        self,
        kube: AsyncClient,
        slurm: NodeSetSlurm,
        *,
        namespace: str | None = None,
        workers: int = 4,
        identity: str | None = None,
        metrics: NodeSetMetrics | None = None,
        gres_listed: Callable[[], Mapping[str, GresLine] | None] = lambda: None,
    ) -> None:
        """`identity`: the replica, as its Events' reportingInstance names it;
        `gres_listed`: Slurm node -> its line in sunk's gres.conf (the gres
        controller's), None where sunk writes none."""
        self._kube = kube
        self._gres_listed = gres_listed
        self._slurm = slurm
        self.metrics = metrics or NodeSetMetrics()
        self.metrics.slurm_requests.set_function(lambda: slurm.requests)
        self.metrics.view_fresh.set_function(lambda: 1 if slurm.fresh else 0)
        self._workers = workers
        # None is every namespace (lightkube's None would be its default one).
        self._nodesets: Informer[Any] = Informer(kube, api.resource(), namespace=namespace)
        self._nodes: Informer[Node] = Informer(kube, Node)
        self._pods: Informer[Pod] = Informer(
            kube, Pod, namespace=namespace, labels={LABEL_NODESET: operators.exists()}
        )
        # A Slurm node has its pod's name: Slurm's changes find the pod by it.
        self._pods.add_index(
            POD_NAME, lambda pod: [pod.metadata.name or ""] if pod.metadata else []
        )
        self.queue: WorkQueue[str] = WorkQueue()
        self._events = EventRecorder(kube, CONTROLLER, instance=identity)
        # Slurm node -> when a drain of Slurm's own was last resumed (monotonic).
        self._resumed: dict[str, float] = {}
        self._nodesets.subscribe(lambda e: self.queue.add(e.key))
        self._nodes.subscribe(self._on_node)
        self._pods.subscribe(self._on_pod)

    @property
    def node_cache(self) -> Informer[Node]:
        """The Nodes, as this controller watches them (run by it; others may
        read and subscribe)."""
        return self._nodes

    @property
    def pod_cache(self) -> Informer[Pod]:
        """The NodeSet pods, as this controller watches them (as `node_cache`)."""
        return self._pods

    # -- events → keys

    def _enqueue_all(self) -> None:
        for key in self._nodesets.list_keys():
            self.queue.add(key)

    def _on_node(self, event: Event[Node]) -> None:
        # Labels, taints or the node's existence change which NodeSets own it.
        old, new = event.old, event.new
        if old is not None and new is not None:
            unchanged = (
                (old.metadata.labels if old.metadata else None)
                == (new.metadata.labels if new.metadata else None)
                and (old.spec.taints if old.spec else None)
                == (new.spec.taints if new.spec else None)
                and (old.status.allocatable if old.status else None)
                == (new.status.allocatable if new.status else None)
            )
            if unchanged:
                return
        self._enqueue_all()

    def _on_pod(self, event: Event[Pod]) -> None:
        meta = event.obj.metadata
        if meta is not None and (owner := (meta.labels or {}).get(LABEL_NODESET)):
            self.queue.add(f"{meta.namespace}/{owner}")

    def _on_slurm_node(self, name: str) -> None:
        if name == ALL_NODES:  # Slurm's view went stale or fresh: every set may act now
            self._enqueue_all()
            return
        for pod in self._pods.by_index(POD_NAME, name):
            self._on_pod(Event("MODIFIED", key_of(pod), pod, pod))

    # -- the loop

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._slurm.follow(self._on_slurm_node))
            for informer in (self._nodesets, self._nodes, self._pods):
                group.create_task(informer.run())
            await asyncio.gather(
                self._nodesets.synced.wait(), self._nodes.synced.wait(), self._pods.synced.wait()
            )
            group.create_task(run_workers(self.queue, self.reconcile, self._workers))

    # -- reconcile

    async def reconcile(self, key: str) -> Result | None:
        with self.metrics.reconciling():
            return await self._reconcile(key)

    async def _reconcile(self, key: str) -> Result | None:
        obj = self._nodesets.get(key)
        if obj is None:
            return None
        namespace, name = key.split("/", 1)
        meta = obj["metadata"]
        deleting = meta.get("deletionTimestamp") is not None
        if not deleting and FINALIZER not in (meta.get("finalizers") or []):
            await self._add_finalizer(namespace, name, meta.get("finalizers") or [])
            return Result(requeue_after=0)
        status = api.NodeSetStatus.model_validate(obj.get("status") or {})
        try:
            spec = api.NodeSetSpec.model_validate(obj["spec"])
        except ValidationError as error:
            message = _format_validation(error)
            await self._events.emit(obj, "InvalidSpec", message, action="Validate", type_="Warning")
            status.conditions = set_condition(
                status.conditions, "SpecValid", "False", "InvalidSpec", message, meta["generation"]
            )
            await self._write_status(namespace, name, obj, status)
            return None

        revision = template_hash(spec)
        # Every NodeSet's feasible nodes: parsed and evaluated once per reconcile.
        incumbents = self._incumbents()
        feasible_nodes = self._feasible_by_claimant(incumbents)
        assignment = assign(feasible_nodes, incumbents)
        me = self._claimant(obj)
        build_errors: dict[str, str] = {}
        owned: dict[str, str] = {}
        for node_name in assignment.nodes_of(me):
            node = self._nodes.get(node_name)
            if node is None:
                continue
            try:
                owned[node_name] = slurm_node_name(spec.slurm.node_name, name, node)
            except SpecError as error:
                build_errors[node_name] = str(error)
        pods = {
            view.name: view
            for view in map(_pod_view, self._pods.items())
            if view.name and self._owned_by(view.name, namespace, name)
        }
        slurm = self._slurm.nodes_with_feature(name)
        feasible_count = len(feasible_nodes.get(me, []))
        result = plan(
            spec,
            revision,
            owned,
            pods,
            slurm,
            deleting=deleting,
            feasible=feasible_count,
            now=time.time(),
            gres=self._node_gres(spec, pods.values()),
            node_gpus=self._node_gpus(pods.values()),
            listed=self._gres_listed(),
        )
        ref = NodeSetRef(namespace, name, meta["uid"])
        await self._keep_reservation(result, ref)
        for action in result.actions:
            try:
                await self._act(action, obj, ref, spec, revision)
            except SpecError as error:
                build_errors[getattr(action, "node", "?")] = str(error)
        await self._update_status(
            namespace, name, obj, status, result, assignment, me, build_errors, slurm is None
        )
        if deleting and not pods and not slurm and slurm is not None:
            await self._remove_finalizer(namespace, name, meta.get("finalizers") or [])
            return None
        if result.actions or result.waiting:
            return Result(requeue_after=WAIT_REQUEUE)
        return None

    def _node_gres(self, spec: api.NodeSetSpec, pods: Any) -> dict[str, str]:
        """Pod name -> the GRES its node has now. Not while the node's GPU
        plugin does not serve it (a kubelet restart keeps the GPUs at 0 until
        the plugin is back: no GPU is gone)."""
        found = {}
        for pod in pods:
            node = self._nodes.get(pod.node)
            if node is not None and not gpu_plugin_not_serving(node):
                found[pod.name] = node_gres(spec.slurm, node)
        return found

    def _node_gpus(self, pods: Any) -> dict[str, str]:
        """Pod name -> the GPUs its Node lists now (`sunk.dev/gpus`)."""
        found = {}
        for pod in pods:
            node = self._nodes.get(pod.node)
            listed = ((node.metadata.annotations if node and node.metadata else None) or {}).get(
                ANNOTATION_NODE_GPUS
            )
            if listed is not None:
                found[pod.name] = listed
        return found

    def _owned_by(self, pod_name: str, namespace: str, nodeset: str) -> bool:
        pod = self._pods.get(f"{namespace}/{pod_name}")
        labels = (pod.metadata.labels if pod and pod.metadata else None) or {}
        return labels.get(LABEL_NODESET) == nodeset

    # -- ownership across every NodeSet

    def _claimant(self, obj: Mapping[str, Any]) -> Claimant:
        meta = obj["metadata"]
        return Claimant(meta.get("creationTimestamp") or "", meta["namespace"], meta["name"])

    def _feasible_by_claimant(
        self, incumbents: Mapping[str, Claimant]
    ) -> dict[Claimant, list[str]]:
        result: dict[Claimant, list[str]] = {}
        nodes = self._nodes.items()
        for obj in self._nodesets.items():
            if obj["metadata"].get("deletionTimestamp"):
                continue
            try:
                spec = api.NodeSetSpec.model_validate(obj["spec"])
            except ValidationError:
                continue
            template = PodTemplateSpec.from_dict(spec.template)
            assert isinstance(template, PodTemplateSpec)
            if template.spec is None:
                continue
            claimant = self._claimant(obj)
            records = self._slurm.nodes_with_feature(claimant.name) or {}
            result[claimant] = [
                n.metadata.name
                for n in nodes
                if n.metadata
                and n.metadata.name
                and feasible(
                    template.spec,
                    n,
                    DAEMON_TOLERATIONS,
                    running=incumbents.get(n.metadata.name) == claimant
                    or _slurm_name(spec, claimant.name, n) in records,
                ).ok
            ]
        return result

    def _incumbents(self) -> dict[str, Claimant]:
        """Node → the NodeSet whose (live) pod runs on it."""
        current: dict[str, Claimant] = {}
        sets = {
            (o["metadata"]["namespace"], o["metadata"]["name"]): self._claimant(o)
            for o in self._nodesets.items()
        }
        for pod in self._pods.items():
            view = _pod_view(pod)
            owner = (pod.metadata.labels or {}).get(LABEL_NODESET) if pod.metadata else None
            claimant = sets.get((pod.metadata.namespace if pod.metadata else "", owner or ""))
            if claimant is not None and view.node and not view.terminating:
                current[view.node] = claimant
        return current

    # -- actions

    async def _keep_reservation(self, result: Plan, ref: NodeSetRef) -> None:
        """A reservation Slurm will not make or delete is reported and retried;
        the set's other actions go on regardless."""
        name = reservation_name(ref)
        match result.reservation:
            case Reserve(slurm_nodes=nodes, start=start, end=end):
                problem = await self._slurm.reserve(name, nodes, start, end)
            case Unreserve():
                problem = await self._slurm.unreserve(name)
            case _:
                problem = None
        if problem is not None:
            log.warning("maintenance reservation %s: %s", name, problem)
            result.waiting.append(f"maintenance reservation {name}: {problem}")

    async def _act(
        self,
        action: Any,
        obj: Mapping[str, Any],
        ref: NodeSetRef,
        spec: api.NodeSetSpec,
        revision: str,
    ) -> None:
        match action:
            case CreatePod(node=node_name):
                node = self._nodes.get(node_name)
                if node is None:
                    return
                if gpu_plugin_not_serving(node):
                    log.info(
                        "node %s: its GPU plugin does not serve it yet; its pod waits", node_name
                    )
                    return
                pod = build_pod(ref, spec, node, revision)
                try:
                    await self._kube.create(pod)
                except ApiError as error:
                    if error.status.code != 409:
                        raise
                    return
                self.metrics.actions.labels(kind="pod_create").inc()
                await self._events.emit(
                    obj,
                    "CreatedPod",
                    f"created pod {pod.metadata.name} on node {node_name}",  # type: ignore[union-attr]
                    action="Create",
                )
            case Drain(slurm_node=name, reason=reason):
                if await self._slurm.drain_unless_drained(name, reason):
                    self.metrics.actions.labels(kind="drain").inc()
                    await self._events.emit(
                        obj, "DrainedNode", f"drained Slurm node {name}: {reason}", action="Drain"
                    )
            case DeletePod(pod=pod_name, slurm_node=name, why=why, confirm=confirm):
                # The cache may be a moment old: confirm with Slurm itself.
                if (
                    confirm
                    and name in (self._slurm.nodes_with_feature(ref.name) or {})
                    and not await self._slurm.drained_and_idle(name)
                ):
                    return
                if not await self._delete_pod(ref.namespace, pod_name):
                    return
                self.metrics.actions.labels(kind="pod_delete").inc()
                await self._events.emit(
                    obj, "DeletedPod", f"deleted pod {pod_name}: {why}", action="Delete"
                )
            case Resume(slurm_node=name, reason=reason):
                if not reason.startswith(REASON_PREFIX):
                    # Slurm's own drain: it comes back at once if slurmd still
                    # reports too few, so at most one resume a minute.
                    last = self._resumed.get(name, float("-inf"))
                    if time.monotonic() - last < SLURM_DRAIN_RESUME_SECONDS:
                        return
                    self._resumed[name] = time.monotonic()
                if await self._slurm.resume_if_reason(name, reason):
                    self.metrics.actions.labels(kind="resume").inc()
                    await self._events.emit(
                        obj, "ResumedNode", f"resumed Slurm node {name}", action="Resume"
                    )
            case Reconfigure(pod=pod_name, registration=registration):
                await self._slurm.reconfigure()
                await self._annotate(
                    ref.namespace, pod_name, {ANNOTATION_SLURMD_RECONFIGURED: registration}
                )
                await self._events.emit(
                    obj,
                    "Reconfigured",
                    f"pod {pod_name}: its node registered anew; slurmctld read its files again",
                    action="Reregister",
                )
            case GiveGpus(pod=pod_name, gpus=gpus):
                await self._annotate(ref.namespace, pod_name, {ANNOTATION_SLURMD_GPUS: gpus})
                await self._events.emit(
                    obj,
                    "GresLineChanged",
                    f"pod {pod_name}: its gres.conf line names GPUs {gpus} (registers anew next)",
                    action="Reregister",
                )
            case Reregister(pod=pod_name, slurm_node=name, conf=conf):
                # The cache may be a moment old: confirm with Slurm itself.
                if name in (self._slurm.nodes_with_feature(ref.name) or {}):
                    if not await self._slurm.drained_and_idle(name):
                        return
                    await self._slurm.delete_node(name)
                if not await self._give_conf(ref.namespace, pod_name, conf):
                    return
                self.metrics.actions.labels(kind="reregister").inc()
                await self._events.emit(
                    obj,
                    "ReregisteredNode",
                    f"Slurm node {name} registers anew in pod {pod_name}: --conf {conf}",
                    action="Reregister",
                )
            case DeleteSlurmNode(slurm_node=name):
                await self._slurm.delete_node(name)
                self.metrics.actions.labels(kind="slurm_delete").inc()
                await self._events.emit(
                    obj, "RemovedNode", f"removed Slurm node {name}", action="Delete"
                )

    async def _give_conf(self, namespace: str, name: str, conf: str) -> bool:
        """The pod's slurmd starts again with `conf` (the slurm chart's slurmd
        container follows these annotations): the registration count moves on
        too, so it starts again even if `conf` is the one it has."""
        pod = self._pods.get(f"{namespace}/{name}")
        if pod is None or pod.metadata is None:
            return False
        annotations = pod.metadata.annotations or {}
        try:
            registration = int(annotations.get(ANNOTATION_SLURMD_REGISTRATION, "0")) + 1
        except ValueError:
            registration = 1
        await self._annotate(
            namespace,
            name,
            {ANNOTATION_SLURMD_CONF: conf, ANNOTATION_SLURMD_REGISTRATION: str(registration)},
        )
        return True

    async def _annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """A slurmd pod's annotations of a node registering anew (the policy
        <release>-operator-pod-updates lets the operator change only those)."""
        patch = {"metadata": {"annotations": annotations}}
        await self._kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)

    async def _delete_pod(self, namespace: str, name: str) -> bool:
        pod = self._pods.get(f"{namespace}/{name}")
        if pod is None or pod.metadata is None or pod.metadata.uid is None:
            return False
        return await delete_pod(self._kube, namespace, name, pod.metadata.uid)

    # -- status

    async def _update_status(
        self,
        namespace: str,
        name: str,
        obj: Mapping[str, Any],
        old: api.NodeSetStatus,
        result: Plan,
        assignment: Assignment,
        me: Claimant,
        build_errors: Mapping[str, str],
        stale: bool,
    ) -> None:
        generation = obj["metadata"].get("generation")
        status = result.status
        conditions = set_condition(old.conditions, "SpecValid", "True", "Valid", "", generation)
        if build_errors:
            message = "; ".join(f"{n}: {e}" for n, e in sorted(build_errors.items()))
            conditions = set_condition(
                conditions, "SpecValid", "False", "CannotBuildPod", message, generation
            )
        conflicts = assignment.conflicts.get(me, [])
        conditions = set_condition(
            conditions,
            "NodeConflict",
            "True" if conflicts else "False",
            "NodeOwnedElsewhere" if conflicts else "NoConflict",
            "; ".join(f"node {n} belongs to NodeSet {o.namespace}/{o.name}" for n, o in conflicts),
            generation,
        )
        conditions = set_condition(
            conditions,
            "SlurmReachable",
            "False" if stale else "True",
            "Stale" if stale else "Fresh",
            "Slurm's view is stale: no drains, deletions or resumes until it is fresh"
            if stale
            else "",
            generation,
        )
        conditions = set_condition(
            conditions,
            "Progressing",
            "False" if result.done else "True",
            "Settled" if result.done else "Working",
            "; ".join(result.waiting)[:1024],
            generation,
        )
        conditions = set_condition(
            conditions,
            "Available",
            "True" if status.desired and status.ready == status.desired else "False",
            "AllReady" if status.ready == status.desired else "NotAllReady",
            f"{status.ready}/{status.desired} pods ready",
            generation,
        )
        status.conditions = conditions
        status.observed_generation = generation
        if status.model_dump(exclude={"conditions"}) == old.model_dump(
            exclude={"conditions"}
        ) and same_conditions(conditions, old.conditions):
            return
        await self._write_status(namespace, name, obj, status)

    async def _write_status(
        self, namespace: str, name: str, obj: Mapping[str, Any], status: api.NodeSetStatus
    ) -> None:
        body = {"status": status.model_dump(mode="json", by_alias=True, exclude_none=True)}
        try:
            await self._kube.patch(
                api.resource().Status, name, body, namespace=namespace, patch_type=PatchType.MERGE
            )
        except ApiError as error:
            # Deleted since the cache saw it (its finalizer was the last): no one to tell.
            if error.status.code != 404:
                raise

    async def _add_finalizer(self, namespace: str, name: str, finalizers: list[str]) -> None:
        patch = {"metadata": {"finalizers": [*finalizers, FINALIZER]}}
        await self._kube.patch(
            api.resource(), name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )

    async def _remove_finalizer(self, namespace: str, name: str, finalizers: list[str]) -> None:
        patch = {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}}
        await self._kube.patch(
            api.resource(), name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )
