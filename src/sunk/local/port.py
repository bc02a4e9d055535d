"""What the runtime needs from Kubernetes, as narrow ports, and their lightkube adapters.

- `NodeApi`: everything one node does, with that node's own identity
  (`system:node:NAME` in `system:nodes`), so the Node authorizer and the
  NodeRestriction admission plugin check it exactly as they check a kubelet.
- `Informer`: list-then-watch of one kind, re-listing after any error
  (including 410 Gone); consumers get a full `resync` and then changes,
  which suits level-triggered consumers.

Unit tests fake these; nothing else in the runtime talks to the apiserver.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import (
    ConfigMap,
    Event,
    Node,
    NodeStatus,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    PodStatus,
    Secret,
    ServiceAccountToken,
)
from lightkube.types import PatchType

from sunk.local.plan import TokenSpec, config_map_data, secret_data
from sunk.local.status import now_utc
from sunk.testbed.kube import async_client, async_http_client

_log = logging.getLogger(__name__)
LEASE_NAMESPACE = "kube-node-lease"


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["resync", "upsert", "delete"]
    objects: list[Any]


def apply_to_cache(event: WatchEvent, cache: dict[tuple[str, str], Any]) -> None:
    """Keep a (namespace, name) → object cache in step with an informer's events."""
    if event.kind == "resync":
        cache.clear()
    for obj in event.objects:
        key = (obj.metadata.namespace or "", obj.metadata.name or "")
        if event.kind == "delete":
            cache.pop(key, None)
        else:
            cache[key] = obj


