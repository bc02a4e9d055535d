"""The kubelet's side of `sunk gpu-plugin`: its gRPC services, their
registration, the rescan of the devices, and the port to the pods bound to
the node.

For each resource the plugin serves the DevicePlugin service (v1beta1) on a
socket of its own and registers it through the kubelet's plugin watcher: a
Registration service socket in the kubelet's `plugins_registry` directory
(`<--root-dir>/plugins_registry`), which the kubelet finds by inotify (or at
its own start), asks GetInfo (type DevicePlugin, the resource's name, the
device plugin socket's path), validates (the name must be an extended
resource name) and connects to; it calls NotifyRegistrationStatus with the
outcome. Removing the registration socket deregisters the plugin. Unlike the
fixed /var/lib/kubelet/device-plugins/kubelet.sock, this directory is under
each kubelet's root dir (and is the path the kubelet recommends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from sunk.gpus import choice
from sunk.gpus.cdi import SpecError
from sunk.gpus.choice import ALL_GPUS, BoundPod
from sunk.gpus.devices import find_gpus
from sunk.gpus.inventory import KIND as NVIDIA_CDI_KIND
from sunk.gpus.proto import deviceplugin_pb2 as dp
from sunk.gpus.proto import deviceplugin_pb2_grpc as dp_grpc
from sunk.gpus.proto import pluginregistration_pb2 as reg
from sunk.gpus.proto import pluginregistration_pb2_grpc as reg_grpc
from sunk.gpus.step_edits import ENV as STEP_EDITS_ENV
from sunk.gpus.step_edits import read_specs, step_edits

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

Context = grpc.aio.ServicerContext[Any, Any]


class BoundPods(Protocol):
    """The pods bound to this node now (a fresh read, never a cache: the
    scheduler writes its condition just before it binds)."""

    async def on_node(self) -> list[BoundPod]: ...


class KubeBoundPods:
    """`BoundPods` from the apiserver: a list with fieldSelector spec.nodeName."""

    def __init__(self, kube: AsyncClient, node: str) -> None:
        self.kube = kube
        self.node = node

    async def on_node(self) -> list[BoundPod]:
        found = []
        async for pod in self.kube.list(Pod, namespace="*", fields={"spec.nodeName": self.node}):
            seen = choice.bound_pod(pod)
            if seen is not None:
                found.append(seen)
        return found


class GpuInventory:
    """The GPUs found in the device directory, rescanned on demand. A GPU
    once found and now missing stays listed as unhealthy."""

    def __init__(self, device_dir: Path) -> None:
        self.device_dir = device_dir
        self.present: tuple[int, ...] = ()
        self.known: tuple[int, ...] = ()
        self._changed = asyncio.Event()

    def scan(self) -> bool:
        """Look again; True if what is present changed (watchers are woken)."""
        found = find_gpus(self.device_dir)
        if found == self.present:
            return False
        gone = sorted(set(self.present) - set(found))
        log.info(
            "GPUs in %s: %s%s", self.device_dir, list(found), f" (gone: {gone})" if gone else ""
        )
        self.present = found
        self.known = tuple(sorted(set(self.known) | set(found)))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def watch(self) -> AsyncIterator[tuple[int, ...]]:
        """What is present now, then again after each change."""
        while True:
            changed = self._changed
            yield self.present
            await changed.wait()


async def keep_scanning(inventory: GpuInventory, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            inventory.scan()
        except OSError as error:
            log.warning("scanning %s: %s", inventory.device_dir, error)


def cdi_devices(names: Iterable[object]) -> list[dp.CDIDevice]:
    """What a container gets: the node's CDI devices `nvidia.com/gpu=<name>`
    (the kind of NVIDIA's spec, whose devices are named by GPU index, and `all`).
    The runtime applies the spec's edits for them (device nodes, driver
    libraries, tools) and refuses to start a container whose device the
    node's spec does not name: no GPU reaches a pod by any other way."""
    return [dp.CDIDevice(name=f"{NVIDIA_CDI_KIND}={name}") for name in names]


