"""Real Kubernetes nodes for the test bed: a kubelet and a containerd per node.

Every node of a bed runs in the bed's room (`sunk_testbed.room`: a network
and mount namespace with one bridge, kube-proxy and cluster DNS). What each
node owns (directories, sockets, cgroup root, address range) comes from
`sunk_testbed.nodeconf`. Every daemon is recorded by the Supervisor; `stop`
removes the node's pods through CRI, then kills what is left in its cgroups,
unmounts what is mounted below its directory and removes its cgroups, so
nothing stays behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sunk_testbed import nodeconf
from sunk_testbed.charts import wait_until
from sunk_testbed.control_plane import (
    KUBERNETES_VERSION,
    KubeAccess,
    KubeControlPlane,
    ensure_built,
    file_lock,
)
from sunk_testbed.nodeconf import NodePaths, Subnet
from sunk_testbed.paths import SCRIPTS, cache_dir
from sunk_testbed.procs import StartError, Supervisor, tail
from sunk_testbed.room import (
    MachineRoom,
    install_cluster_dns,
    kube_port,
    node_environment,
    publish_apiserver,
    room_kubeconfig,
    sh,
)

Log = Callable[[str], None]

CONTAINERD_VERSION = "v2.2.1"
CRICTL_VERSION = "v1.36.0"
COREDNS_VERSION = "v1.14.7"
KWOK_VERSION = "v0.8.0"
# Bumped whenever testbed/nodes/build.sh changes what it produces.
NODE_BUILD_REVISION = 1

# Debian's runc and CNI plugins (scripts/bootstrap.sh installs them).
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"


def node_binaries_dir() -> Path:
    name = (
        f"{KUBERNETES_VERSION}-containerd-{CONTAINERD_VERSION}-coredns-{COREDNS_VERSION}"
        f"-r{NODE_BUILD_REVISION}"
    )
    return cache_dir() / "nodes" / name


def ensure_node_binaries(log: Log) -> Path:
    """Build kubelet, kube-proxy, containerd, crictl, CoreDNS and KWOK unless cached."""
    out = node_binaries_dir()
    script = [
        str(SCRIPTS / "nodes" / "build.sh"),
        str(out),
        KUBERNETES_VERSION,
        CONTAINERD_VERSION,
        CRICTL_VERSION,
        COREDNS_VERSION,
        KWOK_VERSION,
    ]
    what = f"the node binaries (kubelet, containerd {CONTAINERD_VERSION}, CoreDNS, KWOK)"
    return ensure_built(out, script, what, log)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[str] = ()  # kubelet's --register-with-taints form: key=value:Effect


class KubeletNodes:
    """A group of real nodes in a bed's room; several groups may share a room."""

    def __init__(
        self,
        state_dir: Path,
        supervisor: Supervisor,
        control_plane: KubeControlPlane,
        room: MachineRoom,
    ) -> None:
        self.dir = state_dir / "nodes"
        self.supervisor = supervisor
        self.control_plane = control_plane
        self.room = room
        self._indices = room.dir / "node-indices.json"

    def paths(self, name: str) -> NodePaths:
        return NodePaths(self.dir / name)

    def _index(self, name: str) -> int:
        """The node's slot in the room (address and pod range), kept across restarts."""
        with file_lock(self._indices.with_suffix(".lock")):
            try:
                taken: dict[str, int] = json.loads(self._indices.read_text())
            except FileNotFoundError:
                taken = {}
            if name not in taken:
                free = sorted(set(range(1, nodeconf.MAX_NODES + 1)) - set(taken.values()))
                if not free:
                    raise RuntimeError(f"no free node slot in {self.room.netns}")
                taken[name] = free[0]
                self._indices.write_text(json.dumps(taken))
            return taken[name]

    def start(
        self, nodes: Sequence[NodeSpec], bin_dir: Path, *, registry: str, sandbox_image: str
    ) -> list[str]:
        """Start each node's containerd and kubelet unless running; idempotent.
        Images come from `registry` (host:port). Returns the nodes whose kubelet
        it started. Readiness is the caller's."""
        subnet = self.room.subnet()
        # Shared, so that CSI node plugins' Bidirectional mounts (below each
        # node's kubelet root) work here as on a real host (sunk_testbed.storage).
        self.room.share(self.dir)
        indices = {spec.name: self._index(spec.name) for spec in nodes}
        for spec in nodes:
            self._start_containerd(
                spec.name, indices[spec.name], bin_dir, subnet, registry, sandbox_image
            )
        return [
            spec.name
            for spec in nodes
            if self._start_kubelet(spec, subnet.node_address(indices[spec.name]), bin_dir, subnet)
        ]

    def _start_containerd(
        self,
        name: str,
        index: int,
        bin_dir: Path,
        subnet: Subnet,
        registry: str,
        sandbox_image: str,
    ) -> None:
        paths = self.paths(name)
        for directory in (paths.cni_conf_dir, paths.cni_ipam_dir, paths.pod_logs, paths.cdi_dir):
            directory.mkdir(parents=True, exist_ok=True)
        (paths.cni_conf_dir / "10-sunk.conflist").write_text(
            json.dumps(nodeconf.cni_config(subnet, index, paths.cni_ipam_dir), indent=1)
        )
        registry_name = sandbox_image.split("/", 1)[0]
        hosts = paths.registry_hosts / registry_name / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(nodeconf.registry_hosts_toml(f"http://{registry}"))
        paths.containerd_config.write_text(
            nodeconf.containerd_config(
                paths, sandbox_image=sandbox_image, cni_bin_dir=CNI_BIN_DIR, runc=RUNC
            )
        )
        daemon = f"containerd-{name}"
        if self.supervisor.running(daemon):
            return
        env = node_environment(bin_dir)
        self.supervisor.spawn(
            daemon,
            self.room.enter([str(bin_dir / "containerd"), f"--config={paths.containerd_config}"]),
            env=env,
        )
        self.supervisor.wait_ready(
            daemon, lambda: paths.containerd_socket.exists(), timeout=30, what="(no socket)"
        )

    def _start_kubelet(self, spec: NodeSpec, address: str, bin_dir: Path, subnet: Subnet) -> bool:
        name = spec.name
        daemon = f"kubelet-{name}"
        if self.supervisor.running(daemon):
            return False
        paths = self.paths(name)
        sh(self.room.enter(["ip", "addr", "replace", f"{address}/32", "dev", nodeconf.BRIDGE]))
        root = nodeconf.cgroup_root(self.room.tag, name)
        make_cgroup_root(root)
        paths.resolv_conf.write_text("")  # dnsPolicy Default pods: no resolver outside
        room_kubeconfig(
            self.control_plane,
            f"node-{name}",
            f"system:node:{name}",
            ["system:nodes"],
            paths.kubeconfig,
            subnet,
        )
        ca = self.control_plane.pki.ca_cert
        paths.kubelet_config.write_text(
            nodeconf.dump_yaml(
                nodeconf.kubelet_config(paths, address=address, cgroup_root=root, client_ca=ca)
            )
        )
        argv = [
            str(bin_dir / "kubelet"),
            f"--config={paths.kubelet_config}",
            f"--kubeconfig={paths.kubeconfig}",
            f"--root-dir={paths.kubelet_dir}",
            f"--cert-dir={paths.kubelet_dir / 'pki'}",
            f"--hostname-override={name}",
            f"--node-ip={address}",
            "--v=1",
        ]
        if spec.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in spec.labels.items()))
        if spec.taints:
            argv.append("--register-with-taints=" + ",".join(spec.taints))
        env = node_environment(bin_dir)
        spawned = time.time()
        self.supervisor.spawn(daemon, self.room.enter(argv), env=env)
        self._await_device_plugin_socket(daemon, spawned)
        return True

    def _await_device_plugin_socket(self, daemon: str, spawned: float) -> None:
        """Every kubelet binds the same fixed path (kubelet's DevicePluginPath is
        not under --root-dir), after removing what is there: two starting at
        once can both remove, one then binds and the other dies of EADDRINUSE
        ("Failed to start ContainerManager"). So each starts once the one
        before has bound."""
        # kubelet's device plugin registration socket: shared by every kubelet
        # of the room (the room binds its own directory over the fixed path).
        socket = self.room.device_plugins_dir / "kubelet.sock"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.supervisor.running(daemon):
            with contextlib.suppress(FileNotFoundError):
                if socket.stat().st_ctime >= spawned:
                    return
            time.sleep(0.1)

    def pull(
        self, names: Sequence[str], refs: Sequence[str], bin_dir: Path
    ) -> list[subprocess.Popen[bytes]]:
        """Start pulling `refs`, in that order, on each node through its CRI, from
        the registry, in the background: what an image pre-puller does on a real
        cluster, so that pods do not wait for their image one after the other.
        One pull at a time per node (unpacking is CPU-bound; the first image is
        the one most pods need). A pod whose image is not there yet pulls it itself."""
        pulls = []
        for name in names:
            crictl = [
                str(bin_dir / "crictl"),
                f"--runtime-endpoint=unix://{self.paths(name).containerd_socket}",
                "pull",
            ]
            chain = " ; ".join(shlex.join([*crictl, ref]) for ref in refs)
            pulls.append(
                subprocess.Popen(
                    self.room.enter(["sh", "-c", chain]),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return pulls

    def names(self) -> list[str]:
        try:
            return sorted(p.name for p in self.dir.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def stop(self, names: Sequence[str] | None = None, bin_dir: Path | None = None) -> None:
        """Power the nodes off, all at once: kubelet, then every pod (through CRI),
        containerd, and whatever is left in the node's cgroups or mounted below
        its directory. Pods bound to a node come back when it starts again, as
        after a reboot."""
        stopping = list(names if names is not None else self.names())
        if not stopping:
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(stopping)) as pool:
            # list(): the first node's error, if any, is raised here.
            list(pool.map(lambda name: self._power_off(name, bin_dir), stopping))

    def _power_off(self, name: str, bin_dir: Path | None) -> None:
        paths = self.paths(name)
        self.supervisor.stop(f"kubelet-{name}")
        if bin_dir is not None and self.supervisor.running(f"containerd-{name}"):
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    self.room.enter(
                        [
                            str(bin_dir / "crictl"),
                            f"--runtime-endpoint=unix://{paths.containerd_socket}",
                            "--timeout=20s",
                            "rmp",
                            "--force",
                            "--all",
                        ]
                    ),
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        self.supervisor.stop(f"containerd-{name}")
        root = nodeconf.cgroup_root(self.room.tag, name)
        kill_cgroup(root)
        kill_shims(paths.containerd_socket)
        self.room.unmount_below(paths.root)
        remove_cgroup_root(root)


# ----------------------------------------------------------------- host pieces


def make_cgroup_root(root: str) -> None:
    """kubelet refuses a cgroupRoot that does not exist in every hierarchy."""
    for controller in nodeconf.CGROUP_CONTROLLERS:
        path = Path("/sys/fs/cgroup", controller) / root.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        if controller == "cpuset":
            parent = path.parent
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not (path / knob).read_text().strip():
                    (path / knob).write_text((parent / knob).read_text())


def _cgroup_dirs(root: str) -> list[Path]:
    """Every cgroup below `root` in every hierarchy, deepest first."""
    found: list[Path] = []
    for controller in nodeconf.CGROUP_CONTROLLERS:
        top = Path("/sys/fs/cgroup", controller) / root.lstrip("/")
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def kill_cgroup(root: str, timeout: float = 10.0) -> None:
    """SIGKILL every process left in the node's cgroups, until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for directory in _cgroup_dirs(root):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
        if not pids:
            return
        if time.monotonic() > deadline:
            raise StartError(f"processes in {root} survive SIGKILL: {sorted(pids)}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def kill_shims(socket: Path) -> None:
    """containerd's shims outlive it by design; a powered-off node has none."""
    needle = str(socket).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)


def remove_cgroup_root(root: str) -> None:
    for directory in _cgroup_dirs(root):
        with contextlib.suppress(OSError):
            directory.rmdir()


class NodeBed:
    """What real nodes need beside the control plane, started and stopped as one:
    the room (with kube-proxy), the registry the nodes pull from, one group of
    nodes, the `kubernetes` Service's endpoint and cluster DNS."""

    def __init__(
        self,
        state_dir: Path,
        supervisor: Supervisor,
        control_plane: KubeControlPlane,
    ) -> None:
        from sunk_testbed.images import Registry

        self.supervisor = supervisor
        self.control_plane = control_plane
        self.room = MachineRoom(state_dir, supervisor)
        self.registry = Registry(state_dir, supervisor)
        self.group = KubeletNodes(state_dir, supervisor, control_plane, self.room)
        # Nodes whose kubelet `start` started, and when: their Ready must be newer.
        self.restarted: dict[str, datetime.datetime] = {}
        self._pulls: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        specs: Sequence[NodeSpec],
        bin_dir: Path,
        sandbox_image: str,
        pull: Sequence[str] = (),
    ) -> None:
        """Start what is not running (idempotent), and begin pulling the images
        in `pull` on every node; readiness is `ready()`'s."""
        started_at = datetime.datetime.now(datetime.UTC)
        subnet = self.room.up()
        registry = self.registry.start(host=subnet.host_address)
        self.room.start_kube_proxy(bin_dir, self.control_plane, specs[0].name)
        started = self.group.start(specs, bin_dir, registry=registry, sandbox_image=sandbox_image)
        self.restarted = {name: started_at for name in started}
        if pull:
            self._pulls += self.group.pull([spec.name for spec in specs], pull, bin_dir)

    async def ready(
        self, kube: Any, access: KubeAccess, names: Sequence[str], dns_image: str, within: float
    ) -> None:
        """The apiserver's endpoint for pods, the nodes Ready, then CoreDNS ready."""
        from lightkube.resources.apps_v1 import Deployment

        await publish_apiserver(kube, self.room, kube_port(access))

        async def dns_ready() -> bool:
            deployment = await kube.get(Deployment, "coredns", namespace="kube-system")
            return bool(deployment.status and deployment.status.readyReplicas)

        # CoreDNS is applied at once: it is scheduled as soon as a node is Ready.
        await install_cluster_dns(kube, dns_image)
        try:
            await wait_until(
                f"nodes {', '.join(names)} Ready",
                lambda: nodes_ready(kube, names, self.restarted),
                within,
            )
        except TimeoutError as timed_out:
            raise StartError(f"{timed_out}\n{self._log_tails()}") from None
        try:
            await wait_until("cluster DNS (CoreDNS) ready", dns_ready, within)
        except TimeoutError as timed_out:
            raise StartError(f"{timed_out}\n{await self._dns_report(kube, names)}") from None

    def reap_pulls(self, within: float = 0) -> None:
        """Wait up to `within` seconds for the pulls `start` began, then stop the
        rest (their pods pull what is missing themselves)."""
        deadline = time.monotonic() + within
        for pull in self._pulls:
            try:
                pull.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pull.kill()
                pull.wait()
        self._pulls = []

    def _log_tails(self) -> str:
        """The end of each kubelet's and containerd's log, for a start that failed."""
        names = [n for n in self.supervisor.names() if n.startswith(("kubelet-", "containerd-"))]
        return "\n".join(f"--- {n}\n{tail(self.supervisor.log_dir / f'{n}.log', 8)}" for n in names)

    async def _dns_report(self, kube: Any, names: Sequence[str]) -> str:
        """For CoreDNS not ready: its pods' state, their container logs (read
        from the nodes' log directories) and the end of kube-proxy's log."""
        from lightkube.resources.core_v1 import Pod

        lines = []
        try:
            dns_pods = kube.list(Pod, namespace="kube-system", labels=nodeconf.COREDNS_LABELS)
            async for pod in dns_pods:
                lines.append(f"--- pod {describe_pod(pod)}")
        except Exception as error:  # a report must not fail
            lines.append(f"(no pods: {error})")
        for name in names:
            logs = self.group.paths(name).pod_logs
            for path in sorted(logs.glob("kube-system_coredns-*/coredns/*.log")):
                lines.append(f"--- {name}: {path.relative_to(logs)}\n{tail(path, 15)}")
        lines.append(f"--- kube-proxy\n{tail(self.supervisor.log_dir / 'kube-proxy.log', 15)}")
        return "\n".join(lines)

    def stop(self, bin_dir: Path | None) -> None:
        """Every node powered off, then the room and the registry; nothing left behind."""
        self.reap_pulls()
        self.group.stop(None, bin_dir)
        self.room.down()
        self.registry.stop()

    def leftovers(self, names: Sequence[str]) -> list[str]:
        """The room, or a node's cgroup with processes, still there (empty when clean)."""
        left = [f"network namespace {self.room.netns}"] if self.room.netns_path.exists() else []
        for name in names:
            for directory in _cgroup_dirs(nodeconf.cgroup_root(self.room.tag, name)):
                left.append(f"cgroup {directory}")
        return left


