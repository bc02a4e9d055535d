"""The bed's "machine room": the network and mount namespace its real nodes share.

One bridge for all pods, each node's address on it, one kube-proxy (iptables)
for the whole room and cluster DNS (CoreDNS, as a pod). The room is linked to
the host by a veth pair, so the host's apiserver, registry and any host Slurm
are reachable from pods, and the host reaches pods and kubelets by a route
through it. Because iptables rules, sysctls (ip_forward, bridge netfilter)
and listening ports are per network namespace, two beds on one machine never
meet, and the host's own settings are never touched. The room has no way
out: the host does not forward.

The room also has a mount namespace of its own, shared by every kubelet and
containerd in it (not `ip netns exec`, which gives each process a private one:
kubelet's volume mounts would then be invisible to containerd). Pods' mounts
therefore never appear on the host and vanish with the room. In it, three
kernel settings that kubelet insists on (vm.overcommit_memory=1,
kernel.panic=10, kernel.panic_on_oops=1, with `protectKernelDefaults`) read as
kubelet expects from files bound over them: these sysctls are machine-wide,
and the machine's own values are never changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sunk_testbed import nodeconf
from sunk_testbed.control_plane import KubeAccess, KubeControlPlane, file_lock
from sunk_testbed.nodeconf import Subnet
from sunk_testbed.procs import Supervisor

# Candidate /16s for beds' rooms (each picks one no host route overlaps).
_CANDIDATES = [ipaddress.IPv4Network(f"10.{b}.0.0/16") for b in range(160, 200)]
_SUBNET_LOCK = Path("/run/lock/sunk-testbed-subnets.lock")
KUBE_PROXY = "kube-proxy"
# kubelet's DevicePluginPath, a constant not under --root-dir.
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
# What kubelet's protectKernelDefaults demands (see the module's docstring).
KUBELET_KERNEL_SETTINGS = {"vm/overcommit_memory": 1, "kernel/panic": 10, "kernel/panic_on_oops": 1}


def bed_tag(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:6]


def sh(argv: Sequence[str], *, check: bool = True, stdin: str | None = None) -> str:
    proc = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=60
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the host routes or owns."""
    used = []
    for route in json.loads(sh(["ip", "-4", "-j", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(sh(["ip", "-4", "-j", "addr"]) or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(
                    ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
    return used


def pick_subnet(
    used: Sequence[ipaddress.IPv4Network], preferred: ipaddress.IPv4Network | None
) -> ipaddress.IPv4Network:
    """The preferred /16 if nothing uses it, else the first free candidate."""
    for net in ([preferred] if preferred else []) + _CANDIDATES:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.160-199.0.0/16 for a bed's node network")


class MachineRoom:
    """The bed's network namespace: the link to the host, the pod bridge,
    kube-proxy, and the `kubernetes` and DNS Services that pods use."""

    def __init__(self, state_dir: Path, supervisor: Supervisor) -> None:
        self.dir = state_dir / "room"
        self.supervisor = supervisor
        self.tag = bed_tag(state_dir)
        self.netns = f"sunk-{self.tag}"
        self.host_link = f"sk{self.tag}h"
        self._record = self.dir / "room.json"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def mountns_path(self) -> Path:
        return self.dir / "ns" / "mnt"

    @property
    def device_plugins_dir(self) -> Path:
        """What the room's kubelets see as /var/lib/kubelet/device-plugins."""
        return self.dir / "device-plugins"

    def enter(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the room: its network and mount namespaces."""
        return [
            "nsenter",
            f"--net={self.netns_path}",
            f"--mount={self.mountns_path}",
            "--",
            *argv,
        ]

    def _make_mount_namespace(self) -> None:
        """A persistent mount namespace (bound to a file on a private mount)
        with kubelet's kernel settings bound over /proc/sys."""
        holder = self.mountns_path.parent
        if is_mount_point(self.mountns_path):
            return
        holder.mkdir(parents=True, exist_ok=True)
        if not is_mount_point(holder):
            sh(["mount", "--bind", str(holder), str(holder)])
            sh(["mount", "--make-private", str(holder)])
        self.mountns_path.touch()
        sh(["unshare", f"--mount={self.mountns_path}", "--propagation", "private", "true"])
        settings = self.dir / "sysctl"
        settings.mkdir(exist_ok=True)
        for key, value in KUBELET_KERNEL_SETTINGS.items():
            fake = settings / key.replace("/", ".")
            fake.write_text(f"{value}\n")
            sh(self._in_mounts(["mount", "--bind", str(fake), f"/proc/sys/{key}"]))
        # kubelet keeps its device plugin socket and its checkpoint of what
        # devices pods hold in this fixed directory, whatever its --root-dir.
        # Shared with the host, a resource one bed's pods held came back (at 0)
        # on every node of every later bed: a NodeSet there waited for ever.
        self.device_plugins_dir.mkdir(exist_ok=True)
        DEVICE_PLUGINS_DIR.mkdir(parents=True, exist_ok=True)
        sh(
            self._in_mounts(
                ["mount", "--bind", str(self.device_plugins_dir), str(DEVICE_PLUGINS_DIR)]
            )
        )

    def _in_mounts(self, argv: Sequence[str]) -> list[str]:
        """`argv` in the room's mount namespace only (host network)."""
        return ["nsenter", f"--mount={self.mountns_path}", "--", *argv]

    def mounts(self) -> list[str]:
        """Mount points inside the room."""
        table = sh(self._in_mounts(["cat", "/proc/self/mountinfo"]))
        return [line.split()[4] for line in table.splitlines()]

    def share(self, directory: Path) -> None:
        """Make `directory` a shared mount inside the room (bound onto itself,
        then `--make-rshared`), as every directory is on a systemd host. A CSI
        node plugin's `Bidirectional` volume (its FUSE mounts reaching kubelet
        and the pods) is refused by containerd below a private mount, and the
        room's mounts are private. The peer group is the room's alone: nothing
        propagates to or from the host. Idempotent; call it before anything
        is mounted below `directory` (a bind would hide those mounts)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = str(directory.resolve())
        if path in self.mounts():
            return
        sh(self._in_mounts(["mount", "--bind", path, path]))
        sh(self._in_mounts(["mount", "--make-rshared", path]))

    def unmount_below(self, directory: Path) -> None:
        """Lazily unmount everything the room has at or below `directory`, deepest first."""
        if not is_mount_point(self.mountns_path):
            return
        prefix = str(directory.resolve())
        inside = {p for p in self.mounts() if p == prefix or p.startswith(prefix + "/")}
        for point in sorted(inside, key=len, reverse=True):
            sh(self._in_mounts(["umount", "-l", point]), check=False)

    def subnet(self) -> Subnet:
        raw = json.loads(self._record.read_text())
        return Subnet(ipaddress.IPv4Network(raw["subnet"]))

    def up(self) -> Subnet:
        """Create the namespace, link and bridge unless they exist; idempotent."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._make_mount_namespace()
        if self.netns_path.exists() and self._record.exists():
            return self.subnet()
        with file_lock(_SUBNET_LOCK):
            preferred = None
            with contextlib.suppress(FileNotFoundError, KeyError, ValueError):
                preferred = ipaddress.IPv4Network(json.loads(self._record.read_text())["subnet"])
            net = pick_subnet(_host_networks(), preferred)
            self._record.write_text(json.dumps({"subnet": str(net), "netns": self.netns}))
            subnet = Subnet(net)
            inner = f"sk{self.tag}r"
            sh(["ip", "netns", "add", self.netns])
            sh(
                ["ip", "-batch", "-"],
                stdin=(
                    f"link add {self.host_link} type veth peer name {inner} netns {self.netns}\n"
                    f"addr add {subnet.host_address}/30 dev {self.host_link}\n"
                    f"link set {self.host_link} up\n"
                ),
            )
            sh(
                ["ip", "-n", self.netns, "-batch", "-"],
                stdin=(
                    "link set lo up\n"
                    f"link set {inner} name uplink\n"
                    f"addr add {subnet.namespace_address}/30 dev uplink\n"
                    "link set uplink up\n"
                    f"link add {nodeconf.BRIDGE} type bridge\n"
                    f"addr add {subnet.gateway}/17 dev {nodeconf.BRIDGE}\n"
                    f"link set {nodeconf.BRIDGE} up\n"
                    f"route add default via {subnet.host_address}\n"
                ),
            )
            sh(["ip", "route", "add", subnet.pods, "via", subnet.namespace_address])
        # Inside the room only: routing between the bridge and the uplink, and
        # iptables on bridged traffic (a Service's backend on the same bridge).
        for key, value in (
            ("net.ipv4.ip_forward", "1"),
            ("net.bridge.bridge-nf-call-iptables", "1"),
            ("net.ipv4.conf.all.route_localnet", "1"),
        ):
            sh(self.enter(["sysctl", "-qw", f"{key}={value}"]))
        return subnet

    def start_kube_proxy(self, bin_dir: Path, control_plane: KubeControlPlane, node: str) -> None:
        """kube-proxy for every node of the room, named after `node` (one of them)."""
        if self.supervisor.running(KUBE_PROXY):
            return
        subnet = self.subnet()
        kubeconfig = room_kubeconfig(
            control_plane,
            "kube-proxy",
            "system:kube-proxy",
            (),
            self.dir / "kube-proxy.kubeconfig",
            subnet,
        )
        config = self.dir / "kube-proxy.yaml"
        config.write_text(
            nodeconf.dump_yaml(
                nodeconf.kube_proxy_config(kubeconfig, subnet, subnet.namespace_address, node)
            )
        )
        self.supervisor.spawn(
            KUBE_PROXY,
            self.enter([str(bin_dir / "kube-proxy"), f"--config={config}", "--v=1"]),
            env=node_environment(bin_dir),
        )

    def down(self) -> None:
        """Stop kube-proxy and remove the namespace (its links, bridge and rules go with it)."""
        self.supervisor.stop(KUBE_PROXY)
        # The mount namespace goes with its last process; its pods' mounts with it.
        for mount in (self.mountns_path, self.mountns_path.parent):
            if is_mount_point(mount):
                sh(["umount", "-l", str(mount)], check=False)
        if self.netns_path.exists():
            sh(["ip", "netns", "del", self.netns], check=False)
        if Path("/sys/class/net", self.host_link).exists():
            sh(["ip", "link", "del", self.host_link], check=False)


def room_kubeconfig(
    control_plane: KubeControlPlane,
    name: str,
    user: str,
    groups: Sequence[str],
    path: Path,
    subnet: Subnet,
) -> Path:
    """A kubeconfig for a daemon in the room: the apiserver at the host's end of
    the link, verified under the name `kubernetes` that its certificate carries."""
    issued = control_plane.issue_kubeconfig(name, user, groups)
    config = yaml.safe_load(issued.read_text())
    port = int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://{subnet.host_address}:{port}"
        cluster["cluster"]["tls-server-name"] = "kubernetes"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def node_environment(bin_dir: Path) -> dict[str, str]:
    """A node daemon's environment: the node binaries first on PATH (containerd
    finds its shim there), and no proxy: image pulls and everything else of the
    bed stay on this machine."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


def is_mount_point(path: Path) -> bool:
    """From the mount table (os.path.ismount misses a directory bound onto itself)."""
    wanted = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == wanted for line in table)


async def install_cluster_dns(client: Any, image: str) -> None:
    """CoreDNS and the kube-dns Service, applied with the admin client."""
    from lightkube import codecs

    for manifest in nodeconf.coredns_manifests(image):
        await client.apply(codecs.from_dict(manifest), force=True)


async def publish_apiserver(client: Any, room: MachineRoom, apiserver_port: int) -> None:
    """The `kubernetes` Service's endpoint as pods reach it (see nodeconf)."""
    from lightkube import codecs

    manifest = nodeconf.kubernetes_endpoint_slice(room.subnet().host_address, apiserver_port)
    await client.apply(codecs.from_dict(manifest), force=True)


def kube_port(access: KubeAccess) -> int:
    return int(access.server.rsplit(":", 1)[1])
