"""GRES and topology generation: deterministic output, and errors that name the node or field."""

from __future__ import annotations

import pytest
import yaml

from sunk.topology.build import (
    NamedTopology,
    blocks_from_labels,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)
from sunk.topology.problems import ConfigError
from sunk_testbed.gres_topology import GpuGroup, node_gres, render_gres_conf


def test_gres_conf_groups_identical_nodes() -> None:
    h100 = [GpuGroup(type="h100", count=8, files="/dev/nvidia[0-7]", cores="0-31")]
    inventory = {
        "gpu001": h100,
        "gpu002": h100,
        "gpu003": h100,
        "a100-1": [GpuGroup(type="a100", count=2)],
        "cpu1": [],
    }
    assert render_gres_conf(inventory, autodetect="off") == (
        "AutoDetect=off\n"
        "NodeName=gpu[001-003] Name=gpu Type=h100 File=/dev/nvidia[0-7] Cores=0-31\n"
        "NodeName=a100-1 Name=gpu Type=a100 Count=2\n"
    )
    assert node_gres(h100) == ("gpu:h100:8",)


def test_gres_errors_name_node_and_field() -> None:
    with pytest.raises(ConfigError) as error:
        render_gres_conf(
            {
                "n1": [GpuGroup(type="h 100", count=8, files="/dev/nvidia[0-3]")],
                "n2": [GpuGroup(type="x", count=1, files="/dev/a[")],
            }
        )
    assert [str(p) for p in error.value.problems] == [
        "n1[0].type: 'h 100' is not a GRES type",
        "n1[0].files: 4 files for count 8",
        "n2[0].files: '/dev/a[': '[' is never closed",
    ]


LABELS = {
    f"n{i:02d}": {"fabric": f"f{i // 8}", "leaf": f"l{i // 4}", "nvl": f"d{i // 4}"}
    for i in range(16)
}


def test_tree_topology_from_labels() -> None:
    tree = tree_from_labels(LABELS, ["fabric", "leaf"])
    assert render_topology_conf(tree) == (
        "SwitchName=f0.l0 Nodes=n[00-03]\n"
        "SwitchName=f0.l1 Nodes=n[04-07]\n"
        "SwitchName=f1.l2 Nodes=n[08-11]\n"
        "SwitchName=f1.l3 Nodes=n[12-15]\n"
        "SwitchName=f0 Switches=f0.l0,f0.l1\n"
        "SwitchName=f1 Switches=f1.l2,f1.l3\n"
        "SwitchName=root Switches=f0,f1\n"
    )
    one_fabric = {name: labels for name, labels in LABELS.items() if labels["fabric"] == "f0"}
    assert "root" not in render_topology_conf(tree_from_labels(one_fabric, ["fabric", "leaf"]))


def test_block_topology_from_labels() -> None:
    blocks = blocks_from_labels(LABELS, "nvl", [4, 16])
    assert render_topology_conf(blocks) == (
        "BlockName=d0 Nodes=n[00-03]\n"
        "BlockName=d1 Nodes=n[04-07]\n"
        "BlockName=d2 Nodes=n[08-11]\n"
        "BlockName=d3 Nodes=n[12-15]\n"
        "BlockSizes=4,16\n"
    )
    assert blocks_from_labels(LABELS, "nvl").block_sizes == (4,)


def test_topology_yaml_holds_several_topologies() -> None:
    text = render_topology_yaml(
        [
            NamedTopology("fabric", tree_from_labels(LABELS, ["fabric"]), cluster_default=True),
            NamedTopology("nvlink", blocks_from_labels(LABELS, "nvl")),
        ]
    )
    assert yaml.safe_load(text) == [
        {
            "topology": "fabric",
            "cluster_default": True,
            "tree": {
                "switches": [
                    {"switch": "f0", "nodes": "n[00-07]"},
                    {"switch": "f1", "nodes": "n[08-15]"},
                    {"switch": "root", "children": "f0,f1"},
                ]
            },
        },
        {
            "topology": "nvlink",
            "cluster_default": False,
            "block": {
                "block_sizes": [4],
                "blocks": [
                    {"block": f"d{i}", "nodes": f"n[{4 * i:02d}-{4 * i + 3:02d}]"} for i in range(4)
                ],
            },
        },
    ]


def test_topology_errors_name_the_node_or_field() -> None:
    with pytest.raises(ConfigError, match=r"nodes\.n00: has no label 'rack'"):
        tree_from_labels(LABELS, ["fabric", "rack"])
    with pytest.raises(ConfigError, match=r"block_sizes: 12 is not a power-of-two multiple of 4"):
        blocks_from_labels(LABELS, "nvl", [4, 12])
    with pytest.raises(ConfigError, match=r"base size 8 exceeds the smallest block"):
        blocks_from_labels(LABELS, "nvl", [8])
    with pytest.raises(ConfigError, match="exactly one must be the cluster default"):
        render_topology_yaml([NamedTopology("a", blocks_from_labels(LABELS, "nvl"))])