class NodeApi(Protocol):
    node_name: str

    async def register(self, node: Mapping[str, Any]) -> dict[str, Any]: ...
    async def patch_node_status(self, status: Mapping[str, Any]) -> None: ...
    async def renew_lease(self, duration_seconds: int, node_uid: str | None) -> None: ...
    def pods(self) -> AsyncIterator[WatchEvent]: ...
    def own_node(self) -> AsyncIterator[WatchEvent]: ...
    async def patch_pod_status(self, pod: Pod, status: Mapping[str, Any]) -> None: ...
    async def delete_pod(self, pod: Pod) -> None: ...
    async def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None: ...
    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None: ...
    async def pvc(self, namespace: str, name: str) -> PersistentVolumeClaim | None: ...
    async def pv(self, name: str) -> PersistentVolume | None: ...
    async def token(self, pod: Pod, spec: TokenSpec) -> tuple[str, datetime.datetime]: ...
    async def event(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None: ...
    async def close(self) -> None: ...


T = TypeVar("T")


def build(cls: type[T], body: Mapping[str, Any]) -> T:
    """A lightkube object from a JSON-shaped dict."""
    return cast(T, cls.from_dict(dict(body)))  # type: ignore[attr-defined]


def _missing(exc: ApiError) -> bool:
    return exc.status.code == 404


async def informer(
    client: AsyncClient,
    resource: Any,
    *,
    namespace: str | None = "*",
    fields: dict[str, str] | None = None,
    what: str = "",
) -> AsyncIterator[WatchEvent]:
    """List, then watch from the list's resourceVersion; re-list after any failure."""
    kwargs: dict[str, Any] = {"fields": fields} if fields else {}
    if namespace is not None:
        kwargs["namespace"] = namespace
    failures = 0
    while True:
        try:
            listing = client.list(resource, **kwargs)
            items = [item async for item in listing]
            yield WatchEvent("resync", items)
            failures = 0
            async for kind, obj in client.watch(
                resource, resource_version=listing.resourceVersion, **kwargs
            ):
                if kind == "BOOKMARK":
                    continue
                yield WatchEvent("delete" if kind == "DELETED" else "upsert", [obj])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # 410 Gone, dropped connections, apiserver restarts
            failures += 1
            _log.debug("informer %s: %s; re-listing", what or resource.__name__, exc)
            await asyncio.sleep(min(0.2 * failures, 2.0))


class KubeNodeApi:
    """NodeApi over lightkube, as `system:node:<node_name>`."""

    def __init__(self, kubeconfig: Path, node_name: str) -> None:
        self.node_name = node_name
        self.client = async_client(kubeconfig, field_manager="sunk-local-kubelet")
        self.http = async_http_client(kubeconfig)
        self._recent_events: dict[tuple[str, str, str], float] = {}

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()

    async def register(self, node: Mapping[str, Any]) -> dict[str, Any]:
        try:
            created = await self.client.create(build(Node, node))
        except ApiError as exc:
            if exc.status.code != 409:
                raise
            created = await self.client.get(Node, self.node_name)
        out: dict[str, Any] = created.to_dict()
        return out

    async def patch_node_status(self, status: Mapping[str, Any]) -> None:
        await self.client.patch(
            NodeStatus, self.node_name, {"status": dict(status)}, patch_type=PatchType.STRATEGIC
        )

    async def renew_lease(self, duration_seconds: int, node_uid: str | None) -> None:
        now = now_utc().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": now,
        }
        try:
            await self.client.patch(
                Lease,
                self.node_name,
                {"spec": spec},
                namespace=LEASE_NAMESPACE,
                patch_type=PatchType.MERGE,
            )
            return
        except ApiError as exc:
            if not _missing(exc):
                raise
        meta: dict[str, Any] = {"name": self.node_name, "namespace": LEASE_NAMESPACE}
        if node_uid:
            # Like kubelet: the lease goes away with its Node.
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node_uid}
            ]
        await self.client.create(build(Lease, {"metadata": meta, "spec": spec}))

    def pods(self) -> AsyncIterator[WatchEvent]:
        return informer(
            self.client,
            Pod,
            fields={"spec.nodeName": self.node_name},
            what=f"pods of {self.node_name}",
        )

    def own_node(self) -> AsyncIterator[WatchEvent]:
        """This node's Node object, as kubelet watches it (labels for admission)."""
        return informer(
            self.client,
            Node,
            namespace=None,
            fields={"metadata.name": self.node_name},
            what=f"node {self.node_name}",
        )

    async def patch_pod_status(self, pod: Pod, status: Mapping[str, Any]) -> None:
        assert pod.metadata is not None
        # metadata.uid makes the patch fail on a new pod that reuses the name.
        body = {"metadata": {"uid": pod.metadata.uid}, "status": dict(status)}
        await self.client.patch(
            PodStatus,
            pod.metadata.name or "",
            body,
            namespace=pod.metadata.namespace,
            patch_type=PatchType.STRATEGIC,
        )

    async def delete_pod(self, pod: Pod) -> None:
        """The final delete of a terminated pod: no grace left, and only this very pod."""
        assert pod.metadata is not None
        url = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}"
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": pod.metadata.uid},
        }
        reply = await self.http.request("DELETE", url, json=body)
        if reply.status_code not in (200, 202, 404, 409):
            reply.raise_for_status()

    async def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None:
        try:
            cm = await self.client.get(ConfigMap, name, namespace=namespace)
        except ApiError as exc:
            if _missing(exc):
                return None
            raise
        return config_map_data(cm.data, cm.binaryData)

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        try:
            secret = await self.client.get(Secret, name, namespace=namespace)
        except ApiError as exc:
            if _missing(exc):
                return None
            raise
        return secret_data(secret.data)

    async def pvc(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        try:
            return await self.client.get(PersistentVolumeClaim, name, namespace=namespace)
        except ApiError as exc:
            if _missing(exc):
                return None
            raise

    async def pv(self, name: str) -> PersistentVolume | None:
        try:
            return await self.client.get(PersistentVolume, name)
        except ApiError as exc:
            if _missing(exc):
                return None
            raise

    async def token(self, pod: Pod, spec: TokenSpec) -> tuple[str, datetime.datetime]:
        assert pod.metadata is not None
        assert pod.spec is not None
        request = ServiceAccountToken(
            metadata=ObjectMeta(),
            spec=TokenRequestSpec(
                audiences=[spec.audience] if spec.audience else [],
                expirationSeconds=spec.seconds,
                boundObjectRef=BoundObjectReference(
                    apiVersion="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            ),
        )
        reply = await self.client.create(
            request,
            pod.spec.serviceAccountName or "default",
            namespace=pod.metadata.namespace,
        )
        assert reply.status is not None
        token, expires = reply.status.token, reply.status.expirationTimestamp
        assert token is not None
        assert expires is not None
        return token, expires

    async def event(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        """Best effort, and at most one identical event per 30 s (like kubelet's aggregation)."""
        key = (str(involved.get("uid") or involved.get("name")), reason, message)
        loop = asyncio.get_running_loop()
        if loop.time() - self._recent_events.get(key, -1e9) < 30:
            return
        self._recent_events[key] = loop.time()
        if len(self._recent_events) > 4096:
            self._recent_events.clear()
        namespace = involved.get("namespace") or "default"
        stamp = now_utc().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {
                "name": f"{involved.get('name')}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.client.create(build(Event, body))
        except (ApiError, httpx2.HTTPError) as exc:
            _log.debug("event %s for %s not recorded: %s", reason, involved.get("name"), exc)
