"""CDI, the Container Device Interface: how a device reaches a container.

A CDI spec (JSON or YAML, in /etc/cdi or /var/run/cdi; on NVIDIA nodes
written by `nvidia-ctk cdi generate`) names devices of one kind
(`vendor/class`, e.g. `nvidia.com/gpu`) and, for each device and for all of
them together, the container edits that give it: device nodes, mounts (the
driver's libraries and tools), environment and OCI hooks. A runtime asked for
`nvidia.com/gpu=0` applies the spec's common edits and device 0's, nothing
else. containerd applies them for pods (a device plugin's `CDIDevices`, or
DRA); sunk applies the same edits for container job steps.

Pure: `parse_spec` reads and checks one spec (each error names the field),
`Spec.resolve` gives the edits for a list of device names, `spec_to_dict` the
spec's JSON shape. The format: github.com/cncf-tags/container-device-interface
(SPEC.md, version 0.8.0 and earlier).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

# `vendor/class`: the vendor a DNS-like name, the class a plain name.
KIND = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
)
DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_TYPES = frozenset({"b", "c", "u", "p"})
# The spec versions whose fields this reader knows.
VERSIONS = frozenset({"0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"})


class SpecError(ValueError):
    """A spec that breaks the format; the message names the file and field."""


@dataclass(frozen=True)
class DeviceNode:
    path: str  # in the container
    host_path: str | None = None  # on the node; None: `path`
    type: str | None = None  # b, c, u or p; None: the host node's
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None  # cgroup access: r, w, m
    uid: int | None = None
    gid: int | None = None

    @property
    def source(self) -> str:
        return self.host_path or self.path


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    type: str | None = None
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def then(self, other: ContainerEdits) -> ContainerEdits:
        """These edits, then `other`'s (what is already here is not repeated)."""
        return ContainerEdits(
            env=_joined(self.env, other.env),
            device_nodes=_joined(self.device_nodes, other.device_nodes),
            mounts=_joined(self.mounts, other.mounts),
            hooks=_joined(self.hooks, other.hooks),
        )


T = TypeVar("T")


def _joined(a: tuple[T, ...], b: tuple[T, ...]) -> tuple[T, ...]:
    return a + tuple(x for x in b if x not in a)


@dataclass(frozen=True)
class Device:
    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class Spec:
    version: str
    kind: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)

    def qualified(self, name: str) -> str:
        """The fully qualified device name, `vendor/class=name`."""
        return f"{self.kind}={name}"

    def names(self) -> list[str]:
        return [self.qualified(d.name) for d in self.devices]

    def resolve(self, names: Iterable[str]) -> ContainerEdits:
        """The edits a container asking for `names` (fully qualified) gets: the
        spec's common edits, then each device's, in the order asked. A name
        of another kind, or of no device here, is refused."""
        by_name = {self.qualified(d.name): d for d in self.devices}
        edits = ContainerEdits()
        asked = list(names)
        for name in asked:
            device = by_name.get(name)
            if device is None:
                raise SpecError(f"{name}: no such device in the spec of {self.kind}")
            edits = edits.then(device.edits)
        return self.edits.then(edits) if asked else ContainerEdits()


def parse_spec(text: str, source: str = "spec") -> Spec:
    """One CDI spec from its JSON or YAML text; `source` names it in errors."""
    # JSON first: YAML's reader takes JSON too, but not its escaped surrogate
    # pairs (\ud800\udc00 would become two lone surrogates).
    try:
        loaded = json.loads(text)
    except ValueError:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{source}: not JSON or YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise SpecError(f"{source}: a spec is a mapping, not {type(loaded).__name__}")
    return _spec(loaded, source)


