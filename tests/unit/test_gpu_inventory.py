"""What NVIDIA's driver puts on a node (sunk.gpus.inventory), and the CDI spec
made for it; the gres.conf lines NVML's answers give (sunk.gpus.nvml).

Stand-ins, named: the device nodes are made with mknod (NVIDIA's major
numbers, no driver behind them) in a temporary /dev, and the driver's files
are empty files laid out as NVIDIA's installer and the GPU Operator's driver
container lay them out (`/usr/local/nvidia/lib64`, a distribution's
`/usr/lib/x86_64-linux-gnu`). The same code on a real H200 node:
scripts/gpu-check-real-node.py, docs/gpus.md.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sunk.gpus.cdi import DeviceNode, Hook, parse_spec, spec_json
from sunk.gpus.inventory import find_nvidia, library_folders, library_names, nvidia_spec
from sunk.gpus.nvml import NvmlGpu, cores_of, gres_lines, gres_type, ranges

pytestmark = pytest.mark.unit

VERSION = "580.159.04"


def node(tmp_path: Path, gpus: int = 2) -> tuple[Path, Path]:
    dev, root = tmp_path / "dev", tmp_path / "root"
    (dev / "nvidia-caps").mkdir(parents=True)
    for index in range(gpus):
        os.mknod(dev / f"nvidia{index}", stat.S_IFCHR | 0o666, os.makedev(195, index))
    os.mknod(dev / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    os.mknod(dev / "nvidia-uvm", stat.S_IFCHR | 0o666, os.makedev(238, 0))
    os.mknod(dev / "nvidia-caps/nvidia-cap1", stat.S_IFCHR | 0o400, os.makedev(237, 1))
    (dev / "nvidia-modeset").write_text("a regular file is no device")
    lib = root / "usr/local/nvidia/lib64"
    lib.mkdir(parents=True)
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        (lib / f"{name}.{VERSION}").write_text("")
        (lib / f"{name}.1").symlink_to(f"{name}.{VERSION}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")  # the development link: left out
    (lib / "libnvidia-glcore.so.580.159.04").write_text("")  # graphics: not compute
    (root / "usr/local/nvidia/bin").mkdir()
    (root / "usr/local/nvidia/bin/nvidia-smi").write_text("")
    return dev, root


def test_the_node_is_found_as_the_driver_laid_it_out(tmp_path: Path) -> None:
    dev, root = node(tmp_path)
    found = find_nvidia(dev=dev, root=root)
    assert found.gpus == ((0, "/dev/nvidia0"), (1, "/dev/nvidia1"))
    assert found.control == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1")
    assert found.libraries == tuple(
        f"/usr/local/nvidia/lib64/{name}"
        for name in sorted(
            f"{lib}.{suffix}"
            for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")
            for suffix in ("1", VERSION)
        )
    )
    assert found.binaries == ("/usr/local/nvidia/bin/nvidia-smi",)
    assert found.hook is None


def test_the_spec_is_nvidias_shape_one_device_per_gpu_and_all(tmp_path: Path) -> None:
    dev, root = node(tmp_path)
    spec = nvidia_spec(find_nvidia(dev=dev, root=root))
    assert spec.names() == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]
    assert parse_spec(spec_json(spec)) == spec
    one = spec.resolve(["nvidia.com/gpu=1"])
    assert one.device_nodes == (
        DeviceNode("/dev/nvidiactl", host_path=str(dev / "nvidiactl")),
        DeviceNode("/dev/nvidia-uvm", host_path=str(dev / "nvidia-uvm")),
        DeviceNode("/dev/nvidia-caps/nvidia-cap1", host_path=str(dev / "nvidia-caps/nvidia-cap1")),
        DeviceNode("/dev/nvidia1", host_path=str(dev / "nvidia1")),
    )
    libcuda = [m for m in one.mounts if m.container_path.endswith("libcuda.so.1")]
    assert [(m.host_path, m.options) for m in libcuda] == [
        (f"{root}/usr/local/nvidia/lib64/libcuda.so.1", ("ro", "nosuid", "nodev", "bind"))
    ]
    assert library_folders(one) == ["/usr/local/nvidia/lib64"]
    every = spec.resolve(["nvidia.com/gpu=all"])
    assert {n.path for n in every.device_nodes} >= {"/dev/nvidia0", "/dev/nvidia1"}


def test_the_real_dev_needs_no_host_paths(tmp_path: Path) -> None:
    dev, root = node(tmp_path)
    found = find_nvidia(dev=dev, root=root)
    on_node = type(found)(found.gpus, found.control, found.libraries, found.binaries)
    assert on_node.device_node("/dev/nvidia0") == DeviceNode("/dev/nvidia0")


def test_nvidias_hook_gives_the_library_folders_to_the_linker(tmp_path: Path) -> None:
    dev, root = node(tmp_path)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-cdi-hook").write_text("")
    spec = nvidia_spec(find_nvidia(dev=dev, root=root))
    assert spec.edits.hooks == (
        Hook(
            "createContainer",
            "/usr/bin/nvidia-cdi-hook",
            ("nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/local/nvidia/lib64"),
        ),
    )


def test_a_node_without_a_driver_has_nothing(tmp_path: Path) -> None:
    found = find_nvidia(dev=tmp_path / "none", root=tmp_path)
    assert (found.gpus, found.control, found.libraries, found.binaries) == ((), (), (), ())
    assert nvidia_spec(found).devices == ()


@pytest.mark.parametrize(
    ("name", "driver"),
    [
        ("libcuda.so.1", True),
        ("libcuda.so.580.159.04", True),
        ("libnvidia-ml.so.1", True),
        ("libnvidia-nvvm.so.4", True),
        ("libcuda.so", False),  # the development link
        ("libcudart.so.13", False),  # CUDA's runtime: the image's, not the driver's
        ("libnvidia-glcore.so.580.159.04", False),
        ("libcuda.so.1.bak", False),
        ("libnvidia-ml.so.1x", False),
    ],
)
def test_which_files_are_the_drivers_libraries(name: str, driver: bool) -> None:
    assert library_names([name]) == ([name] if driver else [])


# -------------------------------------------------------------------- NVML


def gpu(minor: int, name: str = "NVIDIA H200", cpus: tuple[int, ...] = tuple(range(16))) -> NvmlGpu:
    return NvmlGpu(index=minor, minor=minor, name=name, uuid=f"GPU-{minor}", cpus=cpus)


@pytest.mark.parametrize(
    ("gpus", "cpus", "threads", "lines"),
    [
        # The H200 machine of docs/gpus.md: one GPU near every CPU.
        ([gpu(0)], 16, 1, ["Name=gpu Type=nvidia_h200 File=/dev/nvidia0"]),
        (
            [gpu(i, cpus=tuple(range(0, 16))) for i in range(4)]
            + [gpu(i, cpus=tuple(range(16, 32))) for i in range(4, 8)],
            32,
            1,
            [
                "Name=gpu Type=nvidia_h200 File=/dev/nvidia[0-3] Cores=0-15",
                "Name=gpu Type=nvidia_h200 File=/dev/nvidia[4-7] Cores=16-31",
            ],
        ),
        # Two threads a core: CPUs 0-7 and their siblings 16-23 are cores 0-7.
        (
            [
                gpu(0, cpus=(*range(8), *range(16, 24))),
                gpu(1, cpus=(*range(8, 16), *range(24, 32))),
            ],
            32,
            2,
            [
                "Name=gpu Type=nvidia_h200 File=/dev/nvidia0 Cores=0-7",
                "Name=gpu Type=nvidia_h200 File=/dev/nvidia1 Cores=8-15",
            ],
        ),
        (
            [gpu(0, "NVIDIA A100-SXM4-80GB"), gpu(1, "NVIDIA H100 80GB HBM3"), gpu(3)],
            16,
            1,
            [
                "Name=gpu Type=nvidia_a100-sxm4-80gb File=/dev/nvidia0",
                "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia1",
                "Name=gpu Type=nvidia_h200 File=/dev/nvidia3",
            ],
        ),
        ([], 16, 1, []),
    ],
)
def test_gres_lines_group_gpus_alike(
    gpus: list[NvmlGpu], cpus: int, threads: int, lines: list[str]
) -> None:
    assert gres_lines(gpus, cpus, threads) == lines


def test_gres_types_and_ranges_are_spelled_as_slurm_spells_them() -> None:
    assert gres_type("NVIDIA  H200 ") == "nvidia_h200"
    assert ranges([5, 0, 1, 2, 2, 9, 8]) == "0-2,5,8-9"
    assert ranges([]) == ""
    assert cores_of([0, 16, 1], cpu_count=32, threads_per_core=2) == (0, 1)
