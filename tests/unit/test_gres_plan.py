"""gres.conf from each node's GPUs (sunk.gres.plan): a line per Slurm GPU
node naming the device files its Node lists, typed as its slurmd's --conf.
Pods and Nodes are built here (no apiserver); the controller on the real
one is tests/charts/test_local_up_gpus.py."""

from __future__ import annotations

import datetime
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node, Pod

from sunk.api import (
    ANNOTATION_NODE_GPUS,
    ANNOTATION_SLURMD_CONF,
    ANNOTATION_SLURMD_GPUS,
    LABEL_NODE,
    LABEL_NODESET,
)
from sunk.api.nodeset import API_VERSION, KIND
from sunk.gres.plan import (
    HEADER,
    GpuNode,
    GresLine,
    conf_gpus,
    gres_line,
    lines_since,
    listed_gpus,
    plan,
    slurm_gpu_devices,
)
from sunk.slurm.hostlist import expand

CONF = "Feature=compute CPUs=2 RealMemory=1000 Gres=gpu:4"


def slurmd_pod(
    name: str,
    node: str,
    conf: str = CONF,
    *,
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
            labels={LABEL_NODESET: "compute", LABEL_NODE: node},
            annotations={ANNOTATION_SLURMD_CONF: conf},
            ownerReferences=[owner] if owned else None,
            deletionTimestamp=datetime.datetime(2026, 1, 1) if deleting else None,
        ),
        spec=PodSpec(containers=[]),
    )


def gpu_node(name: str, gpus: str | None) -> Node:
    annotations = {ANNOTATION_NODE_GPUS: gpus} if gpus is not None else {}
    return Node(metadata=ObjectMeta(name=name, annotations=annotations))


@pytest.mark.parametrize(
    ("conf", "gpus"),
    [
        (CONF, (None, 4)),
        ("Feature=a Gres=gpu:h100:8 CPUs=4", ("h100", 8)),
        ("Feature=a Gres=gpu:nvidia_a100_1g.5gb:1", ("nvidia_a100_1g.5gb", 1)),
        ("Feature=a CPUs=2", None),
        ("Feature=a Gres=gpu:4,shard:8", None),  # the admin's own GRES: gresConfig
        ("Feature=a Gres=gpu:mig:1,gpu:h100:1", None),
        ("Feature=Gres=gpu:4", None),
        ("", None),
    ],
)
def test_a_conf_counts_gpus_only_when_gpus_alone(
    conf: str, gpus: tuple[str | None, int] | None
) -> None:
    assert conf_gpus(conf) == gpus


