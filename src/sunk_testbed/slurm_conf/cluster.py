"""slurm.conf from a typed cluster spec, validated before Slurm sees it.

`ClusterSpec` is what a bed's slurm.conf says about its cluster (controllers,
auth, static nodes, node sets for dynamic nodes, partitions, scheduling and
preemption); `render_slurm_conf` turns it into the file, deterministic line
for line so an unchanged spec renders an unchanged file (and no reconfigure).

Two layers of checks, both reporting the offending field or line:
pydantic rejects unknown fields and wrong types (`extra="forbid"`), then
`validate_cluster` checks what types cannot: duplicate node names, bad
hostlists, partitions naming unknown nodes, unknown slurm.conf keys in the
free-form `settings` and `extra_lines`. The rendered text is checked once
more by `check_slurm_conf` as a last line of defence.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sunk.slurm.hostlist import HostlistError, expand
from sunk_testbed.slurm_conf.check import check_slurm_conf
from sunk_testbed.slurm_conf.keys import GLOBAL_KEYS, NODE_KEYS, PARTITION_KEYS
from sunk_testbed.slurm_conf.problems import Problem, raise_if

Value = str | int

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TIME = re.compile(r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}(:\d{2})?|\d+-\d{1,2}(:\d{2}){0,2})$")
_PREEMPT_MODES = frozenset(["OFF", "CANCEL", "GANG", "REQUEUE", "SUSPEND", "WITHIN", "PRIORITY"])


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Controller(_Spec):
    """A slurmctld host: its host name, and the address nodes use to reach it."""

    name: str
    address: str | None = None


class Auth(_Spec):
    type: Literal["auth/munge", "auth/slurm"] = "auth/munge"
    # Path of the HS256 key as slurmctld sees it; None turns JWT off (and
    # with it slurmrestd access by token).
    jwt_key: str | None = "/etc/slurm/jwt_hs256.key"


class NodeGroup(_Spec):
    """Static nodes sharing one NodeName line."""

    names: str  # hostlist, e.g. "gpu[001-128]"
    cpus: int | None = Field(default=None, ge=1)
    sockets: int | None = Field(default=None, ge=1)
    cores_per_socket: int | None = Field(default=None, ge=1)
    threads_per_core: int | None = Field(default=None, ge=1)
    real_memory_mb: int | None = Field(default=None, ge=1)
    gres: tuple[str, ...] = ()  # e.g. ("gpu:h100:8",)
    features: tuple[str, ...] = ()
    weight: int | None = Field(default=None, ge=0)
    state: Literal["UNKNOWN", "FUTURE", "CLOUD", "DOWN", "DRAIN", "IDLE"] | None = None
    address: str | None = None  # NodeAddr (hostlist matching `names`)
    hostname: str | None = None  # NodeHostname
    port: int | None = Field(default=None, ge=1, le=65535)
    settings: dict[str, Value] = {}  # any other NodeName key


class NodeSet(_Spec):
    """A named set of nodes for partitions; `feature` collects dynamic nodes."""

    name: str
    feature: str | None = None
    nodes: str | None = None  # hostlist


class Partition(_Spec):
    name: str
    nodes: tuple[str, ...]  # hostlists, node set names, or "ALL"
    default: bool = False
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = "UP"
    max_time: str = "INFINITE"
    default_time: str | None = None
    priority_tier: int | None = Field(default=None, ge=0)
    preempt_mode: tuple[str, ...] = ()
    oversubscribe: str | None = None  # NO, EXCLUSIVE, YES[:n], FORCE[:n]
    settings: dict[str, Value] = {}  # any other PartitionName key


class Scheduler(_Spec):
    type: str = "sched/backfill"
    parameters: tuple[str, ...] = ()
    select_type: str = "select/cons_tres"
    select_type_parameters: tuple[str, ...] = ("CR_Core_Memory",)


class Preemption(_Spec):
    type: Literal["preempt/none", "preempt/partition_prio", "preempt/qos"] = "preempt/none"
    mode: tuple[str, ...] = ("OFF",)
    exempt_time: str | None = None


class TopologySettings(_Spec):
    plugin: Literal["topology/tree", "topology/block", "topology/flat", "topology/default"]
    parameters: tuple[str, ...] = ()


class ClusterSpec(_Spec):
    cluster_name: str
    controllers: tuple[Controller, ...] = Field(min_length=1)
    slurmctld_port: int = Field(default=6817, ge=1, le=65535)
    slurmd_port: int | None = Field(default=None, ge=1, le=65535)
    slurm_user: str = "slurm"
    auth: Auth = Auth()
    configless: bool = False  # SlurmctldParameters=enable_configless
    state_save_location: str = "/var/spool/slurmctld"
    slurmd_spool_dir: str = "/var/spool/slurmd"
    max_node_count: int | None = Field(default=None, ge=1)  # room for dynamic nodes
    return_to_service: Literal[0, 1, 2] = 2
    nodes: tuple[NodeGroup, ...] = ()
    node_sets: tuple[NodeSet, ...] = ()
    partitions: tuple[Partition, ...] = Field(min_length=1)
    scheduler: Scheduler = Scheduler()
    preemption: Preemption = Preemption()
    topology: TopologySettings | None = None
    gres_types: tuple[str, ...] = ()  # added to those the nodes' gres imply
    settings: dict[str, Value] = {}  # any other cluster-wide key, checked against slurm.conf(5)
    extra_lines: tuple[str, ...] = ()  # verbatim, checked like everything else


def _lower(keys: frozenset[str] | tuple[str, ...]) -> frozenset[str]:
    return frozenset(key.lower() for key in keys)


# Keys the spec renders itself; `settings` may not set them a second time.
_OWN_KEYS = _lower(
    (
        "ClusterName",
        "SlurmctldHost",
        "SlurmctldPort",
        "SlurmdPort",
        "SlurmUser",
        "AuthType",
        "AuthAltTypes",
        "AuthAltParameters",
        "StateSaveLocation",
        "SlurmdSpoolDir",
        "MaxNodeCount",
        "ReturnToService",
        "SchedulerType",
        "SchedulerParameters",
        "SelectType",
        "SelectTypeParameters",
        "PreemptType",
        "PreemptMode",
        "PreemptExemptTime",
        "TopologyPlugin",
        "TopologyParam",
        "GresTypes",
    )
)


_GLOBAL_LOWER = _lower(GLOBAL_KEYS)
_NODE = _lower(NODE_KEYS)
_NODE_OWN = _lower(
    (
        "NodeName",
        "NodeAddr",
        "NodeHostname",
        "Port",
        "CPUs",
        "Sockets",
        "CoresPerSocket",
        "ThreadsPerCore",
        "RealMemory",
        "Gres",
        "Features",
        "Feature",
        "Weight",
        "State",
    )
)
_PARTITION = _lower(PARTITION_KEYS)
_PARTITION_OWN = _lower(
    (
        "PartitionName",
        "Nodes",
        "Default",
        "MaxTime",
        "DefaultTime",
        "PriorityTier",
        "PreemptMode",
        "OverSubscribe",
        "State",
    )
)


def _hostlist(where: str, expr: str, problems: list[Problem]) -> list[str]:
    try:
        names = expand(expr)
    except HostlistError as exc:
        problems.append(Problem(where, str(exc)))
        return []
    if not names:
        problems.append(Problem(where, "empty hostlist"))
    return names


def _check_name(where: str, name: str, problems: list[Problem]) -> None:
    if not _NAME.match(name):
        problems.append(Problem(where, f"{name!r} is not a valid Slurm name"))


def validate_cluster(spec: ClusterSpec) -> list[Problem]:
    """What pydantic cannot check; each problem names the spec field."""
    problems: list[Problem] = []
    if not re.fullmatch(r"[a-z0-9_-]{1,40}", spec.cluster_name):
        # slurmdbd lower-cases cluster names; mixed case breaks accounting later.
        problems.append(Problem("cluster_name", "use 1-40 lower-case letters, digits, '-' or '_'"))
    for i, controller in enumerate(spec.controllers):
        _check_name(f"controllers[{i}].name", controller.name, problems)

    node_owner: dict[str, int] = {}
    for i, group in enumerate(spec.nodes):
        names = _hostlist(f"nodes[{i}].names", group.names, problems)
        for name in names:
            if name in node_owner:
                problems.append(
                    Problem(f"nodes[{i}].names", f"node {name} also in nodes[{node_owner[name]}]")
                )
            node_owner.setdefault(name, i)
        if group.address is not None:
            addresses = _hostlist(f"nodes[{i}].address", group.address, problems)
            if addresses and len(addresses) != len(names):
                problems.append(
                    Problem(
                        f"nodes[{i}].address",
                        f"{len(addresses)} addresses for {len(names)} nodes",
                    )
                )
        problems += _check_settings(f"nodes[{i}].settings", group.settings, _NODE, _NODE_OWN)

    set_names: set[str] = set()
    for i, node_set in enumerate(spec.node_sets):
        where = f"node_sets[{i}]"
        _check_name(f"{where}.name", node_set.name, problems)
        if node_set.name in set_names or node_set.name in node_owner:
            problems.append(Problem(f"{where}.name", f"{node_set.name!r} is already a name"))
        set_names.add(node_set.name)
        if (node_set.feature is None) == (node_set.nodes is None):
            problems.append(Problem(where, "set exactly one of `feature` and `nodes`"))
        if node_set.nodes is not None:
            for name in _hostlist(f"{where}.nodes", node_set.nodes, problems):
                if name not in node_owner:
                    problems.append(Problem(f"{where}.nodes", f"unknown node {name}"))
    if any(s.feature for s in spec.node_sets) and spec.max_node_count is None:
        problems.append(
            Problem("max_node_count", "dynamic node sets (feature=...) need room: set it")
        )

    problems += _check_partitions(spec, set(node_owner), set_names)
    problems += _check_scheduling(spec)
    problems += _check_settings("settings", spec.settings, _GLOBAL_LOWER, _OWN_KEYS)
    for i, line in enumerate(spec.extra_lines):
        problems += [Problem(f"extra_lines[{i}]", p.message) for p in check_slurm_conf(line)]
    return problems


def _check_partitions(spec: ClusterSpec, nodes: set[str], sets: set[str]) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, partition in enumerate(spec.partitions):
        where = f"partitions[{i}]"
        _check_name(f"{where}.name", partition.name, problems)
        if partition.name in seen:
            problems.append(Problem(f"{where}.name", f"duplicate partition {partition.name!r}"))
        seen.add(partition.name)
        if not partition.nodes:
            problems.append(Problem(f"{where}.nodes", "no nodes"))
        for expr in partition.nodes:
            if expr.upper() == "ALL" or expr in sets:
                continue
            for name in _hostlist(f"{where}.nodes", expr, problems):
                if name not in nodes and name not in sets:
                    problems.append(Problem(f"{where}.nodes", f"unknown node or node set {name}"))
        for field in ("max_time", "default_time"):
            value = getattr(partition, field)
            if value is not None and not _TIME.match(value):
                problems.append(Problem(f"{where}.{field}", f"{value!r} is not a Slurm time"))
        for mode in partition.preempt_mode:
            if mode.upper() not in _PREEMPT_MODES:
                problems.append(Problem(f"{where}.preempt_mode", f"unknown mode {mode!r}"))
        problems += _check_settings(
            f"{where}.settings", partition.settings, _PARTITION, _PARTITION_OWN
        )
    if sum(p.default for p in spec.partitions) > 1:
        problems.append(Problem("partitions", "more than one default partition"))
    return problems


def _check_scheduling(spec: ClusterSpec) -> list[Problem]:
    problems: list[Problem] = []
    for mode in spec.preemption.mode:
        if mode.upper() not in _PREEMPT_MODES:
            problems.append(Problem("preemption.mode", f"unknown mode {mode!r}"))
    if spec.preemption.type == "preempt/none" and set(spec.preemption.mode) - {"OFF"}:
        problems.append(Problem("preemption.mode", "a mode needs a preemption type"))
    return problems


def _check_settings(
    where: str, settings: dict[str, Value], allowed: frozenset[str], reserved: frozenset[str]
) -> list[Problem]:
    """Free-form keys: known to slurm.conf(5), not already rendered by a typed field."""
    problems: list[Problem] = []
    for key, value in settings.items():
        if key.lower() in reserved:
            problems.append(Problem(f"{where}.{key}", "set by a typed field of the spec"))
        elif key.lower() not in allowed:
            problems.append(Problem(f"{where}.{key}", "not a slurm.conf key here"))
        if isinstance(value, str) and (any(c.isspace() for c in value) or "#" in value):
            problems.append(Problem(f"{where}.{key}", "values may not contain spaces or '#'"))
    return problems


def _pairs(items: dict[str, Value | None]) -> str:
    return " ".join(f"{key}={value}" for key, value in items.items() if value is not None)


def _gres_types(spec: ClusterSpec) -> list[str]:
    types = list(spec.gres_types)
    for group in spec.nodes:
        for gres in group.gres:
            name = gres.split(":", 1)[0]
            if name not in types:
                types.append(name)
    return types


def render_slurm_conf(spec: ClusterSpec) -> str:
    """The slurm.conf text; raises ConfigError naming each problem."""
    raise_if(validate_cluster(spec))
    lines = [f"ClusterName={spec.cluster_name}"]
    for controller in spec.controllers:
        address = f"({controller.address})" if controller.address else ""
        lines.append(f"SlurmctldHost={controller.name}{address}")
    lines.append(f"SlurmctldPort={spec.slurmctld_port}")
    if spec.slurmd_port is not None:
        lines.append(f"SlurmdPort={spec.slurmd_port}")
    lines += [f"SlurmUser={spec.slurm_user}", f"AuthType={spec.auth.type}"]
    if spec.auth.jwt_key is not None:
        lines += ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={spec.auth.jwt_key}"]
    lines += [
        f"StateSaveLocation={spec.state_save_location}",
        f"SlurmdSpoolDir={spec.slurmd_spool_dir}",
        f"ReturnToService={spec.return_to_service}",
    ]
    if spec.configless:
        lines.append("SlurmctldParameters=enable_configless")
    if spec.max_node_count is not None:
        lines.append(f"MaxNodeCount={spec.max_node_count}")
    lines.append(f"SchedulerType={spec.scheduler.type}")
    if spec.scheduler.parameters:
        lines.append(f"SchedulerParameters={','.join(spec.scheduler.parameters)}")
    lines.append(f"SelectType={spec.scheduler.select_type}")
    if spec.scheduler.select_type_parameters:
        lines.append(f"SelectTypeParameters={','.join(spec.scheduler.select_type_parameters)}")
    lines += [
        f"PreemptType={spec.preemption.type}",
        f"PreemptMode={','.join(spec.preemption.mode)}",
    ]
    if spec.preemption.exempt_time is not None:
        lines.append(f"PreemptExemptTime={spec.preemption.exempt_time}")
    if spec.topology is not None:
        lines.append(f"TopologyPlugin={spec.topology.plugin}")
        if spec.topology.parameters:
            lines.append(f"TopologyParam={','.join(spec.topology.parameters)}")
    if gres_types := _gres_types(spec):
        lines.append(f"GresTypes={','.join(gres_types)}")
    lines += [f"{key}={value}" for key, value in spec.settings.items()]
    lines += [_node_line(group) for group in spec.nodes]
    for node_set in spec.node_sets:
        member = f"Feature={node_set.feature}" if node_set.feature else f"Nodes={node_set.nodes}"
        lines.append(f"NodeSet={node_set.name} {member}")
    lines += [_partition_line(partition) for partition in spec.partitions]
    lines += spec.extra_lines
    text = "\n".join(lines) + "\n"
    raise_if(check_slurm_conf(text))
    return text


def _node_line(group: NodeGroup) -> str:
    return _pairs(
        {
            "NodeName": group.names,
            "NodeAddr": group.address,
            "NodeHostname": group.hostname,
            "Port": group.port,
            "CPUs": group.cpus,
            "Sockets": group.sockets,
            "CoresPerSocket": group.cores_per_socket,
            "ThreadsPerCore": group.threads_per_core,
            "RealMemory": group.real_memory_mb,
            "Gres": ",".join(group.gres) or None,
            "Features": ",".join(group.features) or None,
            "Weight": group.weight,
            **group.settings,
            "State": group.state,
        }
    )


def _partition_line(partition: Partition) -> str:
    return _pairs(
        {
            "PartitionName": partition.name,
            "Nodes": ",".join(partition.nodes),
            "Default": "YES" if partition.default else None,
            "MaxTime": partition.max_time,
            "DefaultTime": partition.default_time,
            "PriorityTier": partition.priority_tier,
            "PreemptMode": ",".join(partition.preempt_mode) or None,
            "OverSubscribe": partition.oversubscribe,
            **partition.settings,
            "State": partition.state,
        }
    )
