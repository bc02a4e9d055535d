"""Property-based tests of text that reaches Slurm's files and arguments:
hostlists, the NodeSet fields that become slurmd's --conf line and node
names, and node labels that become the topology (tests/plugins/fuzz.py sets
how many inputs each tries)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import Node
from pydantic import ValidationError

from sunk.api import nodeset as api
from sunk.nodeset.pods import SpecError, slurm_node_name, slurmd_conf
from sunk.slurm.hostlist import MAX_HOSTS, HostlistError, compress, expand
from sunk.topology.build import (
    Tree,
    blocks_from_labels,
    render_topology_conf,
    tree_from_labels,
)
from sunk.topology.problems import ConfigError

pytestmark = pytest.mark.fuzz

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
HOSTLIST_PIECES = st.sampled_from(["[", "]", ",", "-", "0", "1", "9", "01", "n", " ", "²", "٣"])
HOSTLIST_TEXT = st.one_of(ANY_TEXT, st.lists(HOSTLIST_PIECES, max_size=20).map("".join))
# Node names as Slurm and Kubernetes allow them: what `compress` is given.
LOWER = "abcdefghijklmnopqrstuvwxyz"
ALNUM = LOWER + LOWER.upper() + "0123456789"
NODE_NAMES = st.builds(
    lambda first, middle, last: first + middle + last,
    st.sampled_from(LOWER),
    st.text(LOWER + "0123456789-", max_size=8),
    st.sampled_from(LOWER + "0123456789"),
)
LABEL_VALUES = st.builds(
    lambda first, middle, last: first + middle + last,
    st.sampled_from(ALNUM),
    st.text(ALNUM + "-_.", max_size=20),
    st.sampled_from(["", *ALNUM]),
)


@given(text=HOSTLIST_TEXT)
def test_a_hostlist_expands_or_is_refused_by_name(text: str) -> None:
    try:
        names = expand(text)
    except HostlistError:
        return
    assert len(names) <= MAX_HOSTS


@given(count=st.integers(1_000, 10**7), groups=st.integers(2, 4))
def test_a_huge_hostlist_is_refused_before_it_is_multiplied_out(count: int, groups: int) -> None:
    text = "n" + f"[0-{count}]" * groups
    with pytest.raises(HostlistError, match="more than"):
        expand(text)


@given(names=st.lists(NODE_NAMES, max_size=40))
def test_a_compressed_hostlist_expands_to_the_same_names(names: list[str]) -> None:
    assert sorted(set(expand(compress(names)))) == sorted(set(names))


# -- NodeSet fields that reach slurmd's --conf line and the node's name ------------------

CONF_KEYS = {"Feature", "CPUs", "RealMemory", "Gres"}


def a_node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> Node:
    return Node.from_dict(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": allocatable,
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            },
        }
    )


@given(
    features=st.lists(ANY_TEXT | LABEL_VALUES, max_size=4),
    gres=st.one_of(st.none(), st.lists(ANY_TEXT | st.sampled_from(["gpu:h100:8", "gpu:2"]))),
    from_labels=st.lists(st.sampled_from(["rack", "zone", "gpu"]), max_size=3),
    labels=st.dictionaries(
        st.sampled_from(["rack", "zone", "gpu", "nvidia.com/gpu.product"]), LABEL_VALUES
    ),
    gpus=st.sampled_from([None, "0", "4"]),
    node=NODE_NAMES,
    pattern=st.sampled_from(["{nodeset}-{node}", "{node}", "x-{ip}", "{nodeset}{node}"]),
)
def test_a_nodesets_fields_give_one_conf_line_of_known_keys(
    features: list[str],
    gres: list[str] | None,
    from_labels: list[str],
    labels: dict[str, str],
    gpus: str | None,
    node: str,
    pattern: str,
) -> None:
    """Whatever the NodeSet and the node's labels say: validated at admission or
    a --conf line whose words are each Key=value with a key slurmd expects, no
    key twice, and a node name Slurm and DNS take."""
    try:
        spec = api.SlurmNodeSpec.model_validate(
            {
                "features": features,
                "featuresFromLabels": from_labels,
                "resources": {"gres": gres},
                "nodeName": pattern,
            }
        )
    except ValidationError:
        return
    allocatable = {"cpu": "8", "memory": "16Gi"} | ({"nvidia.com/gpu": gpus} if gpus else {})
    kube_node = a_node(node, labels, allocatable)
    line = slurmd_conf("set-a", spec, kube_node)
    words = line.split(" ")
    keys = [word.partition("=")[0] for word in words]
    assert set(keys) <= CONF_KEYS
    assert len(keys) == len(set(keys))
    for word in words:
        key, _, value = word.partition("=")
        assert value, word
        assert not any(c.isspace() or c == "=" for c in value), word
        if key == "Feature":
            assert all(re.fullmatch(r"[A-Za-z0-9_.+-]+", f) for f in value.split(","))
    try:
        name = slurm_node_name(spec.node_name, "set-a", kube_node)
    except SpecError:
        return
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name)


# -- node labels that become the topology --------------------------------------------------


@given(
    nodes=st.dictionaries(
        NODE_NAMES,
        st.dictionaries(st.sampled_from(["fabric", "leaf", "block"]), LABEL_VALUES),
        max_size=12,
    ),
    unlabelled=st.sampled_from([None, "unplaced"]),
)
def test_node_labels_give_a_topology_whose_file_names_each_node_once(
    nodes: dict[str, dict[str, str]], unlabelled: str | None
) -> None:
    """Any label values: a refusal naming the problem, or a topology.conf that
    places every node in exactly one leaf and holds one switch per line."""
    try:
        tree = tree_from_labels(nodes, ["fabric", "leaf"], unlabelled=unlabelled)
    except ConfigError:
        return
    placed = _nodes_per_line(render_topology_conf(tree), "SwitchName")
    assert sorted(placed) == sorted(nodes)
    assert isinstance(tree, Tree)
    try:
        blocks = blocks_from_labels(nodes, "block", skip_unlabelled=True, small_blocks=True)
    except ConfigError:
        return
    in_blocks = _nodes_per_line(render_topology_conf(blocks), "BlockName")
    assert sorted(in_blocks) == sorted(n for n, labels in nodes.items() if labels.get("block"))


def _nodes_per_line(conf: str, first: str) -> list[str]:
    nodes: list[str] = []
    for line in conf.splitlines():
        if line.startswith("#") or line.startswith("BlockSizes="):
            continue
        words = dict(word.split("=", 1) for word in line.split(" "))
        assert set(words) <= {first, "Nodes", "Switches"}, line
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", words[first]), line
        if "Nodes" in words:
            nodes += expand(words["Nodes"])
    return nodes
