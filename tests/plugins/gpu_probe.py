"""What a container received of the node's stand-in GPUs (sunk_testbed.gpus:
device nodes shaped like NVIDIA's, no driver; a stand-in `libcuda.so.1` whose
`cuInit` counts the GPU device nodes the process sees; a stand-in
`nvidia-smi`). `PROBE` runs in the container and prints one line per thing
found; `read_probe` reads them back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sunk_testbed.gpus import CONTROL_NODES

# A shell script (the images have sh and python3): each NVIDIA device node,
# each driver file a CDI spec mounts, CUDA's device count through ctypes,
# nvidia-smi's GPUs, and the environment's NVIDIA_VISIBLE_DEVICES.
PROBE = r"""
find /dev -name 'nvidia*' -type c | sort | sed 's/^/device /'
for f in /usr/lib/*-linux-gnu/libcuda.so* /usr/bin/nvidia-smi; do
  [ -e "$f" ] && echo "file $f"
done
python3 -c '
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    print("cuda none")
else:
    count = ctypes.c_int(-1)
    print("cuda", cuda.cuInit(0), cuda.cuDeviceGetCount(ctypes.byref(count)), count.value)
'
nvidia-smi -L 2>&1 | sed 's/^/smi /'
echo "env ${NVIDIA_VISIBLE_DEVICES-unset}"
"""


@dataclass(frozen=True)
class Received:
    devices: frozenset[str]  # the NVIDIA device nodes under /dev
    files: frozenset[str]  # driver files present
    cuda_gpus: int | None  # cuDeviceGetCount after cuInit; None: no libcuda
    smi: tuple[str, ...]  # nvidia-smi -L's lines
    env: str  # NVIDIA_VISIBLE_DEVICES, or "unset"

    @property
    def gpus(self) -> frozenset[int]:
        """The GPU indices of the device nodes (/dev/nvidia<N>)."""
        names = (d.removeprefix("/dev/nvidia") for d in self.devices)
        return frozenset(int(n) for n in names if n.isdigit())


def read_probe(lines: Iterable[str]) -> Received:
    devices: set[str] = set()
    files: set[str] = set()
    smi: list[str] = []
    cuda: int | None = None
    env = ""
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        if word == "device":
            devices.add(rest)
        elif word == "file":
            files.add(rest)
        elif word == "cuda" and rest != "none":
            init, got, count = (int(x) for x in rest.split())
            # 100: CUDA_ERROR_NO_DEVICE, as the real driver answers with none.
            cuda = count if (init, got) == (0, 0) else 0 if init == 100 else -1
        elif word == "smi":
            smi.append(rest)
        elif word == "env":
            env = rest
    return Received(frozenset(devices), frozenset(files), cuda, tuple(smi), env)


# The control nodes every GPU container gets (the spec's common edits).
CONTROL = frozenset(f"/dev/{name}" for name in CONTROL_NODES)


def gpu_nodes(indices: Iterable[int]) -> frozenset[str]:
    """The device nodes of these GPUs and the control nodes: what a CDI
    request for exactly them gives."""
    return CONTROL | {f"/dev/nvidia{i}" for i in indices}
