"""gres.conf from a GPU inventory, and the matching `Gres=` of NodeName lines.

Nodes with identical GPUs share one line (`NodeName=gpu[001-064] Name=gpu
Type=h100 File=/dev/nvidia[0-7]`), so the file stays small at thousands of
nodes and does not change when a node of a known kind is added to a range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sunk.slurm.hostlist import HostlistError, compress, expand
from sunk.topology.problems import Problem, raise_if

_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")


class GpuGroup(BaseModel):
    """Identical GPUs of one node, e.g. 8 x h100 at /dev/nvidia[0-7]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str  # Slurm's GRES type, e.g. "h100" (from the node's GPU product label)
    count: int = Field(ge=1)
    files: str | None = None  # device files, a hostlist-style pattern
    cores: str | None = None  # CPU cores close to these GPUs, e.g. "0-31"
    name: str = "gpu"


GpuInventory = Mapping[str, Sequence[GpuGroup]]  # node name -> its GPUs


def node_gres(groups: Sequence[GpuGroup]) -> tuple[str, ...]:
    """The NodeName line's `Gres=` items: ("gpu:h100:8",)."""
    return tuple(f"{g.name}:{g.type}:{g.count}" for g in groups)


def validate_gres(inventory: GpuInventory) -> list[Problem]:
    problems: list[Problem] = []
    for node, groups in inventory.items():
        for i, group in enumerate(groups):
            where = f"{node}[{i}]"
            if not _TYPE.match(group.type):
                problems.append(Problem(f"{where}.type", f"{group.type!r} is not a GRES type"))
            if not _TYPE.match(group.name):
                problems.append(Problem(f"{where}.name", f"{group.name!r} is not a GRES name"))
            if group.files is not None:
                try:
                    files = expand(group.files)
                except HostlistError as exc:
                    problems.append(Problem(f"{where}.files", str(exc)))
                    continue
                if len(files) != group.count:
                    problems.append(
                        Problem(f"{where}.files", f"{len(files)} files for count {group.count}")
                    )
    return problems


def _line(nodes: str, group: GpuGroup) -> str:
    parts = [f"NodeName={nodes}", f"Name={group.name}", f"Type={group.type}"]
    if group.files is not None:
        parts.append(f"File={group.files}")
    else:
        parts.append(f"Count={group.count}")
    if group.cores is not None:
        parts.append(f"Cores={group.cores}")
    return " ".join(parts)


def render_gres_conf(inventory: GpuInventory, *, autodetect: str | None = None) -> str:
    """gres.conf for every node with GPUs; `autodetect` e.g. "nvml" adds AutoDetect=."""
    raise_if(validate_gres(inventory))
    by_kind: dict[tuple[GpuGroup, ...], list[str]] = {}
    for node, groups in inventory.items():
        if groups:
            by_kind.setdefault(tuple(groups), []).append(node)
    lines = [f"AutoDetect={autodetect}"] if autodetect else []
    for groups, nodes in by_kind.items():
        names = compress(nodes)
        lines += [_line(names, group) for group in groups]
    return "\n".join(lines) + "\n"