class _Plugin(dp_grpc.DevicePluginServicer):
    """What both resources share: the node, its GPUs and pods. The methods
    are named as the kubelet's gRPC service names them."""

    def __init__(
        self,
        resource: str,
        node: str,
        inventory: GpuInventory,
        pods: BoundPods,
    ) -> None:
        self.resource = resource
        self.node = node
        self.inventory = inventory
        self.pods = pods
        # Set once the kubelet has read the device list (ListAndWatch).
        self.listed = asyncio.Event()

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Context
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


class GpuPlugin(_Plugin):
    """`nvidia.com/gpu`: one device per GPU (ID: its index), for the pod
    Slurm allocated them to."""

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Context
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: dp.Empty, context: Context
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        async for present in self.inventory.watch():
            devices = [
                dp.Device(ID=str(index), health=HEALTHY if index in present else UNHEALTHY)
                for index in self.inventory.known
            ]
            log.info("%s: listing %s", self.resource, [(d.ID, d.health) for d in devices])
            yield dp.ListAndWatchResponse(devices=devices)
            self.listed.set()

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Context
    ) -> dp.PreferredAllocationResponse:
        try:
            pods = await self.pods.on_node()
        except Exception as error:  # no preference is never an admission failure
            log.warning(
                "%s: no preferred allocation: reading pods failed: %s", self.resource, error
            )
            pods = []
        answers = []
        for wanted in request.container_requests:
            pod, ids = choice.preferred_gpus(
                pods,
                wanted.available_deviceIDs,
                wanted.must_include_deviceIDs,
                wanted.allocation_size,
            )
            log.info(
                "%s: preferred %s of %s for %s",
                self.resource,
                ids,
                sorted(wanted.available_deviceIDs),
                pod.key if pod else "no pod Slurm gave GPUs to",
            )
            answers.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        pods = await _pods_or_abort(self.pods, self.resource, context)
        answers = []
        for wanted in request.container_requests:
            ids = list(wanted.devices_ids)
            pod = choice.gpus_allowed(pods, ids)
            if pod is None:
                message = choice.gpus_refusal(self.resource, ids, self.node)
                log.warning("refused: %s", message)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
            indices = sorted(int(i) for i in ids)
            log.info("%s: %s allocated to %s (Slurm's)", self.resource, indices, pod.key)
            answers.append(dp.ContainerAllocateResponse(cdi_devices=cdi_devices(indices)))
        return dp.AllocateResponse(container_responses=answers)


class NodeGpusPlugin(_Plugin):
    """`sunk.dev/node-gpus`: one device, "all" (every GPU), for the node's
    slurmd pod (of a NodeSet in `slurmd_namespace`); listed while at least
    one GPU is found."""

    def __init__(
        self,
        resource: str,
        node: str,
        inventory: GpuInventory,
        pods: BoundPods,
        slurmd_namespace: str,
        cdi_spec_dirs: Sequence[Path] = (),
    ) -> None:
        super().__init__(resource, node, inventory, pods)
        self.slurmd_namespace = slurmd_namespace
        self.cdi_spec_dirs = tuple(cdi_spec_dirs)

    def container_step_env(self) -> dict[str, str]:
        """The node's CDI edits for its GPUs, for sunk's container steps
        (sunk.gpus.step_edits): read afresh, as containerd reads the specs
        when it creates the slurmd container."""
        if not self.cdi_spec_dirs:
            return {}
        try:
            edits = step_edits(read_specs(self.cdi_spec_dirs), NVIDIA_CDI_KIND)
        except SpecError as error:
            log.error("container steps get no GPU driver files: %s", error)
            return {}
        return {STEP_EDITS_ENV: edits} if edits else {}

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Context
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    async def ListAndWatch(
        self, request: dp.Empty, context: Context
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        # Always the one device, whatever the GPUs found (none, even): a node
        # whose allocatable shows it at 0 is then one whose plugin does not
        # serve it yet (a kubelet just restarted), which the NodeSet waits
        # for, never a node without GPUs, which would wait for ever.
        log.info("%s: listing %s", self.resource, [ALL_GPUS])
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=ALL_GPUS, health=HEALTHY)])
        await asyncio.Event().wait()  # the stream stays open: the kubelet reads it

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Context
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse()

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        pods = await _pods_or_abort(self.pods, self.resource, context)
        answers = []
        for wanted in request.container_requests:
            pod = choice.node_gpus_allowed(pods, self.resource, self.slurmd_namespace)
            if list(wanted.devices_ids) != [ALL_GPUS] or pod is None:
                message = choice.node_gpus_refusal(self.resource, self.node, self.slurmd_namespace)
                log.warning("refused: %s", message)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
            present = self.inventory.present
            log.info("%s: every GPU %s to %s", self.resource, list(present), pod.key)
            # The spec's `all` (none on a node without GPUs, which has no `all`).
            envs = await asyncio.to_thread(self.container_step_env) if present else {}
            answers.append(
                dp.ContainerAllocateResponse(
                    cdi_devices=cdi_devices([ALL_GPUS] if present else []), envs=envs
                )
            )
        return dp.AllocateResponse(container_responses=answers)


