"""Kubernetes' DRA example driver, real, on a running bed: the stand-in for
NVIDIA's DRA driver.

Its kubelet plugin is built here from the official Go module
(`testbed/dra/build.sh`: `sigs.k8s.io/dra-example-driver` at the version
below) into a cache directory keyed by the version, with the module's own Helm
chart copied beside it. Its image (`sunk/dra-example-driver`: a scratch image
around the one static binary at `/usr/bin`, where the project's image has it)
is built by `sunk_testbed.images` when a caller asks for it.

The driver publishes one ResourceSlice per node of simulated GPUs
(`gpu-0`, `gpu-1`, …, each with an `index` attribute) and, for each claim
allocated on its node, writes the CDI spec its runtime applies: the claim's
devices as `GPU_DEVICE_<n>=gpu-<n>` in the container's environment. No
device node: a test reads what a pod received from its environment.

`install_dra_driver` renders the module's chart as shipped (`helm template`)
and applies it with the changes the bed needs: its kubelets share one host,
each with its own root and CDI directory, so the chart's one DaemonSet
becomes one per node, each pointed at its node's plugin, registration and
CDI directories (the chart takes one path for every node), and without the
pod uid that names a rolling update's socket (too long a path there). It
returns once every node has published its devices.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import ResourceSlice

from sunk.api import TAINT_NODE_LOCK
from sunk_testbed import charts
from sunk_testbed.control_plane import ensure_built
from sunk_testbed.helm import Helm
from sunk_testbed.images import Image, ImageSpec, ensure_extra_images
from sunk_testbed.nodeconf import NodePaths
from sunk_testbed.paths import SCRIPTS, cache_dir

Log = Callable[[str], None]

DRA_DRIVER_VERSION = "v0.4.0"
# Bumped whenever testbed/dra/build.sh changes what it produces.
DRA_BUILD_REVISION = 1

# The chart's defaults: its device profile "gpu" names the driver and its DeviceClass.
DRIVER = "gpu.example.com"
DEVICE_CLASS = DRIVER
NAMESPACE = "dra-example-driver"
RELEASE = "dra-example-driver"
BINARY = "dra-example-kubeletplugin"
FIELD_MANAGER = "sunk-testbed"


def dra_driver_dir() -> Path:
    return cache_dir() / "dra" / f"dra-example-driver-{DRA_DRIVER_VERSION}-r{DRA_BUILD_REVISION}"


def ensure_dra_driver(log: Log) -> Path:
    """The kubelet plugin and its chart (`charts/dra-example-driver`), built
    into the cache unless a finished build is there."""
    out = dra_driver_dir()
    script = [str(SCRIPTS / "dra" / "build.sh"), str(out), DRA_DRIVER_VERSION]
    return ensure_built(out, script, f"the DRA example driver {DRA_DRIVER_VERSION}", log)


def ensure_dra_image(log: Log) -> Image:
    """`sunk/dra-example-driver` in the registry storage (built the first
    time, a cache hit after)."""
    binary = (ensure_dra_driver(log) / BINARY).resolve()
    spec = ImageSpec(
        "dra_example_driver",
        "sunk/dra-example-driver",
        "binary",
        (binary,),
        entrypoint=f"/usr/bin/{BINARY}",
    )
    return ensure_extra_images([spec], log)["dra_example_driver"]


def chart_values(image: Image, gpus: int) -> dict[str, Any]:
    """The chart's values the bed sets, each for a reason: its registry's
    image (read-only, so never pulled Always), as many devices as the bed's
    stand-in GPUs, and the one toleration a node plugin on Slurm nodes needs
    (sunk's node lock evicts every pod without it when a Slurm job starts)."""
    return {
        "image": charts.image_values(image),
        "kubeletPlugin": {
            "numDevices": gpus,
            "priorityClassName": "",
            "tolerations": [{"key": TAINT_NODE_LOCK, "operator": "Exists"}],
        },
    }


def per_node(objects: list[dict[str, Any]], nodes: Mapping[str, NodePaths]) -> list[dict[str, Any]]:
    """The rendered chart with its kubelet plugin DaemonSet made one per node,
    each selecting its node and using that node's kubelet plugin, plugin
    registration and CDI directories (the paths the same inside the pod as
    on the host: the driver tells the kubelet its socket's path)."""
    out = []
    for obj in objects:
        if obj.get("kind") != "DaemonSet":
            out.append(obj)
            continue
        for node, paths in sorted(nodes.items()):
            out.append(_node_daemonset(obj, node, paths))
    return out


def _node_daemonset(daemonset: dict[str, Any], node: str, paths: NodePaths) -> dict[str, Any]:
    ds = copy.deepcopy(daemonset)
    ds["metadata"]["name"] = f"{daemonset['metadata']['name']}-{node}"
    ds["spec"]["selector"]["matchLabels"]["sunk.dev/test-node"] = node
    template = ds["spec"]["template"]
    template["metadata"].setdefault("labels", {})["sunk.dev/test-node"] = node
    pod = template["spec"]
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), "kubernetes.io/hostname": node}
    registry = str(paths.kubelet_dir / "plugins_registry")
    plugins = str(paths.kubelet_dir / "plugins")
    dirs = {"plugins-registry": registry, "plugins": plugins, "cdi": str(paths.cdi_dir)}
    for volume in pod["volumes"]:
        if volume["name"] in dirs:
            volume["hostPath"] = {"path": dirs[volume["name"]], "type": "DirectoryOrCreate"}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] in ("plugins-registry", "plugins"):
                mount["mountPath"] = dirs[mount["name"]]
        for env in container.get("env", []):
            if env["name"] == "KUBELET_REGISTRAR_DIRECTORY_PATH":
                env["value"] = registry
            elif env["name"] == "KUBELET_PLUGINS_DIRECTORY_PATH":
                env["value"] = plugins
        # No pod uid, so no rolling-update socket: its name (dra-<uid>.sock)
        # below a node's kubelet root here is longer than the 108 bytes a
        # Unix socket's path may have; the plain dra.sock fits.
        container["env"] = [e for e in container.get("env", []) if e["name"] != "POD_UID"]
    return ds


