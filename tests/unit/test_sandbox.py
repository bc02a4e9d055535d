"""Sandboxes over the cached root filesystem leave nothing behind and write nothing to it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sunk_testbed.sandbox import Bind, Sandbox, ids
from sunk_testbed.slurm_cluster import rootfs_dir

ROOTFS = rootfs_dir("trixie")

pytestmark = pytest.mark.skipif(
    not (ROOTFS / ".complete").exists(), reason="the Slurm root filesystem is not built"
)


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def test_runs_as_the_user_with_hostname_binds_and_env(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root.layer").mkdir()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "file").write_text("from the host\n")
    sandbox = Sandbox(
        ROOTFS,
        tmp_path / "root",
        binds=[Bind(conf, "/etc/sunk-test", read_only=True)],
        hostname="sandboxed",
        user=ids(ROOTFS, "slurm"),
        env={"GREETING": "two words"},
    )
    script = (
        "id -un; hostname; cat /etc/sunk-test/file; echo $GREETING;"
        "touch /etc/sunk-test/new 2>/dev/null || echo read-only;"
        "touch /tmp/scratch && echo writable-layer"
    )
    out = subprocess.run(
        sandbox.argv(["/bin/sh", "-c", script]),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split("\n")
    assert out[:6] == [
        "slurm",
        "sandboxed",
        "from the host",
        "two words",
        "read-only",
        "writable-layer",
    ]


def test_leaves_no_mount_and_does_not_write_the_cache(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root.layer").mkdir()
    before = _mounts()
    marker = "/sunk-sandbox-was-here"
    subprocess.run(
        Sandbox(ROOTFS, tmp_path / "root").argv(["touch", marker]),
        check=True,
        timeout=30,
    )
    assert not (ROOTFS / marker.lstrip("/")).exists()
    assert str(tmp_path) not in _mounts()
    assert _mounts().count("\n") == before.count("\n")


def test_the_pid_is_the_command_itself(tmp_path: Path) -> None:
    """Signals must reach the daemon directly: the exec chain keeps one pid."""
    (tmp_path / "root").mkdir()
    (tmp_path / "root.layer").mkdir()
    proc = subprocess.Popen(Sandbox(ROOTFS, tmp_path / "root").argv(["sleep", "300"]))
    try:
        deadline = 50
        comm = ""
        while deadline and comm != "sleep":
            subprocess.run(["sleep", "0.1"], check=True)
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            deadline -= 1
        assert comm == "sleep"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) != 0
