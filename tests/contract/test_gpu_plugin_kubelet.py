"""`sunk gpu-plugin` on the bed's real kubelets (v1.36, with containerd).

The plugin runs in this process (asyncio, `sunk.gpus.run.run_plugin`, reading
pods through the real apiserver) for one node, and registers through that
node's own plugin watcher directory (`<kubelet --root-dir>/plugins_registry`);
the kubelet finds it, connects, and runs its pods with what it answers.

Stand-ins: no GPU exists on this machine. The four "GPUs" are character
devices made here with mknod (`nvidia0`..`nvidia3`, major 195 as NVIDIA's
driver makes them, beside `nvidiactl`, `nvidia-uvm` and the rest; no driver
loaded: opening one gives ENXIO), with a stand-in `libcuda.so.1` and
`nvidia-smi`, and the CDI spec NVIDIA's toolkit would write for them in the
node's CDI directory (sunk_testbed.gpus). The plugin answers CDI device
names; the node's containerd applies the spec's edits. What the tests show
is which devices and files a container is given, not that a GPU works.

The scheduler's part is played by the test: it writes the pod's status
condition `sunk.dev/SlurmGPUs` with the scheduler's own patch
(`sunk.scheduler.pod_writes.slurm_gpus_patch`) and binds the pod through the
Binding subresource; the pods name a schedulerName nobody serves, so nothing
else places them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.types import PatchType

from plugins.gpu_probe import PROBE, gpu_nodes, read_probe
from plugins.kube import TEST_LABEL
from plugins.nodes import RealNodes
from plugins.slurm_pods import wait_for
from sunk.api import nodeset as nodeset_api
from sunk.api.install import install_crds
from sunk.gpus.plugin import KubeBoundPods
from sunk.gpus.run import GpuPluginConfig, GpuPluginMetrics, run_plugin
from sunk.kube.raw import bind_pod
from sunk.scheduler.pod_writes import slurm_gpus_patch
from sunk_testbed import gpus as stand_in

pytestmark = pytest.mark.contract

NOBODY = "nobody-serves-this"  # a schedulerName: the pods stay unbound until the test binds them


# The GPUs' resource here: not nvidia.com/gpu, which the kubelet keeps managing
# (at zero) once a plugin has served it, and which the scheduler's e2e bed
# advertises on these same nodes by a status patch the kubelet would overwrite.
GPU_RESOURCE = "contract.sunk.dev/gpu"
# Likewise for slurmd's resource: at 0 on a node, the NodeSet would make no
# slurmd pod there (it waits for the plugin), and later modules use the node.
NODE_RESOURCE = "contract.sunk.dev/node-gpus"


@dataclass(frozen=True)
class PluginOnNode:
    node: str
    config: GpuPluginConfig
    metrics: GpuPluginMetrics


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gpu_plugin(
    kube: AsyncClient, kubelet_nodes: RealNodes, testbed_state_dir: Path
) -> AsyncIterator[PluginOnNode]:
    """The plugin for the last node, with four stand-in devices."""
    node = kubelet_nodes.names[-1]
    kubelet_dir = kubelet_nodes.group.paths(node).kubelet_dir
    here = testbed_state_dir / "gpu-plugin" / node
    devices = stand_in.stand_in_gpus(here / "dev", 4)
    spec_dirs = [kubelet_nodes.group.paths(node).cdi_dir]
    stand_in.write_cdi_spec(spec_dirs, devices, stand_in.stand_in_driver(here / "driver"))
    config = GpuPluginConfig(
        node=node,
        # The plugin's --slurmd-namespace, made by the NodeSet test.
        slurmd_namespace=f"t-gpu-plugin-slurm-{secrets.token_hex(3)}",
        resource=GPU_RESOURCE,
        node_resource=NODE_RESOURCE,
        device_dir=devices,
        socket_dir=kubelet_dir / "plugins" / "sunk.dev",
        registry_dir=kubelet_dir / "plugins_registry",
    )
    metrics = GpuPluginMetrics()
    task = asyncio.create_task(run_plugin(config, KubeBoundPods(kube, node), metrics))
    try:
        yield PluginOnNode(node, config, metrics)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stand_in.remove_cdi_spec(spec_dirs)


def gpu_pod(name: str, namespace: str, image: str, resource: str, count: int, **meta: Any) -> Pod:
    return Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": {
                "schedulerName": NOBODY,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", PROBE],
                        # CUDA images set it so; NVIDIA's hook would read it.
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }
    )


async def slurm_gpus(kube: AsyncClient, name: str, namespace: str, gpus: tuple[int, ...]) -> None:
    """What the scheduler writes before it binds: its own patch of pods/status."""
    patch = slurm_gpus_patch(gpus, datetime.datetime.now(datetime.UTC))
    await kube.patch(Pod.Status, name, patch, namespace=namespace, patch_type=PatchType.STRATEGIC)


async def create_and_bind(
    kube: AsyncClient, pod: Pod, node: str, gpus: tuple[int, ...] = ()
) -> str:
    assert pod.metadata is not None
    assert pod.metadata.name
    assert pod.metadata.namespace
    name, namespace = pod.metadata.name, pod.metadata.namespace
    created = await kube.create(pod)
    if gpus:
        await slurm_gpus(kube, name, namespace, gpus)
    assert created.metadata is not None
    assert created.metadata.uid
    await bind_pod(kube, namespace, name, node, created.metadata.uid)
    return name


async def finished(kube: AsyncClient, name: str, namespace: str) -> Pod:
    got: Pod | None = None

    async def done() -> bool:
        nonlocal got
        got = await kube.get(Pod, name, namespace=namespace)
        return bool(got.status and got.status.phase in ("Succeeded", "Failed"))

    await wait_for(f"pod {name} finished", done, 120)
    assert got is not None
    return got


async def logs(kube: AsyncClient, name: str, namespace: str) -> list[str]:
    return [line.rstrip("\n") async for line in kube.log(name, namespace=namespace)]


async def delete(kube: AsyncClient, name: str, namespace: str) -> None:
    with contextlib.suppress(ApiError):
        await kube.delete(Pod, name, namespace=namespace, grace_period=0)


async def listed(kube: AsyncClient, gpu_plugin: PluginOnNode) -> float:
    """Seconds until the node reports 4 GPUs and one `sunk.dev/node-gpus`."""
    started = time.monotonic()
    wanted = {GPU_RESOURCE: "4", NODE_RESOURCE: "1"}

    async def shown() -> bool:
        node = await kube.get(Node, gpu_plugin.node)
        status = node.status
        assert status is not None
        capacity, allocatable = status.capacity or {}, status.allocatable or {}
        return all(capacity.get(k) == v and allocatable.get(k) == v for k, v in wanted.items())

    await wait_for("the node's GPUs in its capacity and allocatable", shown, 60)
    return time.monotonic() - started


async def test_the_kubelet_lists_both_resources(
    kube: AsyncClient, gpu_plugin: PluginOnNode
) -> None:
    """(a) Registered through the node's plugin watcher directory, the kubelet
    reports both resources in the Node's capacity and allocatable; the
    plugin's metrics say it serves them, and how many GPUs it found."""
    print(f"registered and listed in {await listed(kube, gpu_plugin):.1f} s")
    registry = gpu_plugin.metrics.registry
    assert registry.get_sample_value("sunk_gpu_plugin_serving") == 1
    assert registry.get_sample_value("sunk_gpu_plugin_gpus") == 4


