"""Network topology for Slurm from Kubernetes node labels.

- Tree (topology/tree): a list of label keys from the top level down (e.g.
  fabric, superpod, leafgroup); each distinct value path becomes a switch,
  leaves hold the nodes. Several top-level switches get a common root so the
  network is connected (Slurm cannot place a job across disconnected trees).
- Block (topology/block): one label (e.g. an NVLink domain) names each node's
  block; `block_sizes` are the sizes Slurm may allocate.

Rendered as topology.conf (Slurm 24.11) or topology.yaml (25.05+, which can
hold several named topologies, e.g. a tree and a block one).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from sunk.slurm.hostlist import compress
from sunk_testbed.gres_topology.problems import Problem, raise_if

NodeLabels = Mapping[str, Mapping[str, str]]  # node name -> its labels

_MAX_SWITCH_NAME = 64  # topology.conf(5)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
ROOT_SWITCH = "root"


@dataclass(frozen=True)
class Switch:
    name: str
    nodes: tuple[str, ...] = ()
    children: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tree:
    switches: tuple[Switch, ...]


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Blocks:
    blocks: tuple[Block, ...]
    block_sizes: tuple[int, ...]


def _safe(value: str) -> str:
    return _UNSAFE.sub("_", value)


def _label(node: str, labels: Mapping[str, str], key: str, problems: list[Problem]) -> str | None:
    value = labels.get(key)
    if not value:
        problems.append(Problem(f"nodes.{node}", f"has no label {key!r}"))
        return None
    return value


def tree_from_labels(node_labels: NodeLabels, levels: Sequence[str]) -> Tree:
    """Switches from label values; names are the value path ("fab1.sp2.lg3")."""
    problems: list[Problem] = []
    if not levels:
        problems.append(Problem("levels", "need at least one label key"))
    leaves: dict[tuple[str, ...], list[str]] = {}
    for node, labels in node_labels.items():
        path = tuple(_label(node, labels, key, problems) or "" for key in levels)
        if all(path):
            leaves.setdefault(path, []).append(node)
    raise_if(problems)
    children: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in leaves:
        for depth in range(1, len(path)):
            children.setdefault(path[:depth], set()).add(path[: depth + 1])
    names: dict[tuple[str, ...], str] = {}
    for path in sorted({*leaves, *children}):
        name = ".".join(_safe(part) for part in path)
        if len(name) > _MAX_SWITCH_NAME:
            problems.append(Problem(f"switch {name[:20]}...", "name longer than 64 characters"))
        if name in names.values() or name == ROOT_SWITCH:
            problems.append(Problem(f"switch {name}", "label values collide after sanitising"))
        names[path] = name
    raise_if(problems)
    switches = [Switch(names[path], nodes=tuple(sorted(leaves[path]))) for path in sorted(leaves)]
    switches += [
        Switch(names[path], children=tuple(sorted(names[c] for c in kids)))
        for path, kids in sorted(children.items(), key=lambda item: (-len(item[0]), item[0]))
    ]
    tops = sorted(names[path] for path in names if len(path) == 1)
    if len(tops) > 1:
        switches.append(Switch(ROOT_SWITCH, children=tuple(tops)))
    return Tree(tuple(switches))


def blocks_from_labels(
    node_labels: NodeLabels, label: str, block_sizes: Sequence[int] | None = None
) -> Blocks:
    """One block per value of `label`; sizes default to the smallest block's size."""
    problems: list[Problem] = []
    members: dict[str, list[str]] = {}
    for node, labels in node_labels.items():
        value = _label(node, labels, label, problems)
        if value is not None:
            members.setdefault(_safe(value), []).append(node)
    raise_if(problems)
    if not members:
        raise_if([Problem("nodes", "no nodes to place in blocks")])
    smallest = min(len(nodes) for nodes in members.values())
    sizes = tuple(block_sizes) if block_sizes else (smallest,)
    problems += validate_block_sizes(sizes, smallest)
    raise_if(problems)
    blocks = tuple(Block(name, tuple(sorted(nodes))) for name, nodes in sorted(members.items()))
    return Blocks(blocks, sizes)


def validate_block_sizes(sizes: Sequence[int], smallest_block: int) -> list[Problem]:
    """topology.conf(5): each size a power-of-two multiple of the one before."""
    problems: list[Problem] = []
    if not sizes or sizes[0] < 1:
        return [Problem("block_sizes", "need a positive base block size")]
    if sizes[0] > smallest_block:
        problems.append(
            Problem(
                "block_sizes", f"base size {sizes[0]} exceeds the smallest block ({smallest_block})"
            )
        )
    for before, after in itertools.pairwise(sizes):
        ratio = after // before
        if after % before or ratio < 2 or ratio & (ratio - 1):
            problems.append(
                Problem("block_sizes", f"{after} is not a power-of-two multiple of {before}")
            )
    return problems


def render_topology_conf(topology: Tree | Blocks) -> str:
    """topology.conf for the tree or the block plugin."""
    if isinstance(topology, Tree):
        lines = [
            f"SwitchName={s.name} Nodes={compress(s.nodes)}"
            if s.nodes
            else f"SwitchName={s.name} Switches={','.join(s.children)}"
            for s in topology.switches
        ]
    else:
        lines = [f"BlockName={b.name} Nodes={compress(b.nodes)}" for b in topology.blocks]
        lines.append(f"BlockSizes={','.join(str(size) for size in topology.block_sizes)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class NamedTopology:
    name: str
    topology: Tree | Blocks
    cluster_default: bool = False


def render_topology_yaml(topologies: Sequence[NamedTopology]) -> str:
    """topology.yaml (Slurm 25.05+): several named topologies, one the cluster default."""
    problems: list[Problem] = []
    names = [t.name for t in topologies]
    if len(set(names)) != len(names):
        problems.append(Problem("topologies", "duplicate topology names"))
    if sum(t.cluster_default for t in topologies) != 1:
        problems.append(Problem("topologies", "exactly one must be the cluster default"))
    raise_if(problems)
    documents: list[dict[str, object]] = []
    for named in topologies:
        entry: dict[str, object] = {
            "topology": named.name,
            "cluster_default": named.cluster_default,
        }
        topology = named.topology
        if isinstance(topology, Tree):
            entry["tree"] = {
                "switches": [
                    {"switch": s.name, "nodes": compress(s.nodes)}
                    if s.nodes
                    else {"switch": s.name, "children": ",".join(s.children)}
                    for s in topology.switches
                ]
            }
        else:
            entry["block"] = {
                "block_sizes": list(topology.block_sizes),
                "blocks": [{"block": b.name, "nodes": compress(b.nodes)} for b in topology.blocks],
            }
        documents.append(entry)
    return yaml.safe_dump(documents, sort_keys=False, default_flow_style=False)
