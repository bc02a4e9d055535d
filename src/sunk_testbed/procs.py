"""Start, track and stop the test bed's daemons.

Every process the bed starts is recorded in a JSON file in its state directory
with its pid and kernel start time, so that `stop` from another process (a
later `sunk local down`, or a test session after a crash) stops exactly what
was started and never a process that merely reused the pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


class StartError(RuntimeError):
    """A daemon did not come up; the message names it and ends with its log."""


@dataclass(frozen=True)
class Started:
    name: str
    pid: int
    start_time: int
    log: str
    argv: list[str]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Supervisor:
    """The daemons of one test bed, recorded in `<state_dir>/processes.json`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.log_dir = state_dir / "logs"
        self._record = state_dir / "processes.json"
        # Daemons are stopped from several threads at once (a bed's nodes power
        # off together): the record's read-modify-write is one step.
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Started]:
        try:
            raw = json.loads(self._record.read_text())
        except FileNotFoundError:
            return {}
        return {name: Started(**entry) for name, entry in raw.items()}

    def _save(self, procs: Mapping[str, Started]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: asdict(p) for n, p in procs.items()}, indent=1))
        tmp.replace(self._record)

    def running(self, name: str) -> Started | None:
        """The recorded process if it is still the same live process."""
        proc = self._load().get(name)
        if proc is None or _start_time(proc.pid) != proc.start_time or _is_zombie(proc.pid):
            return None
        return proc

    def names(self) -> list[str]:
        return list(self._load())

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Started:
        """Start a foreground daemon in its own session, output to `logs/<name>.log`."""
        if (existing := self.running(name)) is not None:
            return existing
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,  # outlives the CLI that started it; own process group
            )
        start_time = _start_time(popen.pid)
        if start_time is None:
            raise StartError(f"{name} exited at once:\n{tail(log)}")
        started = Started(name, popen.pid, start_time, str(log), list(argv))
        with self._lock:
            procs = self._load()
            procs[name] = started
            self._save(procs)
        return started

    def wait_ready(
        self, name: str, ready: Callable[[], bool], timeout: float = 30.0, what: str = ""
    ) -> None:
        """Wait until `ready()` holds; fail early, with the log, if the daemon died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.running(name) is None:
                log = self.log_dir / f"{name}.log"
                raise StartError(f"{name} exited before it was ready:\n{tail(log)}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.05)
        log = self.log_dir / f"{name}.log"
        raise StartError(f"{name} not ready after {timeout:.0f}s {what}:\n{tail(log)}")

    def stop(self, name: str, grace: float = 10.0) -> None:
        """SIGTERM the daemon's process group, SIGKILL what is left after `grace`."""
        procs = self._load()
        proc = procs.get(name)
        if proc is None:
            return
        if self.running(name) is not None:
            _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(proc.pid):
                time.sleep(0.02)
            if _group_alive(proc.pid):
                _signal_group(proc.pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and _group_alive(proc.pid):
                    time.sleep(0.02)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, os.WNOHANG)
        with self._lock:
            procs = self._load()
            procs.pop(name, None)
            self._save(procs)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop every recorded daemon, newest first."""
        for name in reversed(self.names()):
            self.stop(name, grace)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(_group_members(pgid))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
