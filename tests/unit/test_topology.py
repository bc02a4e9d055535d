"""The topology controller's pure parts: which slurmd pods are placed, what the
ConfigMap must hold for each plugin and file, what Slurm takes for a topology
with no nodes yet, and settings errors that name the field."""

from __future__ import annotations

import datetime

import pytest
import yaml
from lightkube.models.core_v1 import PodCondition, PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Pod

from sunk.api import LABEL_NODESET
from sunk.api.nodeset import API_VERSION, KIND
from sunk.topology.build import (
    Blocks,
    NamedTopology,
    Tree,
    blocks_from_labels,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)
from sunk.topology.plan import UNLABELLED, members, plan, ready_slurmd
from sunk.topology.problems import ConfigError
from sunk.topology.settings import TopologySettings, parse_settings

ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"
NVL = "example.com/nvlink-domain"


def slurmd_pod(
    name: str,
    node: str,
    *,
    ready: bool = True,
    owned: bool = True,
    deleting: bool = False,
) -> Pod:
    owner = OwnerReference(
        apiVersion=API_VERSION, kind=KIND, name="compute", uid="u1", controller=True
    )
    return Pod(
        metadata=ObjectMeta(
            name=name,
            namespace="slurm",
            labels={LABEL_NODESET: "compute"},
            ownerReferences=[owner] if owned else None,
            deletionTimestamp=datetime.datetime(2026, 1, 1) if deleting else None,
        ),
        spec=PodSpec(containers=[], nodeName=node),
        status=PodStatus(
            conditions=[PodCondition(type="Ready", status="True" if ready else "False")]
        ),
    )


def test_a_node_enters_when_its_nodeset_pod_is_ready_on_a_known_node() -> None:
    pods = [
        slurmd_pod("compute-k1", "k1"),
        slurmd_pod("compute-k2", "k2", ready=False),  # slurmd not registered yet
        slurmd_pod("compute-k3", "k3", deleting=True),
        slurmd_pod("lookalike-k4", "k4", owned=False),  # a label alone makes no slurmd pod
        slurmd_pod("compute-gone", "k9"),  # its Node is gone
    ]
    ready = ready_slurmd(pods)
    assert ready == {"compute-k1": "k1", "compute-gone": "k9"}
    assert members(ready, {"k1", "k2", "k3", "k4"}, {}, set()) == {"compute-k1": "k1"}


def test_a_placed_node_stays_while_slurm_has_it_whatever_its_pod_does() -> None:
    """A replaced or flapping slurmd pod keeps its node in the file: a node
    out of it is refused to jobs that name it until it is back."""
    nodes = {"k1", "k2", "k3"}
    placed = {"compute-k1": "k1", "compute-k2": "k2", "compute-k3": "k3"}
    # compute-k1's pod is being replaced, compute-k2's not Ready; Slurm has both.
    # compute-k3 was deleted from Slurm (its pod gone for good): it leaves.
    slurm = {"compute-k1", "compute-k2"}
    assert members({}, nodes, placed, slurm) == {"compute-k1": "k1", "compute-k2": "k2"}
    # Slurm not known at the moment: nothing leaves.
    assert members({}, nodes, placed, None) == placed
    # A Ready pod places its node where it runs now; a Node that is gone places nothing.
    assert members({"compute-k1": "k3"}, {"k2", "k3"}, placed, slurm) == {
        "compute-k1": "k3",
        "compute-k2": "k2",
    }


def settings(**raw: object) -> TopologySettings:
    return TopologySettings.model_validate(raw)


NODES = {
    "c1": {ZONE: "z1", RACK: "r1", NVL: "d1"},
    "c2": {ZONE: "z1", RACK: "r1", NVL: "d1"},
    "c3": {ZONE: "z1", RACK: "r2", NVL: "d2"},
    "c4": {ZONE: "z2", RACK: "r3"},
}


def test_a_tree_from_zone_and_rack_with_the_unlabelled_under_the_root() -> None:
    nodes = {**NODES, "c5": {ZONE: "z2"}, "c6": {}}
    wanted = plan(settings(plugin="tree", tree={"levels": [ZONE, RACK]}), nodes)
    assert yaml.safe_load(wanted.files["topology.yaml"]) == [
        {
            "topology": "tree",
            "cluster_default": True,
            "tree": {
                "switches": [
                    {"switch": "z1.r1", "nodes": "c[1-2]"},
                    {"switch": "z1.r2", "nodes": "c3"},
                    {"switch": "z2.r3", "nodes": "c4"},
                    {"switch": "z1", "children": "z1.r1,z1.r2"},
                    {"switch": "z2", "children": "z2.r3"},
                    {"switch": UNLABELLED, "nodes": "c[5-6]"},
                    {"switch": "root", "children": f"z1,z2,{UNLABELLED}"},
                ]
            },
        }
    ]
    assert (wanted.placed, wanted.unplaced) == (4, ("c5", "c6"))


def test_24_11_gets_topology_conf() -> None:
    wanted = plan(settings(plugin="tree", file="topology.conf", tree={"levels": [ZONE]}), NODES)
    assert wanted.files == {
        "topology.conf": (
            "SwitchName=z1 Nodes=c[1-3]\nSwitchName=z2 Nodes=c4\nSwitchName=root Switches=z1,z2\n"
        )
    }


