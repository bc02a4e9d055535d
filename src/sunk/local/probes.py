"""Probes and lifecycle hooks: exec, TCP and HTTP checks against a running container.

Exec runs the command inside the container's namespaces and root (nsenter
into its main process, then `env -i` with the container's environment), in
the container's cgroup so that a stop kills it too. TCP and HTTP probes
connect from the host to the pod's address, as kubelet does. A probe may
only target the pod network or loopback: a spec naming any other host fails
the probe instead of sending traffic off this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2
from lightkube.models.core_v1 import Container, ExecAction, HTTPGetAction, Probe, TCPSocketAction

from sunk.local.cgroups import Cgroups
from sunk.local.plan import ConfigError, named_port, probe_timing
from sunk.local.system import run

_log = logging.getLogger(__name__)
Result = tuple[bool, str]


@dataclass(frozen=True)
class Target:
    """Where a container's checks go."""

    pid: int  # the container's main process (for exec)
    root: str  # its root directory once it runs in its sandbox
    pod_ip: str
    env: Mapping[str, str]
    user: tuple[int, int] | None
    cgroup: Path | None
    allowed: Callable[[str], bool]  # may traffic go to this address?


def exec_argv(target: Target, command: Sequence[str]) -> list[str]:
    argv = ["nsenter", "-t", str(target.pid), "-m", "-u", "-n", "-r", "-w"]
    if target.user is not None:
        argv += ["-S", str(target.user[0]), "-G", str(target.user[1])]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    env.update(target.env)
    argv += ["--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *command]
    return Cgroups.wrap(argv, target.cgroup)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _entered(target: Target) -> bool:
    try:
        return os.readlink(f"/proc/{target.pid}/root") == target.root
    except OSError:
        return False


async def wait_entered(target: Target, time_limit: float) -> bool:
    """Wait until the container process runs in its sandbox (namespaces and root).

    Right after the spawn its pid is still on the way through nsenter, unshare
    and chroot; entering its namespaces then would land on the host's.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    while not _entered(target):
        if loop.time() > deadline or not _alive(target.pid):
            return False
        await asyncio.sleep(0.005)
    return True


async def run_exec(target: Target, action: ExecAction, time_limit: float) -> Result:
    command = list(action.command or [])
    if not command:
        return False, "exec probe without a command"
    if not await wait_entered(target, time_limit):
        return False, "container is not running"
    try:
        code, out = await run(exec_argv(target, command), check=False, time_limit=time_limit)
    except TimeoutError:
        return False, f"command timed out after {time_limit:g}s"
    return code == 0, out.strip()[-1024:]


def _host_allowed(target: Target, host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"probe host {host!r} is not an address (no DNS on the local runtime)"
    if not target.allowed(host):
        return f"probe host {host} is outside the pod network; refused"
    return None


async def run_tcp(target: Target, action: TCPSocketAction, port: int, time_limit: float) -> Result:
    host = action.host or target.pod_ip
    if refusal := _host_allowed(target, host):
        return False, refusal
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), time_limit)
    except (OSError, TimeoutError) as exc:
        return False, f"dial tcp {host}:{port}: {exc or 'timeout'}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, ""


async def run_http(
    client: httpx2.AsyncClient, target: Target, action: HTTPGetAction, port: int, time_limit: float
) -> Result:
    host = action.host or target.pod_ip
    if refusal := _host_allowed(target, host):
        return False, refusal
    scheme = (action.scheme or "HTTP").lower()
    path = action.path or "/"
    if not path.startswith("/"):
        path = "/" + path
    url = f"{scheme}://{host}:{port}{path}"
    headers = {"User-Agent": "kube-probe/sunk-local"}
    for header in action.httpHeaders or []:
        headers[header.name] = header.value
    try:
        reply = await client.get(url, headers=headers, timeout=time_limit)
    except httpx2.HTTPError as exc:
        return False, f"Get {url}: {exc.__class__.__name__}: {exc}"
    ok = 200 <= reply.status_code < 400
    return ok, f"HTTP probe failed with statuscode: {reply.status_code}" if not ok else ""


class Checker:
    """Runs one probe or hook action of a container."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self.client = client

    async def action(
        self,
        container: Container,
        target: Target,
        exec_: ExecAction | None,
        http: HTTPGetAction | None,
        tcp: TCPSocketAction | None,
        time_limit: float,
    ) -> Result:
        try:
            if exec_ is not None:
                return await run_exec(target, exec_, time_limit)
            if http is not None:
                port = named_port(container, http.port)
                return await run_http(self.client, target, http, port, time_limit)
            if tcp is not None:
                port = named_port(container, tcp.port)
                return await run_tcp(target, tcp, port, time_limit)
        except ConfigError as exc:
            return False, str(exc)
        return False, "unsupported probe handler (exec, httpGet and tcpSocket are)"

    async def probe(self, container: Container, target: Target, probe: Probe) -> Result:
        _, _, time_limit, _, _ = probe_timing(probe)
        return await self.action(
            container, target, probe.exec, probe.httpGet, probe.tcpSocket, time_limit
        )


class ProbeState:
    """Consecutive-result thresholds of one probe."""

    def __init__(self, success_threshold: int, failure_threshold: int, initial: bool) -> None:
        self.success_threshold = success_threshold
        self.failure_threshold = failure_threshold
        self.result = initial
        self._streak = 0
        self._streak_ok = initial

    @property
    def failing(self) -> bool:
        """At least failureThreshold failures in a row."""
        return not self._streak_ok and self._streak >= self.failure_threshold

    def observe(self, ok: bool) -> bool:
        """Record one result; True when the probe's result changed."""
        if ok == self._streak_ok:
            self._streak += 1
        else:
            self._streak_ok, self._streak = ok, 1
        threshold = self.success_threshold if ok else self.failure_threshold
        if self._streak >= threshold and self.result != ok:
            self.result = ok
            return True
        return False


class ProbeLoop:
    """Probes a container every period (after the initial delay) while `gate()` holds."""

    def __init__(
        self,
        kind: str,
        probe: Probe,
        check: Callable[[], Awaitable[Result]],
        on_change: Callable[[ProbeLoop, bool, str], None],
        gate: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kind = kind
        self.probe = probe
        delay, period, _, success, failure = probe_timing(probe)
        if kind != "readiness":
            success = 1  # liveness and startup probes must have successThreshold 1
        self.delay, self.period = delay, period
        self.state = ProbeState(success, failure, initial=kind == "liveness")
        self.check = check
        self.on_change = on_change
        self.gate = gate
        self.last_message = ""

    async def run(self) -> None:
        await asyncio.sleep(self.delay)
        while True:
            if self.gate():
                ok, message = await self.check()
                self.last_message = message
                if not ok:
                    _log.debug("%s probe failed: %s", self.kind, message)
                if self.state.observe(ok) or not ok:
                    self.on_change(self, ok, message)
                if self.kind == "startup" and self.state.result:
                    return  # a startup probe stops once it succeeded
            await asyncio.sleep(self.period)
