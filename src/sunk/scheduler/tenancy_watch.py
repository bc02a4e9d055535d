"""The tenancy ConfigMap, watched: the scheduler grants by it, and `sunk tokens`
keeps a Slurm token for each uid it grants."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from sunk.kube.configmap_watch import ConfigMapWatch
from sunk.kube.events import EventRecorder
from sunk.scheduler.tenancy import Tenancy, TenancyError, parse_tenancy

log = logging.getLogger(__name__)

TENANCY_KEY = "tenancy.yaml"


class TenancyWatch(ConfigMapWatch):
    """The tenancy ConfigMap, kept current. An invalid edit is logged and told
    as an Event on the ConfigMap, and the last valid tenancy stays: a typo must
    not stop every tenant. A missing ConfigMap serves no namespace."""

    def __init__(
        self, kube: AsyncClient, namespace: str, name: str, *, report_invalid: bool = True
    ) -> None:
        super().__init__(kube, namespace, name)
        # One reader reports an invalid edit (the scheduler); others only log it.
        self._events = EventRecorder(kube, "sunk-scheduler") if report_invalid else None
        self._tenancy = Tenancy()
        self._loaded = ""  # the resourceVersion read last
        self.on_change: Callable[[], None] = lambda: None

    def current(self) -> Tenancy:
        return self._tenancy

    async def load(self, configmap: ConfigMap | None) -> None:
        version = configmap.metadata.resourceVersion if configmap and configmap.metadata else ""
        if version == self._loaded:
            return
        self._loaded = version or ""
        if configmap is None:
            self._tenancy = Tenancy()
            log.warning("%s does not exist: no namespace is served", self.source)
        else:
            text = (configmap.data or {}).get(TENANCY_KEY, "")
            try:
                self._tenancy = parse_tenancy(text, self.source)
            except TenancyError as error:
                log.error("%s; the tenancy read before stays", error)
                if self._events is not None:
                    await self._events.emit(
                        configmap, "InvalidTenancy", str(error), action="Validate", type_="Warning"
                    )
                return
            namespaces = sum(len(g.namespaces) for g in self._tenancy.tenants)
            log.info("%s: %d namespaces served", self.source, namespaces)
        self.on_change()
