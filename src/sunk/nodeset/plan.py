"""What the NodeSet controller should do next, decided from current state only.

`plan()` is pure: the NodeSet, the nodes it owns, its pods and Slurm's view of
its nodes go in; the actions to take now and the status come out. Because it
reads state and never remembers what it did, a controller restarted at any
moment decides again from what it finds, and nothing is lost or done twice.

The rules that keep jobs alive:

- A pod leaves (update or scale-in) only once its Slurm node is drained and
  no job runs on it; the executor confirms that with a fresh read of Slurm
  just before it deletes.
- Updates drain at most `maxUnavailable` nodes at a time, counting every
  desired node that is not serving (pod missing, not ready, or drained by an
  update). A node that is already drained and idle (by anyone) is replaced
  without using the budget: it serves no one.
- sunk resumes only drains whose reason carries its own prefix; a drain made
  by a person (any other reason) outlives updates and restarts.
- When Slurm's view is stale nothing that depends on it happens: no drain,
  no delete, no resume. Pods for new nodes are still created.
- With a maintenance window, updates drain only inside it; before it, the
  outdated nodes are reserved in Slurm from the window's start (so no job
  that would still run then starts on them), and the reservation goes when
  the update is done.
- A pod that has failed for good (phase Failed: kubelet refused it, e.g. its
  node's labels had not reached kubelet yet, or it was evicted) runs no
  slurmd, so no job can run through it: it is deleted at once, without a
  drain or a Slurm check, and recreated next time, as the DaemonSet
  controller does.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sunk.api import nodeset as api
from sunk.nodeset.window import window_at

REASON_PREFIX = "sunk/nodeset:"
REASON_UPDATE = f"{REASON_PREFIX} replacing the pod for an update"
REASON_SCALE_IN = f"{REASON_PREFIX} the node left the NodeSet"


@dataclass(frozen=True)
class PodView:
    name: str
    node: str
    revision: str
    ready: bool
    terminating: bool = False
    failed: bool = False  # phase Failed (or Succeeded): it will never run again


@dataclass(frozen=True)
class SlurmNodeView:
    name: str
    drained: bool  # the DRAIN flag, whatever the reason
    busy: bool  # a job runs or completes on it
    reason: str = ""
    responding: bool = True
    base_state: str = "IDLE"  # IDLE, ALLOCATED, MIXED, DOWN, …

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)


@dataclass(frozen=True)
class CreatePod:
    node: str


@dataclass(frozen=True)
class Drain:
    slurm_node: str
    reason: str


@dataclass(frozen=True)
class DeletePod:
    pod: str
    slurm_node: str  # confirmed drained and idle by a fresh read first ...
    why: str
    confirm: bool = True  # ... unless False: a failed pod, whose slurmd is gone anyway


@dataclass(frozen=True)
class Resume:
    slurm_node: str
    reason: str  # the drain reason seen; resume only if it still is


@dataclass(frozen=True)
class DeleteSlurmNode:
    slurm_node: str


@dataclass(frozen=True)
class Reserve:
    """Keep `slurm_nodes` in the set's maintenance reservation for [start, end)."""

    slurm_nodes: tuple[str, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Unreserve:
    """The set needs no maintenance reservation (none may exist)."""


Action = CreatePod | Drain | DeletePod | Resume | DeleteSlurmNode


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    status: api.NodeSetStatus = field(default_factory=api.NodeSetStatus)
    waiting: list[str] = field(default_factory=list)  # why it is not done, for conditions
    # The maintenance reservation the set should have; None: leave it as it is
    # (Slurm's view is stale).
    reservation: Reserve | Unreserve | None = None

    @property
    def done(self) -> bool:
        return not self.actions and not self.waiting


def max_unavailable(strategy: api.UpdateStrategy, desired: int) -> int:
    value = strategy.rolling_update.max_unavailable
    if isinstance(value, str):
        value = math.floor(desired * int(value.rstrip("%")) / 100)
    return max(1, value)


def plan(
    spec: api.NodeSetSpec,
    revision: str,
    owned: Mapping[str, str],
    pods: Mapping[str, PodView],
    slurm: Mapping[str, SlurmNodeView] | None,
    *,
    deleting: bool = False,
    feasible: int | None = None,
    now: float = 0.0,
) -> Plan:
    """`owned`: node → pod name it should have; `pods`: this set's pods by name;
    `slurm`: its Slurm nodes by name, None while Slurm's view is stale; `now`:
    epoch seconds, for the maintenance window."""
    result = Plan()
    desired = {} if deleting else dict(owned)
    stale = slurm is None
    view = slurm or {}

    # 0. Failed pods go at once: nothing runs in them (see the module's rules).
    for pod in sorted(pods.values(), key=lambda p: p.name):
        if pod.failed and not pod.terminating:
            result.actions.append(DeletePod(pod.name, pod.name, "the pod failed", confirm=False))
    by_node = {pod.node: pod for pod in pods.values() if not pod.terminating and not pod.failed}

    # 1. Every desired node gets its pod.
    for node in sorted(desired):
        if node not in by_node and not any(p.node == node for p in pods.values()):
            result.actions.append(CreatePod(node))

    # 2. Pods on nodes that are no longer desired leave, drained first.
    for pod in sorted(pods.values(), key=lambda p: p.name):
        if pod.node in desired or pod.terminating or pod.failed:
            continue
        if stale:
            result.waiting.append(f"{pod.name}: Slurm's view is stale")
            continue
        _leave(result, pod, view.get(pod.name), REASON_SCALE_IN, "the node left the NodeSet")

    # 3. Rolling update, within the budget.
    serving = [
        p for p in by_node.values() if p.node in desired and p.ready and not _drained_by_us(view, p)
    ]
    unavailable = len(desired) - len(serving)
    budget = max_unavailable(spec.update_strategy, len(desired)) - unavailable
    rolling = spec.update_strategy.type == "RollingUpdate"
    outdated = sorted(
        (p for p in by_node.values() if p.node in desired and p.revision != revision),
        # Nodes already out of service first: replacing them costs nothing.
        key=lambda p: (_serves(view, p), p.name),
    )
    window_spec = spec.update_strategy.maintenance_window if rolling else None
    window = window_at(window_spec, now) if window_spec is not None else None
    closed = ""  # why the update may not drain now
    if window_spec is not None and window is None:
        closed = "update waits for a maintenance window (the last one has ended)"
    elif window is not None and not window.open(now):
        closed = f"update waits for the maintenance window from {_iso(window.start)}"
    for pod in outdated if rolling else []:
        if stale:
            result.waiting.append(f"{pod.name}: Slurm's view is stale")
            continue
        state = view.get(pod.name)
        if state is None or (state.drained and not state.busy):
            result.actions.append(DeletePod(pod.name, pod.name, "replaced by an update"))
        elif state.drained:
            result.waiting.append(f"{pod.name}: waiting for its jobs to end ({state.reason})")
        elif closed:
            result.waiting.append(f"{pod.name}: {closed}")
        elif budget > 0:
            result.actions.append(Drain(pod.name, REASON_UPDATE))
            budget -= 1
        else:
            result.waiting.append(f"{pod.name}: update waits for maxUnavailable")
    if not stale:
        reserved = tuple(sorted(p.name for p in outdated if p.name in view)) if rolling else ()
        result.reservation = (
            Reserve(reserved, window.start, window.end)
            if window is not None and reserved
            else Unreserve()
        )

    # 4. Current, ready pods whose node we drained serve again.
    for pod in by_node.values():
        state = view.get(pod.name)
        current = pod.node in desired and pod.revision == revision and pod.ready
        if current and state is not None and state.drained_by_us:
            result.actions.append(Resume(pod.name, state.reason))

    # 5. Slurm records of this set with no pod and no place: forget them.
    if not stale:
        pod_names = set(pods)
        wanted = set(desired.values())
        for name in sorted(view):
            if name not in pod_names and name not in wanted:
                result.actions.append(DeleteSlurmNode(name))

    result.status = _status(spec, revision, desired, pods, view, feasible)
    return result


def _iso(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _leave(result: Plan, pod: PodView, node: SlurmNodeView | None, reason: str, why: str) -> None:
    if node is None or (node.drained and not node.busy):
        result.actions.append(DeletePod(pod.name, pod.name, why))
    elif not node.drained:
        result.actions.append(Drain(pod.name, reason))
    else:
        result.waiting.append(f"{pod.name}: waiting for its jobs to end ({node.reason})")


def _drained_by_us(view: Mapping[str, SlurmNodeView], pod: PodView) -> bool:
    node = view.get(pod.name)
    return node is not None and node.drained_by_us


def _serves(view: Mapping[str, SlurmNodeView], pod: PodView) -> bool:
    node = view.get(pod.name)
    return pod.ready and node is not None and not node.drained


def _status(
    spec: api.NodeSetSpec,
    revision: str,
    desired: Mapping[str, str],
    pods: Mapping[str, PodView],
    view: Mapping[str, SlurmNodeView],
    feasible: int | None,
) -> api.NodeSetStatus:
    live = [p for p in pods.values() if not p.terminating]
    scheduled = [p for p in live if p.node in desired]
    ready = [p for p in scheduled if p.ready]
    counts = api.SlurmCounts()
    for node in view.values():
        if node.drained:
            counts.drain += 1
        if not node.responding:
            counts.not_responding += 1
        match node.base_state:
            case "IDLE":
                counts.idle += 1
            case "ALLOCATED":
                counts.allocated += 1
            case "MIXED":
                counts.mixed += 1
            case "DOWN":
                counts.down += 1
    return api.NodeSetStatus(
        desired=len(desired),
        feasible=feasible if feasible is not None else len(desired),
        scheduled=len(scheduled),
        ready=len(ready),
        updated=sum(1 for p in scheduled if p.revision == revision),
        drained=counts.drain,
        misscheduled=sum(1 for p in live if p.node not in desired),
        unavailable=len(desired) - len(ready),
        template_hash=revision,
        slurm=counts,
    )
