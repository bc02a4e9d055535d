"""The local node runtime: N nodes on this machine that really run pods.

`LocalRuntime` owns what its nodes share: the state directory, the ledger of
host objects, the bed's bridge and /16, the cgroup subtree, the /etc/hosts
feed, the local-path provisioner and an admin client for setup. Each
`NodeAgent` then runs with its own identity.

State directory layout (`RuntimeConfig.state_dir`):

    runtime.lock        flock held while a runtime runs here
    ledger.jsonl        every host object, recorded before it is made
    network.json        the bed's /16 and bridge name (reused on restart)
    root/, root.layer/  the sandboxes' (private) mount point
    pods/<ns>_<name>_<uid>/
        etc/            hosts, hostname, resolv.conf (bind-mounted)
        volumes/<name>/ ConfigMap, Secret, projected, emptyDir volumes
        logs/<container>/<restart>.log
    volumes/pvc-<uid>/  provisioned PersistentVolumes (kept across restarts)

`cleanup(state_dir)` removes everything the ledger (or the bed's naming)
says may exist: processes rooted in the sandboxes, cgroups, network
namespaces, veths, the bridge, and the /run/netns mount if we made it. It
runs before every start and after every stop, so a crashed runtime's
leftovers go at the next start, or with `sunk local nodes --clean`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.resources.storage_v1 import StorageClass

from sunk.local import ledger as L
from sunk.local.apiproxy import SERVICE_NAMES, ApiRelay
from sunk.local.cgroups import Cgroups, remove_tree
from sunk.local.hosts import HostsFeed
from sunk.local.net import (
    Network,
    Subnet,
    bed_tag,
    is_mount_point,
    link_names,
    netns_names,
)
from sunk.local.node import NodeAgent, NodeConfig
from sunk.local.plan import ConfigError
from sunk.local.port import LEASE_NAMESPACE, KubeNodeApi, NodeApi, build
from sunk.local.probes import Checker
from sunk.local.provisioner import IDENTITY as PROVISIONER_IDENTITY
from sunk.local.provisioner import RBAC, Provisioner, storage_class
from sunk.local.system import kill_pids, pids_rooted_at
from sunk.testbed.kube import KUBERNETES_VERSION, async_client

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    state_dir: Path
    rootfs: Path
    nodes: Sequence[NodeConfig]
    backoff_initial: float = 10.0  # kubelet's CrashLoopBackOff: 10 s doubling ...
    backoff_max: float = 300.0  # ... up to 5 min
    volume_refresh: float = 10.0  # ConfigMap/Secret volumes re-read at least this often
    lease_duration: int = 40
    renew_interval: float = 2.0  # Lease renewals; must stay well under the grace period
    status_interval: float = 60.0  # full node status posts between lease renewals
    kubernetes_version: str = KUBERNETES_VERSION
    default_storage_class: bool = False
    stop_grace: float = 5.0  # SIGTERM -> SIGKILL when the runtime itself stops


class Identities(Protocol):
    """Where node and component credentials come from."""

    admin_kubeconfig: Path

    def issue(self, name: str, user: str, groups: Sequence[str]) -> Path: ...


class ControlPlaneIdentities:
    """Client certificates minted by the test bed's control plane CA."""

    def __init__(self, control_plane: Any, admin_kubeconfig: Path) -> None:
        self.control_plane = control_plane  # sunk.testbed.kube.KubeControlPlane
        self.admin_kubeconfig = admin_kubeconfig

    def issue(self, name: str, user: str, groups: Sequence[str]) -> Path:
        path: Path = self.control_plane.issue_kubeconfig(name, user, groups)
        return path


@dataclass
class Env:
    """What nodes and pod workers share."""

    config: RuntimeConfig
    rootfs: Path
    mountpoint: Path
    pods_dir: Path
    volumes_dir: Path
    network: Network
    subnet: Subnet
    cgroups: Cgroups
    hosts: HostsFeed
    checker: Checker
    ledger: L.Ledger
    admin: AsyncClient | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def allowed_address(self, address: str) -> bool:
        """May probes send traffic there? Only the bed's pod network and loopback."""
        try:
            if ipaddress.ip_address(address).is_loopback:
                return True
        except ValueError:
            return False
        return self.subnet.contains(address)

    async def label_node(self, name: str, labels: dict[str, str]) -> None:
        if self.admin is None:
            _log.warning("node %s: labels %s need an admin identity; not set", name, labels)
            return
        await self.admin.patch(Node, name, {"metadata": {"labels": labels}})

    def ensure_volume_dir(self, path: Path) -> Path:
        if path.parent == self.volumes_dir:
            path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise ConfigError(f"volume path {path} does not exist", reason="FailedMount")
        return path


