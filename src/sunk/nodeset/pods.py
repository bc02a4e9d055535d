"""Pure builders: a NodeSet and a Kubernetes node in, the slurmd pod and its Slurm identity out."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube.models.core_v1 import (
    Affinity,
    EnvVar,
    Node,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodSpec,
    PodTemplateSpec,
    ResourceRequirements,
    Toleration,
)
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Pod
from lightkube.utils.quantity import parse_quantity

from sunk.api import (
    ANNOTATION_NODE_GPUS,
    ANNOTATION_SLURMD_CONF,
    ANNOTATION_SLURMD_GPUS,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LABEL_NODE,
    LABEL_NODESET,
    LABEL_TEMPLATE_HASH,
    RESOURCE_NODE_GPUS,
    TAINT_NODE_LOCK,
)
from sunk.api import nodeset as api
from sunk.kube.resources import pod_request

# As the DaemonSet controller does: a node's own trouble must not evict the
# pod that reports it to Slurm, and a cordon is Slurm's business (the syncer
# drains the node; running jobs keep their slurmd).
DAEMON_TOLERATIONS = (
    Toleration(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoExecute"),
    Toleration(key="node.kubernetes.io/unreachable", operator="Exists", effect="NoExecute"),
    Toleration(key="node.kubernetes.io/disk-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/memory-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/pid-pressure", operator="Exists", effect="NoSchedule"),
    Toleration(key="node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule"),
    Toleration(key=TAINT_NODE_LOCK, operator="Exists"),
)

_NAME_OK = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FEATURE_BAD = re.compile(r"[^A-Za-z0-9_.+-]")


class SpecError(ValueError):
    """A NodeSet spec that cannot be turned into a pod; the message names the field."""


@dataclass(frozen=True)
class NodeSetRef:
    namespace: str
    name: str
    uid: str


def internal_ip(node: Node) -> str | None:
    for address in (node.status.addresses if node.status else None) or []:
        if address.type == "InternalIP":
            return address.address
    return None


def slurm_node_name(pattern: str, nodeset: str, node: Node) -> str:
    """The Slurm node name, which is also the pod's name and host name."""
    node_name = node.metadata.name if node.metadata and node.metadata.name else ""
    name = pattern.replace("{nodeset}", nodeset).replace("{node}", node_name.lower())
    if "{ip}" in name:
        ip = internal_ip(node)
        if ip is None:
            raise SpecError(f"spec.slurm.nodeName uses {{ip}} but node {node_name} has none")
        name = name.replace("{ip}", ip.replace(".", "-").replace(":", "-"))
    name = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    if len(name) > 63 or not _NAME_OK.match(name):
        raise SpecError(
            f"spec.slurm.nodeName {pattern!r} gives {name!r} for node {node_name}: "
            "a Slurm node and host name must be at most 63 lower-case letters, digits and '-'"
        )
    return name


def slurm_features(nodeset: str, spec: api.SlurmNodeSpec, labels: Mapping[str, str]) -> list[str]:
    """The set's own feature (partitions select on it), static ones, then ones from labels."""
    features = [nodeset, *spec.features]
    for key in spec.features_from_labels:
        if value := labels.get(key):
            features.append(_FEATURE_BAD.sub("_", value))
    return list(dict.fromkeys(features))


def _allocatable(node: Node, resource: str) -> Any:
    allocatable = (node.status.allocatable if node.status else None) or {}
    value = allocatable.get(resource)
    return parse_quantity(value) if value is not None else None


def gpu_plugin_not_serving(node: Node) -> bool:
    """sunk's GPU plugin served the node and does not now (its kubelet has just
    restarted: the kubelet keeps the resource at 0 until the plugin is back).
    A slurmd pod made now would get no GPU and count none; it waits instead.
    (The plugin serves `sunk.dev/node-gpus` on every node it runs on, GPUs or
    none, so a node without GPUs never waits.)"""
    allocatable = (node.status.allocatable if node.status else None) or {}
    return RESOURCE_NODE_GPUS in allocatable and not _allocatable(node, RESOURCE_NODE_GPUS)


