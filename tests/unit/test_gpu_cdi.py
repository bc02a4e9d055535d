"""CDI specs (sunk.gpus.cdi): read and checked with every error naming its
field, resolved to exactly the edits of the devices asked for, written and
read back unchanged; and, property-based, no text makes the reader fail but
with SpecError."""

from __future__ import annotations

import contextlib
import json
from typing import Any, TypeVar

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from plugins.cdi_specs import NVIDIA_CTK_SPEC as NVIDIA
from sunk.gpus.cdi import (
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Mount,
    Spec,
    SpecError,
    parse_spec,
    spec_json,
    spec_to_dict,
)

pytestmark = pytest.mark.unit


def test_nvidias_shape_is_read() -> None:
    spec = parse_spec(NVIDIA)
    assert spec.kind == "nvidia.com/gpu"
    assert spec.names() == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]
    assert spec.edits.device_nodes == (DeviceNode("/dev/nvidiactl"), DeviceNode("/dev/nvidia-uvm"))
    (mount,) = spec.edits.mounts
    assert mount.options == ("ro", "nosuid", "nodev", "bind")
    (hook,) = spec.edits.hooks
    assert hook.args[1] == "update-ldcache"


def test_one_gpu_gets_the_common_edits_and_its_own_device_node_alone() -> None:
    spec = parse_spec(NVIDIA)
    edits = spec.resolve(["nvidia.com/gpu=1"])
    assert [n.path for n in edits.device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia1",
    ]
    assert edits.mounts == spec.edits.mounts
    assert edits.env == ("NVIDIA_VISIBLE_DEVICES=void",)


def test_two_names_for_one_device_node_give_it_once() -> None:
    edits = parse_spec(NVIDIA).resolve(["nvidia.com/gpu=0", "nvidia.com/gpu=all"])
    paths = [n.path for n in edits.device_nodes]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"]


def test_no_device_asked_gives_nothing_not_even_the_common_edits() -> None:
    assert parse_spec(NVIDIA).resolve([]) == ContainerEdits()


@pytest.mark.parametrize(
    "name", ["nvidia.com/gpu=2", "amd.com/gpu=0", "nvidia.com/gpu", "0", "nvidia.com/gpu=0 "]
)
def test_a_device_the_spec_lacks_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match="no such device"):
        parse_spec(NVIDIA).resolve([name])


def test_json_written_reads_back_unchanged() -> None:
    spec = parse_spec(NVIDIA)
    assert parse_spec(spec_json(spec)) == spec
    assert json.loads(spec_json(spec)) == spec_to_dict(spec)


def _with(change: dict[str, Any]) -> str:
    data = yaml.safe_load(NVIDIA)
    for path, value in change.items():
        target = data
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        if value is DELETE:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return json.dumps(data)


DELETE = object()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"cdiVersion": DELETE}, "spec.cdiVersion: missing"),
        ({"cdiVersion": "9.9.9"}, "spec.cdiVersion: '9.9.9' is not one of"),
        ({"kind": "gpu"}, "spec.kind: 'gpu' is not vendor/class"),
        ({"kind": "nvidia.com/gpu/x"}, "spec.kind"),
        ({"devices": []}, "spec.devices: a spec names at least one device"),
        ({"devices.0.name": "a b"}, "spec.devices[0].name: 'a b' is not a device name"),
        ({"devices.1.name": "0"}, "spec.devices[1].name: '0' is named twice"),
        ({"devices.0.containerEdits": {}}, "spec.devices[0].containerEdits: a device's edits"),
        ({"devices.0.containerEdits": DELETE}, "spec.devices[0].containerEdits: missing"),
        (
            {"devices.0.containerEdits.deviceNodes.0.path": "dev/nvidia0"},
            "spec.devices[0].containerEdits.deviceNodes[0].path: 'dev/nvidia0' is not an absolute",
        ),
        (
            {"devices.0.containerEdits.deviceNodes.0.type": "x"},
            "deviceNodes[0].type: 'x' is not one of b, c, u, p",
        ),
        (
            {"devices.0.containerEdits.deviceNodes.0.permissions": "rwx"},
            "deviceNodes[0].permissions: 'rwx' is not made of r, w and m",
        ),
        ({"devices.0.containerEdits.deviceNodes.0.major": -1}, "deviceNodes[0].major: -1"),
        ({"devices.0.containerEdits.deviceNodes.0.uid": True}, "deviceNodes[0].uid: True"),
        ({"containerEdits.env.0": "NO_EQUALS"}, "spec.containerEdits.env[0]: 'NO_EQUALS'"),
        ({"containerEdits.env.0": "1X=y"}, "spec.containerEdits.env[0]: '1X=y'"),
        (
            {"containerEdits.mounts.0.containerPath": "lib/x"},
            "spec.containerEdits.mounts[0].containerPath: 'lib/x' is not an absolute path",
        ),
        ({"containerEdits.mounts.0.options": "ro"}, "spec.containerEdits.mounts[0].options"),
        ({"containerEdits.hooks.0.hookName": "later"}, "hooks[0].hookName: 'later' is not one"),
        ({"containerEdits.hooks.0.path": "nvidia-cdi-hook"}, "hooks[0].path"),
        ({"containerEdits.hooks.0.timeout": 0}, "hooks[0].timeout: 0 is not a positive"),
        ({"containerEdits.hooks.0.args.0": 7}, "hooks[0].args[0]: 7 is not a string"),
        (
            {"containerEdits.deviceNodes": {"path": "/dev/x"}},
            "containerEdits.deviceNodes: is a list",
        ),
    ],
)
def test_every_error_names_its_field(change: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec(_with(change))
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "a spec is a mapping, not NoneType"),
        ("- a\n- b\n", "a spec is a mapping, not list"),
        ("{", "not JSON or YAML"),
        ('{"cdiVersion": "0.5.0", "kind": 3}', "spec.kind: 3 is not a string"),
    ],
)
def test_text_that_is_no_spec_is_refused_naming_the_file(text: str, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        parse_spec(text, "/etc/cdi/x.yaml" if "kind" not in text else "spec")


# ----------------------------------------------------------------- properties

ALNUM = "abcdefghijklmnopqrstuvwxyzABC0123456789"
paths = st.lists(st.text("abc019-._", min_size=1, max_size=5), min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts)
)
names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(ALNUM),
    st.text(ALNUM, max_size=4)
    | st.builds(lambda a, b: a + ":" + b, st.text(ALNUM, max_size=3), st.sampled_from(ALNUM)),
)
envs = st.builds(
    lambda key, value: f"{key}={value}",
    st.sampled_from(["A", "PATH", "NVIDIA_VISIBLE_DEVICES", "_X1"]),
    st.text(max_size=8),
)
nodes = st.builds(
    DeviceNode,
    path=paths,
    host_path=st.none() | paths,
    type=st.none() | st.sampled_from("bcup"),
    major=st.none() | st.integers(0, 511),
    minor=st.none() | st.integers(0, 2**20),
    permissions=st.none() | st.sampled_from(["r", "rw", "rwm", "m"]),
)
mounts = st.builds(
    Mount,
    host_path=paths,
    container_path=paths,
    options=st.lists(st.sampled_from(["ro", "bind", "nosuid", "nodev"]), unique=True).map(tuple),
)
hooks = st.builds(
    Hook,
    hook_name=st.sampled_from(["createContainer", "startContainer", "prestart"]),
    path=paths,
    args=st.lists(st.text(max_size=8).filter(lambda t: "\0" not in t), max_size=3).map(tuple),
    timeout=st.none() | st.integers(1, 100),
)