class LocalRuntime:
    def __init__(self, config: RuntimeConfig, identities: Identities) -> None:
        self.config = config
        self.identities = identities
        self.state_dir = config.state_dir
        self.tag = bed_tag(config.state_dir)
        self.nodes: dict[str, NodeAgent] = {}
        self._lock: IO[str] | None = None
        self._env: Env | None = None
        self._provisioner: Provisioner | None = None
        self._http: httpx2.AsyncClient | None = None
        self._relay: ApiRelay | None = None

    @property
    def env(self) -> Env:
        if self._env is None:
            raise RuntimeError("the runtime is not started")
        return self._env

    @property
    def gateway(self) -> str:
        """The bridge's host address: where pods reach daemons of this machine."""
        return self.env.subnet.gateway

    @property
    def subnet(self) -> Subnet:
        return self.env.subnet

    def node(self, name: str) -> NodeAgent:
        return self.nodes[name]

    def container_pids(self, namespace: str, pod: str, container: str) -> list[int]:
        """Processes of a running container of a pod on any of our nodes (tests, debugging)."""
        for node in self.nodes.values():
            for worker in node.workers.values():
                if worker.namespace == namespace and worker.name == pod:
                    return worker.container_pids(container)
        return []

    def pods_dir(self) -> Path:
        return self.state_dir / "pods"

    # ----------------------------------------------------------------- start

    async def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _acquire(self.state_dir / "runtime.lock")
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        await asyncio.to_thread(cleanup, self.state_dir)
        ledger = L.Ledger(self.state_dir / "ledger.jsonl")
        mountpoint = self.state_dir / "root"
        _prepare_dirs(self.state_dir, mountpoint)
        ledger.add(L.PROCESS_ROOT, str(mountpoint))
        network = Network(self.tag, self.state_dir, ledger)
        subnet = await network.up()
        cgroups = Cgroups.detect(self.tag, ledger)
        admin = async_client(self.identities.admin_kubeconfig, field_manager="sunk-local")
        proxy_config = await asyncio.to_thread(
            self.identities.issue, "sunk-local-proxy", "system:kube-proxy", ()
        )
        hosts = HostsFeed(async_client(proxy_config, field_manager="sunk-local"))
        # Probes and HTTP hooks go to pod addresses only; never through a proxy.
        self._http = httpx2.AsyncClient(verify=False, trust_env=False, follow_redirects=False)
        env = Env(
            config=self.config,
            rootfs=self.config.rootfs,
            mountpoint=mountpoint,
            pods_dir=self.state_dir / "pods",
            volumes_dir=self.state_dir / "volumes",
            network=network,
            subnet=subnet,
            cgroups=cgroups,
            hosts=hosts,
            checker=Checker(self._http),
            ledger=ledger,
            admin=admin,
        )
        self._env = env
        await self._setup_cluster(admin)
        server = admin.config.cluster.server
        self._relay = ApiRelay(subnet.gateway, server)
        await self._relay.start()
        hosts.static = [(subnet.gateway, SERVICE_NAMES)]
        hosts.start()
        provisioner_config = await asyncio.to_thread(
            self.identities.issue, PROVISIONER_IDENTITY, PROVISIONER_IDENTITY, ()
        )
        self._provisioner = Provisioner(
            async_client(provisioner_config, field_manager=PROVISIONER_IDENTITY),
            env.volumes_dir,
            {n.name for n in self.config.nodes},
        )
        self._provisioner.start()
        for index, node_config in enumerate(self.config.nodes, start=1):
            kubeconfig = await asyncio.to_thread(
                self.identities.issue,
                f"node-{node_config.name}",
                f"system:node:{node_config.name}",
                ["system:nodes"],
            )
            self.nodes[node_config.name] = NodeAgent(
                env,
                node_config,
                index,
                _api_factory(kubeconfig, node_config.name),
            )
        await asyncio.gather(*(node.start() for node in self.nodes.values()))
        _log.info(
            "local runtime up: %d nodes, pod network %s, gateway %s",
            len(self.nodes),
            subnet.network,
            subnet.gateway,
        )

    async def _setup_cluster(self, admin: AsyncClient) -> None:
        """What an installer would apply once: the provisioner's RBAC and StorageClass."""
        for body in RBAC:
            kind = ClusterRole if body["kind"] == "ClusterRole" else ClusterRoleBinding
            await admin.apply(build(kind, body), force=True)
        await admin.apply(
            build(StorageClass, storage_class(self.config.default_storage_class)), force=True
        )

    # ------------------------------------------------------------- nodes

    async def stop_node(self, name: str, grace: float = 0.0) -> None:
        await self.nodes[name].stop(grace)

    async def start_node(self, name: str) -> None:
        await self.nodes[name].start()

    # ------------------------------------------------------------------ stop

    async def stop(self, delete_nodes: bool = False) -> None:
        """Stop every node and remove every host object; idempotent."""
        grace = self.config.stop_grace
        await asyncio.gather(
            *(node.stop(grace) for node in self.nodes.values()), return_exceptions=True
        )
        env = self._env
        if self._relay is not None:
            await self._relay.stop()
            self._relay = None
        if env is not None:
            await env.hosts.stop()
            if self._provisioner is not None:
                await self._provisioner.stop()
                self._provisioner = None
            if delete_nodes and env.admin is not None:
                for name in self.nodes:
                    with contextlib.suppress(ApiError, httpx2.HTTPError):
                        await env.admin.delete(Node, name)
                    with contextlib.suppress(ApiError, httpx2.HTTPError):
                        await env.admin.delete(Lease, name, namespace=LEASE_NAMESPACE)
            if env.admin is not None:
                await env.admin.close()
            await env.network.down()
            env.ledger.close()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        # What is left after an orderly stop (the cgroup base, /run/netns) is routine.
        await asyncio.to_thread(cleanup, self.state_dir, logging.DEBUG)
        self._env = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _api_factory(kubeconfig: Path, name: str) -> Callable[[], NodeApi]:
    return lambda: KubeNodeApi(kubeconfig, name)


