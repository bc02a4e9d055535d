"""Stand-in GPUs for the bed's nodes. No GPU exists on this machine: each
stand-in is shaped like what NVIDIA's driver and container toolkit put on a
real node, so a test can tell exactly what each container received.

- Device files (`stand_in_gpus`): `nvidia<N>` per GPU and the control nodes
  every CUDA process opens (`nvidiactl`, `nvidia-modeset`, `nvidia-uvm`,
  `nvidia-uvm-tools`, `nvidia-caps/nvidia-cap<N>`), character devices of
  NVIDIA's numbers with no driver behind them: opening one fails with ENXIO,
  where a device cgroup that denies it gives EPERM.
- A driver root (`stand_in_driver`): `libcuda.so.1` built from
  testbed/gpu-stand-in/libcuda.c (its `cuInit` counts the GPU device nodes
  the process sees) and `nvidia-smi` (a script listing them), where NVIDIA's
  installer puts the real ones.
- The node's CDI spec (`write_cdi_spec`): what `nvidia-ctk cdi generate`
  writes for those files (sunk.gpus.inventory.nvidia_spec), in the CDI
  directory of each node's containerd. Without NVIDIA's hook binary the spec
  has no ldcache hook; the library is found on the default search path.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from sunk.gpus.cdi import Spec, spec_json
from sunk.gpus.inventory import find_nvidia, nvidia_spec
from sunk_testbed.paths import REPO_ROOT

GPU_MAJOR = 195  # NVIDIA's character device major
CONTROL_NODES = {
    "nvidiactl": (GPU_MAJOR, 255),
    "nvidia-modeset": (GPU_MAJOR, 254),
    # The driver gets these majors at load time; any free one stands in.
    "nvidia-uvm": (510, 0),
    "nvidia-uvm-tools": (510, 1),
    "nvidia-caps/nvidia-cap1": (511, 1),
    "nvidia-caps/nvidia-cap2": (511, 2),
}
# The stand-in library is named as the driver names its own: by version.
DRIVER_VERSION = "580.95.05"
SOURCES = REPO_ROOT / "testbed" / "gpu-stand-in"
SPEC_FILE = "nvidia-stand-in.json"


def _char_device(path: Path, major: int, minor: int) -> None:
    if path.is_char_device() and os.stat(path).st_rdev == os.makedev(major, minor):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    path.chmod(0o666)


def stand_in_gpus(directory: Path, count: int) -> Path:
    """`count` stand-in GPU device files, nvidia0.., and the control nodes,
    in `directory` (the bed's nodes share it)."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        _char_device(directory / f"nvidia{index}", GPU_MAJOR, index)
    for name, (major, minor) in CONTROL_NODES.items():
        _char_device(directory / name, major, minor)
    return directory


def stand_in_driver(root: Path) -> Path:
    """The stand-in driver's files below `root`, at the paths NVIDIA's
    installer uses: `root` is to the spec what `/` is on a real node."""
    libraries = root / "usr" / "lib" / f"{platform.machine()}-linux-gnu"
    binaries = root / "usr" / "bin"
    for folder in (libraries, binaries):
        folder.mkdir(parents=True, exist_ok=True)
    library = libraries / f"libcuda.so.{DRIVER_VERSION}"
    source = SOURCES / "libcuda.c"
    if not library.exists() or library.stat().st_mtime < source.stat().st_mtime:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("the stand-in libcuda needs a C compiler (cc): none on PATH")
        built = library.with_name(library.name + ".new")
        flags = ["-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1"]
        subprocess.run([compiler, *flags, "-o", str(built), str(source)], check=True)
        built.replace(library)
    soname = libraries / "libcuda.so.1"
    if not soname.is_symlink():
        soname.unlink(missing_ok=True)
        soname.symlink_to(library.name)
    smi = binaries / "nvidia-smi"
    shutil.copyfile(SOURCES / "nvidia-smi", smi)
    smi.chmod(0o755)
    return root


def write_cdi_spec(spec_dirs: Iterable[Path], devices: Path, driver: Path) -> Spec:
    """The CDI spec of the stand-ins, written to each of `spec_dirs` (one per
    node's containerd); replaced whole, never seen half written."""
    spec = nvidia_spec(find_nvidia(dev=devices, root=driver))
    text = spec_json(spec)
    for directory in spec_dirs:
        directory.mkdir(parents=True, exist_ok=True)
        # CDI reads *.json and *.yaml only: the temporary name is not read.
        temporary = directory / f".{SPEC_FILE}.tmp"
        temporary.write_text(text)
        temporary.replace(directory / SPEC_FILE)
    return spec


def remove_cdi_spec(spec_dirs: Iterable[Path]) -> None:
    for directory in spec_dirs:
        (directory / SPEC_FILE).unlink(missing_ok=True)
