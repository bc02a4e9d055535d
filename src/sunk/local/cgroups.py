"""Per-container cgroups: exact process tracking, and limits where the machine allows.

Each container process is placed, before it execs, into its own cgroup v2
directory below the runtime's own cgroup (`<own>/sunk-<tag>/<pod>/<container>`).
That gives what a PID namespace gives a real runtime: every process the
container ever forked (slurmstepd, job steps, daemons that setsid) is listed
in `cgroup.procs` and dies with one write to `cgroup.kill`.

Limits need the memory and cpu controllers in that subtree. On a pure
cgroup v2 host they are enabled level by level (`cgroup.subtree_control`);
on a hybrid host (v1 memory/cpu hierarchies, v2 only at
/sys/fs/cgroup/unified, as on this workplace's machines) v2 has no such
controllers, and the runtime reports limits as not enforced instead of
reaching into the v1 hierarchies, which belong to whoever manages the host.
Without any cgroup v2 mount, containers are tracked by mount namespace.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shlex
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from sunk.local import ledger as L

_log = logging.getLogger(__name__)
CPU_PERIOD_US = 100_000


def _cgroup2_mount() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


def _own_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return "/"


class Cgroups:
    def __init__(self, base: Path | None, ledger: L.Ledger, limits: bool) -> None:
        self.base = base  # <own cgroup>/sunk-<tag>, None without cgroup v2
        self.ledger = ledger
        self.limits = limits  # memory and cpu controllers usable below base

    @classmethod
    def detect(cls, tag: str, ledger: L.Ledger) -> Cgroups:
        mount = _cgroup2_mount()
        if mount is None:
            _log.warning("no cgroup v2 mount: containers tracked by mount namespace, no limits")
            return cls(None, ledger, limits=False)
        own = mount / _own_cgroup().lstrip("/")
        base = own / f"sunk-{tag}"
        controllers = set((own / "cgroup.controllers").read_text().split())
        limits = {"memory", "cpu"} <= controllers
        cgroups = cls(base, ledger, limits)
        cgroups._make(base)
        if limits:
            limits = cgroups._delegate(own) and cgroups._delegate(base)
            cgroups.limits = limits
        if not limits:
            _log.warning(
                "cgroup v2 at %s has no delegated memory+cpu controllers: "
                "container limits are not enforced",
                mount,
            )
        return cgroups

    def _delegate(self, path: Path) -> bool:
        try:
            (path / "cgroup.subtree_control").write_text("+memory +cpu")
            return True
        except OSError as exc:  # EBUSY: processes in a non-root cgroup ("no internal processes")
            _log.warning("cannot enable memory/cpu controllers in %s: %s", path, exc)
            return False

    def _make(self, path: Path) -> None:
        self.ledger.add(L.CGROUP, str(path))
        path.mkdir(exist_ok=True)

    def prepare(self, pod: str, container: str) -> Path | None:
        """The container's (empty) cgroup, created if needed."""
        if self.base is None:
            return None
        pod_dir = self.base / pod
        self._make(pod_dir)
        if self.limits:
            self._delegate(pod_dir)
        path = pod_dir / container
        self._make(path)
        return path

    @staticmethod
    def wrap(argv: Sequence[str], cgroup: Path | None) -> list[str]:
        """argv that joins `cgroup` first and then execs (same pid, no fork)."""
        if cgroup is None:
            return list(argv)
        procs = shlex.quote(str(cgroup / "cgroup.procs"))
        return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    @staticmethod
    def pids(cgroup: Path) -> list[int]:
        try:
            return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    @classmethod
    def kill(cls, cgroup: Path) -> None:
        """SIGKILL every process in the cgroup (cgroup.kill where the kernel has it)."""
        try:
            (cgroup / "cgroup.kill").write_text("1")
            return
        except FileNotFoundError:
            if not cgroup.exists():
                return
        except OSError:
            pass
        for pid in cls.pids(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def set_limits(self, cgroup: Path | None, cpu_millis: int | None, memory: int | None) -> bool:
        """Apply limits; False when they cannot be enforced here."""
        if cgroup is None or not self.limits:
            return cpu_millis is None and memory is None
        if memory is not None:
            (cgroup / "memory.max").write_text(str(memory))
            with contextlib.suppress(OSError):
                (cgroup / "memory.swap.max").write_text("0")
        if cpu_millis is not None:
            quota = max(1000, cpu_millis * CPU_PERIOD_US // 1000)
            (cgroup / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        return True

    def oom_killed(self, cgroup: Path | None) -> bool:
        if cgroup is None or not self.limits:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in (cgroup / "memory.events").read_text().splitlines():
                key, value = line.split()
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def remove_pod(self, pod: str) -> None:
        if self.base is not None:
            remove_tree(self.base / pod, self.ledger)


def remove_tree(path: Path, ledger: L.Ledger | None = None, timeout: float = 5.0) -> None:
    """Kill what is left in a cgroup subtree and remove its directories, deepest first."""
    if not path.exists():
        if ledger is not None:
            ledger.remove(L.CGROUP, str(path))
        return
    dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    dirs.append(path)
    for directory in dirs:
        Cgroups.kill(directory)
    for directory in dirs:
        deadline = time.monotonic() + timeout
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                # EBUSY until the killed processes are reaped by their parents.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    _log.warning("cannot remove cgroup %s: %s", directory, exc)
                    break
                Cgroups.kill(directory)
                time.sleep(0.02)
        if ledger is not None:
            ledger.remove(L.CGROUP, str(directory))
