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
- A node whose GPUs changed (its GRES from the node now differs from the
  record Slurm keeps) is drained, and once idle registers anew in the same
  pod: its record deleted and its slurmd given the new `--conf`
  (`Reregister`). Slurm keeps a dynamic node's record as first registered and
  drains a node that reports fewer GPUs than it counts; only a drain of
  sunk's or that one of Slurm's is acted on, a person's waits. Slurm's drain
  of a node whose count is right (it registered before its gres.conf line
  reached slurmctld) is resumed.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sunk.api import nodeset as api
from sunk.gres.plan import GresLine
from sunk.nodeset.window import window_at

REASON_PREFIX = "sunk/nodeset:"
REASON_UPDATE = f"{REASON_PREFIX} replacing the pod for an update"
REASON_SCALE_IN = f"{REASON_PREFIX} the node left the NodeSet"
REASON_GRES = f"{REASON_PREFIX} its GPUs changed"
# Slurm's own drain of a node whose slurmd reports fewer of a GRES than its
# record counts: "gres/gpu count reported lower than configured (3 < 4)".
SLURM_GRES_REASON = "gres/"


@dataclass(frozen=True)
class PodView:
    name: str
    node: str
    revision: str
    ready: bool
    terminating: bool = False
    failed: bool = False  # phase Failed (or Succeeded): it will never run again
    conf: str = ""  # the --conf its slurmd runs with (sunk.dev/slurmd-conf); "": unknown
    gpus: str | None = None  # the GPUs its gres.conf line names (sunk.dev/slurmd-gpus)
    registration: str = ""  # sunk.dev/slurmd-registration
    reconfigured: str = ""  # sunk.dev/slurmd-reconfigured


@dataclass(frozen=True)
class SlurmNodeView:
    name: str
    drained: bool  # the DRAIN flag, whatever the reason
    busy: bool  # a job runs or completes on it
    reason: str = ""
    responding: bool = True
    base_state: str = "IDLE"  # IDLE, ALLOCATED, MIXED, DOWN, …
    gres: str = ""  # as Slurm counts it: "gpu:4", "gpu:h100:8(S:0-1)"

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
class GiveGpus:
    """The pod's gres.conf line is to name `gpus` ("0,2,3"): its node is
    drained and idle, about to register anew."""

    pod: str
    gpus: str


@dataclass(frozen=True)
class Reconfigure:
    """The pod's node registered anew (for `registration`): slurmctld reads
    its files again, so the node takes its place in the topology."""

    pod: str
    registration: str


@dataclass(frozen=True)
class Reregister:
    """Delete the Slurm node's record (once a fresh read confirms it drained
    and idle), then give the pod's slurmd `conf`: it starts again in the
    running container and registers anew."""

    pod: str
    slurm_node: str
    conf: str


