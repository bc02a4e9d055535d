"""The NodeSet custom resource: matching Kubernetes nodes become Slurm compute nodes.

A NodeSet works like a DaemonSet: one slurmd pod on every Kubernetes node
that its pod template's node selector, required node affinity and
tolerations accept. Each pod registers as a dynamic Slurm node named after
the pod. Updates and scale-in never kill a running job: a node is drained in
Slurm and its pod replaced or removed only once no job runs on it.

Node selection lives in the pod template (`nodeSelector`, `affinity`,
`tolerations`), as it does for a DaemonSet, so there is one way to say it.
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sunk.api import GROUP, LABEL_NODESET

KIND = "NodeSet"
PLURAL = "nodesets"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Placeholders a node name pattern may use.
NAME_PLACEHOLDERS = ("{nodeset}", "{node}", "{ip}")


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class _Camel(_Model):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", alias_generator=_camel)


class RollingUpdate(_Camel):
    """How a RollingUpdate proceeds."""

    max_unavailable: Annotated[
        int | str,
        Field(
            description=(
                "How many nodes may be drained for an update at once: a number, or a "
                "percentage of the desired nodes (rounded down, at least 1)."
            ),
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": "type(self) == int ? self >= 1 : "
                        "self.matches('^(100|[1-9][0-9]?)%$')",
                        "message": "must be a positive integer or a percentage from 1% to 100%",
                    }
                ]
            },
        ),
    ] = 1


DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?$"


def duration_seconds(text: str) -> int:
    """A duration as the API writes it ("4h", "90m", "1h30m") in seconds."""
    match = re.fullmatch(DURATION_PATTERN, text)
    if match is None or not text:
        raise ValueError(f"{text!r} is not a duration such as 4h, 90m or 1h30m")
    hours, minutes = (int(part[:-1]) if part else 0 for part in match.groups())
    return hours * 3600 + minutes * 60


def _positive_duration(text: str) -> str:
    if duration_seconds(text) < 60:
        raise ValueError("must be at least one minute")
    return text


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, min_length=2, max_length=12),
    AfterValidator(_positive_duration),
]


class MaintenanceWindow(_Camel):
    """When an update may drain nodes. Before the window the update's nodes are
    reserved in Slurm (a maintenance reservation from the window's start), so
    no job that would still run at the start begins on them; in the window
    they are drained and replaced as usual; outside it nothing is drained."""

    start: Annotated[
        datetime.datetime,
        Field(description="The (first) window's start, RFC 3339, e.g. 2026-12-05T02:00:00Z."),
    ]
    duration: Annotated[Duration, Field(description="How long each window lasts: 4h, 90m, 1h30m.")]
    every: Annotated[
        Duration | None,
        Field(
            description=(
                "Repeat the window this often from `start` (168h: weekly); without it "
                "the window happens once, and an update not done by its end waits for "
                "a new window."
            )
        ),
    ] = None

    @model_validator(mode="after")
    def _fits_its_period(self) -> MaintenanceWindow:
        if self.start.tzinfo is None:
            raise ValueError("start: needs a time zone (Z or an offset)")
        if self.every is not None and duration_seconds(self.every) < duration_seconds(
            self.duration
        ):
            raise ValueError("every: must be at least the window's duration")
        return self


class UpdateStrategy(_Camel):
    """How pods whose template is out of date are replaced: always drained in
    Slurm first and replaced only once no job runs on their node."""

    type: Annotated[
        Literal["RollingUpdate", "OnDelete"],
        Field(
            description=(
                "RollingUpdate drains and replaces outdated pods, at most maxUnavailable "
                "at a time, each only once no job runs on its node; OnDelete replaces a "
                "pod only when someone deletes it."
            )
        ),
    ] = "RollingUpdate"
    rolling_update: RollingUpdate = RollingUpdate()
    maintenance_window: Annotated[
        MaintenanceWindow | None,
        Field(
            description=(
                "RollingUpdate only: drain for updates only inside this window, and "
                "keep jobs from starting across its start (a Slurm maintenance "
                "reservation; Slurm 25.05+). Without it updates start at once."
            )
        ),
    ] = None


class NodeResources(_Camel):
    """What slurmd registers; unset fields come from the Kubernetes node's allocatable."""

    cpus: Annotated[int | None, Field(ge=1, description="CPUs= of the Slurm node.")] = None
    real_memory_mib: Annotated[
        int | None,
        Field(ge=1, alias="realMemoryMiB", description="RealMemory= of the Slurm node, in MiB."),
    ] = None
    gres: Annotated[
        list[Annotated[str, Field(pattern=r"^[a-zA-Z0-9_]+(:[a-zA-Z0-9_.-]+)*(:[0-9]+)?$")]] | None,
        Field(
            description=(
                "Gres= of the Slurm node, e.g. gpu:h100:8; by default taken from "
                "nvidia.com/gpu and the node's GPU product label."
            )
        ),
    ] = None


class SlurmNodeSpec(_Camel):
    """What each pod's Slurm node is: its name, features, partitions and
    resources, as slurmd registers it (dynamic node)."""

    features: Annotated[
        list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]],
        Field(description="Static Slurm features of every node of this set."),
    ] = []
    features_from_labels: Annotated[
        list[str],
        Field(
            description=(
                "Kubernetes node label keys whose values become Slurm features "
                "(label value, sanitised); a missing label adds nothing."
            )
        ),
    ] = []
    partitions: Annotated[
        list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]],
        Field(
            description=(
                "Slurm partitions the nodes join (rendered into slurm.conf as a "
                "NodeSet line on this set's feature)."
            )
        ),
    ] = []
    resources: NodeResources = NodeResources()
    node_name: Annotated[
        str,
        Field(
            description=(
                "Pattern of the Slurm node name, which is also the pod's name: "
                "{nodeset}, {node} (the Kubernetes node) and {ip} (its internal "
                "address, dots as dashes)."
            ),
            max_length=63,
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": "self.contains('{node}') || self.contains('{ip}')",
                        "message": "must contain {node} or {ip}, or two nodes would "
                        "get the same name",
                    },
                    {
                        "rule": "self.replace('{nodeset}', 'a').replace('{node}', 'a')"
                        ".replace('{ip}', 'a').matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                        "message": "must be lower-case letters, digits and '-' around "
                        "the placeholders {nodeset}, {node} and {ip}",
                    },
                ]
            },
        ),
    ] = "{nodeset}-{node}"
    slurmd_container: Annotated[
        str,
        Field(
            description=(
                "The template's container that runs slurmd; it gets SLURMD_NODENAME "
                "and SLURMD_CONF (the --conf line: features, resources) in its "
                "environment."
            )
        ),
    ] = "slurmd"