async def install_dra_driver(
    helm: Helm,
    kube: AsyncClient,
    image: Image,
    nodes: Mapping[str, NodePaths],
    values_dir: Path,
    log: Log,
    *,
    gpus: int,
    within: float = 180,
) -> None:
    """Render the driver's chart, apply it one DaemonSet per node, and
    return once every node has published `gpus` devices; idempotent."""
    started = time.monotonic()
    chart = ensure_dra_driver(log) / "charts" / "dra-example-driver"
    values_file = values_dir / "dra-example-driver-values.yaml"
    await asyncio.to_thread(values_dir.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(values_file.write_text, yaml.safe_dump(chart_values(image, gpus)))
    rendered = await asyncio.to_thread(
        helm.run,
        ["template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values_file)],
    )
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    namespace = Namespace(metadata=ObjectMeta(name=NAMESPACE))
    await kube.apply(namespace, field_manager=FIELD_MANAGER)
    # `helm template -n` puts the namespace in every namespaced object.
    for obj in per_node(objects, nodes):
        await kube.apply(codecs.from_dict(obj), field_manager=FIELD_MANAGER, force=True)

    async def published() -> bool:
        counts = await published_devices(kube)
        return all(counts.get(node) == gpus for node in nodes)

    try:
        await charts.wait_until(
            "the DRA example driver's devices on every node", published, within, 1
        )
    except TimeoutError as timed_out:
        pods = await charts.unready_pods(kube, NAMESPACE)
        raise TimeoutError(f"{timed_out}; pods of {NAMESPACE}:\n{pods}") from None
    seconds = time.monotonic() - started
    log(f"DRA example driver publishing {gpus} devices per node in {seconds:.1f}s")


async def published_devices(kube: AsyncClient) -> dict[str, int]:
    """Devices of the driver's ResourceSlices, by node."""
    counts: dict[str, int] = {}
    async for piece in kube.list(ResourceSlice, fields={"spec.driver": DRIVER}):
        node = piece.spec.nodeName if piece.spec else None
        if node:
            counts[node] = counts.get(node, 0) + len(piece.spec.devices or [])
    return counts
