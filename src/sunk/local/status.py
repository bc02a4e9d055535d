"""Pure pieces of the pod lifecycle: back-off, restart decisions, phase, conditions, status.

The worker records what it observed about each container in a `ContainerView`
and these functions turn the views into the decisions and the status document
kubelet would write.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["waiting", "running", "terminated"]


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def rfc3339(t: datetime.datetime | None) -> str | None:
    if t is None:
        return None
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BackOff:
    """Kubelet's container restart back-off (client-go flowcontrol.Backoff semantics).

    The first restart is immediate and sets the delay to `initial`; each
    further exit within the delay doubles it up to `maximum`. An entry that
    has not been touched for 2 x `maximum` starts over.
    """

    def __init__(self, initial: float, maximum: float, clock: Callable[[], float]) -> None:
        self.initial = initial
        self.maximum = maximum
        self.clock = clock
        self._entries: dict[str, tuple[float, float]] = {}  # key -> (delay, last update)

    def _expired(self, key: str, now: float) -> bool:
        entry = self._entries.get(key)
        return entry is None or now - entry[1] > 2 * self.maximum

    def in_backoff_since(self, key: str, finished_at: float) -> bool:
        """True while `finished_at` is less than the current delay ago."""
        now = self.clock()
        if self._expired(key, now):
            return False
        return now - finished_at < self._entries[key][0]

    def remaining(self, key: str, finished_at: float) -> float:
        if self._expired(key, self.clock()):
            return 0.0
        return max(0.0, finished_at + self._entries[key][0] - self.clock())

    def delay(self, key: str) -> float:
        entry = self._entries.get(key)
        return entry[0] if entry else 0.0

    def next(self, key: str) -> None:
        now = self.clock()
        if self._expired(key, now):
            self._entries[key] = (self.initial, now)
        else:
            delay = self._entries[key][0]
            self._entries[key] = (min(delay * 2, self.maximum), now)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


@dataclass
class Terminated:
    exit_code: int
    reason: str
    started_at: datetime.datetime | None
    finished_at: datetime.datetime
    message: str | None = None
    signal: int | None = None

    def to_json(self, container_id: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
        }
        if self.message:
            out["message"] = self.message
        if self.signal:
            out["signal"] = self.signal
        if container_id:
            out["containerID"] = container_id
        return out


@dataclass
class ContainerView:
    """What the runtime knows about one container of a pod."""

    name: str
    image: str
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy Always
    state: State = "waiting"
    waiting_reason: str = "ContainerCreating"
    waiting_message: str | None = None
    started_at: datetime.datetime | None = None
    terminated: Terminated | None = None  # current state when state == "terminated"
    last: Terminated | None = None  # lastState
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str | None = None
    ever_succeeded: bool = False  # regular init containers: completed once
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        state: dict[str, Any]
        if self.state == "running":
            state = {"running": {"startedAt": rfc3339(self.started_at)}}
        elif self.state == "terminated" and self.terminated is not None:
            state = {"terminated": self.terminated.to_json(self.container_id)}
        else:
            waiting: dict[str, Any] = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            # Images are ignored: every container runs from the node's root filesystem.
            "imageID": "",
            "state": state,
            "lastState": {"terminated": self.last.to_json(None)} if self.last else {},
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def should_restart(restart_policy: str, exit_code: int) -> bool:
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def container_restart_policy(pod_policy: str, view: ContainerView) -> str:
    return "Always" if view.sidecar else pod_policy


Phase = Literal["Pending", "Running", "Succeeded", "Failed"]


def pod_phase(
    restart_policy: str,
    init_done: bool,
    init: Sequence[ContainerView],
    main: Sequence[ContainerView],
) -> Phase:
    """Kubelet's getPhase, for a pod whose sandbox exists."""
    regular_init = [c for c in init if not c.sidecar]
    if not init_done:
        for view in regular_init:
            if (
                view.state == "terminated"
                and view.terminated is not None
                and view.terminated.exit_code != 0
                and restart_policy == "Never"
            ):
                return "Failed"
        return "Pending"
    running = waiting = succeeded = failed = 0
    for view in main:
        if view.state == "running":
            running += 1
        elif view.state == "terminated" and view.terminated is not None:
            if view.terminated.exit_code == 0:
                succeeded += 1
            else:
                failed += 1
        elif view.last is not None:
            # Waiting to restart after an exit: counts as running (CrashLoopBackOff is Running).
            running += 1
        else:
            waiting += 1
    restarting = any(
        v.state == "terminated"
        and v.terminated is not None
        and should_restart(restart_policy, v.terminated.exit_code)
        for v in main
    )
    if waiting > 0:
        return "Pending"
    if running > 0 or restarting:
        return "Running"
    if failed > 0:
        return "Failed"
    return "Succeeded"


def condition(
    previous: Mapping[str, Mapping[str, Any]],
    kind: str,
    status: bool,
    now: datetime.datetime,
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """A pod condition that keeps its lastTransitionTime while its status is unchanged."""
    value = "True" if status else "False"
    before = previous.get(kind)
    since = (
        before.get("lastTransitionTime")
        if before is not None and before.get("status") == value
        else rfc3339(now)
    )
    # reason and message are always present (None deletes them in a strategic merge
    # patch), or a True condition would keep the message of its False past.
    return {
        "type": kind,
        "status": value,
        "lastProbeTime": None,
        "lastTransitionTime": since,
        "reason": reason if reason and not status else None,
        "message": message if message and not status else None,
    }


def pod_conditions(
    previous: Sequence[Mapping[str, Any]],
    *,
    sandbox_ready: bool,
    init_done: bool,
    init: Sequence[ContainerView],
    main: Sequence[ContainerView],
    phase: Phase,
    readiness_gates: Sequence[str],
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The kubelet-owned conditions; PodScheduled and others stay as the API has them."""
    prev = {str(c.get("type")): c for c in previous}
    if init_done:
        init_reason = None
    else:
        pending = [c.name for c in init if not (c.ever_succeeded or (c.sidecar and c.started))]
        init_reason = f"containers with incomplete status: [{' '.join(pending)}]"
    not_ready = [c.name for c in main if not c.ready]
    not_ready += [c.name for c in init if c.sidecar and not c.ready]
    terminal = phase in ("Succeeded", "Failed")
    containers_ready = not not_ready and not terminal
    gates_ok = all(prev.get(gate, {}).get("status") == "True" for gate in readiness_gates)
    ready_message = (
        f"containers with unready status: [{' '.join(not_ready)}]" if not_ready else None
    )
    if terminal:
        ready_reason = "PodCompleted"
    elif not containers_ready:
        ready_reason = "ContainersNotReady"
    else:
        ready_reason = "ReadinessGatesNotReady"
    return [
        condition(prev, "PodReadyToStartContainers", sandbox_ready, now),
        condition(prev, "Initialized", init_done, now, "ContainersNotInitialized", init_reason),
        condition(
            prev,
            "Ready",
            containers_ready and gates_ok,
            now,
            ready_reason,
            ready_message,
        ),
        condition(
            prev,
            "ContainersReady",
            containers_ready,
            now,
            "PodCompleted" if terminal else "ContainersNotReady",
            ready_message,
        ),
    ]
