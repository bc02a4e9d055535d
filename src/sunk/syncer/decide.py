"""What the syncer should change for one node, decided from both sides' current state.

Pure: the Kubernetes node, its slurmd pod and the Slurm node go in; the
actions on both sides come out. Level-triggered, so a restart at any moment
decides again from what it finds.

Kubernetes → Slurm. A *cause* (cordon, node NotReady, a configured node
condition, the slurmd pod NotReady or terminating) drains the Slurm node
with a reason that starts with `sunk/syncer:` and says why. When no cause is
left, sunk resumes the node only if the current reason is the syncer's own.
A drain someone removed in Slurm while its cause persists is put back. A
drain made by a person, or by the NodeSet controller, is never overwritten
or resumed.

Slurm → Kubernetes. The Slurm state shows on the node and its slurmd pod
as an annotation with the reason, conditions (SlurmDrain, SlurmDown,
SlurmNotResponding, SlurmAllocated, and SlurmSynced saying whether they are
current), labels tools and PodDisruptionBudgets can select on (drained; busy
while a job runs or completes), and the node-lock taint while a job runs.
The Slurm node's comment names the pod, for `scontrol show node`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sunk.api import DOMAIN, TAINT_NODE_LOCK

REASON_PREFIX = "sunk/syncer:"
# Every sunk component drains with a reason "sunk/<component>: why".
SUNK_REASON = re.compile(r"^sunk/([a-z-]+):")
CORDON_REASON_ANNOTATION = f"{DOMAIN}/cordon-reason"
ANNOTATION_SLURM_STATE = f"{DOMAIN}/slurm-state"
ANNOTATION_SLURM_REASON = f"{DOMAIN}/slurm-reason"
LABEL_SLURM_DRAIN = f"{DOMAIN}/slurm-drain"  # "true" | "false", for PDBs and tools
# "true" while a job runs or completes on the node: the chart's PodDisruptionBudget
# keeps such a slurmd from eviction, so `kubectl drain` waits for the jobs.
LABEL_SLURM_BUSY = f"{DOMAIN}/slurm-busy"
# True while the Slurm* conditions are current; False while Slurm cannot be read.
CONDITION_SYNCED = "SlurmSynced"
# A slurmd pod not Ready for less than this is starting (slurmd registers before
# its readiness probe first passes), not failing: no drain yet, a recheck instead.
NOT_READY_GRACE = 10.0


@dataclass(frozen=True)
class KubeNodeState:
    name: str
    cordoned: bool
    ready: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Node conditions of the configured list that are True: type → message.
    bad_conditions: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[tuple[str, str]] = ()  # (key, effect)


@dataclass(frozen=True)
class SlurmdPodState:
    name: str
    ready: bool
    terminating: bool
    namespace: str = ""
    node: str = ""
    # Seconds since the pod's Ready condition turned False (inf when unknown).
    not_ready_for: float = float("inf")


@dataclass(frozen=True)
class SlurmState:
    name: str
    base_state: str  # IDLE, ALLOCATED, MIXED, DOWN, …
    drained: bool  # the DRAIN flag
    reason: str
    responding: bool
    busy: bool  # a job runs or completes on it
    comment: str = ""
    # When Slurm last set the reason (Unix seconds; None when it does not say):
    # how long a drain has lasted, for the metrics.
    reason_since: int | None = None


def sunk_drainer(slurm: SlurmState) -> str | None:
    """The sunk component whose drain the node carries (syncer, nodeset), or None
    when it is not drained or drained by someone else (a person, a health check)."""
    if not slurm.drained or (found := SUNK_REASON.match(slurm.reason)) is None:
        return None
    return found.group(1)


@dataclass(frozen=True)
class Drain:
    reason: str
    # The drain sunk made was removed in Slurm while its cause lasts.
    put_back: bool = False


@dataclass(frozen=True)
class Resume:
    reason: str  # resume only if this is still the reason


@dataclass(frozen=True)
class SetTaint:
    present: bool
    effect: str


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True)
class SetComment:
    comment: str


@dataclass
class Decision:
    slurm: list[Drain | Resume | SetComment] = field(default_factory=list)
    taint: SetTaint | None = None
    annotations: dict[str, str | None] = field(default_factory=dict)  # None: remove
    labels: dict[str, str | None] = field(default_factory=dict)
    conditions: list[Condition] = field(default_factory=list)
    recheck_after: float | None = None  # seconds; a cause may start by then


def cause(node: KubeNodeState, pod: SlurmdPodState | None) -> str | None:
    """Why Kubernetes wants the Slurm node drained, as the drain reason; None if it does not."""
    if node.cordoned:
        why = node.annotations.get(CORDON_REASON_ANNOTATION, "").strip()
        return f"{REASON_PREFIX} node cordoned" + (f": {why}" if why else "")
    if not node.ready:
        return f"{REASON_PREFIX} node NotReady"
    for kind, message in sorted(node.bad_conditions.items()):
        return f"{REASON_PREFIX} node condition {kind}" + (f": {message}" if message else "")
    if pod is not None and pod.terminating:
        return f"{REASON_PREFIX} slurmd pod {pod.name} terminating"
    if pod is not None and not pod.ready and pod.not_ready_for >= NOT_READY_GRACE:
        return f"{REASON_PREFIX} slurmd pod {pod.name} not ready"
    return None


def pod_comment(pod: SlurmdPodState) -> str:
    """The Slurm node's comment: which pod it is, for `scontrol show node`."""
    return f"k8s pod {pod.namespace}/{pod.name} on node {pod.node}"