async def test_a_pod_gets_exactly_the_gpus_slurm_allocated(
    kube: AsyncClient, kubelet_nodes: RealNodes, gpu_plugin: PluginOnNode, namespace: str
) -> None:
    """(b) The condition says 2,3: the container has /dev/nvidia2 and
    /dev/nvidia3 and the control nodes, no other NVIDIA device, the driver's
    library and tool; CUDA and nvidia-smi count two GPUs, whatever
    NVIDIA_VISIBLE_DEVICES=all in its environment says."""
    await listed(kube, gpu_plugin)
    image = kubelet_nodes.images.slurm.ref
    pod = gpu_pod("slurm-placed", namespace, image, GPU_RESOURCE, 2)
    name = await create_and_bind(kube, pod, gpu_plugin.node, gpus=(2, 3))
    try:
        got = await finished(kube, name, namespace)
        out = await logs(kube, name, namespace)
        assert got.status is not None
        assert got.status.phase == "Succeeded", (got.status, out)
        seen = read_probe(out)
        assert seen.devices == gpu_nodes((2, 3)), out
        assert {"/usr/bin/nvidia-smi"} < seen.files, out
        assert any(f.endswith("/libcuda.so.1") for f in seen.files), out
        assert (seen.cuda_gpus, len(seen.smi)) == (2, 2), out
        assert seen.env == "all", out  # the pod's own, and nothing read it
    finally:
        await delete(kube, name, namespace)


