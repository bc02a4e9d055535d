"""MIG devices as typed GRES (sunk.gpus.nvml): the gres.conf lines Slurm's
`AutoDetect=nvml` finds for GPUs in MIG mode, and the driver's table of MIG
capability minors they are built from.

Stand-ins, named (no GPU on this machine, and no MIG GPU has run this): the
GPUs and their MIG devices are `NvmlGpu`s and `MigDevice`s written by hand
(names as NVML gives them; GPU instance IDs, UUIDs and memory sizes
plausible, not read from a GPU), and the driver's
/proc/driver/nvidia-caps/mig-minors is `driver_mig_minors()`, text shaped
like the driver's file and numbered as NVIDIA's MIG user guide shows it.
"""

from __future__ import annotations

from itertools import count

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunk.gpus.nvml import (
    MigDevice,
    MigMinorKey,
    NvmlGpu,
    gres_lines,
    mig_gres_type,
    mig_minor_name,
    parse_mig_minors,
)

pytestmark = pytest.mark.unit

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"


def driver_mig_minors(gpus: int = 32) -> str:
    """A stand-in shaped like the driver's mig-minors: `config 1`,
    `monitor 2`, then for every GPU minor the driver allows (0-31) and every
    GPU instance (0-14), the instance's `access` entry and its compute
    instances' (0-7), numbered one after another from 3."""
    minor = count(3)
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpus):
        for gpu_instance in range(15):
            lines.append(f"gpu{gpu}/gi{gpu_instance}/access {next(minor)}")
            lines.extend(
                f"gpu{gpu}/gi{gpu_instance}/ci{ci}/access {next(minor)}" for ci in range(8)
            )
    return "\n".join(lines) + "\n"


MINORS = parse_mig_minors(driver_mig_minors())


def mig(gpu_instance: int, slices: int, memory_mib: int, compute_instance: int = 0) -> MigDevice:
    return MigDevice(
        gpu_instance_id=gpu_instance,
        compute_instance_id=compute_instance,
        slice_count=slices,
        memory_mib=memory_mib,
        uuid=f"MIG-{gpu_instance}-{compute_instance}",
    )


def gpu(
    minor: int,
    name: str = H100,
    migs: tuple[MigDevice, ...] = (),
    cpus: tuple[int, ...] = tuple(range(16)),
    mig_mode: bool | None = None,
) -> NvmlGpu:
    return NvmlGpu(
        index=minor,
        minor=minor,
        name=name,
        uuid=f"GPU-{minor}",
        cpus=cpus,
        mig=bool(migs) if mig_mode is None else mig_mode,
        migs=migs,
    )


# An A100 40GB's three profiles: 4.75, 9.75 and 19.62 GiB of memory.
A100_MIGS = (mig(13, 1, 4864), mig(5, 2, 9984), mig(1, 3, 20096))


def test_the_stand_in_is_numbered_as_nvidias_guide_shows_the_drivers_file() -> None:
    # The entries NVIDIA's MIG user guide shows of the file.
    assert MINORS[(0, 0, None)] == 3
    assert MINORS[(0, 0, 0)] == 4
    assert MINORS[(0, 0, 2)] == 6
    assert MINORS[(3, 3, 3)] == 439
    assert MINORS[(6, 11, 7)] == 920
    assert MINORS[(31, 14, 7)] == 4322
    assert len(MINORS) == 32 * 15 * 9  # config and monitor are no GPU's


