"""Which pod a GPU allocation is for, and whether the kubelet may give it:
the pure decisions, then the plugin's gRPC answers over a real unix socket
with the port to the node's pods faked (the contract test runs it on real
kubelets). The device files are stand-ins made with mknod: no GPU here."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from lightkube.models.core_v1 import (
    Container,
    PodCondition,
    PodSpec,
    PodStatus,
    ResourceRequirements,
)
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Pod

from sunk.api import CONDITION_SLURM_GPUS, RESOURCE_NODE_GPUS
from sunk.gpus import choice
from sunk.gpus.choice import BoundPod, bound_pod, parse_gpus
from sunk.gpus.plugin import GpuInventory, GpuPlugin, NodeGpusPlugin, SocketDirs, serving
from sunk.gpus.proto import deviceplugin_pb2 as dp
from sunk.gpus.proto import deviceplugin_pb2_grpc as dp_grpc
from sunk.gpus.proto import pluginregistration_pb2 as reg
from sunk.gpus.proto import pluginregistration_pb2_grpc as reg_grpc
from sunk.gpus.run import GpuPluginConfig, GpuPluginMetrics, run_plugin

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
GPU = "nvidia.com/gpu"
NODE_GPUS = RESOURCE_NODE_GPUS
SLURM_NS = "slurm"


def at(seconds: int) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def placed(name: str, gpus: tuple[int, ...], created: int = 0, **extra: object) -> BoundPod:
    fields: dict[str, object] = {
        "namespace": "default",
        "name": name,
        "created": at(created),
        "phase": "Pending",
        "terminating": False,
        "slurm_gpus": gpus,
        "resources": frozenset({GPU}),
    }
    fields.update(extra)
    return BoundPod(**fields)  # type: ignore[arg-type]


def slurmd(name: str = "slurmd-0", **extra: object) -> BoundPod:
    fields: dict[str, object] = {
        "namespace": SLURM_NS,
        "name": name,
        "created": T0,
        "phase": "Pending",
        "terminating": False,
        "resources": frozenset({NODE_GPUS}),
        "nodeset_owned": True,
    }
    fields.update(extra)
    return BoundPod(**fields)  # type: ignore[arg-type]


# -- the condition -------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "indices"),
    [
        ("0,1", (0, 1)),
        ("3", (3,)),
        ("2, 1,2", (1, 2)),
        ("", None),
        (None, None),
        ("0,x", None),
        ("-1", None),
        ("0,,1", None),
    ],
)
def test_parse_gpus(message: str | None, indices: tuple[int, ...] | None) -> None:
    assert parse_gpus(message) == indices


def lightkube_pod(
    conditions: list[PodCondition] | None = None,
    owners: list[OwnerReference] | None = None,
    limits: dict[str, str] | None = None,
    deleting: bool = False,
    started: bool = False,
) -> Pod:
    return Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="default",
            creationTimestamp=T0,
            ownerReferences=owners,
            deletionTimestamp=T0 if deleting else None,
        ),
        spec=PodSpec(
            containers=[Container(name="main", resources=ResourceRequirements(limits=limits or {}))]
        ),
        status=PodStatus(phase="Pending", conditions=conditions, startTime=T0 if started else None),
    )


def test_a_pod_as_the_plugin_sees_it() -> None:
    condition = PodCondition(
        type=CONDITION_SLURM_GPUS, status="True", reason="AllocatedBySlurm", message="2,3"
    )
    seen = bound_pod(lightkube_pod([condition], limits={GPU: "2"}))
    assert seen == BoundPod(
        "default", "p", T0, "Pending", False, (2, 3), frozenset({GPU}), nodeset_owned=False
    )
    false = PodCondition(type=CONDITION_SLURM_GPUS, status="False", message="2,3")
    assert bound_pod(lightkube_pod([false])).slurm_gpus is None  # type: ignore[union-attr]
    other = PodCondition(type="Ready", status="True", message="2,3")
    assert bound_pod(lightkube_pod([other])).slurm_gpus is None  # type: ignore[union-attr]
    assert bound_pod(lightkube_pod(deleting=True)).terminating  # type: ignore[union-attr]
    assert bound_pod(lightkube_pod(started=True)).admitted  # type: ignore[union-attr]


def ref(api_version: str, kind: str, controller: bool | None = True) -> OwnerReference:
    return OwnerReference(
        apiVersion=api_version, kind=kind, name="n", uid="u", controller=controller
    )


@pytest.mark.parametrize(
    ("owner", "owned"),
    [
        (ref("sunk.dev/v1alpha1", "NodeSet"), True),
        (ref("sunk.dev/v1alpha1", "NodeSet", controller=None), False),
        (ref("evil.io/v1", "NodeSet"), False),
        (ref("apps/v1", "ReplicaSet"), False),
    ],
)
def test_nodeset_ownership(owner: OwnerReference, owned: bool) -> None:
    assert bound_pod(lightkube_pod(owners=[owner])).nodeset_owned is owned  # type: ignore[union-attr]


# -- preferred allocation ------------------------------------------------------

ALL4 = ["0", "1", "2", "3"]


def test_the_oldest_candidate_is_preferred() -> None:
    pods = [placed("young", (0, 1), created=20), placed("old", (2, 3), created=10)]
    pod, ids = choice.preferred_gpus(pods, ALL4, [], 2)
    assert (pod.name if pod else None, ids) == ("old", ["2", "3"])


def test_a_candidate_whose_gpus_are_not_all_available_is_passed_over() -> None:
    pods = [placed("old", (2, 3), created=10), placed("young", (0, 1), created=20)]
    pod, ids = choice.preferred_gpus(pods, ["0", "1", "2"], [], 2)
    assert (pod.name if pod else None, ids) == ("young", ["0", "1"])


def test_too_few_gpus_or_a_missing_must_include_pass_a_candidate_over() -> None:
    pods = [placed("one", (3,), created=1), placed("two", (0, 1), created=2)]
    assert choice.preferred_gpus(pods, ALL4, [], 2)[1] == ["0", "1"]
    assert choice.preferred_gpus(pods, ALL4, ["3"], 1)[1] == ["3"]
    assert choice.preferred_gpus(pods, ALL4, ["2"], 1) == (None, [])


def test_the_first_indices_up_to_the_size_with_must_include_first() -> None:
    pods = [placed("four", (0, 1, 2, 3))]
    assert choice.preferred_gpus(pods, ALL4, [], 2)[1] == ["0", "1"]
    assert choice.preferred_gpus(pods, ALL4, ["3"], 2)[1] == ["0", "3"]


def test_no_candidate_is_no_preference() -> None:
    pods = [
        placed("running", (0,), phase="Running"),
        placed("deleting", (1,), terminating=True),
        placed("unplaced", None),  # type: ignore[arg-type]
        # Admitted, its image still pulling: its GPUs are allocated already.
        placed("admitted", (2,), admitted=True),
    ]
    assert choice.preferred_gpus(pods, ALL4, [], 1) == (None, [])
    assert choice.preferred_gpus([], ALL4, [], 1) == (None, [])


# -- allocation ----------------------------------------------------------------


def test_an_allocation_is_allowed_only_within_one_candidates_gpus() -> None:
    pods = [placed("a", (0, 1), created=1), placed("b", (2, 3), created=2)]
    assert choice.gpus_allowed(pods, ["2", "3"]).name == "b"  # type: ignore[union-attr]
    assert choice.gpus_allowed(pods, ["0"]).name == "a"  # type: ignore[union-attr]
    assert choice.gpus_allowed(pods, ["1", "2"]) is None  # across two pods
    assert choice.gpus_allowed([placed("a", (0, 1), phase="Running")], ["0"]) is None
    assert choice.gpus_allowed([placed("a", (0, 1), terminating=True)], ["0"]) is None
    assert choice.gpus_allowed([placed("a", (0, 1), admitted=True)], ["0"]) is None
    assert choice.gpus_allowed([placed("a", None)], ["0"]) is None  # type: ignore[arg-type]


def test_every_gpu_goes_only_to_a_pending_slurmd_pod_of_the_slurm_namespace() -> None:
    assert choice.node_gpus_allowed([slurmd()], NODE_GPUS, SLURM_NS).name == "slurmd-0"  # type: ignore[union-attr]
    refused = [
        slurmd(nodeset_owned=False),
        slurmd(namespace="default"),
        slurmd(resources=frozenset({GPU})),
        slurmd(phase="Running"),
        slurmd(terminating=True),
    ]
    for pod in refused:
        assert choice.node_gpus_allowed([pod], NODE_GPUS, SLURM_NS) is None, pod


def test_refusals_say_why() -> None:
    said = choice.gpus_refusal(GPU, ["3", "10", "2"], "kn-1")
    assert said.startswith("nvidia.com/gpu 2,3,10: these GPUs were not allocated by Slurm")
    assert "kn-1" in said
    said = choice.node_gpus_refusal(NODE_GPUS, "kn-1", SLURM_NS)
    assert "slurmd pod of a NodeSet in namespace slurm" in said


# -- the plugin over gRPC, the node's pods faked ------------------------------


class FakePods:
    def __init__(self, pods: list[BoundPod]) -> None:
        self.pods = pods
        self.fail = False

    async def on_node(self) -> list[BoundPod]:
        if self.fail:
            raise RuntimeError("apiserver unreachable")
        return list(self.pods)


class Served:
    def __init__(
        self, dirs: SocketDirs, pods: FakePods, devices: Path, inventory: GpuInventory
    ) -> None:
        self.dirs, self.pods, self.devices, self.inventory = dirs, pods, devices, inventory

    def plugin(self, resource: str) -> dp_grpc.DevicePluginStub:
        channel = grpc.aio.insecure_channel(f"unix:{self.dirs.plugin_socket(resource)}")
        return dp_grpc.DevicePluginStub(channel)

    def registration(self, resource: str) -> reg_grpc.RegistrationStub:
        channel = grpc.aio.insecure_channel(f"unix:{self.dirs.registration_socket(resource)}")
        return reg_grpc.RegistrationStub(channel)


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    devices = tmp_path / "dev"
    devices.mkdir()
    for index in range(4):  # stand-ins: no GPU here
        os.mknod(devices / f"nvidia{index}", stat.S_IFCHR | 0o666, os.makedev(195, index))
    dirs = SocketDirs(tmp_path / "plugins", tmp_path / "registry", Path("/host/plugins"))
    pods = FakePods([])
    inventory = GpuInventory(devices)
    inventory.scan()
    gpus = GpuPlugin(GPU, "kn-1", inventory, pods)
    node_gpus = NodeGpusPlugin(NODE_GPUS, "kn-1", inventory, pods, SLURM_NS)
    async with serving(GPU, gpus, dirs), serving(NODE_GPUS, node_gpus, dirs):
        yield Served(dirs, pods, devices, inventory)
    assert list(dirs.registry_dir.iterdir()) == []  # deregistered
    assert list(dirs.socket_dir.iterdir()) == []


async def test_registration_names_the_resource_and_the_socket_as_the_kubelet_sees_it(
    served: Served,
) -> None:
    assert served.dirs.registration_socket(GPU).name == "nvidia.com-gpu-reg.sock"
    info = await served.registration(GPU).GetInfo(reg.InfoRequest())
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DevicePlugin",
        GPU,
        ["v1beta1"],
    )
    assert info.endpoint == "/host/plugins/nvidia.com-gpu.sock"
    await served.registration(GPU).NotifyRegistrationStatus(
        reg.RegistrationStatus(plugin_registered=False, error="refused")
    )


async def test_devices_are_listed_and_follow_the_directory(served: Served) -> None:
    options = await served.plugin(GPU).GetDevicePluginOptions(dp.Empty())
    assert options.get_preferred_allocation_available
    gpus = served.plugin(GPU).ListAndWatch(dp.Empty())
    nodes = served.plugin(NODE_GPUS).ListAndWatch(dp.Empty())

    async def listed(stream: Any) -> list[tuple[str, str]]:
        answer = await asyncio.wait_for(stream.read(), 5)
        return [(d.ID, d.health) for d in answer.devices]

    assert await listed(gpus) == [(str(i), "Healthy") for i in range(4)]
    assert await listed(nodes) == [("all", "Healthy")]
    (served.devices / "nvidia3").unlink()
    assert served.inventory.scan()
    assert await listed(gpus) == [(str(i), "Healthy") for i in range(3)] + [("3", "Unhealthy")]
    for index in range(3):
        (served.devices / f"nvidia{index}").unlink()
    assert served.inventory.scan()
    # slurmd's one device stays, GPUs or none (what the NodeSet counts on).
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(nodes.read()), 0.3)
    assert await listed(gpus) == [(str(i), "Unhealthy") for i in range(4)]
    gpus.cancel()
    nodes.cancel()


async def test_allocate_hands_slurms_gpus_and_refuses_others(served: Served) -> None:
    served.pods.pods = [placed("job", (2, 3))]
    stub = served.plugin(GPU)
    preferred = await stub.GetPreferredAllocation(
        dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=ALL4, allocation_size=2)
            ]
        )
    )
    assert list(preferred.container_responses[0].deviceIDs) == ["2", "3"]
    answer = await stub.Allocate(
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["3", "2"])])
    )
    got = answer.container_responses[0]
    # The node's CDI devices alone: no device spec, no environment.
    assert [d.name for d in got.cdi_devices] == ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]
    assert (list(got.devices), dict(got.envs), list(got.mounts)) == ([], {}, [])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["0"])])
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not allocated by Slurm" in (refused.value.details() or "")


async def test_no_pod_to_read_is_no_preference_but_a_refused_allocation(served: Served) -> None:
    served.pods.fail = True
    stub = served.plugin(GPU)
    preferred = await stub.GetPreferredAllocation(
        dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=ALL4, allocation_size=1)
            ]
        )
    )
    assert list(preferred.container_responses[0].deviceIDs) == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["0"])])
        )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_every_gpu_to_the_slurmd_pod_only(served: Served) -> None:
    stub = served.plugin(NODE_GPUS)
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=["all"])]
    )
    served.pods.pods = [slurmd(nodeset_owned=False)]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Allocate(request)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    served.pods.pods = [slurmd()]
    answer = await stub.Allocate(request)
    got = answer.container_responses[0]
    assert [d.name for d in got.cdi_devices] == ["nvidia.com/gpu=all"]
    assert (list(got.devices), dict(got.envs)) == ([], {})


async def test_a_node_without_gpus_gives_the_slurmd_pod_no_cdi_device(served: Served) -> None:
    """The spec of a node without GPUs has no `all`: naming it would stop the pod."""
    for index in range(4):
        (served.devices / f"nvidia{index}").unlink()
    assert served.inventory.scan()
    served.pods.pods = [slurmd()]
    answer = await served.plugin(NODE_GPUS).Allocate(
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["all"])])
    )
    assert list(answer.container_responses[0].cdi_devices) == []


async def test_no_gpu_is_served_while_the_toolkit_lets_a_container_take_them(
    tmp_path: Path,
) -> None:
    """NVIDIA's toolkit as shipped (its envvar setting left out, so true):
    the plugin does not register with the kubelet and says so in its metric;
    once the setting is false it registers."""
    toolkit = tmp_path / "config.toml"
    toolkit.write_text('[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n')
    config = GpuPluginConfig(
        node="kn-1",
        slurmd_namespace=SLURM_NS,
        device_dir=tmp_path / "dev",
        socket_dir=tmp_path / "plugins",
        registry_dir=tmp_path / "registry",
        rescan_seconds=0.05,
        toolkit_config=toolkit,
    )
    metrics = GpuPluginMetrics()
    registration = SocketDirs(config.socket_dir, config.registry_dir).registration_socket(GPU)
    task = asyncio.create_task(run_plugin(config, FakePods([]), metrics))
    try:
        await asyncio.sleep(0.3)
        assert not registration.exists()
        assert metrics.registry.get_sample_value("sunk_gpu_plugin_toolkit_unsafe") == 1
        toolkit.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n")
        async with asyncio.timeout(5):
            while not registration.exists():
                await asyncio.sleep(0.05)
        assert metrics.registry.get_sample_value("sunk_gpu_plugin_toolkit_unsafe") == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
