"""A pod's resource requests as the kubelet counts them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightkube.models.core_v1 import Container, PodSpec
from lightkube.utils.quantity import parse_quantity


def container_requests(container: Container) -> Mapping[str, str]:
    resources = container.resources
    if resources is None:
        return {}
    # Kubernetes defaults a missing request to the limit; extended resources live in limits.
    return {**(resources.limits or {}), **(resources.requests or {})}


def _sum(containers: Sequence[Container], name: str) -> float:
    total = 0.0
    for container in containers:
        value = container_requests(container).get(name)
        if value is not None:
            total += float(parse_quantity(value) or 0)
    return total


def pod_request(spec: PodSpec | None, name: str) -> float:
    """What the pod requests of resource `name`: its containers and sidecars
    (init containers that restart) together, or a plain init container with
    the sidecars beside it, whichever is more."""
    containers = list(spec.containers) if spec else []
    inits = list((spec.initContainers if spec else None) or [])
    sidecars = _sum([c for c in inits if c.restartPolicy == "Always"], name)
    largest_init = max((_sum([c], name) for c in inits if c.restartPolicy != "Always"), default=0)
    return max(_sum(containers, name), largest_init) + sidecars