def test_blocks_leave_the_unlabelled_out_and_may_be_smaller_than_the_base_on_26_05() -> None:
    wanted = plan(settings(plugin="block", block={"label": NVL, "sizes": [2, 4]}), NODES)
    assert yaml.safe_load(wanted.files["topology.yaml"])[0]["block"] == {
        "block_sizes": [2, 4],
        "blocks": [{"block": "d1", "nodes": "c[1-2]"}, {"block": "d2", "nodes": "c3"}],
    }
    assert wanted.unplaced == ("c4",)


def test_the_other_plugins_settings_add_a_second_topology_for_partitions() -> None:
    """topology.yaml: the tree stays the cluster's default; the blocks are a
    topology named `block` that a partition selects with Topology=block."""
    wanted = plan(
        settings(plugin="tree", tree={"levels": [ZONE]}, block={"label": NVL, "sizes": [2]}),
        NODES,
    )
    tree, blocks = yaml.safe_load(wanted.files["topology.yaml"])
    assert (tree["topology"], tree["cluster_default"]) == ("tree", True)
    assert (blocks["topology"], blocks["cluster_default"]) == ("block", False)
    assert blocks["block"]["blocks"] == [
        {"block": "d1", "nodes": "c[1-2]"},
        {"block": "d2", "nodes": "c3"},
    ]
    assert (wanted.placed, wanted.unplaced) == (3, ("c4",))  # c4 is in no block
    with pytest.raises(ConfigError, match=r"block\.label: topology\.conf holds one topology"):
        parse_settings(
            "plugin: tree\nfile: topology.conf\ntree: {levels: [z]}\nblock: {label: d}\n"
        )


def test_24_11_blocks_wait_until_they_hold_the_base_size() -> None:
    # Its slurmctld exits on a block smaller than the base size.
    wanted = plan(
        settings(plugin="block", file="topology.conf", block={"label": NVL, "sizes": [2]}), NODES
    )
    assert wanted.files == {"topology.conf": "BlockName=d1 Nodes=c[1-2]\nBlockSizes=2\n"}
    assert wanted.unplaced == ("c3", "c4")


def test_no_nodes_yet_is_a_topology_each_slurm_accepts() -> None:
    # Seen on the bed: 26.05 refuses `switches: []` / `blocks: []` and takes one
    # without nodes; 24.11 refuses a switch without nodes and takes an empty file.
    tree = plan(settings(plugin="tree", tree={"levels": [ZONE]}), {})
    assert yaml.safe_load(tree.files["topology.yaml"])[0]["tree"] == {
        "switches": [{"switch": "empty"}]
    }
    blocks = plan(settings(plugin="block", block={"label": NVL}), {"c4": NODES["c4"]})
    assert yaml.safe_load(blocks.files["topology.yaml"])[0]["block"] == {
        "block_sizes": [1],
        "blocks": [{"block": "empty"}],
    }
    assert render_topology_conf(Tree(())) == "# no nodes in the topology yet\n"
    assert render_topology_conf(Blocks((), (4,))) == "# no nodes in the topology yet\n"
    only_unlabelled = tree_from_labels({"c6": {}}, [ZONE], unlabelled=UNLABELLED)
    assert render_topology_conf(only_unlabelled) == f"SwitchName={UNLABELLED} Nodes=c6\n"


def test_plugin_none_removes_the_topology_files() -> None:
    assert plan(settings(), NODES).files == {}


def test_settings_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as error:
        parse_settings("plugin: torus\nblock: {sizes: [two]}")
    assert [p.where for p in error.value.problems] == ["plugin", "block.sizes.0"]
    with pytest.raises(ConfigError, match=r"tree\.levels: the tree needs at least one label"):
        parse_settings("plugin: tree")
    with pytest.raises(ConfigError, match=r"block\.label: blocks need a label key"):
        parse_settings("plugin: block")
    with pytest.raises(ConfigError, match="not YAML"):
        parse_settings("plugin: [")
    assert parse_settings(None) == TopologySettings()


def test_label_values_that_collide_name_the_switch() -> None:
    with pytest.raises(ConfigError, match=r"switch a_b: label values collide"):
        tree_from_labels({"n1": {ZONE: "a/b"}, "n2": {ZONE: "a_b"}}, [ZONE])
    with pytest.raises(ConfigError, match=rf"switch {UNLABELLED}: label values collide"):
        tree_from_labels({"n1": {ZONE: UNLABELLED}, "n2": {}}, [ZONE], unlabelled=UNLABELLED)


def test_strict_builders_still_refuse_what_the_controller_tolerates() -> None:
    with pytest.raises(ConfigError, match=r"nodes\.c6: has no label"):
        tree_from_labels({"c6": {}}, [ZONE])
    with pytest.raises(ConfigError, match="no nodes to place in blocks"):
        blocks_from_labels({}, NVL)
    text = render_topology_yaml(
        [
            NamedTopology(
                "b",
                blocks_from_labels(NODES, NVL, [2], skip_unlabelled=True, small_blocks=True),
                cluster_default=True,
            )
        ]
    )
    assert "c4" not in text
