"""What the topology ConfigMap must hold (pure).

A slurmd pod of a NodeSet enters the topology when it is Ready on a Node the
cache knows, under its pod's name (the Slurm node's) with its Node's labels.
Ready, not merely scheduled: 24.11 places a dynamic node only if it exists
when the topology is read (a node that registers after that stays out of
every switch until the next reconfigure), and 26.05.5 refused a new
cluster's first jobs when the file named nodes before they registered
("Requested node configuration is not available"; docs/training.md).

Once in, a node stays, placed by the Node it entered from, for as long as
Slurm has it, whatever its pod does: while a pod is replaced or its
readiness flaps, a node out of the file is refused to every job that names
it ("Requested topology configuration is not available") until a file naming
it again reaches slurmctld, and each change is a reconfigure. The NodeSet
controller deletes a Slurm node only once its pod is gone for good.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from lightkube.resources.core_v1 import Pod

from sunk.api.nodeset import owning_nodeset
from sunk.kube.client import pod_ready
from sunk.topology.build import (
    Block,
    Blocks,
    NamedTopology,
    NodeLabels,
    Tree,
    blocks_from_labels,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)
from sunk.topology.settings import TopologySettings

# The leaf switch of the tree's members that lack a level label (under the root).
UNLABELLED = "unlabelled"


def ready_slurmd(pods: Iterable[Pod]) -> dict[str, str]:
    """Slurm node name -> Kubernetes Node, of each NodeSet pod that is Ready
    and not being deleted."""
    found: dict[str, str] = {}
    for pod in pods:
        meta, spec = pod.metadata, pod.spec
        if meta is None or spec is None or not meta.name or meta.deletionTimestamp is not None:
            continue
        if owning_nodeset(pod) is not None and spec.nodeName and pod_ready(pod):
            found[meta.name] = spec.nodeName
    return found


def members(
    ready: Mapping[str, str],
    known_nodes: Collection[str],
    placed: Mapping[str, str],
    slurm_nodes: Collection[str] | None,
) -> dict[str, str]:
    """Slurm node name -> the Kubernetes Node whose labels place it.

    `ready` is `ready_slurmd`'s answer; `placed` the same map as last written;
    `slurm_nodes` the nodes Slurm has now, or None when that is not known
    (then no placed node leaves). Nodes on a Node the cache lacks are out."""
    kept = {
        name: node for name, node in placed.items() if slurm_nodes is None or name in slurm_nodes
    }
    return {name: node for name, node in (kept | dict(ready)).items() if node in known_nodes}


@dataclass(frozen=True)
class Plan:
    files: dict[str, str]  # the topology file(s) the ConfigMap holds; any other is removed
    placed: int  # members in a switch or block
    unplaced: tuple[str, ...]  # members missing a label (or, 24.11, in too small a block)


def plan(settings: TopologySettings, nodes: NodeLabels) -> Plan:
    """Raises ConfigError (naming the field or switch) when no topology can be built."""
    if settings.plugin == "none":
        return Plan({}, 0, ())
    default, unplaced = _build(settings.plugin, settings, nodes)
    if settings.file == "topology.conf":
        text = render_topology_conf(default)
    else:
        named = [NamedTopology(settings.plugin, default, cluster_default=True)]
        if (second := settings.also()) is not None:
            topology, left_out = _build(second, settings, nodes)
            named.append(NamedTopology(second, topology))
            unplaced = tuple(sorted({*unplaced, *left_out}))
        text = render_topology_yaml(named)
    return Plan({settings.file: text}, len(nodes) - len(unplaced), unplaced)


def _build(
    plugin: str, settings: TopologySettings, nodes: NodeLabels
) -> tuple[Tree | Blocks, tuple[str, ...]]:
    """One topology and the nodes it leaves out (a missing label or, 24.11, too small a block)."""
    if plugin == "tree":
        tree = tree_from_labels(nodes, settings.tree.levels, unlabelled=UNLABELLED)
        return tree, next((s.nodes for s in tree.switches if s.name == UNLABELLED), ())
    blocks = blocks_from_labels(
        nodes, settings.block.label, settings.block.sizes, skip_unlabelled=True, small_blocks=True
    )
    if settings.file == "topology.conf":
        blocks = _only_full_blocks(blocks)
    placed = {node for block in blocks.blocks for node in block.nodes}
    return blocks, tuple(sorted(set(nodes) - placed))


def _only_full_blocks(blocks: Blocks) -> Blocks:
    """24.11's slurmctld exits on a block with fewer nodes than the base size
    ("children count lower than bblock_node_cnt"): leave such blocks out until
    they fill."""
    base = blocks.block_sizes[0]
    full: tuple[Block, ...] = tuple(b for b in blocks.blocks if len(b.nodes) >= base)
    return Blocks(full, blocks.block_sizes)
