"""Where container output lives, and how `sunk local logs` finds it.

Like kubelet's /var/log/pods: `<runtime state>/pods/<ns>_<pod>_<uid>/logs/
<container>/<restart count>.log`, one file per container instance, written by
the container itself (stdout and stderr together, no timestamps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class LogNotFound(LookupError):
    pass


@dataclass(frozen=True)
class LogFile:
    pod_dir: Path
    container: str
    path: Path
    defaulted_from: list[str]  # the containers there were, when none was named


def _pod_dir(pods_dir: Path, namespace: str, pod: str) -> Path:
    candidates = [
        d
        for d in pods_dir.glob(f"{namespace}_{pod}_*")
        if d.is_dir() and d.name.rsplit("_", 1)[0] == f"{namespace}_{pod}"
    ]
    if not candidates:
        raise LogNotFound(f'pod "{pod}" not found in namespace "{namespace}" on the local nodes')
    return max(candidates, key=lambda d: d.stat().st_mtime)  # the newest pod of that name


def write_containers(pod_dir: Path, init: list[str], app: list[str]) -> None:
    """Record the pod's container names for `sunk local logs` (which has no API access)."""
    (pod_dir / "containers.json").write_text(
        json.dumps({"initContainers": init, "containers": app})
    )


def find_log(
    pods_dir: Path, namespace: str, pod: str, container: str | None = None, previous: bool = False
) -> LogFile:
    pod_dir = _pod_dir(pods_dir, namespace, pod)
    logs = pod_dir / "logs"
    try:
        spec = json.loads((pod_dir / "containers.json").read_text())
    except (OSError, ValueError):
        spec = {"initContainers": [], "containers": []}
    names = [*spec["initContainers"], *spec["containers"]]
    defaulted: list[str] = []
    if container is None:
        if not spec["containers"]:
            raise LogNotFound(f'pod "{pod}" has no containers')
        container = spec["containers"][0]  # kubectl's default: the first app container
        defaulted = names if len(names) > 1 else []
    directory = logs / container
    instances = sorted(
        (f for f in directory.glob("*.log") if f.stem.isdigit()), key=lambda f: int(f.stem)
    )
    if not instances:
        raise LogNotFound(
            f'container "{container}" in pod "{pod}" has no log'
            + (f" (containers: {', '.join(names)})" if names else "")
        )
    if previous:
        if len(instances) < 2:
            raise LogNotFound(
                f'previous terminated container "{container}" in pod "{pod}" not found'
            )
        return LogFile(pod_dir, container, instances[-2], defaulted)
    return LogFile(pod_dir, container, instances[-1], defaulted)
