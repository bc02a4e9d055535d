"""Which Kubernetes nodes a NodeSet's pod template accepts, as the DaemonSet controller decides.

A node is feasible when the template's nodeSelector matches its labels, one
of the required node-affinity terms matches it, and every NoSchedule or
NoExecute taint on it is tolerated, counting the tolerations the controller
adds to every NodeSet pod (see `pods.DAEMON_TOLERATIONS`). Pure functions.

Like the DaemonSet controller's "should run" and "should continue running",
a node that already runs the set's pod only needs its NoExecute taints
tolerated: a NoSchedule taint (a node lifecycle controller's `not-ready` or
`unreachable` while heartbeats lag, an admin's) keeps new pods off but never
drains and removes a running slurmd. The controller counts a node whose
Slurm record of the set still exists (its pod just replaced by an update) as
running too, so that record, and a drain reason on it, are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightkube.models.core_v1 import Node, PodSpec, Toleration

from sunk.kube.matching import term_matches, tolerates


@dataclass(frozen=True)
class Feasibility:
    ok: bool
    reason: str = ""


FEASIBLE = Feasibility(True)


def feasible(
    spec: PodSpec,
    node: Node,
    extra_tolerations: Sequence[Toleration] = (),
    *,
    running: bool = False,
) -> Feasibility:
    """`running`: the set's pod already runs on `node` (only NoExecute taints then count)."""
    labels = (node.metadata.labels if node.metadata else None) or {}
    name = node.metadata.name if node.metadata else None
    for key, value in (spec.nodeSelector or {}).items():
        if labels.get(key) != value:
            return Feasibility(False, f"nodeSelector {key}={value} does not match")
    affinity = spec.affinity.nodeAffinity if spec.affinity else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    if required is not None and not any(
        term_matches(term, labels, name or "") for term in required.nodeSelectorTerms
    ):
        return Feasibility(False, "no required node affinity term matches")
    tolerations = [*(spec.tolerations or []), *extra_tolerations]
    effects = ("NoExecute",) if running else ("NoSchedule", "NoExecute")
    for taint in (node.spec.taints if node.spec else None) or []:
        if taint.effect in effects and not any(tolerates(t, taint) for t in tolerations):
            return Feasibility(False, f"taint {taint.key}:{taint.effect} is not tolerated")
    return FEASIBLE