T = TypeVar("T")


def unique(items: st.SearchStrategy[T], min_size: int = 0) -> st.SearchStrategy[tuple[T, ...]]:
    return st.lists(items, unique=True, max_size=3, min_size=min_size).map(tuple)


edits = st.builds(
    ContainerEdits,
    env=unique(envs),
    device_nodes=unique(nodes),
    mounts=unique(mounts),
    hooks=unique(hooks),
)
device_edits = st.builds(
    ContainerEdits, device_nodes=unique(nodes, min_size=1), mounts=unique(mounts), env=unique(envs)
)
specs = st.builds(
    Spec,
    version=st.sampled_from(["0.5.0", "0.6.0", "0.8.0"]),
    kind=st.sampled_from(["nvidia.com/gpu", "example.com/gpu", "sunk.dev/check"]),
    devices=st.lists(
        st.builds(Device, name=names, edits=device_edits),
        min_size=1,
        max_size=4,
        unique_by=lambda d: d.name,
    ).map(tuple),
    edits=edits,
)


@pytest.mark.fuzz
@given(specs)
def test_every_spec_written_reads_back_unchanged(spec: Spec) -> None:
    assert parse_spec(spec_json(spec)) == spec
    assert parse_spec(yaml.safe_dump(spec_to_dict(spec))) == spec


@pytest.mark.fuzz
@given(specs, st.data())
def test_resolved_edits_hold_the_common_ones_and_the_asked_devices_alone(
    spec: Spec, data: st.DataObject
) -> None:
    asked = data.draw(st.lists(st.sampled_from(spec.devices), min_size=1, max_size=3))
    got = spec.resolve(spec.qualified(d.name) for d in asked)
    wanted_nodes = set(spec.edits.device_nodes) | {n for d in asked for n in d.edits.device_nodes}
    assert set(got.device_nodes) == wanted_nodes
    assert len(got.device_nodes) == len(wanted_nodes)
    assert set(got.mounts) == set(spec.edits.mounts) | {m for d in asked for m in d.edits.mounts}


def _mutations() -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | st.integers(-3, 2**33) | st.text(max_size=10)
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=12,
    )


@pytest.mark.fuzz
@given(specs, st.data())
def test_a_mangled_spec_is_read_or_refused_with_spec_error_alone(
    spec: Spec, data: st.DataObject
) -> None:
    """Any field of a valid spec replaced by any JSON value, or any text."""
    document = spec_to_dict(spec)
    target: Any = document
    for _ in range(data.draw(st.integers(0, 4))):
        if isinstance(target, dict) and target:
            key = data.draw(st.sampled_from(sorted(target)))
        elif isinstance(target, list) and target:
            key = data.draw(st.integers(0, len(target) - 1))
        else:
            break
        if not isinstance(target[key], (dict, list)):
            break
        target = target[key]
    if isinstance(target, dict):
        target[data.draw(st.sampled_from([*target, "extra", "path", "name", "kind"]))] = data.draw(
            _mutations()
        )
    elif isinstance(target, list) and target:
        target[data.draw(st.integers(0, len(target) - 1))] = data.draw(_mutations())
    text = data.draw(st.sampled_from([json.dumps(document), yaml.safe_dump(document)]))
    try:
        parsed = parse_spec(text)
    except SpecError:
        return
    assert parse_spec(spec_json(parsed)) == parsed


@pytest.mark.fuzz
@given(st.text(max_size=200))
def test_any_text_is_read_or_refused_with_spec_error_alone(text: str) -> None:
    with contextlib.suppress(SpecError):
        parse_spec(text)
