"""The few API calls lightkube cannot express, sent through its own HTTP client.

Sent with the client's configured credentials and base URL, so the one
kubeconfig and the one connection pool serve these too. lightkube 1.0 has no
public raw request: `create(Pod.Binding)` binds but then fails to parse the
Status the apiserver answers, and `delete` takes no preconditions. So these
two reach its HTTP client (`_http`, the one private access in sunk; the
scheduler's and NodeSet's e2e tests bind and delete through it on the real
apiserver, so a lightkube that moves it fails there first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient


def _http(client: AsyncClient) -> Any:
    return client._client._client  # lightkube's httpx2.AsyncClient


async def delete_pod(client: AsyncClient, namespace: str, name: str, uid: str) -> bool:
    """Delete the pod only if it is still the one with `uid` (DeleteOptions preconditions).

    Returns False if it is already gone or was replaced by a newer pod of
    the same name, which must not be deleted on the old one's account.
    """
    reply = await _http(client).request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        json={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}},
    )
    if reply.status_code in (404, 409):
        return False
    if reply.status_code >= 400:
        raise ApiError(request=reply.request, response=reply)
    return True


async def bind_pod(
    client: AsyncClient,
    namespace: str,
    name: str,
    node: str,
    uid: str,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """POST pods/binding: lightkube binds, then fails to parse the 201 Status reply.

    `annotations` are set on the pod with the binding (the apiserver copies them)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        metadata["annotations"] = dict(annotations)
    reply = await _http(client).post(
        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
        json={
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )
    if reply.status_code >= 400:
        raise ApiError(request=reply.request, response=reply)
