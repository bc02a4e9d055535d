"""Token buckets that bound the syncer's writes to the Kubernetes and Slurm APIs.

A bucket holds up to `burst` tokens and refills at `rate` per second; each
write takes one, waiting when none is left. A mass event (a whole rack
cordoned, Slurm coming back after an outage) then reaches slurmctld and the
apiserver as a steady stream instead of a spike, while a single change still
goes out at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class WriteLimits:
    """Writes per second and burst, per API; a rate of 0 means unlimited."""

    slurm_rate: float = 20.0
    slurm_burst: int = 50
    kube_rate: float = 50.0
    kube_burst: int = 100


class TokenBucket:
    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if burst < 1:
            raise ValueError("a bucket needs room for at least one token")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = asyncio.Lock()  # waiters are served in order
        self.waited = 0.0  # seconds spent waiting, in total

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def delay(self) -> float:
        """Seconds until a token is free (0 if one is now)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    async def acquire(self) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            while (wait := self.delay()) > 0:
                self.waited += wait
                await asyncio.sleep(wait)
            self._tokens -= 1
