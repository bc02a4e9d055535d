"""Network topology for Slurm from Kubernetes node labels (pure).

- Tree (topology/tree): a list of label keys from the top level down (e.g.
  fabric, superpod, leafgroup); each distinct value path becomes a switch,
  leaves hold the nodes. Several top-level switches get a common root so the
  network is connected (Slurm cannot place a job across disconnected trees).
  Nodes without every label either fail the build (naming them) or, when
  the caller names a leaf for them (`unlabelled=`), hang from the root there:
  a node in no switch could run no job that spans nodes.
- Block (topology/block): one label (e.g. an NVLink domain) names each node's
  block; `block_sizes` are the sizes Slurm may allocate. Nodes without the
  label fail the build or (`skip_unlabelled=True`) stay out of every block,
  where Slurm still runs jobs on them, block-blind.

Rendered as topology.conf (Slurm 24.11) or topology.yaml (25.05+, which can
hold several named topologies, e.g. a tree and a block one). Each renderer
writes what its Slurm accepts for a topology without nodes (the cluster's
first moments, every node gone): 26.05 refuses a topology.yaml with no switch
or block but takes one that holds no node; 24.11 refuses a switch without
children but takes a topology.conf with no line at all.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from sunk.slurm.hostlist import compress
from sunk.topology.problems import Problem, raise_if

NodeLabels = Mapping[str, Mapping[str, str]]  # node name -> its labels

_MAX_SWITCH_NAME = 64  # topology.conf(5)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
ROOT_SWITCH = "root"
# The one switch or block of a topology.yaml without nodes (26.05 needs one).
EMPTY_UNIT = "empty"


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


def tree_from_labels(
    node_labels: NodeLabels, levels: Sequence[str], *, unlabelled: str | None = None
) -> Tree:
    """Switches from label values; names are the value path ("fab1.sp2.lg3").
    With `unlabelled`, nodes missing a label are the leaf of that name, under
    the root; without it they are errors."""
    problems: list[Problem] = []
    if not levels:
        problems.append(Problem("levels", "need at least one label key"))
    leaves: dict[tuple[str, ...], list[str]] = {}
    strays: list[str] = []
    for node, labels in node_labels.items():
        if unlabelled is not None and not all(labels.get(key) for key in levels):
            strays.append(node)
            continue
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
        if name in names.values() or name in (ROOT_SWITCH, unlabelled):
            problems.append(Problem(f"switch {name}", "label values collide after sanitising"))
        names[path] = name
    raise_if(problems)
    switches = [Switch(names[path], nodes=tuple(sorted(leaves[path]))) for path in sorted(leaves)]
    switches += [
        Switch(names[path], children=tuple(sorted(names[c] for c in kids)))
        for path, kids in sorted(children.items(), key=lambda item: (-len(item[0]), item[0]))
    ]
    tops = sorted(names[path] for path in names if len(path) == 1)
    if strays and unlabelled is not None:
        switches.append(Switch(unlabelled, nodes=tuple(sorted(strays))))
        tops.append(unlabelled)
    if len(tops) > 1:
        switches.append(Switch(ROOT_SWITCH, children=tuple(tops)))
    return Tree(tuple(switches))


def blocks_from_labels(
    node_labels: NodeLabels,
    label: str,
    block_sizes: Sequence[int] | None = None,
    *,
    skip_unlabelled: bool = False,
    small_blocks: bool = False,
) -> Blocks:
    """One block per value of `label`; sizes default to the smallest block's size.

    A controller that follows nodes as they come passes `skip_unlabelled`
    (a node without the label stays out of every block) and `small_blocks`
    (a block may hold fewer nodes than the base size while its nodes join,
    and there may be no block at all yet): Slurm 26.05 takes both."""
    problems: list[Problem] = []
    members: dict[str, list[str]] = {}
    for node, labels in node_labels.items():
        if skip_unlabelled and not labels.get(label):
            continue
        value = _label(node, labels, label, problems)
        if value is not None:
            members.setdefault(_safe(value), []).append(node)
    raise_if(problems)
    if not members and not small_blocks:
        raise_if([Problem("nodes", "no nodes to place in blocks")])
    smallest = min((len(nodes) for nodes in members.values()), default=1)
    sizes = tuple(block_sizes) if block_sizes else (smallest,)
    problems += validate_block_sizes(sizes, None if small_blocks else smallest)
    raise_if(problems)
    blocks = tuple(Block(name, tuple(sorted(nodes))) for name, nodes in sorted(members.items()))
    return Blocks(blocks, sizes)


def validate_block_sizes(sizes: Sequence[int], smallest_block: int | None) -> list[Problem]:
    """topology.conf(5): each size a power-of-two multiple of the one before,
    and (unless `smallest_block` is None) no block smaller than the base."""
    problems: list[Problem] = []
    if not sizes or sizes[0] < 1:
        return [Problem("block_sizes", "need a positive base block size")]
    if smallest_block is not None and sizes[0] > smallest_block:
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
    """topology.conf for the tree or the block plugin. Switches and blocks
    without nodes are left out (24.11 refuses an empty switch); with none
    left the file is a comment."""
    if isinstance(topology, Tree):
        lines = [
            f"SwitchName={s.name} Nodes={compress(s.nodes)}"
            if s.nodes
            else f"SwitchName={s.name} Switches={','.join(s.children)}"
            for s in topology.switches
            if s.nodes or s.children
        ]
    else:
        lines = [
            f"BlockName={b.name} Nodes={compress(b.nodes)}" for b in topology.blocks if b.nodes
        ]
        if lines:
            lines.append(f"BlockSizes={','.join(str(size) for size in topology.block_sizes)}")
    return "\n".join(lines or ["# no nodes in the topology yet"]) + "\n"


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
            switches = topology.switches or (Switch(EMPTY_UNIT),)
            entry["tree"] = {"switches": [_yaml_switch(s) for s in switches]}
        else:
            blocks = topology.blocks or (Block(EMPTY_UNIT, ()),)
            entry["block"] = {
                "block_sizes": list(topology.block_sizes),
                "blocks": [
                    {"block": b.name, "nodes": compress(b.nodes)} if b.nodes else {"block": b.name}
                    for b in blocks
                ],
            }
        documents.append(entry)
    return yaml.safe_dump(documents, sort_keys=False, default_flow_style=False)


def _yaml_switch(switch: Switch) -> dict[str, str]:
    if switch.nodes:
        return {"switch": switch.name, "nodes": compress(switch.nodes)}
    if switch.children:
        return {"switch": switch.name, "children": ",".join(switch.children)}
    return {"switch": switch.name}  # 26.05 takes a switch without nodes; not none at all
