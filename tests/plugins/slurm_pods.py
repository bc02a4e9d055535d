"""A Slurm whose nodes are slurmd pods on the session's real nodes, for end-to-end tests.

The Slurm runs on the host (the bed's standalone Slurm of the images' default
release, with its light settings: the pods' slurmd runs unprivileged), has no static nodes, is
configless, and listens at the room's host address, so slurmd pods started
from the slurm image register as dynamic nodes. Each bed has a namespace and
a state directory of its own, removed afterwards; the nodes are shared by the
session, so whatever a module changes on them (labels, taints, cordons,
extended resources) is put back when its bed goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.types import PatchType

from plugins.nodes import RealNodes
from sunk_testbed import slurmpods
from sunk_testbed.charts import wait_until
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import SlurmCluster, ensure_release_rootfs


@dataclass
class SlurmBed:
    nodes: RealNodes
    cluster: SlurmCluster
    state: Path
    namespace: str
    kube: AsyncClient
    ctld_port: int

    @property
    def node_names(self) -> list[str]:
        return self.nodes.names

    @property
    def image(self) -> str:
        """The slurm image (built here from images/slurm) that slurmd pods run."""
        return self.nodes.images.slurm.ref

    async def log(self, pod: str, container: str | None = None) -> str:
        """The pod's log, read through the apiserver from its kubelet."""
        lines: list[str] = [
            line async for line in self.kube.log(pod, namespace=self.namespace, container=container)
        ]
        return "".join(lines)


async def wait_for(
    what: str, check: Callable[[], Awaitable[Any]], timeout: float = 20, interval: float = 0.1
) -> None:
    """`charts.wait_until` at a test's pace, failing as an assertion."""
    try:
        await wait_until(what, check, timeout, interval=interval)
    except TimeoutError as late:
        raise AssertionError(str(late)) from None


async def create(kube: AsyncClient, body: Mapping[str, Any]) -> Any:
    """Create the object a JSON-shaped dict describes."""
    return await kube.create(from_dict(dict(body)))


# ----------------------------------------------------------------- shared nodes


@dataclass(frozen=True)
class NodeState:
    """What a test may change on a shared node, as it was before."""

    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    extended: dict[str, str]  # capacity entries with a domain: nvidia.com/gpu…


async def node_states(kube: AsyncClient, names: Sequence[str]) -> dict[str, NodeState]:
    states = {}
    for name in names:
        node = await kube.get(Node, name)
        assert node.metadata is not None
        capacity = (node.status.capacity if node.status else None) or {}
        states[name] = NodeState(
            labels=dict(node.metadata.labels or {}),
            annotations=dict(node.metadata.annotations or {}),
            taints=[t.to_dict() for t in (node.spec.taints if node.spec else None) or []],
            unschedulable=bool(node.spec and node.spec.unschedulable),
            extended={k: str(v) for k, v in capacity.items() if "/" in k},
        )
    return states


def _merge(before: Mapping[str, str], now: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch from `now` back to `before`, leaving Kubernetes' own keys alone."""
    patch: dict[str, str | None] = {k: None for k in now if k not in before}
    patch.update({k: v for k, v in before.items() if now.get(k) != v})
    return {k: v for k, v in patch.items() if not _kubernetes_key(k)}


def _kubernetes_key(key: str) -> bool:
    """A key of the kubelet's or the control plane's (kubernetes.io, k8s.io and subdomains)."""
    domain = key.partition("/")[0] if "/" in key else ""
    return any(domain == d or domain.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))


async def restore_nodes(kube: AsyncClient, before: Mapping[str, NodeState]) -> None:
    """Put each node back as `before` says (what kubelets maintain themselves aside)."""
    now = await node_states(kube, list(before))
    for name, state in before.items():
        current = now[name]
        body = {
            "metadata": {
                "labels": _merge(state.labels, current.labels),
                "annotations": _merge(state.annotations, current.annotations),
            },
            "spec": {"taints": state.taints or None, "unschedulable": state.unschedulable},
        }
        await kube.patch(Node, name, body, patch_type=PatchType.MERGE)
        extended = _merge(state.extended, current.extended)
        if extended:
            await set_capacity(kube, name, extended)


async def set_capacity(kube: AsyncClient, node: str, extended: Mapping[str, str | None]) -> None:
    """Advertise (or, with None, withdraw) extended resources on a node, as a
    device plugin would; the kubelet copies them to allocatable."""
    await kube.patch(
        Node.Status, node, {"status": {"capacity": dict(extended)}}, patch_type=PatchType.MERGE
    )


# ----------------------------------------------------------------- the bed


@contextlib.asynccontextmanager
async def slurm_bed(
    nodes: RealNodes,
    kube: AsyncClient,
    *,
    prefix: str,
    extra_conf: Sequence[str] = (),
    etc_files: Mapping[str, str] | None = None,
) -> AsyncIterator[SlurmBed]:
    """The bed, with what slurmd pods need in its namespace: the munge key
    Secret and the `slurmctld` Service with its endpoint at the host."""
    rootfs = await asyncio.to_thread(ensure_release_rootfs, DEFAULT_SLURM)
    state = Path(tempfile.mkdtemp(prefix="sunk-sb-", dir="/tmp"))
    host = nodes.room.subnet().host_address
    cluster = SlurmCluster(
        state,
        Supervisor(state),
        rootfs,
        nodes=0,
        controller_address=host,
        extra_conf=["SlurmctldParameters=enable_configless", *extra_conf],
        etc_files=etc_files,
    )
    namespace = f"{prefix}-{secrets.token_hex(2)}"
    before = await node_states(kube, nodes.names)
    try:
        access = await asyncio.to_thread(cluster.start)
        await create(
            kube,
            {"metadata": {"name": namespace}, "apiVersion": "v1", "kind": "Namespace"},
        )

        async def has_account() -> bool:
            try:
                await kube.get(ServiceAccount, "default", namespace=namespace)
                return True
            except ApiError:
                return False

        await wait_for("the default ServiceAccount", has_account)
        port = access.slurmctld_port
        await create(kube, slurmpods.munge_secret(namespace, access.munge_key))
        await create(kube, slurmpods.controller_service(namespace, port))
        await create(kube, slurmpods.controller_endpoints(namespace, host, port))
        yield SlurmBed(nodes, cluster, state, namespace, kube, port)
    finally:
        try:
            await kube.deletecollection(Pod, namespace=namespace, grace_period=0)

            async def no_pods() -> bool:
                return not [p async for p in kube.list(Pod, namespace=namespace)]

            await wait_for("pods to be gone", no_pods, timeout=30)
            await kube.delete(Namespace, namespace)
        except (ApiError, AssertionError):
            pass
        await restore_nodes(kube, before)
        await asyncio.to_thread(cluster.stop)
        shutil.rmtree(state, ignore_errors=True)
