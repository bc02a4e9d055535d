"""GRES and network topology for Slurm, from what Kubernetes knows of its nodes.

gres.conf from a GPU inventory (`render_gres_conf`, and `node_gres` for the
NodeName lines' `Gres=`): a product feature no sunk component uses yet, so it
lives in the workshop until one does. topology.conf and topology.yaml from
node labels (tree and block) are the product's (`sunk.topology`, which the
operator's topology controller uses) and are offered here too. Tests show a
real slurmctld and slurmd accept what they write
(tests/slurm/test_slurm_port_conf_accepted.py).

No slurm.conf here: the chart's templates are its one source
(charts/slurm/templates/_config.tpl); the test bed writes its sandbox's own.
"""

from sunk.topology.build import (
    Block,
    Blocks,
    NamedTopology,
    Switch,
    Tree,
    blocks_from_labels,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)
from sunk.topology.problems import ConfigError, Problem
from sunk_testbed.gres_topology.gres import GpuGroup, GpuInventory, node_gres, render_gres_conf

__all__ = [
    "Block",
    "Blocks",
    "ConfigError",
    "GpuGroup",
    "GpuInventory",
    "NamedTopology",
    "Problem",
    "Switch",
    "Tree",
    "blocks_from_labels",
    "node_gres",
    "render_gres_conf",
    "render_topology_conf",
    "render_topology_yaml",
    "tree_from_labels",
]
