"""`sunk gpu-plugin`: the wiring (one process per node, no leader: each
plugin serves its own kubelet)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from sunk.api import GPU_RESOURCE, RESOURCE_NODE_GPUS
from sunk.gpus.plugin import (
    BoundPods,
    GpuInventory,
    GpuPlugin,
    KubeBoundPods,
    NodeGpusPlugin,
    SocketDirs,
    keep_scanning,
    serving,
)
from sunk.gpus.publish import KubeNodeAnnotations, NodeAnnotations, keep_publishing
from sunk.gpus.toolkit import CONFIG_PATH, unsafe_settings
from sunk.kube.client import kube_client

log = logging.getLogger(__name__)

SOCKET_DIR = Path("/var/lib/kubelet/plugins/sunk.dev")
REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")


@dataclass(frozen=True)
class GpuPluginConfig:
    node: str
    slurmd_namespace: str
    resource: str = GPU_RESOURCE
    # What NodeSets ask for; a test on shared nodes serves another name.
    node_resource: str = RESOURCE_NODE_GPUS
    device_dir: Path = Path("/dev")
    socket_dir: Path = SOCKET_DIR
    host_socket_dir: Path | None = None  # default: socket_dir
    registry_dir: Path = REGISTRY_DIR
    kubeconfig: Path | None = None
    rescan_seconds: float = 10.0
    # NVIDIA's container toolkit config as this process sees it (None: not checked).
    toolkit_config: Path | None = None
    # The node's CDI spec directories as this process sees them: their edits
    # for the GPUs go to sunk's container steps (none: no driver files there).
    cdi_spec_dirs: tuple[Path, ...] = ()
    metrics_port: int | None = None  # None: no /metrics endpoint
    # Write the GPUs found on the Node (annotation sunk.dev/gpus).
    publish_gpus: bool = False


class GpuPluginMetrics:
    """What one node's plugin exports: the GPUs it finds, and whether the
    kubelet has both of its resources (an alert tells a node whose plugin
    stopped serving, or lost a GPU)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.gpus = Gauge(
            "sunk_gpu_plugin_gpus",
            "GPUs found on the node at the last scan.",
            registry=self.registry,
        )
        self.toolkit_unsafe = Gauge(
            "sunk_gpu_plugin_toolkit_unsafe",
            "1 while NVIDIA's container toolkit on the node would hand a container GPUs by "
            "its own environment or mounts: the plugin serves no GPU until it is fixed.",
            registry=self.registry,
        )
        self.serving = Gauge(
            "sunk_gpu_plugin_serving",
            "1 once both resources (the pods' GPUs, the slurmd pod's) are served to the kubelet.",
            registry=self.registry,
        )


async def wait_for_a_safe_toolkit(
    config: GpuPluginConfig, metrics: GpuPluginMetrics | None = None
) -> None:
    """Return once NVIDIA's container toolkit on the node (if any) hands out
    no GPU by a container's own settings; until then, say why, and look
    again every rescan."""
    said: list[str] = []
    while config.toolkit_config is not None:
        try:
            text = config.toolkit_config.read_text()
        except FileNotFoundError:
            text = None  # no toolkit on the node: the runtime's CDI alone
        problems = [] if text is None else unsafe_settings(text, CONFIG_PATH)
        if metrics is not None:
            metrics.toolkit_unsafe.set(1 if problems else 0)
        if not problems:
            if said:
                log.info("NVIDIA's container toolkit is safe now: serving the GPUs")
            return
        if problems != said:
            for problem in problems:
                log.error("serving no GPU: %s", problem)
            said = problems
        await asyncio.sleep(config.rescan_seconds)


async def run_plugin(
    config: GpuPluginConfig,
    pods: BoundPods,
    metrics: GpuPluginMetrics | None = None,
    nodes: NodeAnnotations | None = None,
) -> None:
    """Serve both resources to the node's kubelet until cancelled."""
    await wait_for_a_safe_toolkit(config, metrics)
    inventory = GpuInventory(config.device_dir)
    inventory.scan()
    if metrics is not None:
        metrics.gpus.set_function(lambda: len(inventory.present))
    dirs = SocketDirs(config.socket_dir, config.registry_dir, config.host_socket_dir)
    gpus = GpuPlugin(config.resource, config.node, inventory, pods)
    node_gpus = NodeGpusPlugin(
        config.node_resource,
        config.node,
        inventory,
        pods,
        config.slurmd_namespace,
        config.cdi_spec_dirs,
    )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(serving(config.resource, gpus, dirs))
        # slurmd's resource only once the kubelet counts the GPUs: a node that
        # offers it offers them too, and its slurmd pod's GRES counts them all.
        await gpus.listed.wait()
        await stack.enter_async_context(serving(config.node_resource, node_gpus, dirs))
        if metrics is not None:
            metrics.serving.set(1)
        log.info("GPU plugin of node %s: %d GPU(s) found", config.node, len(inventory.present))
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(keep_scanning(inventory, config.rescan_seconds))
            if nodes is not None:
                tasks.create_task(keep_publishing(inventory.watch(), config.node, nodes))


async def main(config: GpuPluginConfig) -> None:
    metrics = GpuPluginMetrics()
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)
    kube = kube_client(config.kubeconfig, "sunk-gpu-plugin")
    try:
        nodes = KubeNodeAnnotations(kube) if config.publish_gpus else None
        await run_plugin(config, KubeBoundPods(kube, config.node), metrics, nodes)
    finally:
        await kube.close()