def describe_pod(pod: Any) -> str:
    """One line per pod: name, node, phase, unmet conditions and each
    container's state (for reports of what did not come up)."""
    status = pod.status
    parts = [f"{pod.metadata.name} on {pod.spec.nodeName or '(unscheduled)'}: {status.phase}"]
    for c in status.conditions or []:
        if c.status != "True":
            parts.append(f"{c.type}=False({c.reason or ''}: {c.message or ''})")
    for cs in status.containerStatuses or []:
        state = cs.state
        if state and state.waiting:
            now = f"waiting {state.waiting.reason}: {state.waiting.message or ''}"
        elif state and state.terminated:
            now = f"terminated {state.terminated.reason} exit {state.terminated.exitCode}"
        else:
            now = "running"
        parts.append(f"{cs.name} {now}, ready={cs.ready}, restarts={cs.restartCount}")
    return "; ".join(parts)


async def nodes_ready(
    kube: Any, names: Sequence[str], since: Mapping[str, datetime.datetime] | None = None
) -> bool:
    """Every named node has reported Ready; a node in `since` with a heartbeat
    after its time there (a node's status outlives its kubelet, so a restarted
    node looks Ready at once)."""
    from lightkube.resources.core_v1 import Node

    ready = set()
    async for node in kube.list(Node):
        conditions = (node.status.conditions if node.status else None) or []
        started = (since or {}).get(node.metadata.name)
        for c in conditions:
            fresh = started is None or (
                c.lastHeartbeatTime is not None
                and c.lastHeartbeatTime >= started - datetime.timedelta(seconds=1)
            )
            if c.type == "Ready" and c.status == "True" and fresh:
                ready.add(node.metadata.name)
    return set(names) <= ready
