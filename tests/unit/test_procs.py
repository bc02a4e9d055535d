"""The supervisor stops exactly what it started: whole process groups, never a reused pid."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sunk_testbed.procs import StartError, Supervisor


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_spawn_records_and_stop_kills_the_whole_group(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    # A parent with a child that ignores SIGTERM: the group must still be gone.
    script = "trap '' TERM; sleep 300 & echo $! > child.pid; wait"
    started = sup.spawn("tree", ["/bin/sh", "-c", script], cwd=tmp_path)
    sup.wait_ready("tree", lambda: (tmp_path / "child.pid").exists(), timeout=5)
    child = int((tmp_path / "child.pid").read_text())
    assert sup.running("tree") == started
    assert _alive(child)

    sup.stop("tree", grace=0.5)

    assert not _alive(started.pid)
    assert not _alive(child)
    assert sup.names() == []


def test_spawn_is_idempotent_while_running(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    first = sup.spawn("sleeper", ["sleep", "300"])
    try:
        assert sup.spawn("sleeper", ["sleep", "300"]) == first
    finally:
        sup.stop_all()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    """A record whose start time does not match the live process is not that process."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = {
            "ghost": {
                "name": "ghost",
                "pid": bystander.pid,
                "start_time": 1,  # not the bystander's start time
                "log": str(tmp_path / "ghost.log"),
                "argv": ["sleep", "300"],
            }
        }
        (tmp_path / "processes.json").write_text(json.dumps(record))
        sup = Supervisor(tmp_path)
        assert sup.running("ghost") is None
        sup.stop_all()
        time.sleep(0.1)
        assert bystander.poll() is None
        assert sup.names() == []
    finally:
        bystander.kill()
        bystander.wait()


def test_wait_ready_reports_an_early_exit_with_the_log(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    sup.spawn("broken", ["/bin/sh", "-c", "echo 'fatal: no config' >&2; exit 3"])
    with pytest.raises(StartError, match="no config"):
        sup.wait_ready("broken", lambda: False, timeout=5)
    sup.stop_all()


def test_processes_outlive_the_starting_session(tmp_path: Path) -> None:
    """`sunk local up` returns while its daemons keep running: they have their own session."""
    sup = Supervisor(tmp_path)
    started = sup.spawn("sleeper", ["sleep", "300"])
    try:
        assert os.getsid(started.pid) == started.pid
        assert os.getpgid(started.pid) == started.pid
    finally:
        sup.stop_all()
