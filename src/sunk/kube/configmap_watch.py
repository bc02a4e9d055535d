"""One ConfigMap, watched by name: what a component reads its settings from
and follows without a restart."""

from __future__ import annotations

import asyncio

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from sunk.kube.informer import Informer


class ConfigMapWatch:
    """Calls `load` with the ConfigMap (None while it does not exist) once it
    has been read, and again after each change; `ready` is set after the
    first `load`. A watch by name carries a metadata.name field selector, so
    RBAC limited to that name (resourceNames) allows it."""

    def __init__(self, kube: AsyncClient, namespace: str, name: str) -> None:
        self.source = f"ConfigMap {namespace}/{name}"
        self._key = f"{namespace}/{name}"
        self._informer: Informer[ConfigMap] = Informer(
            kube, ConfigMap, namespace=namespace, fields={"metadata.name": name}
        )
        self._changed = asyncio.Event()
        self._informer.subscribe(lambda _: self._changed.set())
        self.ready = asyncio.Event()

    async def load(self, configmap: ConfigMap | None) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._informer.run())
            await self._informer.synced.wait()
            while True:
                self._changed.clear()
                await self.load(self._informer.get(self._key))
                self.ready.set()
                await self._changed.wait()
