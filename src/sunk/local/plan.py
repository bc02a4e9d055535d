"""Pure functions from a Pod spec (plus the objects it references) to what must run.

Nothing here does I/O: the worker fetches what `references` and
`token_requests` name, and these functions turn spec + fetched data into
environments, command lines, files of projected volumes and bind mounts.
That keeps the Kubernetes semantics (expansion rules, optional references,
modes, resource arithmetic, admission) unit-testable without a cluster.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any

from lightkube.models.core_v1 import (
    Container,
    DownwardAPIVolumeFile,
    KeyToPath,
    ObjectFieldSelector,
    Probe,
    ResourceFieldSelector,
    Volume,
)
from lightkube.resources.core_v1 import Pod
from lightkube.utils.quantity import parse_quantity

from sunk.testbed.sandbox import Bind

DEFAULT_FILE_MODE = 0o644
DEFAULT_TOKEN_SECONDS = 3600
GPU = "nvidia.com/gpu"


class ConfigError(Exception):
    """A container cannot be configured yet (CreateContainerConfigError and friends)."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------- references


@dataclass(frozen=True)
class Ref:
    kind: str  # "ConfigMap" | "Secret"
    name: str


@dataclass(frozen=True)
class TokenSpec:
    audience: str
    seconds: int


@dataclass
class Fetched:
    """What the worker fetched for one pod (None: does not exist)."""

    config_maps: dict[str, dict[str, bytes] | None] = field(default_factory=dict)
    secrets: dict[str, dict[str, bytes] | None] = field(default_factory=dict)
    tokens: dict[TokenSpec, str] = field(default_factory=dict)

    def data(self, kind: str, name: str) -> dict[str, bytes] | None:
        table = self.config_maps if kind == "ConfigMap" else self.secrets
        if name not in table:
            raise ConfigError(f"{kind.lower()} {name!r} not fetched yet")
        return table[name]


def config_map_data(
    data: Mapping[str, str] | None, binary: Mapping[str, str] | None
) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (data or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (binary or {}).items()})
    return out