def pod_requests(spec: PodSpec | None) -> dict[str, float]:
    """The CPU and memory a pod requests, as the kubelet counts them."""
    return {resource: pod_request(spec, resource) for resource in ("cpu", "memory")}


def slurmd_conf(
    nodeset: str, spec: api.SlurmNodeSpec, node: Node, reserved: Mapping[str, float] | None = None
) -> str:
    """The --conf line of a dynamic node: features and resources.

    Resources the spec leaves open come from the node's allocatable, which is
    what Kubernetes lets pods use on it, less `reserved` (the slurmd pod's own
    requests, `pod_requests`: a pod the scheduler binds for a whole node's
    allocation must still fit beside it): CPUs, RealMemory in MiB, and GPUs
    as gpu[:type]:count with the type from the GPU product label.
    """
    reserved = reserved or {}
    labels = (node.metadata.labels if node.metadata else None) or {}
    parts = [f"Feature={','.join(slurm_features(nodeset, spec, labels))}"]
    resources = spec.resources
    cpus = resources.cpus
    if cpus is None and (allocatable := _allocatable(node, "cpu")) is not None:
        cpus = max(1, math.floor(float(allocatable) - reserved.get("cpu", 0)))
    if cpus is not None:
        parts.append(f"CPUs={cpus}")
    memory = resources.real_memory_mib
    if memory is None and (allocatable := _allocatable(node, "memory")) is not None:
        free = float(allocatable) - reserved.get("memory", 0)
        memory = max(1, math.floor(free / (1024 * 1024)))
    if memory is not None:
        parts.append(f"RealMemory={memory}")
    if gres := node_gres(spec, node):
        parts.append(f"Gres={gres}")
    return " ".join(parts)


def node_gres(spec: api.SlurmNodeSpec, node: Node) -> str:
    """The Gres= value of the node's --conf ("gpu:h100:4"; "" for none): the
    spec's, else the GPUs the node offers now (its allocatable, which leaves
    out a GPU its plugin lists as unhealthy) typed by the GPU product label."""
    if spec.resources.gres is not None:
        return ",".join(spec.resources.gres)
    gpus = _allocatable(node, GPU_RESOURCE)
    if not gpus:
        return ""
    product = ((node.metadata.labels if node.metadata else None) or {}).get(GPU_PRODUCT_LABEL)
    kind = f"gpu:{gpu_type(product)}" if product else "gpu"
    return f"{kind}:{int(gpus)}"


def gpu_type(product: str) -> str:
    """A GRES type from a GPU product label: 'NVIDIA-H100-80GB-HBM3' → 'h100'."""
    words = [w for w in re.split(r"[-_ ]+", product.lower()) if w and w != "nvidia"]
    for word in words:
        if re.match(r"^[a-z]+[0-9]+[a-z]*$", word):
            return word
    return re.sub(r"[^a-z0-9]", "", words[0]) if words else "gpu"


def slurmd_annotations(conf: str, node: Node) -> dict[str, str]:
    """What a new slurmd pod says of its node: its --conf line and, where the
    node's GPU plugin lists them and the line counts GPUs, the GPUs its
    gres.conf line is to name."""
    annotations = {ANNOTATION_SLURMD_CONF: conf}
    listed = ((node.metadata.annotations if node.metadata else None) or {}).get(
        ANNOTATION_NODE_GPUS
    )
    if listed is not None and " Gres=gpu" in f" {conf}":
        annotations[ANNOTATION_SLURMD_GPUS] = listed
    return annotations


