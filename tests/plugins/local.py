"""A local bed: the node runtime with N nodes plus its own small Slurm, for end-to-end tests.

The Slurm has no static nodes, is configless, and listens at the runtime's
gateway, so slurmd pods register as dynamic nodes. The session's control
plane is shared; everything else lives in a state directory of its own and
is removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Namespace, Pod, Secret, Service, ServiceAccount
from lightkube.resources.discovery_v1 import EndpointSlice

from sunk.local import slurmpods
from sunk.local.logs import find_log
from sunk.local.node import NodeConfig
from sunk.local.port import build
from sunk.local.runtime import ControlPlaneIdentities, LocalRuntime, RuntimeConfig
from sunk.testbed.kube import KubeAccess, KubeControlPlane
from sunk.testbed.procs import Supervisor
from sunk.testbed.slurm import SlurmCluster, ensure_rootfs


@dataclass
class LocalBed:
    runtime: LocalRuntime
    cluster: SlurmCluster
    state: Path  # the bed's state dir; the runtime's is state / "nodes"
    nodes: list[str]
    namespace: str
    kube: AsyncClient

    def log(self, pod: str, container: str | None = None, previous: bool = False) -> str:
        found = find_log(self.runtime.pods_dir(), self.namespace, pod, container, previous)
        return found.path.read_text(errors="replace")

    async def serve_slurm_to_pods(self) -> int:
        """What slurmd pods need in the namespace: the munge key Secret and the
        `slurmctld` Service with its endpoint at the gateway. Returns the port."""
        access = self.cluster.access()
        ns, port = self.namespace, access.slurmctld_port
        await self.kube.create(build(Secret, slurmpods.munge_secret(ns, access.munge_key)))
        await self.kube.create(build(Service, slurmpods.controller_service(ns, port)))
        await self.kube.create(
            build(EndpointSlice, slurmpods.controller_endpoints(ns, self.runtime.gateway, port))
        )
        return port


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


def runtime_for_tests(
    state: Path,
    rootfs: Path,
    nodes: Sequence[NodeConfig],
    control_plane: KubeControlPlane,
    access: KubeAccess,
) -> LocalRuntime:
    """A node runtime with test timings: quick back-off, volume refresh and stop."""
    config = RuntimeConfig(
        state_dir=state,
        rootfs=rootfs,
        nodes=nodes,
        backoff_initial=0.5,
        backoff_max=2.0,
        volume_refresh=0.5,
        stop_grace=2.0,
    )
    return LocalRuntime(config, ControlPlaneIdentities(control_plane, access.admin_kubeconfig))


@contextlib.asynccontextmanager
async def local_bed(
    control_plane: KubeControlPlane,
    access: KubeAccess,
    kube: AsyncClient,
    nodes: Callable[[str], Sequence[NodeConfig]],
    *,
    prefix: str = "t-local",
    extra_conf: Sequence[str] = (),
    etc_files: Mapping[str, str] | None = None,
) -> AsyncIterator[LocalBed]:
    """`nodes(tag)` names the nodes; `tag` keeps two beds (or test runs) apart."""
    rootfs = await asyncio.to_thread(ensure_rootfs)
    state = Path(tempfile.mkdtemp(prefix="sunk-lr-", dir="/tmp"))
    tag = secrets.token_hex(2)
    node_configs = list(nodes(tag))
    runtime = runtime_for_tests(state / "nodes", rootfs, node_configs, control_plane, access)
    cluster = SlurmCluster(
        state,
        Supervisor(state),
        rootfs,
        nodes=0,
        controller_address="127.0.0.1",  # replaced below, once the gateway is known
        extra_conf=["SlurmctldParameters=enable_configless", *extra_conf],
        etc_files=etc_files,
    )
    namespace = f"{prefix}-{tag}"
    try:
        await runtime.start()
        cluster.controller_address = runtime.gateway
        await asyncio.to_thread(cluster.start)
        await kube.create(
            build(
                Namespace,
                {"metadata": {"name": namespace, "labels": {"sunk.test/contract": "true"}}},
            )
        )

        async def has_account() -> bool:
            try:
                await kube.get(ServiceAccount, "default", namespace=namespace)
                return True
            except ApiError:
                return False

        await wait_for("the default ServiceAccount", has_account)
        yield LocalBed(runtime, cluster, state, [n.name for n in node_configs], namespace, kube)
    finally:
        # Pods first, while their nodes still run, so the runtime finalizes them.
        try:
            await kube.deletecollection(Pod, namespace=namespace, grace_period=0)

            async def no_pods() -> bool:
                return not [p async for p in kube.list(Pod, namespace=namespace)]

            await wait_for("pods to be gone", no_pods, timeout=20)
            await kube.delete(Namespace, namespace)
        except (ApiError, AssertionError):
            pass
        await runtime.stop(delete_nodes=True)
        await asyncio.to_thread(cluster.stop)
        shutil.rmtree(state, ignore_errors=True)