async def _pods_or_abort(pods: BoundPods, resource: str, context: Context) -> list[BoundPod]:
    try:
        return await pods.on_node()
    except Exception as error:
        message = f"{resource}: cannot read the pods bound to this node: {error}"
        log.warning("refused: %s", message)
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        raise  # abort raises; this is for the type checker


class Registration(reg_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks a plugin's registration socket."""

    def __init__(self, resource: str, endpoint: str) -> None:
        self.resource = resource
        self.endpoint = endpoint

    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DevicePlugin",
            name=self.resource,
            endpoint=self.endpoint,
            supported_versions=[API_VERSION],
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("%s: registered with the kubelet (%s)", self.resource, self.endpoint)
        else:
            log.error("%s: the kubelet refused the registration: %s", self.resource, request.error)
        return reg.RegistrationStatusResponse()


@dataclass(frozen=True)
class SocketDirs:
    """Where the sockets go, as this process and as the kubelet sees them."""

    socket_dir: Path  # the device plugin sockets
    registry_dir: Path  # the kubelet's plugins_registry
    host_socket_dir: Path | None = None  # socket_dir as the kubelet sees it (default: same)

    def plugin_socket(self, resource: str) -> Path:
        return self.socket_dir / socket_name(resource)

    def endpoint(self, resource: str) -> str:
        """The device plugin socket's path that GetInfo hands the kubelet."""
        return str((self.host_socket_dir or self.socket_dir) / socket_name(resource))

    def registration_socket(self, resource: str) -> Path:
        return self.registry_dir / f"{_file_stem(resource)}-reg.sock"


def socket_name(resource: str) -> str:
    """`nvidia.com/gpu` -> `nvidia.com-gpu.sock`."""
    return f"{_file_stem(resource)}.sock"


def _file_stem(resource: str) -> str:
    return resource.replace("/", "-")


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.asynccontextmanager
async def serving(
    resource: str, servicer: dp_grpc.DevicePluginServicer, dirs: SocketDirs
) -> AsyncIterator[None]:
    """Serve `servicer` for `resource` and register it with the kubelet, until
    the block ends; then deregister (remove the registration socket) and stop."""
    plugin_socket, registration_socket = (
        dirs.plugin_socket(resource),
        dirs.registration_socket(resource),
    )
    for directory in (plugin_socket.parent, registration_socket.parent):
        directory.mkdir(parents=True, exist_ok=True)
    servers: list[grpc.aio.Server] = []
    try:
        # The device plugin first: the kubelet connects as soon as it registers.
        _remove(plugin_socket)
        plugin = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(servicer, plugin)
        plugin.add_insecure_port(f"unix:{plugin_socket}")
        await plugin.start()
        servers.append(plugin)
        _remove(registration_socket)
        registrar = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(
            Registration(resource, dirs.endpoint(resource)), registrar
        )
        registrar.add_insecure_port(f"unix:{registration_socket}")
        await registrar.start()
        servers.append(registrar)
        log.info("%s: serving %s, registering at %s", resource, plugin_socket, registration_socket)
        yield
    finally:
        _remove(registration_socket)  # the kubelet deregisters the plugin
        for server in reversed(servers):
            await server.stop(grace=1)
        _remove(plugin_socket)
