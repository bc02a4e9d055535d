"""One container process: spawned into its cgroup, watched through a pidfd, stopped for good.

The sandbox's command line keeps one pid from `unshare` to the container's
command (see sunk.testbed.sandbox), so the pid we start is the container's
main process: SIGTERM reaches it directly. Its exit is noticed through a
pidfd registered with the event loop (no thread per child), and its status
is collected with Popen.poll.

A real runtime gives each container a PID namespace, so when the main
process exits every other process of the container dies with it. Here the
container's cgroup plays that part: `kill_rest` empties it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from sunk.local.cgroups import Cgroups
from sunk.local.system import kill_pids, pids_in_mount_ns


class ContainerProcess:
    def __init__(self, popen: subprocess.Popen[bytes], cgroup: Path | None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.cgroup = cgroup
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()
        self._mount_ns: str | None = None  # for tracking without cgroup v2
        self._host_mount_ns = os.readlink("/proc/self/ns/mnt")
        self._pidfd = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    @classmethod
    def spawn(cls, argv: Sequence[str], log: Path, cgroup: Path | None) -> ContainerProcess:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(
                Cgroups.wrap(argv, cgroup),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # never in the runtime's own process group
            )
        return cls(popen, cgroup)

    def _on_exit(self) -> None:
        code = self.popen.poll()
        if code is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        if not self.exited.done():
            self.exited.set_result(code)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def note_mount_ns(self) -> None:
        """Remember the container's mount namespace once it has its own (fallback tracking)."""
        if self._mount_ns is None and self.running:
            with contextlib.suppress(OSError):
                ns = os.readlink(f"/proc/{self.pid}/ns/mnt")
                if ns != self._host_mount_ns:
                    self._mount_ns = ns

    def signal(self, sig: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill_rest(self) -> None:
        """SIGKILL every process of the container, the main one included."""
        self.note_mount_ns()
        self.signal(signal.SIGKILL)
        if self.cgroup is not None:
            Cgroups.kill(self.cgroup)
        elif self._mount_ns is not None:
            kill_pids(pids_in_mount_ns(self._mount_ns))

    def leftovers(self) -> list[int]:
        if self.cgroup is not None:
            return Cgroups.pids(self.cgroup)
        if self._mount_ns is not None:
            return pids_in_mount_ns(self._mount_ns)
        return [self.pid] if self.running else []

    async def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL for everything left at the deadline; the exit status."""
        if self.running:
            self.note_mount_ns()
            self.signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), grace)
        code = await self.finish()
        return code

    async def finish(self) -> int:
        """Make sure nothing of the container runs any more; the main process's status."""
        for _ in range(250):
            self.kill_rest()
            if self.exited.done() and not self.leftovers():
                break
            await asyncio.sleep(0.02)
        return await self.exited


def exit_code(returncode: int) -> tuple[int, int | None]:
    """(exit code as a runtime reports it, signal): 128+N for death by signal N."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None
