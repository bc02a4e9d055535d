"""Config rendering: deterministic output, and errors that name the field or line."""

from __future__ import annotations

import pydantic
import pytest
import yaml

from sunk_testbed.slurm_conf import (
    ClusterSpec,
    ConfigError,
    Controller,
    GpuGroup,
    NamedTopology,
    NodeGroup,
    NodeSet,
    Partition,
    Preemption,
    blocks_from_labels,
    check_slurm_conf,
    node_gres,
    render_gres_conf,
    render_slurm_conf,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)


def spec(**changes: object) -> ClusterSpec:
    base = ClusterSpec(
        cluster_name="c1",
        controllers=(Controller(name="ctl-0", address="10.0.0.1"), Controller(name="ctl-1")),
        nodes=(
            NodeGroup(
                names="gpu[001-004]",
                cpus=64,
                real_memory_mb=512000,
                gres=node_gres([GpuGroup(type="h100", count=8)]),
                features=("h100", "rack1"),
            ),
        ),
        node_sets=(NodeSet(name="dyn", feature="sunk-dynamic"),),
        max_node_count=1000,
        partitions=(
            Partition(
                name="gpu", nodes=("gpu[001-004]", "dyn"), default=True, max_time="7-00:00:00"
            ),
            Partition(name="low", nodes=("ALL",), priority_tier=1, preempt_mode=("REQUEUE",)),
        ),
        preemption=Preemption(type="preempt/partition_prio", mode=("REQUEUE",)),
        settings={"MinJobAge": 30, "SlurmctldLogFile": "/var/log/slurm/slurmctld.log"},
        extra_lines=("# added by hand", "SlurmctldDebug=info"),
    )
    return base.model_copy(update=changes)


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_renders_every_part_of_the_spec() -> None:
    text = render_slurm_conf(spec())
    assert lines(text) == [
        "ClusterName=c1",
        "SlurmctldHost=ctl-0(10.0.0.1)",
        "SlurmctldHost=ctl-1",
        "SlurmctldPort=6817",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "AuthAltTypes=auth/jwt",
        "AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "ReturnToService=2",
        "MaxNodeCount=1000",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "GresTypes=gpu",
        "MinJobAge=30",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "NodeName=gpu[001-004] CPUs=64 RealMemory=512000 Gres=gpu:h100:8 Features=h100,rack1",
        "NodeSet=dyn Feature=sunk-dynamic",
        "PartitionName=gpu Nodes=gpu[001-004],dyn Default=YES MaxTime=7-00:00:00 State=UP",
        "PartitionName=low Nodes=ALL MaxTime=INFINITE PriorityTier=1 PreemptMode=REQUEUE State=UP",
        "# added by hand",
        "SlurmctldDebug=info",
    ]
    assert render_slurm_conf(spec()) == text  # deterministic: no spurious reconfigures
    assert check_slurm_conf(text) == []


def problems_of(bad: ClusterSpec) -> list[str]:
    with pytest.raises(ConfigError) as error:
        render_slurm_conf(bad)
    return [str(p) for p in error.value.problems]


def test_semantic_errors_name_the_field() -> None:
    bad = spec(
        cluster_name="Big Cluster",
        nodes=(NodeGroup(names="gpu[01-04"), NodeGroup(names="a[1-2]"), NodeGroup(names="a2")),
        node_sets=(NodeSet(name="dyn", feature="x", nodes="a1"),),
        partitions=(
            Partition(name="p", nodes=("zzz",), max_time="forever", default=True),
            Partition(name="p", nodes=("a1",), default=True, preempt_mode=("SOMETIMES",)),
        ),
        settings={"Bogus": 1, "ClusterName": "x", "Prolog": "/a b"},
        extra_lines=("Foo=1", "NodeName=a1"),
    )
    assert problems_of(bad) == [
        "cluster_name: use 1-40 lower-case letters, digits, '-' or '_'",
        "nodes[0].names: 'gpu[01-04': '[' is never closed",
        "nodes[2].names: node a2 also in nodes[1]",
        "node_sets[0]: set exactly one of `feature` and `nodes`",
        "partitions[0].nodes: unknown node or node set zzz",
        "partitions[0].max_time: 'forever' is not a Slurm time",
        "partitions[1].name: duplicate partition 'p'",
        "partitions[1].preempt_mode: unknown mode 'SOMETIMES'",
        "partitions: more than one default partition",
        "settings.Bogus: not a slurm.conf key here",
        "settings.ClusterName: set by a typed field of the spec",
        "settings.Prolog: values may not contain spaces or '#'",
        "extra_lines[0]: unknown key 'Foo'",
    ]


def test_dynamic_node_sets_need_room() -> None:
    assert problems_of(spec(max_node_count=None)) == [
        "max_node_count: dynamic node sets (feature=...) need room: set it"
    ]


def test_extra_lines_may_not_redefine_nodes() -> None:
    problems = problems_of(spec(extra_lines=("NodeName=gpu002 CPUs=1",)))
    assert problems == ["line 25: node gpu002 already defined on line 21"]


def test_unknown_and_mistyped_fields_name_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as error:
        ClusterSpec.model_validate(
            {
                "cluster_name": "c",
                "controllers": [{"name": "ctl"}],
                "partitions": [{"name": "p", "nodes": ["ALL"], "maxtime": "1"}],
                "nodes": [{"names": "n1", "cpus": "many"}],
            }
        )
    text = str(error.value)
    assert "partitions.0.maxtime" in text
    assert "Extra inputs are not permitted" in text
    assert "nodes.0.cpus" in text
    with pytest.raises(pydantic.ValidationError, match="controllers"):
        ClusterSpec.model_validate({"cluster_name": "c", "controllers": [], "partitions": []})


def test_check_slurm_conf_names_lines() -> None:
    text = "\n".join(
        [
            "ClusterName=c  # comment",
            "SlurmctldPort=6817",
            "NodeName=n[1-2] CPUs=2 Bogus=1",
            "NodeName=n2",
            "PartitionName=p Nodes=n[1-2 State=UP",
            "SlurmctldPort=6818",
            "not a pair",
            "Include /etc/slurm/extra.conf",
            "",
        ]
    )
    assert [str(p) for p in check_slurm_conf(text)] == [
        "line 3: unknown key 'Bogus' on a NodeName line",
        "line 4: node n2 already defined on line 3",
        "line 5: bad hostlist in nodes: 'n[1-2': '[' is never closed",
        "line 6: SlurmctldPort already set on line 2",
        "line 7: not Key=Value pairs: 'not a pair'",
    ]
    assert check_slurm_conf("clustername=c\nnodename=a cpus=1\n") == []  # case-insensitive


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
