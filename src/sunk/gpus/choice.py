"""Which pod a GPU allocation is for, and whether it is allowed (pure).

The kubelet's device plugin API does not say which pod it allocates for: a
request carries device IDs and a size only. So the plugin reads the pods
bound to its node at that moment and judges from them:

- `nvidia.com/gpu`: sunk's scheduler writes on a pod it places, before it
  binds it, the status condition `sunk.dev/SlurmGPUs` (True, reason
  `AllocatedBySlurm`, message: the GPU indices Slurm allocated to the pod's
  job on that node, "0,1"). A status condition because a pod's author can
  write its annotations but not its status (tenants hold no pods/status
  permission), so it cannot be forged. A *candidate* is a pod bound to the
  node, not terminating, Pending and not yet admitted (the kubelet allocates
  while it admits the pod, and sets `status.startTime` only once it has),
  with that condition True. The scheduler binds one such pod to a node at a
  time (sunk.scheduler.gpu_binds), so there is one candidate; should there
  be more, the preferred allocation is the oldest candidate's indices; an
  allocation is allowed only if its device IDs are all the indices of one
  candidate, or a subset of them.
- `sunk.dev/node-gpus` (one device, "all": every GPU): allowed only to a
  Pending pod of the Slurm cluster's namespace on the node that requests it
  and whose controller is a NodeSet (the slurmd pod), so Slurm sees every GPU
  and confines each job to its own.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sunk.api import CONDITION_SLURM_GPUS, GROUP

NODESET_KIND = "NodeSet"
# The one device of the node resource.
ALL_GPUS = "all"

_EPOCH = datetime.datetime.min.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class BoundPod:
    """What the plugin needs of a pod bound to its node."""

    namespace: str
    name: str
    created: datetime.datetime
    phase: str
    terminating: bool
    # The indices of a True `sunk.dev/SlurmGPUs` condition; None without one
    # (or with one that does not parse).
    slurm_gpus: tuple[int, ...] | None = None
    # Extended resources any of its containers asks for (requests or limits).
    resources: frozenset[str] = frozenset()
    # Its controller ownerReference is a NodeSet (apiVersion sunk.dev/...).
    nodeset_owned: bool = False
    # The kubelet admitted it (status.startTime): its devices are allocated.
    admitted: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_gpus(message: str | None) -> tuple[int, ...] | None:
    """ "0,1" -> (0, 1), ascending and without repeats; None if it is not a
    list of indices (an empty list included: a condition without GPUs grants none)."""
    if not message:
        return None
    indices = set()
    for part in message.split(","):
        text = part.strip()
        if not text.isdigit():
            return None
        indices.add(int(text))
    return tuple(sorted(indices))


def condition_gpus(conditions: Iterable[Any]) -> tuple[int, ...] | None:
    """The indices of a pod's True `sunk.dev/SlurmGPUs` condition, if any."""
    for condition in conditions:
        if condition.type == CONDITION_SLURM_GPUS:
            return parse_gpus(condition.message) if condition.status == "True" else None
    return None


def bound_pod(pod: Any) -> BoundPod | None:
    """A lightkube Pod as the plugin sees it (None without a name)."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    if meta is None or not meta.name:
        return None
    resources: set[str] = set()
    if spec is not None:
        for container in [*(spec.initContainers or []), *(spec.containers or [])]:
            wanted = container.resources
            if wanted is not None:
                resources.update((wanted.requests or {}).keys())
                resources.update((wanted.limits or {}).keys())
    owned = any(
        ref.controller
        and ref.kind == NODESET_KIND
        and (ref.apiVersion or "").startswith(f"{GROUP}/")
        for ref in meta.ownerReferences or []
    )
    return BoundPod(
        namespace=meta.namespace or "",
        name=meta.name,
        created=meta.creationTimestamp or _EPOCH,
        phase=(status.phase if status else None) or "",
        terminating=meta.deletionTimestamp is not None,
        slurm_gpus=condition_gpus((status.conditions if status else None) or []),
        resources=frozenset(resources),
        nodeset_owned=owned,
        admitted=bool(status and status.startTime),
    )


def _pending(pod: BoundPod) -> bool:
    return pod.phase == "Pending" and not pod.terminating


def gpu_candidates(pods: Iterable[BoundPod]) -> list[BoundPod]:
    """Pods the GPUs may go to, oldest first: Pending, not admitted, not
    terminating, with the scheduler's condition."""
    found = [pod for pod in pods if _pending(pod) and not pod.admitted and pod.slurm_gpus]
    return sorted(found, key=lambda pod: (pod.created, pod.key))


def preferred_gpus(
    pods: Iterable[BoundPod],
    available: Collection[str],
    must_include: Collection[str],
    size: int,
) -> tuple[BoundPod | None, list[str]]:
    """The pod the kubelet most likely allocates for, and the device IDs to
    prefer: the oldest candidate whose indices are all available, include
    `must_include` and are at least `size`; its first `size` indices (those
    it must include first). No such pod: (None, []) — no preference, never
    an error (an error fails the pod's admission)."""
    offered, required = set(available), set(must_include)
    for pod in gpu_candidates(pods):
        ids = [str(index) for index in pod.slurm_gpus or ()]
        if len(ids) < size or not set(ids) <= offered or not required <= set(ids):
            continue
        chosen = [i for i in ids if i in required]
        chosen += [i for i in ids if i not in required][: max(size - len(chosen), 0)]
        return pod, sorted(chosen, key=int)
    return None, []


def gpus_allowed(pods: Iterable[BoundPod], requested: Sequence[str]) -> BoundPod | None:
    """The candidate whose indices hold all of `requested` (the oldest if
    several), None if no pod on the node was given them by Slurm."""
    wanted = set(requested)
    for pod in gpu_candidates(pods):
        if wanted <= {str(index) for index in pod.slurm_gpus or ()}:
            return pod
    return None


def node_gpus_allowed(
    pods: Iterable[BoundPod], resource: str, slurmd_namespace: str
) -> BoundPod | None:
    """The slurmd pod that may take every GPU: Pending on the node, in the
    Slurm cluster's namespace, asking for `resource`, its controller a
    NodeSet. None if there is none."""
    found = [
        pod
        for pod in pods
        if _pending(pod)
        and pod.namespace == slurmd_namespace
        and resource in pod.resources
        and pod.nodeset_owned
    ]
    return min(found, key=lambda pod: (pod.created, pod.key), default=None)


def gpus_refusal(resource: str, requested: Sequence[str], node: str) -> str:
    """Why the kubelet must refuse GPUs no pod was given by Slurm (it shows this)."""
    ids = ",".join(sorted(requested, key=_index_order))
    return (
        f"{resource} {ids}: these GPUs were not allocated by Slurm to any pod on node "
        f"{node}; GPUs on a Slurm node belong to Slurm, so a pod takes them only when "
        "placed through Slurm (by sunk's scheduler)"
    )


def node_gpus_refusal(resource: str, node: str, slurmd_namespace: str) -> str:
    """Why the kubelet must refuse every GPU to a pod that is not the slurmd pod."""
    return (
        f"{resource}: every GPU of node {node} goes only to a slurmd pod of a NodeSet "
        f"in namespace {slurmd_namespace}; GPUs on a Slurm node belong to Slurm"
    )


def _index_order(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (-1, device)
