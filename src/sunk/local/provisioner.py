"""A local-path provisioner: one directory per claim, like rancher's local-path-provisioner.

It plays the external-provisioner protocol with the real controllers: the
StorageClass `sunk-local` (provisioner `sunk.dev/local-path`) binds on first
consumer, so the scheduler picks a node and writes it into the claim's
`volume.kubernetes.io/selected-node` annotation; this provisioner then makes
`<state>/volumes/pvc-<uid>/` and creates a `local` PersistentVolume with
node affinity to that node and a claimRef to the claim; the PV controller
binds the two and the scheduler binds the pod. When a claim is deleted, the
PV controller marks the PV Released; with reclaimPolicy Delete the directory
and the PV are removed here.

It runs with its own identity (`sunk-local-provisioner`), granted exactly
these verbs by a ClusterRole the runtime applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from lightkube.resources.storage_v1 import StorageClass

from sunk.local.port import apply_to_cache, build, informer

_log = logging.getLogger(__name__)

PROVISIONER = "sunk.dev/local-path"
STORAGE_CLASS = "sunk-local"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
IDENTITY = "sunk-local-provisioner"

RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": IDENTITY},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["persistentvolumes"],
                "verbs": ["get", "list", "watch", "create", "delete"],
            },
            {
                "apiGroups": [""],
                "resources": ["persistentvolumeclaims"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["storage.k8s.io"],
                "resources": ["storageclasses"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": IDENTITY},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": IDENTITY,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": IDENTITY}],
    },
]


def storage_class(default: bool) -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": annotations},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }


def volume_for(claim: PersistentVolumeClaim, node: str, path: Path, reclaim: str) -> dict[str, Any]:
    """The PersistentVolume for a claim, pinned to `node`."""
    assert claim.metadata is not None
    assert claim.spec is not None
    requests = claim.spec.resources.requests if claim.spec.resources else None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{claim.metadata.uid}",
            "annotations": {PROVISIONED_BY: PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": (requests or {}).get("storage", "1Gi")},
            "accessModes": list(claim.spec.accessModes or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": claim.spec.storageClassName,
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


class Provisioner:
    def __init__(self, client: AsyncClient, root: Path, nodes: set[str]) -> None:
        self.client = client
        self.root = root
        self.nodes = nodes
        self._claims: dict[tuple[str, str], PersistentVolumeClaim] = {}
        self._volumes: dict[tuple[str, str], PersistentVolume] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._tasks = [
            asyncio.create_task(self._follow(PersistentVolumeClaim, self._claims)),
            asyncio.create_task(self._follow(PersistentVolume, self._volumes, None)),
            asyncio.create_task(self._reconciler()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.client.close()

    async def _follow(
        self, resource: Any, cache: dict[tuple[str, str], Any], namespace: str | None = "*"
    ) -> None:
        async for event in informer(
            self.client, resource, namespace=namespace, what=f"provisioner {resource.__name__}"
        ):
            apply_to_cache(event, cache)
            self._dirty.set()

    async def _reconciler(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning("provisioner: %s", exc)
                await asyncio.sleep(1)
                self._dirty.set()

    async def _reconcile(self) -> None:
        volumes = {name for (_, name) in self._volumes}
        for claim in list(self._claims.values()):
            if claim.metadata is None or claim.spec is None:
                continue
            annotations = claim.metadata.annotations or {}
            node = annotations.get(SELECTED_NODE)
            phase = claim.status.phase if claim.status else None
            if phase != "Pending" or claim.spec.volumeName or node not in self.nodes:
                continue
            cls_name = claim.spec.storageClassName
            if not cls_name:
                continue
            try:
                cls = await self.client.get(StorageClass, cls_name)
            except ApiError:
                continue
            if cls.provisioner != PROVISIONER or f"pvc-{claim.metadata.uid}" in volumes:
                continue
            path = self.root / f"pvc-{claim.metadata.uid}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # any container user may write, like local-path-provisioner
            body = volume_for(claim, node, path, cls.reclaimPolicy or "Delete")
            try:
                await self.client.create(build(PersistentVolume, body))
                _log.info(
                    "provisioned %s for %s/%s on %s",
                    body["metadata"]["name"],
                    claim.metadata.namespace,
                    claim.metadata.name,
                    node,
                )
            except ApiError as exc:
                if exc.status.code != 409:
                    raise
        for volume in list(self._volumes.values()):
            meta, spec = volume.metadata, volume.spec
            if (
                meta is None
                or spec is None
                or (meta.annotations or {}).get(PROVISIONED_BY) != PROVISIONER
            ):
                continue
            released = volume.status is not None and volume.status.phase == "Released"
            if (
                released
                and spec.persistentVolumeReclaimPolicy == "Delete"
                and spec.local is not None
            ):
                path = Path(spec.local.path)
                if path.parent == self.root:
                    shutil.rmtree(path, ignore_errors=True)
                with contextlib.suppress(ApiError):
                    await self.client.delete(PersistentVolume, meta.name or "")
                _log.info("deleted released volume %s", meta.name)