@pytest.mark.parametrize(
    ("gpus", "cpus", "lines"),
    [
        # One A100 in MIG mode, near every CPU: a line per MIG device, no Cores.
        (
            [gpu(0, A100, A100_MIGS)],
            16,
            [
                "Name=gpu Type=nvidia_a100_1g.5gb MultipleFiles=/dev/nvidia0,"
                "/dev/nvidia-caps/nvidia-cap120,/dev/nvidia-caps/nvidia-cap121",
                "Name=gpu Type=nvidia_a100_2g.10gb MultipleFiles=/dev/nvidia0,"
                "/dev/nvidia-caps/nvidia-cap48,/dev/nvidia-caps/nvidia-cap49",
                "Name=gpu Type=nvidia_a100_3g.20gb MultipleFiles=/dev/nvidia0,"
                "/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
            ],
        ),
        # An H100 (no '-' in its name: all of it stays) near half the CPUs.
        (
            [gpu(4, H100, (mig(9, 1, 9984), mig(10, 1, 9984)), cpus=tuple(range(16, 32)))],
            32,
            [
                "Name=gpu Type=nvidia_h100_80gb_hbm3_1g.10gb MultipleFiles=/dev/nvidia4,"
                "/dev/nvidia-caps/nvidia-cap624,/dev/nvidia-caps/nvidia-cap625 Cores=16-31",
                "Name=gpu Type=nvidia_h100_80gb_hbm3_1g.10gb MultipleFiles=/dev/nvidia4,"
                "/dev/nvidia-caps/nvidia-cap633,/dev/nvidia-caps/nvidia-cap634 Cores=16-31",
            ],
        ),
        # Two compute instances of one GPU instance: two devices, one type
        # (Slurm names a MIG device by its GPU instance's slices).
        (
            [gpu(0, A100, (mig(1, 3, 20096, 0), mig(1, 3, 20096, 1)))],
            16,
            [
                "Name=gpu Type=nvidia_a100_3g.20gb MultipleFiles=/dev/nvidia0,"
                "/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
                "Name=gpu Type=nvidia_a100_3g.20gb MultipleFiles=/dev/nvidia0,"
                "/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap14",
            ],
        ),
        # A node mixing both: the plain GPUs' lines as without MIG, the MIG
        # GPU's between them by minor (a run of plain GPUs ends at it).
        (
            [
                gpu(3, cpus=tuple(range(16))),
                gpu(0, cpus=tuple(range(16))),
                gpu(2, A100, (mig(13, 1, 4864),), cpus=tuple(range(16))),
                gpu(1, cpus=tuple(range(16))),
            ],
            32,
            [
                "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia[0-1] Cores=0-15",
                "Name=gpu Type=nvidia_a100_1g.5gb MultipleFiles=/dev/nvidia2,"
                "/dev/nvidia-caps/nvidia-cap390,/dev/nvidia-caps/nvidia-cap391 Cores=0-15",
                "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia3 Cores=0-15",
            ],
        ),
        # MIG-capable but MIG mode off: the GPU's line as ever.
        (
            [gpu(0, A100, mig_mode=False)],
            16,
            ["Name=gpu Type=nvidia_a100-sxm4-40gb File=/dev/nvidia0"],
        ),
    ],
)
def test_a_gpu_in_mig_mode_gets_a_line_per_mig_device(
    gpus: list[NvmlGpu], cpus: int, lines: list[str]
) -> None:
    assert gres_lines(gpus, cpus, mig_minors=MINORS) == lines


@pytest.mark.parametrize(
    ("name", "slices", "memory_mib", "gres_type"),
    [
        (A100, 1, 4864, "nvidia_a100_1g.5gb"),
        ("NVIDIA A100-SXM4-80GB", 1, 9856, "nvidia_a100_1g.10gb"),
        ("NVIDIA A100 80GB PCIe", 7, 80000, "nvidia_a100_80gb_pcie_7g.78gb"),
        (H100, 1, 9984, "nvidia_h100_80gb_hbm3_1g.10gb"),
        ("NVIDIA A30", 1, 5836, "nvidia_a30_1g.6gb"),
        # roundl: a half rounds up, where Python's round would give 2 and 4.
        (A100, 1, 2560, "nvidia_a100_1g.3gb"),
        (A100, 2, 4608, "nvidia_a100_2g.5gb"),
        (A100, 1, 2559, "nvidia_a100_1g.2gb"),
    ],
)
def test_a_mig_type_is_spelled_as_slurms_nvml_detection_spells_it(
    name: str, slices: int, memory_mib: int, gres_type: str
) -> None:
    assert mig_gres_type(name, mig(1, slices, memory_mib)) == gres_type


def test_a_gpu_in_mig_mode_without_mig_devices_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"GPU 0 \(NVIDIA A100-SXM4-40GB, GPU-0\) has MIG mode on"):
        gres_lines([gpu(0, A100, mig_mode=True)], 16, mig_minors=MINORS)