def _acquire(path: Path) -> IO[str]:
    handle = path.open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"another local runtime runs on {path.parent}") from None
    return handle


def _prepare_dirs(state_dir: Path, mountpoint: Path) -> None:
    shutil.rmtree(state_dir / "pods", ignore_errors=True)  # logs of an earlier run
    (state_dir / "pods").mkdir(parents=True)
    (state_dir / "volumes").mkdir(exist_ok=True)
    mountpoint.mkdir(exist_ok=True)
    Path(f"{mountpoint}.layer").mkdir(exist_ok=True)


def running_elsewhere(state_dir: Path) -> bool:
    """Does a live runtime hold this state directory?"""
    path = state_dir / "runtime.lock"
    if not path.exists():
        return False
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def cleanup(state_dir: Path, level: int = logging.INFO) -> list[str]:
    """Remove every host object a runtime on `state_dir` may have left; what was removed.

    Safe to run at any time no runtime holds the state directory, any number
    of times. Order matters: processes first (they keep namespaces alive),
    then cgroups, namespaces, links, the bridge, and the /run/netns mount.
    """
    removed: list[str] = []
    if not state_dir.exists():
        return removed
    ledger = L.Ledger(state_dir / "ledger.jsonl")
    tag = bed_tag(state_dir)
    try:
        roots = {name for name, _ in ledger.entries(L.PROCESS_ROOT)} | {str(state_dir / "root")}
        for root in roots:
            deadline = time.monotonic() + 10
            while (pids := pids_rooted_at(Path(root))) and time.monotonic() < deadline:
                kill_pids(pids)
                removed += [f"process {p}" for p in pids]
                time.sleep(0.05)
            ledger.remove(L.PROCESS_ROOT, root)
        cgroup_dirs = sorted(
            (Path(name) for name, _ in ledger.entries(L.CGROUP)), key=lambda p: -len(p.parts)
        )
        for directory in cgroup_dirs:
            if directory.exists():
                removed.append(f"cgroup {directory}")
            remove_tree(directory, ledger)
        netns = {name for name, _ in ledger.entries(L.NETNS)} | set(netns_names(f"sk-{tag}-"))
        for name in sorted(netns):
            if Path("/run/netns", name).exists():
                subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
                removed.append(f"netns {name}")
            ledger.remove(L.NETNS, name)
        links = {name for name, _ in ledger.entries(L.LINK)} | {
            name for name, _ in ledger.entries(L.BRIDGE)
        }
        links |= set(link_names(f"sk{tag}"))
        for name in sorted(links):
            if Path("/sys/class/net", name).exists():
                subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
                removed.append(f"link {name}")
            ledger.remove(L.LINK, name)
            ledger.remove(L.BRIDGE, name)
        for name, _ in list(ledger.entries(L.NETNS_MOUNT)):
            # Only if no namespace (of any bed) is left in it.
            if is_mount_point(name) and not os.listdir(name):
                subprocess.run(["umount", name], capture_output=True, check=False)
                removed.append(f"mount {name}")
            if not is_mount_point(name) or not os.listdir(name):
                ledger.remove(L.NETNS_MOUNT, name)
        ledger.compact()
    finally:
        ledger.close()
    if removed:
        _log.log(level, "cleaned up %d leftovers in %s: %s", len(removed), state_dir, removed)
    return removed
