"""What the syncer's decider sees of Kubernetes nodes and pods, and which
condition changes are told as Events (pure)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Literal

from lightkube.models.core_v1 import NodeCondition, PodCondition
from lightkube.resources.core_v1 import Node, Pod

from sunk.kube.client import pod_ready
from sunk.syncer.decide import Condition, KubeNodeState, SlurmdPodState

# Slurm states that show on Kubernetes as Events when they begin and end:
# condition type → (Event reason when True, Event reason when False).
STATE_EVENTS = {
    "SlurmDown": ("SlurmDown", "SlurmUp"),
    "SlurmNotResponding": ("SlurmNotResponding", "SlurmResponding"),
}


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


def pod_state(pod: Pod, now: datetime.datetime | None = None) -> SlurmdPodState:
    ready = pod_ready(pod)
    not_ready_for = 0.0 if ready else float("inf")
    if not ready:
        conditions = (pod.status.conditions if pod.status else None) or []
        since = next((c.lastTransitionTime for c in conditions if c.type == "Ready"), None)
        if since is not None:
            now = now or datetime.datetime.now(datetime.UTC)
            not_ready_for = max(0.0, (now - since).total_seconds())
    return SlurmdPodState(
        name=(pod.metadata.name if pod.metadata else None) or "",
        ready=ready,
        terminating=bool(pod.metadata and pod.metadata.deletionTimestamp),
        namespace=(pod.metadata.namespace if pod.metadata else None) or "",
        node=(pod.spec.nodeName if pod.spec else None) or "",
        not_ready_for=not_ready_for,
    )


def state_event(
    have: NodeCondition | PodCondition | None, wanted: Condition
) -> tuple[str, Literal["Normal", "Warning"]] | None:
    """The Event (reason, type) a condition's change deserves, if any.

    Slurm drains that began in Slurm, DOWN and NOT_RESPONDING are told when
    they begin and end; sunk's own drains are told by their action's Event.
    """
    was_true = have is not None and have.status == "True"
    now_true = wanted.status == "True"
    if was_true == now_true:
        return None
    if wanted.type == "SlurmDrain":
        if now_true and wanted.reason == "SlurmDrain":
            return "SlurmDrained", "Warning"
        if not now_true and have is not None and have.reason == "SlurmDrain":
            return "SlurmDrainCleared", "Normal"
        return None
    if wanted.type in STATE_EVENTS:
        on, off = STATE_EVENTS[wanted.type]
        return (on, "Warning") if now_true else (off, "Normal")
    return None