def _spec(data: Mapping[Any, Any], at: str) -> Spec:
    version = _string(data, "cdiVersion", at, required=True)
    assert version is not None
    if version not in VERSIONS:
        raise SpecError(f"{at}.cdiVersion: {version!r} is not one of {sorted(VERSIONS)}")
    kind = _string(data, "kind", at, required=True)
    assert kind is not None
    if not KIND.fullmatch(kind):
        raise SpecError(f"{at}.kind: {kind!r} is not vendor/class (e.g. nvidia.com/gpu)")
    devices_data = _list(data, "devices", at)
    if not devices_data:
        raise SpecError(f"{at}.devices: a spec names at least one device")
    devices = []
    seen: set[str] = set()
    for i, item in enumerate(devices_data):
        where = f"{at}.devices[{i}]"
        if not isinstance(item, dict):
            raise SpecError(f"{where}: a device is a mapping")
        name = _string(item, "name", where, required=True)
        assert name is not None
        if not DEVICE_NAME.fullmatch(name):
            raise SpecError(
                f"{where}.name: {name!r} is not a device name (letters, digits, '_', '.',"
                " ':' and '-', beginning and ending with a letter or digit)"
            )
        if name in seen:
            raise SpecError(f"{where}.name: {name!r} is named twice")
        seen.add(name)
        edits = _edits(item.get("containerEdits"), f"{where}.containerEdits", required=True)
        devices.append(Device(name, edits))
    common = _edits(data.get("containerEdits"), f"{at}.containerEdits", required=False)
    return Spec(version=version, kind=kind, devices=tuple(devices), edits=common)


def _edits(data: Any, at: str, *, required: bool) -> ContainerEdits:
    if data is None:
        if required:
            raise SpecError(f"{at}: missing")
        return ContainerEdits()
    if not isinstance(data, dict):
        raise SpecError(f"{at}: containerEdits is a mapping")
    env = []
    for i, item in enumerate(_list(data, "env", at)):
        if not isinstance(item, str) or not ENV.fullmatch(item):
            raise SpecError(f"{at}.env[{i}]: {item!r} is not NAME=VALUE")
        env.append(item)
    nodes = tuple(
        _device_node(item, f"{at}.deviceNodes[{i}]")
        for i, item in enumerate(_list(data, "deviceNodes", at))
    )
    mounts = tuple(
        _mount(item, f"{at}.mounts[{i}]") for i, item in enumerate(_list(data, "mounts", at))
    )
    hooks = tuple(
        _hook(item, f"{at}.hooks[{i}]") for i, item in enumerate(_list(data, "hooks", at))
    )
    edits = ContainerEdits(tuple(env), nodes, mounts, hooks)
    if required and edits == ContainerEdits():
        raise SpecError(f"{at}: a device's edits must give it something")
    return edits


def _device_node(data: Any, at: str) -> DeviceNode:
    if not isinstance(data, dict):
        raise SpecError(f"{at}: a device node is a mapping")
    path = _absolute(data, "path", at, required=True)
    assert path is not None
    kind = _string(data, "type", at)
    if kind is not None and kind not in DEVICE_TYPES:
        raise SpecError(f"{at}.type: {kind!r} is not one of b, c, u, p")
    permissions = _string(data, "permissions", at)
    if permissions is not None and (not permissions or set(permissions) - set("rwm")):
        raise SpecError(f"{at}.permissions: {permissions!r} is not made of r, w and m")
    return DeviceNode(
        path=path,
        host_path=_absolute(data, "hostPath", at),
        type=kind,
        major=_int(data, "major", at),
        minor=_int(data, "minor", at),
        file_mode=_int(data, "fileMode", at),
        permissions=permissions,
        uid=_int(data, "uid", at),
        gid=_int(data, "gid", at),
    )


def _mount(data: Any, at: str) -> Mount:
    if not isinstance(data, dict):
        raise SpecError(f"{at}: a mount is a mapping")
    host = _string(data, "hostPath", at, required=True)
    container = _absolute(data, "containerPath", at, required=True)
    assert host is not None
    assert container is not None
    options = _list(data, "options", at)
    for i, option in enumerate(options):
        if not isinstance(option, str) or not option:
            raise SpecError(f"{at}.options[{i}]: {option!r} is not a mount option")
    return Mount(host, container, _string(data, "type", at), tuple(options))


