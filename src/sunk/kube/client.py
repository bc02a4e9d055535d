"""The one way sunk's components get a Kubernetes client."""

from __future__ import annotations

from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.resources.core_v1 import Pod

from sunk.http_transport import http_transport

# Idle connections to the apiserver are kept, as many as requests run at once
# and for a minute: a burst then reuses them. httpx's defaults (20, for 5 s)
# made the scheduler open ~60 new TLS connections per burst of 1,000 pods and
# ~15 at the start of every burst after a pause, each a handshake on both sides.
# A minute stays under the apiserver's own 90 s idle timeout, so a kept
# connection is not closed by the server just as a request goes out on it.
KEPT_CONNECTIONS = httpx2.Limits(
    max_connections=100, max_keepalive_connections=100, keepalive_expiry=60.0
)


def kube_client(
    kubeconfig: Path | None, field_manager: str, *, namespace: str | None = None
) -> AsyncClient:
    """From a kubeconfig file, or (None) the pod's service account; `namespace`:
    the client's default (else the kubeconfig's)."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    single = config.get()
    if single is None or single.user is None:
        raise ValueError("the kubeconfig's current context names no user")
    # The transport carries the limits, so it also carries the TLS settings
    # (CA and client certificate) that lightkube would otherwise give httpx.
    transport = http_transport(
        verify=verify_cluster(single.cluster, single.user, single.abs_file),
        limits=KEPT_CONNECTIONS,
    )
    return AsyncClient(
        single, namespace=namespace, field_manager=field_manager, transport=transport
    )


def pod_ready(pod: Pod) -> bool:
    """The pod's Ready condition is True."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