async def test_gpus_slurm_did_not_allocate_are_refused(
    kube: AsyncClient, kubelet_nodes: RealNodes, gpu_plugin: PluginOnNode, namespace: str
) -> None:
    """(c) A pod bound without the scheduler's condition: the kubelet fails
    its admission with the plugin's refusal."""
    await listed(kube, gpu_plugin)
    image = kubelet_nodes.images.slurm.ref
    name = await create_and_bind(
        kube, gpu_pod("unplaced", namespace, image, GPU_RESOURCE, 1), gpu_plugin.node
    )
    try:
        got = await finished(kube, name, namespace)
        assert got.status is not None
        assert got.status.phase == "Failed"
        assert got.status.reason == "UnexpectedAdmissionError", got.status
        assert "not allocated by Slurm" in (got.status.message or ""), got.status.message
        print(f"refused: {got.status.message}")
    finally:
        await delete(kube, name, namespace)


@pytest_asyncio.fixture(loop_scope="session")
async def slurmd_namespace(kube: AsyncClient, gpu_plugin: PluginOnNode) -> AsyncIterator[str]:
    """The plugin's --slurmd-namespace, made for one test."""
    name = gpu_plugin.config.slurmd_namespace
    await kube.create(Namespace(metadata=ObjectMeta(name=name, labels={TEST_LABEL: "true"})))

    async def account() -> bool:
        try:
            await kube.get(ServiceAccount, "default", namespace=name)
        except ApiError:
            return False
        return True

    await wait_for("the namespace's default ServiceAccount", account, 30)
    try:
        yield name
    finally:
        await kube.deletecollection(Pod, namespace=name, grace_period=0)
        await kube.delete(Namespace, name)


async def test_every_gpu_goes_only_to_a_nodesets_pod(
    kube: AsyncClient, kubelet_nodes: RealNodes, gpu_plugin: PluginOnNode, slurmd_namespace: str
) -> None:
    """(d) `sunk.dev/node-gpus` in the Slurm namespace: refused to a pod no
    NodeSet controls; a pod whose controller is a NodeSet (a real one, made
    here; no operator runs) gets the CDI spec's `all`: all four GPUs, the
    control nodes and the driver's files."""
    await listed(kube, gpu_plugin)
    image = kubelet_nodes.images.slurm.ref
    name = await create_and_bind(
        kube,
        gpu_pod("not-slurmd", slurmd_namespace, image, NODE_RESOURCE, 1),
        gpu_plugin.node,
    )
    try:
        got = await finished(kube, name, slurmd_namespace)
        assert got.status is not None
        assert (got.status.phase, got.status.reason) == ("Failed", "UnexpectedAdmissionError")
        assert "goes only to a slurmd pod of a NodeSet" in (got.status.message or "")
    finally:
        await delete(kube, name, slurmd_namespace)

    async with asyncio.timeout(60):
        await install_crds(kube)
    nodeset = await kube.create(
        nodeset_api.resource()(
            {
                "apiVersion": nodeset_api.API_VERSION,
                "kind": nodeset_api.KIND,
                "metadata": {"name": "gpus"},
                "spec": {
                    "template": {"spec": {"containers": [{"name": "slurmd", "image": image}]}}
                },
            }
        ),
        namespace=slurmd_namespace,
    )
    owner = {
        "apiVersion": nodeset_api.API_VERSION,
        "kind": nodeset_api.KIND,
        "name": "gpus",
        "uid": nodeset["metadata"]["uid"],
        "controller": True,
    }
    pod = gpu_pod("slurmd", slurmd_namespace, image, NODE_RESOURCE, 1, ownerReferences=[owner])
    name = await create_and_bind(kube, pod, gpu_plugin.node)
    try:
        got = await finished(kube, name, slurmd_namespace)
        out = await logs(kube, name, slurmd_namespace)
        assert got.status is not None
        assert got.status.phase == "Succeeded", (got.status, out)
        seen = read_probe(out)
        assert seen.devices == gpu_nodes(range(4)), out
        assert (seen.cuda_gpus, len(seen.smi)) == (4, 4), out
    finally:
        await delete(kube, name, slurmd_namespace)
        with contextlib.suppress(ApiError):
            await kube.delete(nodeset_api.resource(), "gpus", namespace=slurmd_namespace)