def test_each_gpu_node_gets_its_own_files_typed_as_its_slurmd() -> None:
    pods = [
        slurmd_pod("compute-b", "b", "Feature=compute Gres=gpu:h100:8"),
        slurmd_pod("compute-a", "a"),
        slurmd_pod("compute-cpu", "cpu", "Feature=compute CPUs=2"),  # no GPU line
        slurmd_pod("compute-gone", "gone"),  # its Node is not (yet) known
        slurmd_pod("compute-new", "new"),  # its plugin has not written yet
        slurmd_pod("compute-old", "a", deleting=True),
        slurmd_pod("stray", "a", owned=False),  # a pod no NodeSet owns
        slurmd_pod("compute-none", "none"),  # every GPU gone
    ]
    nodes = {
        "a": gpu_node("a", "0,2,3"),
        "b": gpu_node("b", "0,1,2,3,4,5,6,7"),
        "cpu": gpu_node("cpu", ""),
        "new": gpu_node("new", None),
        "none": gpu_node("none", ""),
    }
    wanted = plan(pods, nodes)
    assert wanted.text == HEADER + (
        "NodeName=compute-a Name=gpu File=/dev/nvidia[0,2-3]\n"
        "NodeName=compute-b Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    )
    assert wanted.nodes == 2
    assert wanted.problems == ()


def test_a_gpu_list_that_does_not_parse_is_reported_and_its_node_gets_no_line() -> None:
    wanted = plan([slurmd_pod("compute-a", "a")], {"a": gpu_node("a", "all")})
    assert wanted.text == HEADER
    assert len(wanted.problems) == 1
    assert "node a" in wanted.problems[0]
    assert ANNOTATION_NODE_GPUS in wanted.problems[0]


def test_one_gpu_is_one_file() -> None:
    assert gres_line(GpuNode("n", (3,))) == "NodeName=n Name=gpu File=/dev/nvidia3"


@given(st.sets(st.integers(min_value=0, max_value=63), min_size=1, max_size=16))
def test_the_files_are_exactly_the_nodes_gpus(gpus: set[int]) -> None:
    """Read back as Slurm reads a hostlist, the File= names each GPU's device
    file once, and no other."""
    line = gres_line(GpuNode("n", tuple(sorted(gpus))))
    assert line is not None
    files = line.split("File=", 1)[1]
    assert sorted(expand(files)) == sorted(f"/dev/nvidia{i}" for i in gpus)


def test_the_lines_written_read_back_as_each_nodes_gpu_count() -> None:
    pods = [slurmd_pod("compute-a", "a"), slurmd_pod("compute-b", "b", "Gres=gpu:h100:8")]
    nodes = {"a": gpu_node("a", "0,2,3"), "b": gpu_node("b", "0,1,2,3,4,5,6,7")}
    text = plan(pods, nodes).text + "Name=shard Count=8\n"  # not its own: not counted
    assert listed_gpus(text, {"compute-a": 100.0}) == {
        "compute-a": GresLine(3, 100.0),
        "compute-b": GresLine(8, 0.0),
    }


def test_a_line_keeps_its_time_until_it_changes() -> None:
    old = {
        "a": "NodeName=a Name=gpu File=/dev/nvidia[0-3]",
        "b": "NodeName=b Name=gpu File=/dev/nvidia0",
    }
    new = {"a": old["a"], "b": "NodeName=b Name=gpu File=/dev/nvidia[0-1]", "c": "x"}
    assert lines_since(old, new, {"a": 5.0, "b": 5.0, "gone": 1.0}, 9.0) == {
        "a": 5.0,
        "b": 9.0,
        "c": 9.0,
    }


def test_a_pods_own_gpu_list_names_its_files_not_its_nodes_list_now() -> None:
    """Set by the NodeSet controller, changed only when the node is drained
    and idle: a GPU gone from the Node leaves the line as it is until then."""
    pod = slurmd_pod("compute-a", "a")
    assert pod.metadata is not None
    pod.metadata.annotations = {**(pod.metadata.annotations or {}), ANNOTATION_SLURMD_GPUS: "0-bad"}
    wanted = plan([pod], {"a": gpu_node("a", "0,2,3")})
    assert wanted.problems[0].startswith("pod compute-a:")
    pod.metadata.annotations[ANNOTATION_SLURMD_GPUS] = "0,1,2,3"
    assert plan([pod], {"a": gpu_node("a", "0,2,3")}).text.endswith(
        "NodeName=compute-a Name=gpu File=/dev/nvidia[0-3]\n"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("indices", "listed", "devices"),
    [
        ((0, 1), "0,1,2,3", (0, 1)),
        ((1,), "0,2,3", (2,)),  # IDX:1 of File=/dev/nvidia[0,2-3]
        ((0, 1, 2), "0,2,3", (0, 2, 3)),
        ((0, 2), "1,5,7", (1, 7)),
        ((3, 0), "0,1,2,3", (3, 0)),
        ((0, 1), None, (0, 1)),  # no list on the pod: Slurm's indices as they are
        ((), "", ()),
    ],
)
def test_slurms_gpu_indices_name_the_devices_of_the_nodes_line(
    indices: tuple[int, ...], listed: str | None, devices: tuple[int, ...]
) -> None:
    assert slurm_gpu_devices(indices, listed) == devices


@pytest.mark.unit
@pytest.mark.parametrize(
    ("indices", "listed", "words"),
    [
        ((3,), "0,2,3", ["[3]", "beyond the 3 GPUs", ANNOTATION_SLURMD_GPUS]),
        ((0,), "", ["beyond the 0 GPUs"]),
        ((0,), "2,0", [ANNOTATION_SLURMD_GPUS, "'2,0'"]),
        ((0,), "0, 1", [ANNOTATION_SLURMD_GPUS]),
    ],
)
def test_an_index_beyond_the_line_or_a_list_that_does_not_parse_is_refused_naming_it(
    indices: tuple[int, ...], listed: str, words: list[str]
) -> None:
    with pytest.raises(ValueError, match=re.escape(words[0])) as raised:
        slurm_gpu_devices(indices, listed)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.unit
@given(
    st.sets(st.integers(0, 63), max_size=16).flatmap(
        lambda present: st.tuples(
            st.just(sorted(present)),
            st.lists(st.integers(0, max(len(present) - 1, 0)), unique=True)
            if present
            else st.just([]),
        )
    )
)
def test_each_slurm_index_names_one_present_gpu_and_distinct_indices_distinct_gpus(
    case: tuple[list[int], list[int]],
) -> None:
    present, indices = case
    devices = slurm_gpu_devices(indices, ",".join(map(str, present)))
    assert set(devices) <= set(present)
    assert len(set(devices)) == len(indices)
    # The count's order is the line's: a lower index names a lower device.
    assert [devices[indices.index(i)] for i in sorted(indices)] == sorted(devices)