def template_hash(spec: api.NodeSetSpec) -> str:
    """Changes whenever a pod built from the spec would differ; names the pods' revision."""
    relevant = {
        "template": spec.template,
        "slurm": spec.slurm.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
    return digest[:10]


def _pin_to(node_name: str, existing: Affinity | None) -> Affinity:
    """Keep the template's affinity, and require this one node (by field, like a DaemonSet)."""
    pin = NodeSelectorRequirement(key="metadata.name", operator="In", values=[node_name])
    affinity = existing or Affinity()
    node_affinity = affinity.nodeAffinity or NodeAffinity()
    required = node_affinity.requiredDuringSchedulingIgnoredDuringExecution
    terms = required.nodeSelectorTerms if required else [NodeSelectorTerm()]
    pinned = [
        NodeSelectorTerm(
            matchExpressions=term.matchExpressions,
            matchFields=[
                *(f for f in term.matchFields or [] if f.key != "metadata.name"),
                pin,
            ],
        )
        for term in terms
    ]
    node_affinity.requiredDuringSchedulingIgnoredDuringExecution = NodeSelector(
        nodeSelectorTerms=pinned
    )
    affinity.nodeAffinity = node_affinity
    return affinity


def build_pod(owner: NodeSetRef, spec: api.NodeSetSpec, node: Node, revision: str) -> Pod:
    """The slurmd pod of `owner` on `node`."""
    node_name = node.metadata.name if node.metadata and node.metadata.name else ""
    name = slurm_node_name(spec.slurm.node_name, owner.name, node)
    template = PodTemplateSpec.from_dict(spec.template)
    assert isinstance(template, PodTemplateSpec)  # from_dict is typed as its base class
    pod_spec = template.spec
    if pod_spec is None or not pod_spec.containers:
        raise SpecError("spec.template.spec.containers: the pod template needs a container")
    containers = {c.name: c for c in pod_spec.containers}
    slurmd = containers.get(spec.slurm.slurmd_container)
    if slurmd is None:
        raise SpecError(
            f"spec.slurm.slurmdContainer: no container named {spec.slurm.slurmd_container!r} "
            f"in the template (it has {', '.join(sorted(containers))})"
        )
    conf = slurmd_conf(owner.name, spec.slurm, node, pod_requests(pod_spec))
    slurmd.env = [
        *(e for e in slurmd.env or [] if e.name not in ("SLURMD_NODENAME", "SLURMD_CONF")),
        EnvVar(name="SLURMD_NODENAME", value=name),
        EnvVar(name="SLURMD_CONF", value=conf),
    ]
    if _allocatable(node, RESOURCE_NODE_GPUS):
        # sunk's device plugin runs on the node: every GPU goes to slurmd,
        # whose jobs Slurm confines to the GPUs it allocated them.
        resources = slurmd.resources or ResourceRequirements()
        resources.limits = {**(resources.limits or {}), RESOURCE_NODE_GPUS: "1"}
        slurmd.resources = resources
    pod_spec.affinity = _pin_to(node_name, pod_spec.affinity)
    pod_spec.tolerations = _merge_tolerations(pod_spec.tolerations or [], DAEMON_TOLERATIONS)
    pod_spec.hostname = name
    meta = template.metadata or ObjectMeta()
    labels = {
        **(meta.labels or {}),
        LABEL_NODESET: owner.name,
        LABEL_NODE: node_name,
        LABEL_TEMPLATE_HASH: revision,
    }
    return Pod(
        metadata=ObjectMeta(
            name=name,
            namespace=owner.namespace,
            labels=labels,
            annotations={**(meta.annotations or {}), **slurmd_annotations(conf, node)},
            ownerReferences=[
                OwnerReference(
                    apiVersion=api.API_VERSION,
                    kind=api.KIND,
                    name=owner.name,
                    uid=owner.uid,
                    controller=True,
                    blockOwnerDeletion=True,
                )
            ],
        ),
        spec=pod_spec,
    )


def _merge_tolerations(own: Sequence[Toleration], added: Sequence[Toleration]) -> list[Toleration]:
    merged = list(own)
    for toleration in added:
        if toleration not in merged:
            merged.append(toleration)
    return merged
