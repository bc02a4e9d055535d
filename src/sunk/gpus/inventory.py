"""What NVIDIA's driver puts on a node, and the CDI spec that hands it out.

`find_nvidia` lists a node's NVIDIA device nodes (one `nvidia<N>` per GPU; the
control nodes every CUDA process opens: `nvidiactl`, `nvidia-uvm`,
`nvidia-uvm-tools`, `nvidia-modeset`), the driver's user-space libraries
(`libcuda`, `libnvidia-ml` and the rest of the compute and utility set) and
its tools (`nvidia-smi`). `nvidia_spec` (pure) makes the CDI spec
`nvidia-ctk cdi generate` makes for them: kind `nvidia.com/gpu`, one device
per GPU (its device node) and `all`, the control nodes, libraries and tools
as the common edits, the libraries' folders given to the container's linker
cache by NVIDIA's `update-ldcache` hook where the node has the hook. On a
node with NVIDIA's toolkit, its own spec (/etc/cdi/nvidia.yaml) is read
instead; this one stands in where there is none, and is what the bed's
stand-in GPUs and the real-GPU check (docs/gpus.md) use.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sunk.gpus.cdi import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec
from sunk.gpus.devices import find_gpus

KIND = "nvidia.com/gpu"
CDI_VERSION = "0.5.0"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# The driver's libraries a CUDA or NVML program loads (nvidia-ctk's compute
# and utility sets): each is mounted by every name it has in its folder (the
# versioned file and its SONAME link).
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
)
LIBRARY_FILE = re.compile("(?:" + "|".join(map(re.escape, LIBRARIES)) + r")(?:\.\d+)+")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Where distributions, NVIDIA's installer and the GPU Operator's driver put them.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
)
BINARY_DIRS = ("/usr/bin", "/usr/local/nvidia/bin")
HOOK = "/usr/bin/nvidia-cdi-hook"  # NVIDIA's, from its container toolkit
READ_ONLY_BIND = ("ro", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class NvidiaNode:
    """What the driver put on a node (absolute paths on the node)."""

    gpus: tuple[tuple[int, str], ...]  # (index, device node under /dev), by index
    control: tuple[str, ...]  # device nodes every GPU process opens, under /dev
    libraries: tuple[str, ...]
    binaries: tuple[str, ...]
    hook: str | None = None  # NVIDIA's CDI hook, where the node has it
    dev: str = "/dev"  # where the device nodes are on the node
    root: str = "/"  # where the driver's files are on the node (host paths below it)

    def device_node(self, path: str) -> DeviceNode:
        """The device node `path` (under /dev in the container) from the node's."""
        if self.dev == "/dev":
            return DeviceNode(path)
        return DeviceNode(path, host_path=str(Path(self.dev) / Path(path).relative_to("/dev")))


def library_names(names: Iterable[str]) -> list[str]:
    """The entries of a folder that are driver libraries: `<library>.<N...>`
    of `LIBRARIES` (the versioned file and the SONAME link; the unversioned
    development link is left, as nvidia-ctk leaves it)."""
    return sorted(name for name in names if LIBRARY_FILE.fullmatch(name))


def find_nvidia(
    dev: Path = Path("/dev"),
    library_dirs: Sequence[str] = LIBRARY_DIRS,
    binary_dirs: Sequence[str] = BINARY_DIRS,
    root: Path = Path("/"),
) -> NvidiaNode:
    """The node's NVIDIA devices, libraries and tools. `root` is where the
    driver's files are seen from (`/run/nvidia/driver` under the GPU
    Operator's driver container); the paths found are the node's own."""
    gpus = tuple((index, f"/dev/nvidia{index}") for index in find_gpus(dev))
    control: list[str] = []
    for name in CONTROL_NODES:
        if _is_char_device(dev / name):
            control.append(f"/dev/{name}")
    caps = dev / "nvidia-caps"
    for name in sorted(_listing(caps)):
        if _is_char_device(caps / name):
            control.append(f"/dev/nvidia-caps/{name}")
    libraries: list[str] = []
    seen: set[str] = set()
    for folder in library_dirs:
        here = root / folder.lstrip("/")
        real = os.path.realpath(here)
        if real in seen:
            continue  # /usr/lib64 -> /usr/lib and the like
        seen.add(real)
        libraries.extend(str(Path(folder) / n) for n in library_names(_listing(here)))
    binaries = [
        str(Path(folder) / name)
        for folder in binary_dirs
        for name in BINARIES
        if (root / folder.lstrip("/") / name).is_file()
    ]
    hook = HOOK if (root / HOOK.lstrip("/")).is_file() else None
    return NvidiaNode(
        gpus=gpus,
        control=tuple(control),
        libraries=tuple(libraries),
        binaries=tuple(dict.fromkeys(binaries)),
        hook=hook,
        dev=str(dev),
        root=str(root),
    )


def nvidia_spec(node: NvidiaNode) -> Spec:
    """The CDI spec nvidia-ctk would write for `node`: device `<index>` per GPU
    and `all`; the rest common to them. The driver's files, found below
    `node.root`, are seen at their own paths in the container."""

    def host(path: str) -> str:
        return str(Path(node.root) / path.lstrip("/"))

    devices = [
        Device(str(index), ContainerEdits(device_nodes=(node.device_node(path),)))
        for index, path in node.gpus
    ]
    if devices:
        every = tuple(node.device_node(path) for _, path in node.gpus)
        devices.append(Device("all", ContainerEdits(device_nodes=every)))
    files = (*node.libraries, *node.binaries)
    mounts = tuple(Mount(host(path), path, options=READ_ONLY_BIND) for path in files)
    hooks: tuple[Hook, ...] = ()
    folders = sorted({str(Path(path).parent) for path in node.libraries})
    if node.hook and folders:
        args = ["nvidia-cdi-hook", "update-ldcache"]
        for folder in folders:
            args += ["--folder", folder]
        hooks = (Hook("createContainer", node.hook, tuple(args)),)
    common = ContainerEdits(
        device_nodes=tuple(node.device_node(path) for path in node.control),
        mounts=mounts,
        hooks=hooks,
    )
    return Spec(version=CDI_VERSION, kind=KIND, devices=tuple(devices), edits=common)


def library_folders(edits: ContainerEdits) -> list[str]:
    """The container folders of the libraries among `edits`' mounts: what
    NVIDIA's update-ldcache hook gives the container's linker."""
    return sorted(
        {
            str(Path(m.container_path).parent)
            for m in edits.mounts
            if library_names([Path(m.container_path).name])
        }
    )


def _listing(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False
