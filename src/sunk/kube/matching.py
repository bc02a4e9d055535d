"""Kubernetes' own rules for matching a node: node-selector terms and taint
tolerations, as the scheduler and the DaemonSet controller apply them (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from lightkube.models.core_v1 import NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration


def term_matches(term: NodeSelectorTerm, labels: Mapping[str, str], name: str) -> bool:
    # An empty term matches no node (Kubernetes' rule), a term with both
    # lists must satisfy both.
    if not term.matchExpressions and not term.matchFields:
        return False
    fields = {"metadata.name": name}
    return all(requirement_matches(r, labels) for r in term.matchExpressions or []) and all(
        requirement_matches(r, fields) for r in term.matchFields or []
    )


def requirement_matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    values = req.values or []
    match req.operator:
        case "In":
            return value is not None and value in values
        case "NotIn":
            return value is None or value not in values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                actual, bound = int(value or ""), int(values[0])
            except (ValueError, IndexError):
                return False
            return actual > bound if req.operator == "Gt" else actual < bound
    return False


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and (toleration.value or "") == (taint.value or "")
