"""A controller's one channel to Slurm, which each controller's adapter builds on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView

log = logging.getLogger(__name__)

T = TypeVar("T")


def tell(callback: Callable[[T], None], change: T) -> None:
    """Hand a change to a controller's callback; one that fails is logged, and
    the changes after it still come."""
    try:
        callback(change)
    except Exception:
        log.exception("a Slurm change callback failed on %r", change)


class SlurmChannel:
    """The client for acting and for reads that must be fresh; the cached,
    evented view for deciding. What every adapter offers alike is here."""

    def __init__(self, client: SlurmClient, view: SlurmView) -> None:
        self._client = client
        self._view = view

    @property
    def fresh(self) -> bool:
        return self._view.fresh

    @property
    def requests(self) -> int:
        return self._client.stats.requests

    def poll_now(self) -> None:
        self._view.poll_now()