def secret_data(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def _spec(pod: Pod) -> Any:
    if pod.spec is None:
        raise ConfigError("pod has no spec")
    return pod.spec


def all_containers(pod: Pod) -> list[Container]:
    spec = _spec(pod)
    return [*(spec.initContainers or []), *spec.containers]


def references(pod: Pod) -> set[Ref]:
    """ConfigMaps and Secrets the pod's volumes and environments read."""
    refs: set[Ref] = set()
    for volume in _spec(pod).volumes or []:
        if volume.configMap and volume.configMap.name:
            refs.add(Ref("ConfigMap", volume.configMap.name))
        if volume.secret and volume.secret.secretName:
            refs.add(Ref("Secret", volume.secret.secretName))
        if volume.projected:
            for source in volume.projected.sources or []:
                if source.configMap and source.configMap.name:
                    refs.add(Ref("ConfigMap", source.configMap.name))
                if source.secret and source.secret.name:
                    refs.add(Ref("Secret", source.secret.name))
    for container in all_containers(pod):
        for env_from in container.envFrom or []:
            if env_from.configMapRef and env_from.configMapRef.name:
                refs.add(Ref("ConfigMap", env_from.configMapRef.name))
            if env_from.secretRef and env_from.secretRef.name:
                refs.add(Ref("Secret", env_from.secretRef.name))
        for env in container.env or []:
            source = env.valueFrom
            if source and source.configMapKeyRef and source.configMapKeyRef.name:
                refs.add(Ref("ConfigMap", source.configMapKeyRef.name))
            if source and source.secretKeyRef and source.secretKeyRef.name:
                refs.add(Ref("Secret", source.secretKeyRef.name))
    return refs


def token_requests(pod: Pod) -> set[TokenSpec]:
    """Service-account tokens the pod's projected volumes need."""
    specs = set()
    for volume in _spec(pod).volumes or []:
        for source in (volume.projected.sources or []) if volume.projected else []:
            if source.serviceAccountToken:
                token = source.serviceAccountToken
                specs.add(
                    TokenSpec(
                        token.audience or "", token.expirationSeconds or DEFAULT_TOKEN_SECONDS
                    )
                )
    return specs


# ----------------------------------------------------------------- quantities


def quantity(value: str | None) -> Decimal:
    parsed = parse_quantity(value)
    return parsed if parsed is not None else Decimal(0)


def cpu_millis(value: str | None) -> int:
    return math.ceil(quantity(value) * 1000)


def _limits(container: Container) -> dict[str, str]:
    return dict(container.resources.limits or {}) if container.resources else {}


def _requests(container: Container) -> dict[str, str]:
    return dict(container.resources.requests or {}) if container.resources else {}


def _add(total: dict[str, Decimal], extra: Mapping[str, Decimal]) -> dict[str, Decimal]:
    out = dict(total)
    for key, value in extra.items():
        out[key] = out.get(key, Decimal(0)) + value
    return out


def _max(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: max(a.get(k, Decimal(0)), b.get(k, Decimal(0))) for k in {*a, *b}}


def container_requests(container: Container) -> dict[str, Decimal]:
    return {k: quantity(v) for k, v in _requests(container).items()}


def pod_requests(pod: Pod) -> dict[str, Decimal]:
    """Effective requests as the scheduler and kubelet count them.

    max(sum of app containers + sidecars, the largest regular init container
    plus the sidecars started before it) + pod overhead.
    """
    spec = _spec(pod)
    apps: dict[str, Decimal] = {}
    for container in spec.containers:
        apps = _add(apps, container_requests(container))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for container in spec.initContainers or []:
        if container.restartPolicy == "Always":
            sidecars = _add(sidecars, container_requests(container))
        else:
            init_peak = _max(init_peak, _add(sidecars, container_requests(container)))
    total = _max(_add(apps, sidecars), init_peak)
    return _add(total, {k: quantity(v) for k, v in (spec.overhead or {}).items()})


def container_limits(container: Container) -> tuple[int | None, int | None]:
    """(cpu millicores, memory bytes) limits, None where unlimited."""
    limits = _limits(container)
    cpu = cpu_millis(limits["cpu"]) if "cpu" in limits else None
    memory = int(quantity(limits["memory"])) if "memory" in limits else None
    return cpu, memory


# ------------------------------------------------------------------ admission


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


def _fmt(resource: str, value: Decimal) -> str:
    return str(math.ceil(value * 1000)) if resource == "cpu" else str(math.ceil(value))


def admit(
    pod: Pod,
    admitted: Sequence[Pod],
    allocatable: Mapping[str, Decimal],
    node_labels: Mapping[str, str],
    node_name: str,
) -> Rejection | None:
    """Kubelet's admission: node affinity, pod count and resources against allocatable."""
    if not node_matches(pod, node_labels, node_name):
        return Rejection(
            "NodeAffinity",
            "Pod was rejected: Predicate NodeAffinity failed: "
            "node(s) didn't match Pod's node affinity/selector",
        )
    if len(admitted) + 1 > allocatable.get("pods", Decimal(110)):
        return Rejection(
            "OutOfpods",
            f"Pod was rejected: Node didn't have enough resource: pods, requested: 1, "
            f"used: {len(admitted)}, capacity: {allocatable.get('pods')}",
        )
    used: dict[str, Decimal] = {}
    for other in admitted:
        used = _add(used, pod_requests(other))
    for resource, requested in sorted(pod_requests(pod).items()):
        if requested <= 0:
            continue
        capacity = allocatable.get(resource, Decimal(0))
        if used.get(resource, Decimal(0)) + requested > capacity:
            return Rejection(
                f"OutOf{resource}",
                f"Pod was rejected: Node didn't have enough resource: {resource}, "
                f"requested: {_fmt(resource, requested)}, "
                f"used: {_fmt(resource, used.get(resource, Decimal(0)))}, "
                f"capacity: {_fmt(resource, capacity)}",
            )
    return None


def _expression_matches(expr: Any, value: str | None) -> bool:
    op, values = expr.operator, list(expr.values or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_matches(pod: Pod, labels: Mapping[str, str], node_name: str) -> bool:
    spec = _spec(pod)
    for key, value in (spec.nodeSelector or {}).items():
        if labels.get(key) != value:
            return False
    affinity = spec.affinity.nodeAffinity if spec.affinity else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    if required is None or not required.nodeSelectorTerms:
        return True
    for term in required.nodeSelectorTerms:  # terms are ORed, expressions ANDed
        exprs = term.matchExpressions or []
        fields = term.matchFields or []
        if not exprs and not fields:
            continue
        if all(_expression_matches(e, labels.get(e.key)) for e in exprs) and all(
            _expression_matches(f, node_name if f.key == "metadata.name" else None) for f in fields
        ):
            return True
    return False


# -------------------------------------------------------------- environment


_ENV_NAME = re.compile(r"^[^=\s][^=]*$")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: `$$` escapes, unknown references stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class PodContext:
    """What field and resource references resolve against."""

    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, Decimal] = field(default_factory=dict)


def field_value(pod: Pod, selector: ObjectFieldSelector, ctx: PodContext) -> str:
    path = selector.fieldPath
    meta = pod.metadata
    spec = _spec(pod)
    simple = {
        "metadata.name": meta.name if meta else None,
        "metadata.namespace": meta.namespace if meta else None,
        "metadata.uid": meta.uid if meta else None,
        "spec.nodeName": spec.nodeName,
        "spec.serviceAccountName": spec.serviceAccountName,
        "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
        "status.podIP": ctx.pod_ip,
        "status.podIPs": ctx.pod_ip,
    }
    if path in simple:
        return simple[path] or ""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match and meta:
        table = meta.labels if match.group(1) == "labels" else meta.annotations
        return str((table or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations") and meta:
        table = meta.labels if path == "metadata.labels" else meta.annotations
        return "\n".join(f'{k}="{v}"' for k, v in sorted((table or {}).items()))
    raise ConfigError(f"unsupported fieldPath {path!r}")


def resource_value(
    pod: Pod, selector: ResourceFieldSelector, ctx: PodContext, default: str | None
) -> str:
    name = selector.containerName or default
    container = next((c for c in all_containers(pod) if c.name == name), None)
    if container is None:
        raise ConfigError(f"resourceFieldRef names unknown container {name!r}")
    kind, _, resource = selector.resource.partition(".")
    table = _limits(container) if kind == "limits" else _requests(container)
    if resource in table:
        amount = quantity(table[resource])
    elif kind == "limits":
        amount = ctx.node_allocatable.get(resource, Decimal(0))
    else:
        amount = Decimal(0)
    divisor = quantity(selector.divisor) if selector.divisor else Decimal(1)
    if divisor == 0:
        divisor = Decimal(1)
    value = math.ceil(amount / divisor)
    if resource == "cpu" and kind == "requests" and value == 0 and amount == 0:
        return "0"
    return str(value)


def _required(
    data: dict[str, bytes] | None, kind: str, name: str, optional: bool
) -> dict[str, bytes]:
    if data is None:
        if optional:
            return {}
        raise ConfigError(f"{kind.lower()} {name!r} not found")
    return data


def container_env(
    pod: Pod, container: Container, fetched: Fetched, ctx: PodContext
) -> dict[str, str]:
    """The container's environment: envFrom, then env in order, with $(VAR) expansion."""
    env: dict[str, str] = {}
    for source in container.envFrom or []:
        prefix = source.prefix or ""
        if source.configMapRef:
            ref = source.configMapRef
            data = _required(
                fetched.data("ConfigMap", ref.name or ""),
                "ConfigMap",
                ref.name or "",
                bool(ref.optional),
            )
        elif source.secretRef:
            ref2 = source.secretRef
            data = _required(
                fetched.data("Secret", ref2.name or ""),
                "Secret",
                ref2.name or "",
                bool(ref2.optional),
            )
        else:
            continue
        for key, value in data.items():
            if _ENV_NAME.match(prefix + key):
                env[prefix + key] = value.decode(errors="replace")
    for var in container.env or []:
        if var.valueFrom is None:
            env[var.name] = expand(var.value or "", env)
            continue
        source2 = var.valueFrom
        if source2.fieldRef:
            env[var.name] = field_value(pod, source2.fieldRef, ctx)
        elif source2.resourceFieldRef:
            env[var.name] = resource_value(pod, source2.resourceFieldRef, ctx, container.name)
        elif source2.configMapKeyRef or source2.secretKeyRef:
            key_ref = source2.configMapKeyRef or source2.secretKeyRef
            kind = "ConfigMap" if source2.configMapKeyRef else "Secret"
            assert key_ref is not None
            name = key_ref.name or ""
            found = fetched.data(kind, name)
            if found is None or key_ref.key not in found:
                if key_ref.optional:
                    continue
                what = (
                    f"{kind.lower()} {name!r}"
                    if found is None
                    else f"key {key_ref.key!r} in {kind} {name!r}"
                )
                raise ConfigError(f"couldn't find {what}")
            env[var.name] = found[key_ref.key].decode(errors="replace")
    return env


def container_argv(container: Container, env: Mapping[str, str]) -> list[str]:
    """command + args, expanded. Images are ignored, so there is no entrypoint to fall back
    to: a container without `command` runs its `args` as the command line."""
    argv = [expand(a, env) for a in [*(container.command or []), *(container.args or [])]]
    if not argv:
        raise ConfigError(
            f"container {container.name!r} has no command or args "
            "(the local runtime ignores images, so there is no entrypoint)",
            reason="CreateContainerError",
        )
    return argv


def pod_hostname(pod: Pod) -> str:
    """spec.hostname or the pod's name, cut to 63 characters like kubelet does."""
    spec = _spec(pod)
    name = spec.hostname or (pod.metadata.name if pod.metadata else "") or "pod"
    return name[:63].rstrip("-.")


# ------------------------------------------------------------------- volumes

FileMap = dict[str, tuple[bytes, int]]  # relative path -> (content, mode)


def _check_path(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not path:
        raise ConfigError(f"invalid volume item path {path!r}")
    return path


def _project_keys(
    data: dict[str, bytes], items: Sequence[KeyToPath] | None, mode: int, what: str, optional: bool
) -> FileMap:
    files: FileMap = {}
    if not items:
        for key, value in data.items():
            files[_check_path(key)] = (value, mode)
        return files
    for item in items:
        if item.key not in data:
            if optional:
                continue
            raise ConfigError(f"{what}: key {item.key!r} not found", reason="FailedMount")
        files[_check_path(item.path)] = (
            data[item.key],
            item.mode if item.mode is not None else mode,
        )
    return files


def _downward_files(
    pod: Pod, items: Sequence[DownwardAPIVolumeFile] | None, mode: int, ctx: PodContext
) -> FileMap:
    files: FileMap = {}
    for item in items or []:
        if item.fieldRef:
            value = field_value(pod, item.fieldRef, ctx)
        elif item.resourceFieldRef:
            value = resource_value(pod, item.resourceFieldRef, ctx, None)
        else:
            continue
        files[_check_path(item.path)] = (
            value.encode(),
            item.mode if item.mode is not None else mode,
        )
    return files


def _object_files(
    fetched: Fetched,
    kind: str,
    name: str,
    items: Sequence[KeyToPath] | None,
    mode: int,
    optional: bool | None,
) -> FileMap:
    """The keys of a ConfigMap or Secret as files (a volume, or a projected source)."""
    data = _required(fetched.data(kind, name), kind, name, bool(optional))
    return _project_keys(data, items, mode, f"{kind.lower()} {name!r}", bool(optional))


def volume_files(volume: Volume, pod: Pod, fetched: Fetched, ctx: PodContext) -> FileMap | None:
    """Files of a ConfigMap, Secret, downwardAPI or projected volume; None for other kinds."""
    if volume.configMap:
        src = volume.configMap
        mode = src.defaultMode if src.defaultMode is not None else DEFAULT_FILE_MODE
        return _object_files(fetched, "ConfigMap", src.name or "", src.items, mode, src.optional)
    if volume.secret:
        src2 = volume.secret
        mode = src2.defaultMode if src2.defaultMode is not None else DEFAULT_FILE_MODE
        return _object_files(
            fetched, "Secret", src2.secretName or "", src2.items, mode, src2.optional
        )
    if volume.downwardAPI:
        src3 = volume.downwardAPI
        mode = src3.defaultMode if src3.defaultMode is not None else DEFAULT_FILE_MODE
        return _downward_files(pod, src3.items, mode, ctx)
    if volume.projected:
        proj = volume.projected
        mode = proj.defaultMode if proj.defaultMode is not None else DEFAULT_FILE_MODE
        files: FileMap = {}
        for source in proj.sources or []:
            if source.configMap:
                cm = source.configMap
                files.update(
                    _object_files(fetched, "ConfigMap", cm.name or "", cm.items, mode, cm.optional)
                )
            elif source.secret:
                sec = source.secret
                files.update(
                    _object_files(fetched, "Secret", sec.name or "", sec.items, mode, sec.optional)
                )
            elif source.downwardAPI:
                files.update(_downward_files(pod, source.downwardAPI.items, mode, ctx))
            elif source.serviceAccountToken:
                token = source.serviceAccountToken
                spec = TokenSpec(
                    token.audience or "", token.expirationSeconds or DEFAULT_TOKEN_SECONDS
                )
                if spec not in fetched.tokens:
                    raise ConfigError("service account token not issued yet", reason="FailedMount")
                files[_check_path(token.path)] = (fetched.tokens[spec].encode(), mode)
        return files
    return None


def volume_read_only(volume: Volume) -> bool:
    """ConfigMap, Secret, downwardAPI and projected volumes are always mounted read-only."""
    return bool(volume.configMap or volume.secret or volume.downwardAPI or volume.projected)


def container_binds(
    container: Container, volume_dirs: Mapping[str, Path], read_only: Iterable[str] = ()
) -> list[Bind]:
    """Bind mounts for the container's volumeMounts, parents before children."""
    forced = set(read_only)
    binds = []
    for mount in container.volumeMounts or []:
        if mount.name not in volume_dirs:
            raise ConfigError(f"volumeMount {mount.name!r} names no volume of the pod")
        source = volume_dirs[mount.name]
        if mount.subPath:
            source = source / _check_path(mount.subPath)
        binds.append(
            Bind(source, mount.mountPath, read_only=bool(mount.readOnly) or mount.name in forced)
        )
    return sorted(binds, key=lambda b: len(PurePosixPath(b.target).parts))


# ------------------------------------------------------------------- probes


def named_port(container: Container, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for p in container.ports or []:
        if p.name == port:
            return p.containerPort
    raise ConfigError(f"container {container.name!r} has no port named {port!r}")


def probe_timing(probe: Probe) -> tuple[float, float, float, int, int]:
    """(initial delay, period, timeout, success threshold, failure threshold) with defaults."""
    return (
        float(probe.initialDelaySeconds or 0),
        float(probe.periodSeconds or 10),
        float(probe.timeoutSeconds or 1),
        int(probe.successThreshold or 1),
        int(probe.failureThreshold or 3),
    )
