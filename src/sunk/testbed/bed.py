"""One local cluster: the Kubernetes control plane, local nodes and both charts.

`sunk local up` goes through `Bed`: it builds or reuses the caches, starts the
control plane, runs the local node runtime (`sunk local nodes`) as a daemon,
installs the sunk-cluster and slurm charts with the real helm, starts sunk's
operator, syncer and scheduler on the host (as the chart's ServiceAccounts; the root
filesystem has no Python), and waits until a user on the login pod sees every
compute node idle in `sinfo`. Every daemon is recorded by the Supervisor, so
`down` stops exactly what `up` started.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from sunk.kube.client import kube_client
from sunk.testbed import charts
from sunk.testbed.helm import Helm, ensure_helm
from sunk.testbed.kube import KubeAccess, KubeControlPlane, ensure_binaries
from sunk.testbed.procs import Supervisor
from sunk.testbed.slurm import ensure_rootfs

Log = Callable[[str], None]

NAMESPACE = "slurm"
RELEASE = "slurm"
CLUSTER_RELEASE = "sunk"
# The one login user of the local cluster; `sunk local ssh` logs in as it.
USER_NAME = "researcher"
USER_UID = 2000
NODE_PREFIX = "local-"
# The host processes `up` starts besides the control plane, in start order.
NODES_DAEMON = "local-nodes"
COMPONENTS = ("operator", "syncer", "scheduler")
# slurm.conf KillWait, told to the scheduler: a pod's default 30 s grace period
# fits (the scheduler refuses pods whose grace exceeds KillWait minus 1 s).
KILL_WAIT = 32


@dataclass(frozen=True)
class Prepared:
    """Where the cached parts are, and what it took to get them."""

    kube_bin: Path
    rootfs: Path
    helm: Path
    seconds: float
    cold: bool  # True when anything had to be built or downloaded


@dataclass(frozen=True)
class BedAccess:
    kube: KubeAccess
    login_address: str
    ssh_key: Path
    user: str
    nodes: list[str]


class Bed:
    def __init__(self, state_dir: Path, *, nodes: int = 3) -> None:
        self.state_dir = state_dir
        self.supervisor = Supervisor(state_dir)
        self.node_count = nodes
        self.files = state_dir / "cluster"

    def prepare(self, log: Log = print) -> Prepared:
        """Build or reuse the cached binaries, root filesystem and helm."""
        started = time.monotonic()
        cold = False

        def note(message: str) -> None:
            nonlocal cold
            cold = True
            log(message)

        kube_bin = ensure_binaries(note)
        rootfs = ensure_rootfs("trixie", note)
        helm = ensure_helm(note)
        return Prepared(kube_bin, rootfs, helm, time.monotonic() - started, cold)

    def kube(self, log: Log = print) -> KubeControlPlane:
        return KubeControlPlane(self.state_dir, self.supervisor, log=log)

    def node_names(self) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(1, self.node_count + 1)]

    def up(self, log: Log = print) -> BedAccess:
        """Start everything that is not running yet and wait until Slurm is usable; idempotent."""
        t0 = time.monotonic()
        prepared = self.prepare(log)
        log(f"caches ready in {time.monotonic() - t0:.1f}s")
        t1 = time.monotonic()
        kube = self.kube(log).start()
        log(f"kubernetes control plane ready in {time.monotonic() - t1:.1f}s: {kube.server}")
        self.files.mkdir(parents=True, exist_ok=True)
        self.supervisor.spawn(
            NODES_DAEMON,
            [
                *_sunk(),
                "local",
                "nodes",
                "--state",
                str(self.state_dir),
                "--count",
                str(self.node_count),
                "--prefix",
                NODE_PREFIX,
                "--label",
                f"{charts.NODE_POOL_LABEL}={charts.COMPUTE_POOL}",
            ],
        )
        access = asyncio.run(self._install(kube, prepared.helm, log))
        self._write_summary(access)
        return access

    async def _install(self, kube: KubeAccess, helm_binary: Path, log: Log) -> BedAccess:
        client = kube_client(kube.admin_kubeconfig, "sunk-local")
        try:
            return await self._install_with(client, kube, helm_binary, log)
        finally:
            await client.close()

    async def _install_with(
        self, client: AsyncClient, kube: KubeAccess, helm_binary: Path, log: Log
    ) -> BedAccess:
        t0 = time.monotonic()
        names = self.node_names()
        await charts.wait_until("the local nodes Ready", lambda: _nodes_ready(client, names), 120)
        log(f"{len(names)} local nodes Ready in {time.monotonic() - t0:.1f}s: {', '.join(names)}")

        t1 = time.monotonic()
        key = self.files / "id_ed25519"
        user = charts.User(USER_NAME, USER_UID, charts.new_ssh_key(key))
        charts.make_homes(self.files / "home", [user])
        helm = Helm(helm_binary, kube.admin_kubeconfig, self.files / "helm")
        await asyncio.to_thread(
            helm.upgrade_install,
            CLUSTER_RELEASE,
            "sunk-cluster",
            NAMESPACE,
            charts.cluster_values(RELEASE),
            values_file=self.files / "sunk-values.yaml",
        )
        values = charts.slurm_values(
            users=[user], home=self.files / "home", slurm_config={"KillWait": KILL_WAIT}
        )
        await asyncio.to_thread(
            helm.upgrade_install,
            RELEASE,
            "slurm",
            NAMESPACE,
            values,
            values_file=self.files / "slurm-values.yaml",
        )
        log(f"charts installed in {time.monotonic() - t1:.1f}s (helm releases sunk, slurm)")

        t2 = time.monotonic()
        restd = await charts.wait_until(
            "slurmrestd Ready",
            lambda: charts.pod_ip(client, NAMESPACE, charts.component(RELEASE, "slurmrestd")),
            300,
        )
        log(f"slurmctld, slurmdbd, slurmrestd up in {time.monotonic() - t2:.1f}s")
        await self._start_components(client, kube, f"http://{restd}:{charts.RESTAPI_PORT}")

        t3 = time.monotonic()
        login = await charts.wait_until(
            "the login pod Ready",
            lambda: charts.pod_ip(client, NAMESPACE, charts.component(RELEASE, "login")),
            300,
        )
        nodes = [f"compute-{name}" for name in names]
        await charts.wait_until(
            "every compute node idle in sinfo",
            lambda: asyncio.to_thread(self._all_idle, key, login, nodes),
            300,
            interval=1,
        )
        log(f"{len(nodes)} compute nodes idle in Slurm in {time.monotonic() - t3:.1f}s")
        t4 = time.monotonic()
        await charts.wait_until(
            "accounting (sacct) answering",
            lambda: asyncio.to_thread(self._accounting_up, key, login),
            300,
            interval=1,
        )
        log(f"accounting answers sacct in {time.monotonic() - t4:.1f}s")
        return BedAccess(kube, login, key, USER_NAME, nodes)

    async def _start_components(self, client: AsyncClient, kube: KubeAccess, restd: str) -> None:
        """sunk operator, syncer and scheduler on the host, each as its chart ServiceAccount."""
        jwt = await charts.secret_file(
            client, NAMESPACE, f"{RELEASE}-jwt", "jwt_hs256.key", self.files / "jwt_hs256.key"
        )
        for name in COMPONENTS:
            account = f"{CLUSTER_RELEASE}-{name}"
            kubeconfig = await charts.service_account_kubeconfig(
                client,
                kube.server,
                kube.ca_file,
                NAMESPACE,
                account,
                self.files / f"{account}.kubeconfig",
            )
            argv = [
                *_sunk(),
                name,
                "--slurmrestd",
                restd,
                "--jwt-key",
                str(jwt),
                "--kubeconfig",
                str(kubeconfig),
                # The scheduler places pods of every namespace; the Slurm one holds slurmd pods.
                "--slurmd-namespace" if name == "scheduler" else "--namespace",
                NAMESPACE,
                "--lease-namespace",
                NAMESPACE,
            ]
            if name in ("syncer", "scheduler"):
                argv += ["--metrics-port", "0"]  # three components on one host
            if name == "scheduler":
                argv += ["--kill-wait", str(KILL_WAIT)]
            # A new slurmrestd address (or token) after a re-run: restart.
            self.supervisor.stop(name)
            self.supervisor.spawn(name, argv)

    def _all_idle(self, key: Path, login: str, nodes: Sequence[str]) -> bool:
        proc = self.ssh(key, login, ["sinfo -h -N -o '%N %t'"], timeout=30)
        states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in nodes)

    def _accounting_up(self, key: Path, login: str) -> bool:
        return self.ssh(key, login, ["sacct -n -X"], timeout=30).returncode == 0

    def ssh(
        self, key: Path, login: str, command: Sequence[str], *, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            charts.ssh_argv(key, USER_NAME, login, command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def login_address(self) -> str:
        """The login pod's current address (it changes when the pod is replaced)."""
        kube = self.kube().access()
        if kube is None:
            raise RuntimeError(f"no running control plane in {self.state_dir}: `sunk local up`")

        async def find() -> str | None:
            client = kube_client(kube.admin_kubeconfig, "sunk-local")
            try:
                return await charts.pod_ip(client, NAMESPACE, charts.component(RELEASE, "login"))
            finally:
                await client.close()

        address = asyncio.run(find())
        if address is None:
            raise RuntimeError("the login pod is not ready (see `sunk local status`)")
        return address

    def ssh_key(self) -> Path:
        return self.files / "id_ed25519"

    def down(self) -> None:
        """Stop what this bed started, and nothing else; idempotent.

        sunk's components first, then the nodes (whose runtime stops every
        pod's processes and removes its network namespaces and mounts), then
        the control plane; no build is ever triggered here.
        """
        for name in COMPONENTS:
            self.supervisor.stop(name)
        self.supervisor.stop(NODES_DAEMON, grace=60)
        self.supervisor.stop_all()

    def status(self) -> dict[str, bool]:
        """Each recorded daemon and whether it still runs."""
        return {n: self.supervisor.running(n) is not None for n in self.supervisor.names()}

    def _write_summary(self, access: BedAccess) -> None:
        summary: dict[str, Any] = {
            "kubernetes": {
                "server": access.kube.server,
                "kubeconfig": str(access.kube.admin_kubeconfig),
            },
            "slurm": {
                "namespace": NAMESPACE,
                "releases": [CLUSTER_RELEASE, RELEASE],
                "login": access.login_address,
                "user": access.user,
                "ssh_key": str(access.ssh_key),
                "nodes": access.nodes,
            },
        }
        (self.state_dir / "bed.json").write_text(json.dumps(summary, indent=2))


def _sunk() -> list[str]:
    """The sunk CLI of this Python, for the daemons `up` starts."""
    return [sys.executable, "-m", "sunk"]


async def _nodes_ready(client: AsyncClient, names: Sequence[str]) -> bool:
    ready = set()
    async for node in client.list(Node):
        conditions = (node.status.conditions if node.status else None) or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            ready.add(node.metadata.name if node.metadata else "")
    return set(names) <= ready
