"""A plain user's shell on a slurm release's login pod, over ssh: how the
chart tests do what a researcher does."""

from __future__ import annotations

import asyncio
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient

from sunk_testbed import charts


@dataclass
class LoginShell:
    kube: AsyncClient
    namespace: str
    release: str
    key: Path
    user: str

    async def login_address(self) -> str:
        return await charts.wait_until(
            "a ready login pod",
            lambda: charts.pod_ip(
                self.kube, self.namespace, charts.component(self.release, "login")
            ),
            120,
        )

    async def ssh(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` in a login shell of the plain user on the login pod."""
        address = await self.login_address()
        argv = charts.ssh_argv(self.key, self.user, address, [command])
        proc = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=120, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{command!r} failed ({proc.returncode}): {proc.stderr}")
        return proc

    async def poll_ssh(self, what: str, command: str, pattern: str, timeout: float) -> str:
        """Run `command` every second until its output matches `pattern`; that output."""
        last: list[str] = []

        async def matches() -> str | None:
            proc = await self.ssh(command, check=False)
            last[:] = [f"rc {proc.returncode}: {proc.stdout}{proc.stderr}"]
            return proc.stdout if re.search(pattern, proc.stdout) else None

        try:
            out: str = await charts.wait_until(what, matches, timeout, interval=1)
        except TimeoutError as late:
            raise TimeoutError(f"{late}; last {command!r}: {''.join(last)[-1500:]}") from None
        return out
