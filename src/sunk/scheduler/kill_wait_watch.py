"""slurm.conf's KillWait, watched in the slurm chart's config ConfigMap: the
window a cancelled placeholder holds its nodes, so the longest grace period
a pod may have. Read from Slurm's own file, it is set in one place."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from sunk.kube.configmap_watch import ConfigMapWatch
from sunk.kube.events import EventRecorder
from sunk.slurm.conf import DEFAULT_KILL_WAIT, SlurmConfError, kill_wait

log = logging.getLogger(__name__)

SLURM_CONF_KEY = "slurm.conf"


class KillWaitWatch(ConfigMapWatch):
    """KillWait, kept current. A value sunk cannot read is logged and told as
    an Event on the ConfigMap, and the last one read stays; a missing
    ConfigMap (or key) is Slurm's default."""

    def __init__(
        self, kube: AsyncClient, namespace: str, name: str, on_change: Callable[[int], None]
    ) -> None:
        super().__init__(kube, namespace, name)
        self._events = EventRecorder(kube, "sunk-scheduler")
        self._on_change = on_change
        self._seconds: int | None = None

    async def load(self, configmap: ConfigMap | None) -> None:
        text = (configmap.data or {}).get(SLURM_CONF_KEY) if configmap else None
        if text is None:
            seconds = DEFAULT_KILL_WAIT
            log.warning(
                "%s holds no %s: KillWait is taken as Slurm's default, %ds",
                self.source, SLURM_CONF_KEY, seconds,
            )  # fmt: skip
        else:
            try:
                seconds = kill_wait(text)
            except SlurmConfError as error:
                kept = self._seconds if self._seconds is not None else DEFAULT_KILL_WAIT
                note = f"{self.source} {SLURM_CONF_KEY}: {error}; KillWait stays {kept}s"
                log.error("%s", note)
                assert configmap is not None
                await self._events.emit(
                    configmap, "InvalidSlurmConfig", note, action="Validate", type_="Warning"
                )
                seconds = kept
        if seconds != self._seconds:
            log.info("%s: KillWait %ds", self.source, seconds)
            self._seconds = seconds
            self._on_change(seconds)