@dataclass(frozen=True)
class Reserve:
    """Keep `slurm_nodes` in the set's maintenance reservation for [start, end)."""

    slurm_nodes: tuple[str, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Unreserve:
    """The set needs no maintenance reservation (none may exist)."""


Action = (
    CreatePod | Drain | DeletePod | Resume | DeleteSlurmNode | GiveGpus | Reregister | Reconfigure
)

# How long a changed gres.conf line may take to reach slurmctld: the kubelet
# updates a mounted ConfigMap within its sync period (a minute), then the
# slurm chart's reconfigure sidecar applies it within seconds.
GRES_PROPAGATION_SECONDS = 90.0


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
    gres: Mapping[str, str] | None = None,
    node_gpus: Mapping[str, str] | None = None,
    listed: Mapping[str, GresLine] | None = None,
) -> Plan:
    """`owned`: node → pod name it should have; `pods`: this set's pods by name;
    `slurm`: its Slurm nodes by name, None while Slurm's view is stale; `now`:
    epoch seconds, for the maintenance window; `gres`: pod name → the GRES its
    node has now ("gpu:4", "" for none), as a new pod's `--conf` would say;
    `node_gpus`: pod name → the GPUs its Node lists now ("0,2,3");
    `listed`: Slurm node → its line in sunk's gres.conf (None: sunk writes none)."""
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

    # 4. A current pod whose node's GPUs changed registers anew, drained first.
    regres: set[str] = set()
    for pod in sorted(by_node.values(), key=lambda p: p.name):
        current = pod.node in desired and pod.revision == revision and pod.ready
        state = view.get(pod.name)
        want = (gres or {}).get(pod.name)
        if not current or stale or want is None or not pod.conf:
            continue
        if state is None:
            # Not in Slurm: about to register, or its record deleted and its
            # new --conf not given (that write failed): give it.
            if with_gres(pod.conf, want) != pod.conf:
                result.actions.append(Reregister(pod.name, pod.name, with_gres(pod.conf, want)))
            continue
        if same_gres(state.gres, want):
            if pod.registration and pod.reconfigured != pod.registration:
                result.actions.append(Reconfigure(pod.name, pod.registration))
            line = (listed or {}).get(pod.name)
            if (
                state.drained
                and state.reason.startswith(SLURM_GRES_REASON)
                and line is not None
                and line.gpus == gpu_count(want)
            ):
                # Slurm drained it for a registration that came before its
                # line in sunk's gres.conf reached slurmctld (a new node); the
                # line is written and counts right: a resume has slurmd
                # register again (and Slurm drains it again if still short).
                result.actions.append(Resume(pod.name, state.reason))
            continue
        regres.add(pod.name)
        change = f"{state.gres or 'no GRES'} -> {want or 'no GRES'}"
        if not state.drained:
            result.actions.append(Drain(pod.name, f"{REASON_GRES} ({change})"))
        elif state.busy:
            result.waiting.append(
                f"{pod.name}: its GPUs changed ({change}): waiting for its jobs to end"
            )
        elif state.drained_by_us or state.reason.startswith(SLURM_GRES_REASON):
            found = (node_gpus or {}).get(pod.name)
            line = (listed or {}).get(pod.name)
            if listed is not None and found is not None and pod.gpus != found:
                # Its gres.conf line names the GPUs now, first: slurmd must
                # find it when it starts again.
                result.actions.append(GiveGpus(pod.name, found))
                result.waiting.append(f"{pod.name}: its gres.conf line changes to GPUs {found}")
            elif (
                listed is not None
                and found is not None
                and (
                    line is None
                    or line.gpus != gpu_count(want)
                    or now - line.since < GRES_PROPAGATION_SECONDS
                )
            ):
                result.waiting.append(
                    f"{pod.name}: its GPUs changed ({change}): waiting for its gres.conf line"
                    " to reach slurmctld"
                )
            else:
                result.actions.append(Reregister(pod.name, pod.name, with_gres(pod.conf, want)))
        else:
            result.waiting.append(
                f"{pod.name}: its GPUs changed ({change}): registers anew once resumed"
                f" (drained: {state.reason})"
            )

    # 5. Current, ready pods whose node we drained serve again.
    for pod in by_node.values():
        state = view.get(pod.name)
        current = pod.node in desired and pod.revision == revision and pod.ready
        if current and state is not None and state.drained_by_us and pod.name not in regres:
            result.actions.append(Resume(pod.name, state.reason))

    # 6. Slurm records of this set with no pod and no place: forget them.
    if not stale:
        pod_names = set(pods)
        wanted = set(desired.values())
        for name in sorted(view):
            if name not in pod_names and name not in wanted:
                result.actions.append(DeleteSlurmNode(name))

    result.status = _status(spec, revision, desired, pods, view, feasible)
    return result


def same_gres(slurm: str, conf: str) -> bool:
    """Slurm's GRES of a node ("gpu:h100:4(S:0-1),shard:8") counts what a
    `--conf` Gres= value ("shard:8,gpu:h100:4") does: the same entries, less
    Slurm's socket affinity, in any order."""

    def entries(text: str) -> set[str]:
        return {part.split("(", 1)[0] for part in text.split(",") if part}

    return entries(slurm) == entries(conf)


def gpu_count(gres: str) -> int | None:
    """4 for "gpu:4" or "gpu:h100:4"; None for anything else."""
    parts = gres.split(":")
    if len(parts) in (2, 3) and parts[0] == "gpu" and parts[-1].isdigit():
        return int(parts[-1])
    return None


def with_gres(conf: str, gres: str) -> str:
    """`conf` with its Gres= replaced by `gres` ("" drops it)."""
    kept = [part for part in conf.split(" ") if part and not part.startswith("Gres=")]
    return " ".join([*kept, *([f"Gres={gres}"] if gres else [])])


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
