"""Service names inside pods: each pod's /etc/hosts, generated from Services and EndpointSlices.

There is no cluster DNS and no kube-proxy on the local runtime, so names are
written into every pod's /etc/hosts and kept fresh as Services and
EndpointSlices change:

- headless Service (clusterIP None): the service name maps to every ready
  endpoint address, and each endpoint with a `hostname` (StatefulSet pods
  with `subdomain`) gets `<hostname>.<service>[.<ns>[.svc[.<domain>]]]`;
- ClusterIP Service: nothing would route the virtual IP, so the name maps to
  one ready endpoint address instead (the lowest, so the choice is stable);
- ExternalName and endpoint-less Services get no entry.

Services of the pod's own namespace are listed under their short name too;
those of other namespaces only qualified (`svc.ns`, `svc.ns.svc`, ...), as the
cluster DNS search path would resolve them. The feed runs with the
`system:kube-proxy` identity, which is what reads Services and
EndpointSlices on a real node.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod, Service
from lightkube.resources.discovery_v1 import EndpointSlice

from sunk.local.port import apply_to_cache, informer
from sunk.local.volumes import write_file_in_place

_log = logging.getLogger(__name__)
CLUSTER_DOMAIN = "cluster.local"
SERVICE_LABEL = "kubernetes.io/service-name"

HostEntry = tuple[str, list[str]]


def _ready_addresses(slices: Iterable[EndpointSlice]) -> list[tuple[str, str | None]]:
    found: dict[str, str | None] = {}
    for eps in slices:
        if eps.addressType not in ("IPv4", "IPv6"):
            continue
        for endpoint in eps.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and conditions.ready is False:
                continue
            for address in endpoint.addresses:
                found.setdefault(address, endpoint.hostname)
    return sorted(found.items(), key=lambda item: _sort_key(item[0]))


def _sort_key(address: str) -> tuple[int, int]:
    try:
        ip = ipaddress.ip_address(address)
        return ip.version, int(ip)
    except ValueError:
        return 9, 0


def service_entries(
    namespace: str,
    services: Iterable[Service],
    slices: Mapping[tuple[str, str], list[EndpointSlice]],
    domain: str = CLUSTER_DOMAIN,
) -> list[HostEntry]:
    """(address, names) lines for every resolvable Service, seen from `namespace`."""
    entries: list[HostEntry] = []
    for svc in sorted(
        services,
        key=lambda s: (
            (s.metadata.namespace or "", s.metadata.name or "") if s.metadata else ("", "")
        ),
    ):
        if svc.metadata is None or svc.spec is None:
            continue
        name, ns = svc.metadata.name or "", svc.metadata.namespace or ""
        if svc.spec.type == "ExternalName":
            continue
        qualified = [f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.{domain}"]
        names = ([name] if ns == namespace else []) + qualified
        addresses = _ready_addresses(slices.get((ns, name), []))
        if not addresses:
            continue
        if svc.spec.clusterIP == "None":
            for address, hostname in addresses:
                entries.append((address, names))
                if hostname:
                    host_names = [f"{hostname}.{n}" for n in names]
                    entries.append((address, host_names))
        else:
            entries.append((addresses[0][0], names))
    return entries


def hosts_file(
    pod_ip: str,
    hostname: str,
    fqdn: str | None,
    aliases: Iterable[HostEntry],
    services: Iterable[HostEntry],
) -> str:
    lines = [
        "# Kubernetes-managed hosts file (sunk local runtime: services resolve here).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::1\tip6-mcastprefix",
        "fe00::2\tip6-allrouters",
    ]
    own = [fqdn, hostname] if fqdn else [hostname]
    if pod_ip:
        lines.append(f"{pod_ip}\t{' '.join(own)}")
    aliases = list(aliases)
    if aliases:
        lines.append("\n# Entries added by HostAliases.")
        lines += [f"{ip}\t{' '.join(names)}" for ip, names in aliases]
    services = list(services)
    if services:
        lines.append("\n# Services (no cluster DNS, no kube-proxy: endpoint addresses).")
        lines += [f"{ip}\t{' '.join(names)}" for ip, names in services]
    return "\n".join(lines) + "\n"


@dataclass
class _Registration:
    namespace: str
    pod_ip: str
    hostname: str
    fqdn: str | None
    aliases: list[HostEntry]
    path: Path


def _pod_hosts_parts(pod: Pod, hostname: str) -> tuple[str | None, list[HostEntry]]:
    spec = pod.spec
    namespace = pod.metadata.namespace if pod.metadata else ""
    fqdn = None
    if spec is not None and spec.subdomain:
        fqdn = f"{hostname}.{spec.subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}"
    aliases = (
        [
            (alias.ip, list(alias.hostnames or []))
            for alias in (spec.hostAliases or [])
            if spec and alias.ip
        ]
        if spec
        else []
    )
    return fqdn, aliases


class HostsFeed:
    def __init__(self, client: AsyncClient | None) -> None:
        self.client = client
        self._services: dict[tuple[str, str], Service] = {}
        self._slices: dict[tuple[str, str], EndpointSlice] = {}
        self._pods: dict[str, _Registration] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.static: list[HostEntry] = []  # e.g. the apiserver relay's names

    def start(self) -> None:
        if self.client is None:
            return
        self._tasks = [
            asyncio.create_task(self._follow(Service, self._services), name="hosts services"),
            asyncio.create_task(self._follow(EndpointSlice, self._slices), name="hosts slices"),
            asyncio.create_task(self._writer(), name="hosts writer"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.client is not None:
            await self.client.close()

    async def _follow(self, resource: Any, cache: dict[tuple[str, str], Any]) -> None:
        assert self.client is not None
        async for event in informer(self.client, resource, what=f"hosts {resource.__name__}"):
            apply_to_cache(event, cache)
            self._dirty.set()

    async def _writer(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.05)  # coalesce bursts of events
            self._dirty.clear()
            self.rewrite_all()

    def _slices_by_service(self) -> dict[tuple[str, str], list[EndpointSlice]]:
        out: dict[tuple[str, str], list[EndpointSlice]] = {}
        for (ns, _), eps in self._slices.items():
            labels = eps.metadata.labels if eps.metadata else None
            service = (labels or {}).get(SERVICE_LABEL)
            if service:
                out.setdefault((ns, service), []).append(eps)
        return out

    def render(
        self,
        reg: _Registration,
        slices: Mapping[tuple[str, str], list[EndpointSlice]] | None = None,
    ) -> str:
        slices = self._slices_by_service() if slices is None else slices
        services = service_entries(reg.namespace, self._services.values(), slices)
        return hosts_file(
            reg.pod_ip, reg.hostname, reg.fqdn, reg.aliases, [*self.static, *services]
        )

    def rewrite_all(self) -> None:
        slices = self._slices_by_service()
        for reg in list(self._pods.values()):
            with contextlib.suppress(OSError):
                write_file_in_place(reg.path, self.render(reg, slices))

    def register(self, uid: str, pod: Pod, pod_ip: str, hostname: str, path: Path) -> None:
        fqdn, aliases = _pod_hosts_parts(pod, hostname)
        namespace = pod.metadata.namespace if pod.metadata else ""
        reg = _Registration(namespace or "", pod_ip, hostname, fqdn, aliases, path)
        self._pods[uid] = reg
        write_file_in_place(path, self.render(reg))

    def unregister(self, uid: str) -> None:
        self._pods.pop(uid, None)