def test_a_mig_device_the_drivers_table_lacks_is_refused_by_its_entry() -> None:
    with pytest.raises(ValueError, match="no gpu0/gi13/access in /proc/driver/nvidia-caps"):
        gres_lines([gpu(0, A100, A100_MIGS)], 16)
    only_gpu_instances = {key: minor for key, minor in MINORS.items() if key[2] is None}
    with pytest.raises(ValueError, match=r"MIG device MIG-13-0 of GPU 0 .*gpu0/gi13/ci0/access"):
        gres_lines([gpu(0, A100, A100_MIGS)], 16, mig_minors=only_gpu_instances)


def test_mig_devices_on_a_gpu_with_mig_mode_off_are_refused() -> None:
    with pytest.raises(ValueError, match=r"GPU 0 .* has MIG devices but MIG mode off"):
        gpu(0, A100, A100_MIGS, mig_mode=False)


# ------------------------------------------------------------ mig-minors


def test_entries_of_no_gpu_and_blank_lines_are_skipped() -> None:
    text = "config 1\r\nmonitor 2\r\n\n  \ngpu0/gi1/access\t12\r\nsomething-else 9\n"
    assert parse_mig_minors(text) == {(0, 1, None): 12}
    assert parse_mig_minors("") == {}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("config 1\ngpu0/gi1/access\n", 2),
        ("gpu0/gi1/access twelve", 1),
        ("gpu0/gi1/access 12 13", 1),
        ("gpu0/gi/access 12", 1),
        ("gpu0/gi1/ci0 13", 1),
        ("gpu01/gi1/access 12", 1),  # the driver's names have no leading zeros
        ("gpu0/gi1/access -12", 1),
        ("gpu0/gi1/access\xa012", 1),  # a space to Python, none to C
        ("gpu0/gi1/access 12345678", 1),  # eight digits: beyond every Linux minor
        ("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/access 13", 4),
    ],
)
def test_a_malformed_gpu_line_is_refused_by_its_number(text: str, line: int) -> None:
    with pytest.raises(ValueError, match=rf"mig-minors line {line}: "):
        parse_mig_minors(text)


def test_an_entry_listed_twice_names_its_first_line() -> None:
    with pytest.raises(ValueError, match=r"line 3: gpu0/gi1/ci0/access again \(first on line 1\)"):
        parse_mig_minors("gpu0/gi1/ci0/access 13\nconfig 1\ngpu0/gi1/ci0/access 13\n")


ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=80)
PIECES = st.sampled_from(
    [
        "gpu",
        "0",
        "1",
        "01",
        "/gi",
        "/ci",
        "/access",
        " ",
        "\t",
        "\n",
        "\r",
        "\xa0",
        "٣",
        "-",
        "config",
    ]
)
MIG_TEXT = st.one_of(ANY_TEXT, st.lists(PIECES, max_size=30).map("".join))
NUMBERS = st.integers(0, 9_999_999)
KEYS = st.tuples(NUMBERS, NUMBERS, st.none() | NUMBERS)


@pytest.mark.fuzz
@given(text=MIG_TEXT)
def test_any_text_is_read_or_refused_with_value_error(text: str) -> None:
    try:
        found = parse_mig_minors(text)
    except ValueError as exc:
        refusal = str(exc)
    else:
        assert len(found) <= text.count("\n") + 1
        assert all(0 <= minor <= 9_999_999 for minor in found.values())
        return
    assert refusal.startswith("/proc/driver/nvidia-caps/mig-minors line ")


@pytest.mark.fuzz
@given(
    entries=st.dictionaries(KEYS, NUMBERS, max_size=40),
    blank=st.sampled_from([" ", "\t", "  \t "]),
    line_end=st.sampled_from(["\n", "\r\n"]),
)
def test_entries_written_as_the_driver_writes_them_read_back(
    entries: dict[MigMinorKey, int], blank: str, line_end: str
) -> None:
    lines = [
        "config 1",
        *(f"{mig_minor_name(key)}{blank}{minor}" for key, minor in entries.items()),
    ]
    assert parse_mig_minors(line_end.join([*lines, "monitor 2", ""])) == entries