_TEMPLATE_RULES = [
    {
        "rule": "has(self.spec) && has(self.spec.containers) && size(self.spec.containers) > 0",
        "message": "the pod template needs at least one container",
        "fieldPath": ".spec.containers",
    },
    {
        "rule": "!has(self.spec) || !has(self.spec.nodeName)",
        "message": "must not be set: the NodeSet places one pod on every matching node",
        "fieldPath": ".spec.nodeName",
    },
    {
        "rule": "!has(self.spec) || !has(self.spec.restartPolicy) "
        "|| self.spec.restartPolicy == 'Always'",
        "message": "must be Always: slurmd is a long-running daemon",
        "fieldPath": ".spec.restartPolicy",
    },
]


class NodeSetSpec(_Camel):
    """One slurmd pod on every Kubernetes node the template's placement
    matches, each a Slurm node, as a DaemonSet would run it."""

    template: Annotated[
        dict[str, Any],
        Field(
            description=(
                "The pod run on every matching node; its nodeSelector, required "
                "node affinity and tolerations choose the nodes."
            ),
            json_schema_extra={"x-kubernetes-validations": _TEMPLATE_RULES},
        ),
    ]
    slurm: SlurmNodeSpec = SlurmNodeSpec()
    update_strategy: UpdateStrategy = UpdateStrategy()


class Condition(_Camel):
    """A condition of the set, as Kubernetes objects report them."""

    type: Annotated[str, Field(description="Available, Progressing or SlurmSynced.")]
    status: Annotated[
        Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")
    ]
    reason: Annotated[str, Field(description="Why, in one CamelCase word.")]
    message: Annotated[str, Field(description="Why, for people.")] = ""
    last_transition_time: Annotated[str, Field(description="When status last changed.")]
    observed_generation: Annotated[
        int | None, Field(description="The spec generation the condition was written for.")
    ] = None


class SlurmCounts(_Camel):
    """Slurm's view of the set's nodes: base state, with drain counted apart."""

    idle: Annotated[int, Field(description="Nodes IDLE in Slurm.")] = 0
    allocated: Annotated[int, Field(description="Nodes ALLOCATED in Slurm (fully used).")] = 0
    mixed: Annotated[int, Field(description="Nodes MIXED in Slurm (partly used).")] = 0
    down: Annotated[int, Field(description="Nodes DOWN in Slurm.")] = 0
    drain: Annotated[
        int, Field(description="Nodes draining or drained, whatever their base state.")
    ] = 0
    not_responding: Annotated[int, Field(description="Nodes slurmctld cannot reach.")] = 0


class NodeSetStatus(_Camel):
    """The set as both sides see it: its pods on Kubernetes, its nodes in Slurm."""

    observed_generation: Annotated[
        int | None, Field(description="The spec generation this status was written for.")
    ] = None
    desired: Annotated[
        int, Field(description="Nodes that match the placement and can run the pod.")
    ] = 0
    feasible: Annotated[
        int, Field(description="Nodes that match the placement, whether or not the pod fits.")
    ] = 0
    scheduled: Annotated[int, Field(description="Pods placed on a node.")] = 0
    ready: Annotated[int, Field(description="Pods ready (slurmd registered).")] = 0
    updated: Annotated[int, Field(description="Pods of the current template.")] = 0
    drained: Annotated[int, Field(description="Slurm nodes drained for an update or removal.")] = 0
    misscheduled: Annotated[
        int, Field(description="Pods on nodes that no longer match the placement.")
    ] = 0
    unavailable: Annotated[int, Field(description="Desired pods not ready.")] = 0
    template_hash: Annotated[str, Field(description="Hash of the current pod template.")] = ""
    slurm: SlurmCounts = SlurmCounts()
    conditions: Annotated[
        list[Condition],
        Field(
            description="Available, Progressing and SlurmSynced.",
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        ),
    ] = []


def resource() -> Any:
    """lightkube's generic resource class for NodeSets."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)


def owning_nodeset(pod: Any) -> str | None:
    """The name of the NodeSet that made `pod`, None for any other pod.

    A label is anyone's to write: a pod is a NodeSet's only if its controller
    ownerReference names that NodeSet and its `sunk.dev/nodeset` label agrees
    (the reference needs a uid, and the garbage collector deletes a pod whose
    owner does not exist). Callers also keep to the namespace their NodeSets
    live in, which tenants cannot create pods in."""
    meta = pod.metadata
    if meta is None:
        return None
    label = (meta.labels or {}).get(LABEL_NODESET)
    for ref in meta.ownerReferences or []:
        if ref.controller and ref.apiVersion == API_VERSION and ref.kind == KIND:
            return label if ref.name == label and ref.uid else None
    return None
