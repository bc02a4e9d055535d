"""Waiting out an apiserver that is away, for what a component does once at start.

A component that exits because the apiserver did not answer its first call
is restarted by its kubelet with a growing back-off (up to five minutes), so
a one-minute outage at the wrong moment would keep it down for several more.
Calls made at start go through `until_answered` instead: connection errors,
timeouts, 429 and 5xx are waited out with a capped back-off; any other answer
(a 403, a 404, bad input) is an error the caller must see at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx2
from lightkube import ApiError

log = logging.getLogger(__name__)

T = TypeVar("T")


def transient(error: BaseException) -> bool:
    """Whether `error` says "not now" rather than "no"."""
    if isinstance(error, ApiError):
        return error.status.code == 429 or (error.status.code or 0) >= 500
    if isinstance(error, httpx2.HTTPStatusError):
        return error.response.status_code == 429 or error.response.status_code >= 500
    return isinstance(error, httpx2.TransportError | TimeoutError)


async def until_answered(
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    attempt_timeout: float = 60.0,
    first_delay: float = 1.0,
    max_delay: float = 30.0,
) -> T:
    """`call()`, again after each transient failure (each attempt bounded by
    `attempt_timeout`), until it answers; cancel the caller to give up."""
    delay = first_delay
    while True:
        try:
            async with asyncio.timeout(attempt_timeout):
                return await call()
        except Exception as error:
            if not transient(error):
                raise
            log.warning("%s: %s; again in %.0fs", what, error or type(error).__name__, delay)
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not secrecy
        delay = min(max_delay, delay * 2)
