"""Kubernetes Events for every action a controller takes, and why."""

from __future__ import annotations

import datetime
import logging
import secrets
import socket
from typing import Any, Literal

from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.events_v1 import Event

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(self, client: AsyncClient, controller: str) -> None:
        self._client = client
        self._controller = controller
        self._instance = f"{controller}-{socket.gethostname()}"

    async def emit(
        self,
        regarding: Any,
        reason: str,
        note: str,
        *,
        action: str,
        type_: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """Record an Event about `regarding` (a lightkube object or a dict). Never raises:
        an Event that cannot be written must not stop the action it describes."""
        obj: dict[str, Any] = regarding if isinstance(regarding, dict) else regarding.to_dict()
        meta: dict[str, Any] = obj.get("metadata", {})
        namespace: str = meta.get("namespace") or "default"
        event = Event(
            # As client-go names them: `<object>.<unique hex>`. (A generateName
            # ending in "." is refused: the prefix itself must be a valid name.)
            metadata=ObjectMeta(
                name=f"{meta.get('name')}.{secrets.token_hex(8)}", namespace=namespace
            ),
            eventTime=datetime.datetime.now(datetime.UTC),
            reportingController=self._controller,
            reportingInstance=self._instance[:128],
            action=action,
            reason=reason,
            note=note[:1024],
            type=type_,
            regarding=ObjectReference(
                apiVersion=obj.get("apiVersion"),
                kind=obj.get("kind") or type(regarding).__name__,
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                resourceVersion=meta.get("resourceVersion"),
            ),
        )
        try:
            await self._client.create(event)
        except Exception:
            log.warning("could not record event %s on %s/%s", reason, namespace, meta.get("name"))
