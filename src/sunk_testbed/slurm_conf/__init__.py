"""Slurm configuration rendering: pure functions from typed specs to files.

The test bed's, for beds and benchmarks that start Slurm with a rendered
configuration; the charts render a cluster's with Helm templates.
"""

from sunk_testbed.slurm_conf.check import check_slurm_conf
from sunk_testbed.slurm_conf.cluster import (
    Auth,
    ClusterSpec,
    Controller,
    NodeGroup,
    NodeSet,
    Partition,
    Preemption,
    Scheduler,
    TopologySettings,
    render_slurm_conf,
    validate_cluster,
)
from sunk_testbed.slurm_conf.gres import GpuGroup, GpuInventory, node_gres, render_gres_conf
from sunk_testbed.slurm_conf.problems import ConfigError, Problem
from sunk_testbed.slurm_conf.topology import (
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

__all__ = [
    "Auth",
    "Block",
    "Blocks",
    "ClusterSpec",
    "ConfigError",
    "Controller",
    "GpuGroup",
    "GpuInventory",
    "NamedTopology",
    "NodeGroup",
    "NodeSet",
    "Partition",
    "Preemption",
    "Problem",
    "Scheduler",
    "Switch",
    "TopologySettings",
    "Tree",
    "blocks_from_labels",
    "check_slurm_conf",
    "node_gres",
    "render_gres_conf",
    "render_slurm_conf",
    "render_topology_conf",
    "render_topology_yaml",
    "tree_from_labels",
    "validate_cluster",
]