def stale(reason: str) -> Decision:
    """Slurm cannot be read: act on neither side, only say the mirror is not current."""
    return Decision(conditions=[Condition(CONDITION_SYNCED, "False", "SlurmStale", reason)])


def decide(
    node: KubeNodeState,
    pod: SlurmdPodState | None,
    slurm: SlurmState | None,
    *,
    lock_effect: str = "NoExecute",
) -> Decision:
    decision = Decision()
    if slurm is None:
        # Not (yet) a Slurm node: nothing to mirror, and any old mirror goes.
        decision.annotations = {ANNOTATION_SLURM_STATE: None, ANNOTATION_SLURM_REASON: None}
        decision.labels = {LABEL_SLURM_DRAIN: None, LABEL_SLURM_BUSY: None}
        if _has_lock(node):
            decision.taint = SetTaint(False, lock_effect)
        return decision

    # Kubernetes → Slurm.
    wanted = cause(node, pod)
    if wanted is None and pod is not None and not pod.ready:
        decision.recheck_after = max(0.0, NOT_READY_GRACE - pod.not_ready_for)
    ours = slurm.drained and slurm.reason.startswith(REASON_PREFIX)
    if wanted is not None:
        if not slurm.drained or (ours and slurm.reason != wanted):
            # The mirror still shows sunk's own drain: someone removed it in Slurm.
            mirrored = node.annotations.get(ANNOTATION_SLURM_REASON, "")
            put_back = not slurm.drained and mirrored.startswith(REASON_PREFIX)
            decision.slurm.append(Drain(wanted, put_back))
    elif ours:
        decision.slurm.append(Resume(slurm.reason))
    if pod is not None and slurm.comment != pod_comment(pod):
        decision.slurm.append(SetComment(pod_comment(pod)))

    # Slurm → Kubernetes.
    state = slurm.base_state + ("+DRAIN" if slurm.drained else "")
    state += "" if slurm.responding else "+NOT_RESPONDING"
    decision.annotations = {
        ANNOTATION_SLURM_STATE: state,
        ANNOTATION_SLURM_REASON: slurm.reason
        if slurm.drained or slurm.base_state == "DOWN"
        else None,
    }
    decision.labels = {
        LABEL_SLURM_DRAIN: _label(slurm.drained),
        LABEL_SLURM_BUSY: _label(slurm.busy),
    }
    origin = "SunkDrain" if slurm.reason.startswith("sunk/") else "SlurmDrain"
    decision.conditions = [
        Condition(
            "SlurmDrain",
            _bool(slurm.drained),
            origin if slurm.drained else "NotDrained",
            slurm.reason if slurm.drained else "",
        ),
        Condition("SlurmDown", _bool(slurm.base_state == "DOWN"), slurm.base_state, slurm.reason),
        Condition(
            "SlurmNotResponding",
            _bool(not slurm.responding),
            "NotResponding" if not slurm.responding else "Responding",
            "",
        ),
        Condition("SlurmAllocated", _bool(slurm.busy), slurm.base_state, ""),
        Condition(CONDITION_SYNCED, "True", "InStep", ""),
    ]
    if slurm.busy != _has_lock(node):
        decision.taint = SetTaint(slurm.busy, lock_effect)
    return decision


def _bool(value: bool) -> str:
    return "True" if value else "False"


def _label(value: bool) -> str:
    return "true" if value else "false"


def _has_lock(node: KubeNodeState) -> bool:
    return any(key == TAINT_NODE_LOCK for key, _ in node.taints)
