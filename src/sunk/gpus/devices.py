"""The GPUs of a node: the character devices `nvidia<N>` of a directory (pure
but for the directory listing)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

# The device files NVIDIA's driver makes, one per GPU (nvidiactl, nvidia-uvm
# and the like do not match).
GPU_NAME = re.compile(r"nvidia(\d+)")


def gpu_indices(names_and_modes: dict[str, int]) -> tuple[int, ...]:
    """The GPU indices among directory entries (name -> st_mode), ascending:
    names `nvidia<N>` that are character devices."""
    found = []
    for name, mode in names_and_modes.items():
        match = GPU_NAME.fullmatch(name)
        if match and stat.S_ISCHR(mode):
            found.append(int(match.group(1)))
    return tuple(sorted(found))


def find_gpus(device_dir: Path) -> tuple[int, ...]:
    """The GPUs in `device_dir` (e.g. /dev), by index. A missing directory has none."""
    entries: dict[str, int] = {}
    try:
        with os.scandir(device_dir) as listing:
            for entry in listing:
                if GPU_NAME.fullmatch(entry.name):
                    try:
                        entries[entry.name] = entry.stat(follow_symlinks=True).st_mode
                    except OSError:
                        continue  # vanished between the listing and the stat
    except FileNotFoundError:
        return ()
    return gpu_indices(entries)
