"""Maintenance windows: when an update may drain nodes (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sunk.api import nodeset as api


@dataclass(frozen=True)
class Window:
    start: int  # epoch seconds
    end: int

    def open(self, now: float) -> bool:
        return self.start <= now < self.end


def window_at(spec: api.MaintenanceWindow, now: float) -> Window | None:
    """The window open at `now`, else the next one; None once a window that
    does not repeat has ended."""
    first = int(spec.start.timestamp())
    length = api.duration_seconds(spec.duration)
    if spec.every is None:
        return Window(first, first + length) if now < first + length else None
    period = api.duration_seconds(spec.every)
    # The latest start at or before now (or the first, if that is still ahead).
    start = first + max(0, math.floor((now - first) / period)) * period
    if now >= start + length:
        start += period
    return Window(start, start + length)
