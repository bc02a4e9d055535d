"""Small helpers around host commands and /proc, shared by the runtime's parts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path


class CommandError(RuntimeError):
    def __init__(self, argv: Sequence[str], code: int, output: str) -> None:
        super().__init__(f"{' '.join(argv)} exited {code}: {output.strip()}")
        self.argv = list(argv)
        self.code = code
        self.output = output


async def run(
    argv: Sequence[str], *, check: bool = True, time_limit: float = 30.0, stdin: bytes | None = None
) -> tuple[int, str]:
    """Run a host command to completion; (exit code, stdout+stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), time_limit)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    code = proc.returncode if proc.returncode is not None else -1
    text = out.decode(errors="replace")
    if check and code != 0:
        raise CommandError(argv, code, text)
    return code, text


def start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def pids_rooted_at(root: Path) -> list[int]:
    """Every process whose root directory is `root` (i.e. chrooted into a sandbox there)."""
    found = []
    wanted = str(root)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "root") == wanted:
                    found.append(int(entry.name))
    return found


def pids_in_mount_ns(inode: str) -> list[int]:
    """Every process in the mount namespace `inode` (as readlink /proc/PID/ns/mnt shows it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == inode:
                    found.append(int(entry.name))
    return found


def kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
