"""gres.conf lines for a node's GPUs as NVIDIA's management library (NVML)
describes them: what Slurm's `AutoDetect=nvml` finds, for Slurm packages
built without it (Debian's).

`gres_lines` (pure) writes one line per run of GPUs alike: `Name=gpu`,
`Type` (the GPU's name as Slurm's NVML detection spells it: lower case,
spaces as underscores), `File` (the device nodes, by minor number) and,
where a GPU is closer to some CPUs than others, `Cores`, from `NvmlGpu`s:
what NVML (NVIDIA's nvidia-ml-py bindings) says of each GPU. A GPU in MIG
mode gets one line per MIG device instead, as Slurm's NVML detection
(gpu_nvml.c) has it: `Type` the GPU's name up to its first '-' and the MIG
profile (`nvidia_a100_1g.5gb`), `MultipleFiles` the GPU's device node and
the two capability nodes of the MIG device's GPU and compute instances,
whose minors `parse_mig_minors` reads from the driver's `MIG_MINORS`. The
real-GPU check (scripts/gpu-check-real-node.py) asks NVML for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The driver's table of every MIG capability's device minor.
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"

# (GPU minor, GPU instance ID, compute instance ID): a compute instance's
# entry; with None for the compute instance: its GPU instance's.
MigMinorKey = tuple[int, int, int | None]

# The driver writes its numbers without leading zeros, and Slurm matches the
# names as text, so `gpu01` is no entry of GPU 1; seven digits hold every
# Linux minor (below 2**20).
_NUMBER = r"(0|[1-9][0-9]{0,6})"
_MIG_ENTRY = re.compile(rf"gpu{_NUMBER}/gi{_NUMBER}(?:/ci{_NUMBER})?/access")
_MINOR = re.compile(r"[0-9]{1,7}")
# C's isspace (Slurm's fscanf splits on it), less the newline lines end at.
_SPACE = " \t\r\f\v"
_BLANKS = re.compile(rf"[{_SPACE}]+")


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance in a GPU instance) as NVML gives it."""

    gpu_instance_id: int
    compute_instance_id: int
    slice_count: int  # the GPU instance's slices (gpuInstanceSliceCount)
    memory_mib: int  # memorySizeMB: NVML's MB are MiB
    uuid: str  # MIG-...


@dataclass(frozen=True)
class NvmlGpu:
    index: int  # NVML's
    minor: int  # of /dev/nvidia<minor>
    name: str  # e.g. "NVIDIA H200"
    uuid: str
    cpus: tuple[int, ...]  # the logical CPUs NVML says are near it
    mig: bool = False  # MIG mode on
    migs: tuple[MigDevice, ...] = ()  # its MIG devices, by NVML's MIG index

    def __post_init__(self) -> None:
        if self.migs and not self.mig:
            raise ValueError(f"GPU {self.index} ({self.uuid}) has MIG devices but MIG mode off")


def gres_type(name: str) -> str:
    """`NVIDIA H200` -> `nvidia_h200`, as Slurm's NVML detection names it."""
    return "_".join(name.lower().split())


def mig_gres_type(gpu_name: str, mig: MigDevice) -> str:
    """`NVIDIA A100-SXM4-40GB` and a 1-slice MIG device of 4864 MiB ->
    `nvidia_a100_1g.5gb`: the GPU's name up to its first '-', the slices and
    the memory in GiB, rounded, as Slurm's NVML detection names it."""
    # Slurm rounds with roundl (halves away from zero), not Python's round.
    gib = (mig.memory_mib + 512) // 1024
    return gres_type(f"{gpu_name.split('-', 1)[0]}_{mig.slice_count}g.{gib}gb")


def mig_minor_name(key: MigMinorKey) -> str:
    """(0, 1, None) -> `gpu0/gi1/access`, (0, 1, 0) -> `gpu0/gi1/ci0/access`:
    the entry's name in the driver's MIG_MINORS."""
    gpu, gpu_instance, compute_instance = key
    if compute_instance is None:
        return f"gpu{gpu}/gi{gpu_instance}/access"
    return f"gpu{gpu}/gi{gpu_instance}/ci{compute_instance}/access"