def _hook(data: Any, at: str) -> Hook:
    if not isinstance(data, dict):
        raise SpecError(f"{at}: a hook is a mapping")
    name = _string(data, "hookName", at, required=True)
    if name not in HOOK_NAMES:
        raise SpecError(f"{at}.hookName: {name!r} is not one of {sorted(HOOK_NAMES)}")
    path = _absolute(data, "path", at, required=True)
    assert path is not None
    args = _strings(data, "args", at)
    env = _strings(data, "env", at)
    for i, item in enumerate(env):
        if not ENV.fullmatch(item):
            raise SpecError(f"{at}.env[{i}]: {item!r} is not NAME=VALUE")
    timeout = _int(data, "timeout", at)
    if timeout is not None and timeout <= 0:
        raise SpecError(f"{at}.timeout: {timeout} is not a positive number of seconds")
    return Hook(name, path, args, env, timeout)


def _string(data: Mapping[Any, Any], key: str, at: str, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise SpecError(f"{at}.{key}: missing")
        return None
    if not isinstance(value, str):
        raise SpecError(f"{at}.{key}: {value!r} is not a string")
    if "\0" in value:
        raise SpecError(f"{at}.{key}: holds a NUL")
    return value


def _absolute(data: Mapping[Any, Any], key: str, at: str, *, required: bool = False) -> str | None:
    value = _string(data, key, at, required=required)
    if value is not None and not value.startswith("/"):
        raise SpecError(f"{at}.{key}: {value!r} is not an absolute path")
    return value


def _int(data: Mapping[Any, Any], key: str, at: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{at}.{key}: {value!r} is not a whole number")
    return value


def _list(data: Mapping[Any, Any], key: str, at: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(f"{at}.{key}: is a list, not {type(value).__name__}")
    return value


def _strings(data: Mapping[Any, Any], key: str, at: str) -> tuple[str, ...]:
    values = _list(data, key, at)
    for i, value in enumerate(values):
        if not isinstance(value, str) or "\0" in value:
            raise SpecError(f"{at}.{key}[{i}]: {value!r} is not a string")
    return tuple(values)


def edits_to_dict(edits: ContainerEdits) -> dict[str, Any]:
    """The edits in the spec's JSON shape (fields left unset are left out)."""
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = list(edits.env)
    if edits.device_nodes:
        out["deviceNodes"] = [_drop_none(_node_dict(n)) for n in edits.device_nodes]
    if edits.mounts:
        out["mounts"] = [
            _drop_none(
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "type": m.type,
                    "options": list(m.options) or None,
                }
            )
            for m in edits.mounts
        ]
    if edits.hooks:
        out["hooks"] = [
            _drop_none(
                {
                    "hookName": h.hook_name,
                    "path": h.path,
                    "args": list(h.args) or None,
                    "env": list(h.env) or None,
                    "timeout": h.timeout,
                }
            )
            for h in edits.hooks
        ]
    return out


def _node_dict(node: DeviceNode) -> dict[str, Any]:
    return {
        "path": node.path,
        "hostPath": node.host_path,
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
        "fileMode": node.file_mode,
        "permissions": node.permissions,
        "uid": node.uid,
        "gid": node.gid,
    }


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def spec_to_dict(spec: Spec) -> dict[str, Any]:
    """The spec in its JSON shape, which `parse_spec` reads back unchanged."""
    out: dict[str, Any] = {
        "cdiVersion": spec.version,
        "kind": spec.kind,
        "devices": [
            {"name": d.name, "containerEdits": edits_to_dict(d.edits)} for d in spec.devices
        ],
    }
    if spec.edits != ContainerEdits():
        out["containerEdits"] = edits_to_dict(spec.edits)
    return out


def spec_json(spec: Spec) -> str:
    return json.dumps(spec_to_dict(spec), indent=2) + "\n"
