"""What the gres ConfigMap must hold (pure).

A slurmd pod of a NodeSet whose `--conf` counts GPUs (`Gres=gpu[:type]:N`,
the pod's `sunk.dev/slurmd-conf`) gets one line, under its name (the Slurm
node's), naming the device files of the GPUs its node counts in Slurm (the
pod's `sunk.dev/slurmd-gpus`; a pod without it: those its Node lists now,
`sunk.dev/gpus`), typed as its `--conf` types them:

    NodeName=compute-a1 Name=gpu Type=h100 File=/dev/nvidia[0,2-3]

A node whose GPUs changed keeps its line until the NodeSet controller, the
node drained and idle, gives its pod the new list, then registers it anew
(docs/gpus.md). Pods whose `--conf` names no GPU, or
other GRES too (a NodeSet's own `resources.gres`: gres.conf is then the
admin's, `gresConfig`), and Nodes without a GPU list get no line; a list that
does not parse is reported and its node gets none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Node, Pod

from sunk.api import (
    ANNOTATION_NODE_GPUS,
    ANNOTATION_SLURMD_CONF,
    ANNOTATION_SLURMD_GPUS,
    LABEL_NODE,
)
from sunk.api.nodeset import owning_nodeset
from sunk.gpus.nvml import ranges
from sunk.gpus.publish import parse_gpus
from sunk.slurm.hostlist import expand

GRES_FILE = "gres.conf"
HEADER = (
    "# Written by sunk's operator from each node's GPUs (its Node's sunk.dev/gpus);\n"
    "# to write gres.conf by hand, set the slurm chart's gresConfig instead.\n"
)
# `Gres=gpu:4` or `Gres=gpu:h100:4` in a --conf line, and nothing else in it.
_CONF_GRES = re.compile(r"(?:^| )Gres=gpu(?::([A-Za-z0-9_.-]+))?:([0-9]+)(?: |$)")


@dataclass(frozen=True)
class GpuNode:
    slurm_node: str
    gpus: tuple[int, ...]
    gres_type: str | None = None


@dataclass(frozen=True)
class GresLine:
    """A Slurm node's line in sunk's gres.conf: how many GPUs it names, and
    since when (epoch seconds) it has named them."""

    gpus: int
    since: float


@dataclass(frozen=True)
class Plan:
    text: str
    nodes: int  # Slurm nodes with a line
    problems: tuple[str, ...] = field(default=())


def conf_gpus(conf: str) -> tuple[str | None, int] | None:
    """(type, count) of the GPUs a `--conf` line counts; None when it counts
    none, or other GRES beside them."""
    found = _CONF_GRES.search(conf)
    if found is None:
        return None
    return found.group(1), int(found.group(2))


def gpu_nodes(pods: Iterable[Pod], nodes: Mapping[str, Node]) -> tuple[list[GpuNode], list[str]]:
    """The Slurm GPU nodes of the NodeSets' pods, and the problems found."""
    found: list[GpuNode] = []
    problems: list[str] = []
    for pod in pods:
        meta = pod.metadata
        if meta is None or not meta.name or meta.deletionTimestamp is not None:
            continue
        if owning_nodeset(pod) is None:
            continue
        annotations = meta.annotations or {}
        gpus = conf_gpus(annotations.get(ANNOTATION_SLURMD_CONF, ""))
        if gpus is None:
            continue
        listed = annotations.get(ANNOTATION_SLURMD_GPUS)
        where = f"pod {meta.name}"
        if listed is None:
            node_name = (meta.labels or {}).get(LABEL_NODE, "")
            node = nodes.get(node_name)
            if node is None or node.metadata is None:
                continue
            listed = (node.metadata.annotations or {}).get(ANNOTATION_NODE_GPUS)
            where = f"node {node_name}"
        if listed is None:
            continue
        try:
            indices = parse_gpus(listed)
        except ValueError as error:
            problems.append(f"{where}: {error}")
            continue
        found.append(GpuNode(meta.name, indices, gpus[0]))
    return found, problems


def gres_line(node: GpuNode, dev: str = "/dev") -> str | None:
    if not node.gpus:
        return None
    files = (
        f"{dev}/nvidia{node.gpus[0]}"
        if len(node.gpus) == 1
        else f"{dev}/nvidia[{ranges(node.gpus)}]"
    )
    typed = f" Type={node.gres_type}" if node.gres_type else ""
    return f"NodeName={node.slurm_node} Name=gpu{typed} File={files}"


_LINE = re.compile(r"NodeName=(\S+) Name=gpu(?: Type=\S+)? File=(\S+)")


def node_lines(text: str) -> dict[str, str]:
    """Slurm node -> its line, in a gres.conf this controller wrote (other
    lines are not its own)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line)
        if match:
            found[match.group(1)] = line
    return found


def listed_gpus(text: str, since: Mapping[str, float]) -> dict[str, GresLine]:
    """Slurm node -> its line's GPU count, and since when it reads so
    (`since`; a line not in it counts as old)."""
    found: dict[str, GresLine] = {}
    for node, line in node_lines(text).items():
        match = _LINE.fullmatch(line)
        assert match is not None  # node_lines kept only lines that match
        found[node] = GresLine(len(expand(match.group(2))), since.get(node, 0.0))
    return found


def lines_since(
    old: Mapping[str, str], new: Mapping[str, str], since: Mapping[str, float], now: float
) -> dict[str, float]:
    """When each node's line in `new` was last changed: kept from `since`
    where `old` had the same line, `now` otherwise."""
    return {
        node: since.get(node, now) if old.get(node) == line else now for node, line in new.items()
    }


def slurm_gpu_devices(slurm_indices: Sequence[int], listed: str | None) -> tuple[int, ...]:
    """The GPUs (N of /dev/nvidiaN) that Slurm's GPU indices on a node name.

    Slurm counts a node's GPUs in the order of its gres.conf line's device
    files (`IDX:1` of `File=/dev/nvidia[0,2-3]` is /dev/nvidia2), and the line
    names its slurmd pod's `sunk.dev/slurmd-gpus` (`listed`), ascending. A pod
    without that annotation (a node whose plugin listed no GPUs when it
    started): the indices as they are. ValueError, naming the annotation, for
    a list that does not parse or an index beyond it."""
    if listed is None:
        return tuple(slurm_indices)
    try:
        devices = parse_gpus(listed)
    except ValueError as error:
        raise ValueError(
            f"annotation {ANNOTATION_SLURMD_GPUS}: {listed[:64]!r} is not GPU indices"
            ' ascending, comma-separated ("0,2,3")'
        ) from error
    beyond = [i for i in slurm_indices if not 0 <= i < len(devices)]
    if beyond:
        raise ValueError(
            f"Slurm's GPU indices {beyond} are beyond the {len(devices)} GPUs of the"
            f" node's gres.conf line (annotation {ANNOTATION_SLURMD_GPUS}: {listed!r})"
        )
    return tuple(devices[i] for i in slurm_indices)


def plan(pods: Iterable[Pod], nodes: Mapping[str, Node]) -> Plan:
    found, problems = gpu_nodes(pods, nodes)
    lines = sorted(line for node in found if (line := gres_line(node)) is not None)
    return Plan(HEADER + "".join(f"{line}\n" for line in lines), len(lines), tuple(problems))
