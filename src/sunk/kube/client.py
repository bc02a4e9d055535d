"""The one way sunk's components get a Kubernetes client."""

from __future__ import annotations

from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod


def kube_client(kubeconfig: Path | None, field_manager: str) -> AsyncClient:
    """From a kubeconfig file, or (None) the pod's service account."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config, field_manager=field_manager)


def pod_ready(pod: Pod) -> bool:
    """The pod's Ready condition is True."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