def parse_mig_minors(text: str) -> dict[MigMinorKey, int]:
    """The driver's MIG_MINORS (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access
    13`, ...) as {(GPU minor, GPU instance, compute instance or None): device
    minor}. Entries of no GPU (`config 1`, `monitor 2`) and blank lines are
    skipped; a `gpu...` line not of that shape, or one listed twice, is
    refused with a ValueError naming its line."""
    found: dict[MigMinorKey, int] = {}
    first_line: dict[MigMinorKey, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        fields = _BLANKS.split(line.strip(_SPACE))
        if not fields[0].startswith("gpu"):
            continue
        entry = _MIG_ENTRY.fullmatch(fields[0])
        if len(fields) != 2 or entry is None or not _MINOR.fullmatch(fields[1]):
            raise ValueError(
                f"{MIG_MINORS} line {number}: {line.strip(_SPACE)!r} is not"
                " `gpu<minor>/gi<id>[/ci<id>]/access <device minor>`"
            )
        gpu, gpu_instance, compute_instance = entry.groups()
        key = (
            int(gpu),
            int(gpu_instance),
            None if compute_instance is None else int(compute_instance),
        )
        if key in found:
            raise ValueError(
                f"{MIG_MINORS} line {number}: {fields[0]} again (first on line {first_line[key]})"
            )
        found[key] = int(fields[1])
        first_line[key] = number
    return found


def ranges(numbers: Iterable[int]) -> str:
    """`0,1,2,5` -> `0-2,5`."""
    ordered = sorted(set(numbers))
    out: list[str] = []
    start = prev = None
    for n in ordered:
        if start is None:
            start = prev = n
        elif prev is not None and n == prev + 1:
            prev = n
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def cores_of(cpus: Sequence[int], cpu_count: int, threads_per_core: int) -> tuple[int, ...]:
    """The cores of logical CPUs numbered as Linux numbers them on x86: the
    first thread of every core, then the second (CPU c is core c mod cores)."""
    cores = max(cpu_count // max(threads_per_core, 1), 1)
    return tuple(sorted({cpu % cores for cpu in cpus}))


def mig_files(gpu: NvmlGpu, mig: MigDevice, mig_minors: Mapping[MigMinorKey, int], dev: str) -> str:
    """The device nodes a job on `mig` needs: its GPU's, and its GPU and
    compute instances' capability nodes (Slurm's order)."""
    caps = []
    for key in (
        (gpu.minor, mig.gpu_instance_id, None),
        (gpu.minor, mig.gpu_instance_id, mig.compute_instance_id),
    ):
        if key not in mig_minors:
            raise ValueError(
                f"MIG device {mig.uuid} of GPU {gpu.index} ({gpu.uuid}):"
                f" no {mig_minor_name(key)} in {MIG_MINORS}"
            )
        caps.append(f"{dev}/nvidia-caps/nvidia-cap{mig_minors[key]}")
    return ",".join([f"{dev}/nvidia{gpu.minor}", *caps])


def gres_lines(
    gpus: Sequence[NvmlGpu],
    cpu_count: int,
    threads_per_core: int = 1,
    dev: str = "/dev",
    mig_minors: Mapping[MigMinorKey, int] | None = None,
) -> list[str]:
    """One line per run of GPUs of one type and one CPU affinity, by minor;
    for a GPU in MIG mode, one line per MIG device, its capability nodes
    from `mig_minors` (parse_mig_minors of the driver's MIG_MINORS). Raises
    ValueError for a GPU in MIG mode without MIG devices (Slurm's detection
    stops slurmd there) and for a MIG device `mig_minors` does not list."""
    lines: list[str] = []
    run: list[NvmlGpu] = []

    def cores(gpu: NvmlGpu) -> str:
        if gpu.cpus and len(set(gpu.cpus)) < cpu_count:
            return f" Cores={ranges(cores_of(gpu.cpus, cpu_count, threads_per_core))}"
        return ""

    def flush() -> None:
        if not run:
            return
        first = run[0]
        minors = [g.minor for g in run]
        files = (
            f"{dev}/nvidia{minors[0]}" if len(minors) == 1 else f"{dev}/nvidia[{ranges(minors)}]"
        )
        lines.append(f"Name=gpu Type={gres_type(first.name)} File={files}{cores(first)}")
        run.clear()

    for gpu in sorted(gpus, key=lambda g: g.minor):
        if gpu.mig:
            if not gpu.migs:
                raise ValueError(
                    f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}) has MIG mode on but no MIG"
                    " devices: create its MIG devices or turn its MIG mode off"
                )
            flush()
            # MultipleFiles, not File: one device of several nodes (File
            # would make each node a device of its own).
            lines.extend(
                f"Name=gpu Type={mig_gres_type(gpu.name, mig)}"
                f" MultipleFiles={mig_files(gpu, mig, mig_minors or {}, dev)}{cores(gpu)}"
                for mig in gpu.migs
            )
            continue
        if run and (
            gpu.name != run[0].name or gpu.cpus != run[0].cpus or gpu.minor != run[-1].minor + 1
        ):
            flush()
        run.append(gpu)
    flush()
    return lines


def threads_per_core() -> int:
    """Linux's count of hardware threads per core (1 where it cannot tell)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return 1
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return max(count, 1)
