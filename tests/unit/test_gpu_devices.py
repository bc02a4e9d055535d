"""Finding a node's GPUs: the `nvidia<N>` character devices of a directory.

No GPU exists here: the devices are stand-ins made with mknod (NVIDIA's major
number 195, no driver loaded, so opening one gives ENXIO); the plugin only
lists them and hands their paths to the kubelet.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from sunk.gpus.devices import find_gpus, gpu_indices
from sunk.gpus.plugin import GpuInventory

NVIDIA_MAJOR = 195
CHR = stat.S_IFCHR | 0o666


def stand_in(directory: Path, name: str, minor: int) -> Path:
    path = directory / name
    os.mknod(path, CHR, os.makedev(NVIDIA_MAJOR, minor))
    return path


def test_only_character_devices_named_nvidia_n_are_gpus(tmp_path: Path) -> None:
    for index in (3, 0, 1, 10):
        stand_in(tmp_path, f"nvidia{index}", index)
    stand_in(tmp_path, "nvidiactl", 255)
    stand_in(tmp_path, "nvidia-uvm", 254)
    (tmp_path / "nvidia7").write_text("a regular file is not a GPU")
    (tmp_path / "nvidia8").mkdir()
    os.symlink(tmp_path / "nvidia0", tmp_path / "nvidia0x")
    assert find_gpus(tmp_path) == (0, 1, 3, 10)


def test_a_symlink_to_a_device_counts_and_a_dangling_one_does_not(tmp_path: Path) -> None:
    real = stand_in(tmp_path, "real", 4)
    os.symlink(real, tmp_path / "nvidia4")
    os.symlink(tmp_path / "gone", tmp_path / "nvidia5")
    assert find_gpus(tmp_path) == (4,)


def test_a_missing_directory_has_no_gpus(tmp_path: Path) -> None:
    assert find_gpus(tmp_path / "absent") == ()


def test_a_stand_in_is_no_gpu_to_open(tmp_path: Path) -> None:
    """What the tests' devices are: no driver answers them."""
    path = stand_in(tmp_path, "nvidia0", 0)
    with pytest.raises(OSError, match="No such device") as raised:
        os.close(os.open(path, os.O_RDWR))
    assert raised.value.errno in (6, 19)  # ENXIO, or ENODEV on a nodev mount


def test_gpu_indices_from_names_and_modes() -> None:
    chr_mode, reg_mode = stat.S_IFCHR | 0o600, stat.S_IFREG | 0o600
    entries = {"nvidia2": chr_mode, "nvidia1": chr_mode, "nvidia3": reg_mode, "sda": chr_mode}
    assert gpu_indices(entries) == (1, 2)


async def test_the_inventory_wakes_watchers_on_a_change_and_remembers_vanished_gpus(
    tmp_path: Path,
) -> None:
    stand_in(tmp_path, "nvidia0", 0)
    stand_in(tmp_path, "nvidia1", 1)
    inventory = GpuInventory(tmp_path)
    assert inventory.scan() is True
    assert inventory.scan() is False  # nothing changed
    seen = inventory.watch()
    assert await anext(seen) == (0, 1)
    waiting = asyncio.ensure_future(anext(seen))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    (tmp_path / "nvidia1").unlink()
    assert inventory.scan() is True
    assert await asyncio.wait_for(waiting, 1) == (0,)
    assert inventory.known == (0, 1)  # the vanished one is still listed, as unhealthy
    await seen.aclose()
