"""The bed's pod network: one bridge, one network namespace and veth per pod.

Layout (one /16 per bed, picked free at first start and kept):

    10.B.0.1/16     the bridge's own address in the host namespace: the bed's
                    gateway, where host daemons (slurmctld, ...) are reachable
    10.B.N.1/32     node N's address (also on the bridge): its InternalIP, and
                    the podIP of its hostNetwork pods
    10.B.N.2-254    pods of node N, each in its own namespace behind a veth

Pods get only the on-link /16 route, no default route, and the host does not
forward (ip_forward stays as it is, 0 here): traffic from a pod can reach the
bridge, the host's addresses on it and other pods of this bed, nothing else.

Names carry the bed's tag (a hash of its state directory) so that beds can
coexist: bridge `sk<tag>-br`, veth `sk<tag><pod>`, namespace `sk-<tag>-<pod>`.
Everything is recorded in the ledger before it is made.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sunk.local import ledger as L
from sunk.local.system import CommandError, run

LOCK_FILE = Path("/run/lock/sunk-local-net.lock")
# Candidate /16s: 10.200.0.0/16 ... 10.254.0.0/16 (far from the bed's 10.96/16 services).
_CANDIDATES = [ipaddress.IPv4Network(f"10.{b}.0.0/16") for b in range(200, 255)]


def bed_tag(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:5]


def short_hash(text: str, length: int = 6) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Subnet:
    network: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    def node_address(self, index: int) -> str:
        if not 1 <= index <= 254:
            raise ValueError("node index must be 1..254")
        return str(self.network.network_address + index * 256 + 1)

    def pod_address(self, index: int, slot: int) -> str:
        if not 2 <= slot <= 254:
            raise ValueError("pod slot must be 2..254")
        return str(self.network.network_address + index * 256 + slot)

    def contains(self, address: str) -> bool:
        try:
            return ipaddress.ip_address(address) in self.network
        except ValueError:
            return False


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the host routes or owns, in any table."""
    used = []
    _, routes = await run(["ip", "-4", "-j", "route", "show", "table", "all"])
    for route in json.loads(routes or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst, strict=False))
    _, addrs = await run(["ip", "-4", "-j", "addr"])
    for link in json.loads(addrs or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(
                    ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
    return used


def pick_subnet(
    used: list[ipaddress.IPv4Network], preferred: ipaddress.IPv4Network | None
) -> ipaddress.IPv4Network:
    """The preferred /16 if nothing uses it, else the first free candidate."""
    candidates = ([preferred] if preferred else []) + _CANDIDATES
    for net in candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.200-254.0.0/16 for the pod network")


class Network:
    def __init__(self, tag: str, state_dir: Path, ledger: L.Ledger) -> None:
        self.tag = tag
        self.ledger = ledger
        self.bridge = f"sk{tag}-br"
        self._record = state_dir / "network.json"
        self.subnet: Subnet | None = None

    @property
    def netns_prefix(self) -> str:
        return f"sk-{self.tag}-"

    @property
    def link_prefix(self) -> str:
        return f"sk{self.tag}"

    def netns_name(self, key: str) -> str:
        return f"{self.netns_prefix}{short_hash(key, 10)}"

    def veth_name(self, key: str) -> str:
        return f"{self.link_prefix}{short_hash(key)}"  # 2 + 5 + 6 = 13 <= 15 characters

    def _recorded(self) -> ipaddress.IPv4Network | None:
        try:
            return ipaddress.IPv4Network(json.loads(self._record.read_text())["subnet"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    async def up(self) -> Subnet:
        """Create the bridge with the gateway address; reuses the recorded /16 when free."""
        with _host_lock():
            net = pick_subnet(await _used_networks(), self._recorded())
            self._record.write_text(json.dumps({"subnet": str(net), "bridge": self.bridge}))
            subnet = Subnet(net)
            self.ledger.add(L.BRIDGE, self.bridge)
            await run(["ip", "link", "add", self.bridge, "type", "bridge"])
            await run(["ip", "addr", "add", f"{subnet.gateway}/16", "dev", self.bridge])
            await run(["ip", "link", "set", self.bridge, "up"])
        self.subnet = subnet
        return subnet

    def _need_subnet(self) -> Subnet:
        if self.subnet is None:
            raise RuntimeError("the network is not up")
        return self.subnet

    async def add_node_address(self, index: int) -> str:
        address = self._need_subnet().node_address(index)
        code, out = await run(
            ["ip", "addr", "add", f"{address}/32", "dev", self.bridge], check=False
        )
        if code != 0 and "File exists" not in out:
            raise CommandError(["ip", "addr", "add", address], code, out)
        return address

    async def remove_node_address(self, index: int) -> None:
        address = self._need_subnet().node_address(index)
        await run(["ip", "addr", "del", f"{address}/32", "dev", self.bridge], check=False)

    async def add_pod(self, key: str, address: str) -> str:
        """A fresh network namespace with `eth0` at `address`, wired to the bridge."""
        netns, veth = self.netns_name(key), self.veth_name(key)
        await self.remove_pod(key)  # leftovers of an earlier attempt
        if not _is_mount("/run/netns"):
            # `ip netns add` turns /run/netns into a mount point of its own.
            self.ledger.add(L.NETNS_MOUNT, "/run/netns")
        self.ledger.add(L.NETNS, netns)
        self.ledger.add(L.LINK, veth)
        host = (
            f"netns add {netns}\n"
            f"link add {veth} type veth peer name eth0 netns {netns}\n"
            f"link set {veth} master {self.bridge} up\n"
        )
        await run(["ip", "-batch", "-"], stdin=host.encode())
        inside = f"addr add {address}/16 dev eth0\nlink set eth0 up\nlink set lo up\n"
        await run(["ip", "-n", netns, "-batch", "-"], stdin=inside.encode())
        return netns

    async def remove_pod(self, key: str) -> None:
        netns, veth = self.netns_name(key), self.veth_name(key)
        await delete_netns(netns)
        await delete_link(veth)
        self.ledger.remove(L.NETNS, netns)
        self.ledger.remove(L.LINK, veth)

    async def down(self) -> None:
        await delete_link(self.bridge)
        self.ledger.remove(L.BRIDGE, self.bridge)


def _is_mount(path: str) -> bool:
    return is_mount_point(path)


def is_mount_point(path: str) -> bool:
    """From the mount table: os.path.ismount misses a bind mount of a directory onto
    itself on the same filesystem, which is what `ip netns add` makes of /run/netns."""
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == path for line in table)


def _exists(path: Path) -> bool:
    return path.exists()


async def delete_netns(name: str) -> None:
    if _exists(Path("/run/netns", name)):
        await run(["ip", "netns", "del", name], check=False)


async def delete_link(name: str) -> None:
    if _exists(Path("/sys/class/net", name)):
        await run(["ip", "link", "del", name], check=False)


def netns_names(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
    except FileNotFoundError:
        return []


def link_names(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(prefix))
