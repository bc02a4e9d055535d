"""What sunk's container steps get of the node's CDI edits for its GPUs
(sunk.gpus.step_edits), and the GPU plugin handing them to the slurmd pod.

Stand-ins, named: the specs are the one sunk makes for a stand-in node
(device nodes made with mknod, NVIDIA's major numbers, no driver; empty
driver files) and hand-written ones shaped like `nvidia-ctk cdi generate`'s.
The SPANK plugin that applies the lines runs on the bed: test_local_up_gpus.
"""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.cdi_specs import NVIDIA_CTK_SPEC as NVIDIA
from sunk.api import RESOURCE_NODE_GPUS
from sunk.gpus.cdi import ContainerEdits, Device, DeviceNode, Mount, Spec, SpecError, spec_json
from sunk.gpus.choice import BoundPod
from sunk.gpus.inventory import find_nvidia, nvidia_spec
from sunk.gpus.plugin import GpuInventory, NodeGpusPlugin
from sunk.gpus.proto import deviceplugin_pb2 as dp
from sunk.gpus.step_edits import ENV, read_specs, step_edits

pytestmark = pytest.mark.unit

KIND = "nvidia.com/gpu"

# nvidia-ctk names each GPU by index and by UUID (the same device node).
NVIDIA_CTK_SPEC = NVIDIA.replace(
    '- name: "1"',
    "- name: GPU-4f1e6b38-0d2c-4a0c-9d1e-6a1b2c3d4e5f\n"
    "  containerEdits:\n"
    "    deviceNodes:\n"
    "    - path: /dev/nvidia0\n"
    '- name: "1"',
)


def lines(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in text.splitlines()]  # type: ignore[misc]


def test_each_gpu_node_once_then_what_every_gpu_process_gets(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text(NVIDIA_CTK_SPEC)
    assert lines(step_edits(read_specs([tmp_path]), KIND)) == [
        ("gpu", "/dev/nvidia0"),
        ("gpu", "/dev/nvidia1"),
        ("node", "/dev/nvidiactl"),
        ("node", "/dev/nvidia-uvm"),
        ("mount", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"),
        ("env", "NVIDIA_VISIBLE_DEVICES=void"),
    ]


def test_the_spec_sunk_makes_for_a_node_gives_its_gpus_control_nodes_and_driver(
    tmp_path: Path,
) -> None:
    dev, root = tmp_path / "dev", tmp_path / "root"
    dev.mkdir()
    for index in range(2):
        os.mknod(dev / f"nvidia{index}", stat.S_IFCHR | 0o666, os.makedev(195, index))
    os.mknod(dev / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("")
    got = lines(step_edits([nvidia_spec(find_nvidia(dev=dev, root=root))], KIND))
    assert got == [
        ("gpu", "/dev/nvidia0"),
        ("gpu", "/dev/nvidia1"),
        ("node", "/dev/nvidiactl"),
        ("mount", "/usr/bin/nvidia-smi"),
    ]


def test_other_kinds_give_nothing_and_a_devices_own_mounts_come_with_any_gpu() -> None:
    other = Spec(
        "0.5.0",
        "example.com/fpga",
        (Device("0", ContainerEdits(device_nodes=(DeviceNode("/dev/fpga0"),))),),
    )
    own = Spec(
        "0.5.0",
        KIND,
        (
            Device(
                "0",
                ContainerEdits(
                    device_nodes=(DeviceNode("/dev/nvidia0"),),
                    mounts=(Mount("/x", "/usr/lib/firmware/gsp.bin"),),
                    env=("A=1",),
                ),
            ),
        ),
    )
    assert lines(step_edits([other, own], KIND)) == [
        ("gpu", "/dev/nvidia0"),
        ("mount", "/usr/lib/firmware/gsp.bin"),
        ("env", "A=1"),
    ]
    assert step_edits([other], KIND) == ""


def test_a_line_break_is_refused_naming_the_kind_and_edit() -> None:
    spec = Spec("0.5.0", KIND, (), ContainerEdits(env=("A=one\ntwo",)))
    with pytest.raises(SpecError, match=r"nvidia.com/gpu: env 'A=one\\ntwo'"):
        step_edits([spec], KIND)


def test_specs_that_cannot_be_read_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")  # no devices
    (tmp_path / "b.json").write_text(NVIDIA)  # YAML in a .json: still read
    (tmp_path / "c.txt").write_text("not a spec's suffix")
    specs = read_specs([tmp_path, tmp_path / "missing"])
    assert [s.kind for s in specs] == [KIND]


paths = st.lists(
    st.from_regex(r"/[a-z0-9_.-]{1,12}(/[a-z0-9_. -]{1,12}){0,3}", fullmatch=True),
    max_size=6,
    unique=True,
)


@given(gpus=paths, nodes=paths, mounts=paths)
def test_every_edit_comes_back_from_its_line(
    gpus: list[str], nodes: list[str], mounts: list[str]
) -> None:
    """What the SPANK plugin reads: a word, one space, the rest of the line."""
    nodes = [n for n in nodes if n not in gpus]
    spec = Spec(
        "0.5.0",
        KIND,
        tuple(
            Device(str(i), ContainerEdits(device_nodes=(DeviceNode(p),)))
            for i, p in enumerate(gpus)
        ),
        ContainerEdits(
            device_nodes=tuple(DeviceNode(p) for p in nodes),
            mounts=tuple(Mount("/host" + p, p) for p in mounts),
        ),
    )
    got = lines(step_edits([spec], KIND))
    assert got == [("gpu", p) for p in gpus] + [("node", p) for p in nodes] + [
        ("mount", p) for p in mounts
    ]


class OnePod:
    def __init__(self, pod: BoundPod) -> None:
        self.pod = pod

    async def on_node(self) -> list[BoundPod]:
        return [self.pod]


async def test_the_slurmd_pod_gets_the_edits_beside_every_gpu(tmp_path: Path) -> None:
    dev, specs = tmp_path / "dev", tmp_path / "cdi"
    dev.mkdir()
    specs.mkdir()
    os.mknod(dev / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    (specs / "nvidia.json").write_text(spec_json(nvidia_spec(find_nvidia(dev=dev, root=tmp_path))))
    inventory = GpuInventory(dev)
    inventory.scan()
    slurmd = BoundPod(
        namespace="slurm",
        name="slurmd-0",
        created=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        phase="Pending",
        terminating=False,
        resources=frozenset({RESOURCE_NODE_GPUS}),
        nodeset_owned=True,
    )
    plugin = NodeGpusPlugin(RESOURCE_NODE_GPUS, "kn-1", inventory, OnePod(slurmd), "slurm", [specs])
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=["all"])]
    )
    answer = (await plugin.Allocate(request, None)).container_responses[0]  # type: ignore[arg-type]
    assert [d.name for d in answer.cdi_devices] == ["nvidia.com/gpu=all"]
    assert dict(answer.envs) == {ENV: "gpu /dev/nvidia0\n"}
    # Without spec directories: the CDI device alone.
    plugin.cdi_spec_dirs = ()
    answer = (await plugin.Allocate(request, None)).container_responses[0]  # type: ignore[arg-type]
    assert dict(answer.envs) == {}
