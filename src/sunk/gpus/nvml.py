"""gres.conf lines for a node's GPUs as NVIDIA's management library (NVML)
describes them: what Slurm's `AutoDetect=nvml` finds, for Slurm packages
built without it (Debian's).

`gres_lines` (pure) writes one line per run of GPUs alike: `Name=gpu`,
`Type` (the GPU's name as Slurm's NVML detection spells it: lower case,
spaces as underscores), `File` (the device nodes, by minor number) and,
where a GPU is closer to some CPUs than others, `Cores`, from `NvmlGpu`s:
what NVML (NVIDIA's nvidia-ml-py bindings) says of each GPU. The real-GPU
check (scripts/gpu-check-real-node.py) asks NVML for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NvmlGpu:
    index: int  # NVML's
    minor: int  # of /dev/nvidia<minor>
    name: str  # e.g. "NVIDIA H200"
    uuid: str
    cpus: tuple[int, ...]  # the logical CPUs NVML says are near it
    mig: bool = False  # MIG mode on


def gres_type(name: str) -> str:
    """`NVIDIA H200` -> `nvidia_h200`, as Slurm's NVML detection names it."""
    return "_".join(name.lower().split())


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


def gres_lines(
    gpus: Sequence[NvmlGpu], cpu_count: int, threads_per_core: int = 1, dev: str = "/dev"
) -> list[str]:
    """One line per run of GPUs of one type and one CPU affinity, by minor."""
    lines: list[str] = []
    run: list[NvmlGpu] = []

    def flush() -> None:
        if not run:
            return
        first = run[0]
        minors = [g.minor for g in run]
        files = (
            f"{dev}/nvidia{minors[0]}" if len(minors) == 1 else f"{dev}/nvidia[{ranges(minors)}]"
        )
        line = f"Name=gpu Type={gres_type(first.name)} File={files}"
        if first.cpus and len(set(first.cpus)) < cpu_count:
            line += f" Cores={ranges(cores_of(first.cpus, cpu_count, threads_per_core))}"
        lines.append(line)
        run.clear()

    for gpu in sorted(gpus, key=lambda g: g.minor):
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
