"""How sunk's long-running components run as processes: until SIGTERM.

Kubernetes stops a pod's containers with SIGTERM (every rollout, scale-in and
`kubectl delete pod`). Python's default for SIGTERM is to die on the spot,
skipping every `finally`; here it cancels the main task instead, as Ctrl-C
does, so the clean-up runs (the leader hands its Lease back) and the process
exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


def run_until_terminated(main: Coroutine[Any, Any, None]) -> None:
    asyncio.run(_cancelled_by_sigterm(main))


async def _cancelled_by_sigterm(main: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(main)
    terminated = asyncio.Event()

    def terminate() -> None:
        log.info("SIGTERM: stopping")
        terminated.set()
        task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        await task
    except asyncio.CancelledError:
        if not terminated.is_set():
            raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
