"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

As in client-go: a candidate takes the Lease when it is free or when its
holder has not renewed it for `lease_duration`, measured on the candidate's
own clock from when it last *saw the Lease change* (never by comparing the
holder's timestamps with local time, so clock skew cannot make two leaders).
Every write is a compare-and-swap on resourceVersion. The leader renews every
`retry_period`, each attempt cut off at `renew_deadline`; if it cannot renew
by then it stops leading (its work is cancelled) before anyone else may take
over, and stands as a candidate again. A candidate that cannot reach the
apiserver keeps trying. Stopping a leader (SIGTERM, see `sunk.service`) hands
the Lease back, so its successor takes over within half a retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._client = client
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._duration = lease_duration
        self._deadline = renew_deadline
        self._retry = retry_period
        self._observed_rv = ""
        self._observed_at = 0.0
        self.is_leader = False
        self.terms = 0  # how many times it has led, for tests and logs

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Stand as a candidate, run `lead()` while leading, and stand again when
        the Lease is lost: a lost Lease (an apiserver outage, a partition) costs
        one term, never the process. Returns when `lead()` returns; cancelling
        the task (SIGTERM) hands the Lease back on the way out."""
        while True:
            await self._acquire()
            if await self._lead(lead):
                return
            log.warning(
                "%s lost %s/%s; standing as a candidate again",
                self.identity,
                self._namespace,
                self._name,
            )

    async def _acquire(self) -> None:
        # Polling is the protocol: the Lease itself is the only signal.
        while True:
            try:
                async with asyncio.timeout(self._deadline):
                    if await self._try_acquire_or_renew():
                        return
            except (ApiError, httpx2.HTTPError, TimeoutError) as error:
                # The apiserver is away: keep standing, as client-go does.
                log.warning("cannot reach %s/%s: %s", self._namespace, self._name, error)
            # Twice per retry period: a Lease handed back is taken within about
            # a second. Jittered, so standbys do not poll in step.
            await asyncio.sleep(self._retry / 2 * random.uniform(1.0, 1.2))  # noqa: S311

    async def _lead(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """One term: True if `lead()` returned, False if the Lease was lost."""
        self.is_leader = True
        self.terms += 1
        log.info("%s leads %s/%s", self.identity, self._namespace, self._name)
        work = asyncio.create_task(lead())
        renewing = asyncio.create_task(self._renew_until_lost())
        try:
            done, _ = await asyncio.wait({work, renewing}, return_when=asyncio.FIRST_COMPLETED)
            if renewing in done:
                return False
            await work  # propagate its exception, if any
            return True
        finally:
            self.is_leader = False
            for task in (work, renewing):
                task.cancel()
            # The work has stopped before the Lease goes: never two leaders at work.
            await asyncio.gather(work, renewing, return_exceptions=True)
            await self._release()

    async def _renew_until_lost(self) -> None:
        """Renew every retry period; return once `renew_deadline` has passed since
        the last renewal. Each attempt is cut off at that deadline, so a hung
        request cannot keep a leader working after its Lease may have passed on."""
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self._retry)
            left = last_renewal + self._deadline - time.monotonic()
            renewed = False
            if left > 0:
                try:
                    async with asyncio.timeout(left):
                        renewed = await self._try_acquire_or_renew()
                except (ApiError, httpx2.HTTPError, TimeoutError) as error:
                    log.warning("renewing %s/%s failed: %s", self._namespace, self._name, error)
            if renewed:
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal >= self._deadline:
                return

    async def _try_acquire_or_renew(self) -> bool:
        now = _now()
        try:
            lease = await self._client.get(Lease, self._name, namespace=self._namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            return await self._create(now)
        spec = lease.spec or LeaseSpec()
        assert lease.metadata is not None
        rv = lease.metadata.resourceVersion or ""
        if rv != self._observed_rv:
            self._observed_rv, self._observed_at = rv, time.monotonic()
        holder = spec.holderIdentity or ""
        expired = time.monotonic() > self._observed_at + (spec.leaseDurationSeconds or 0)
        if holder and holder != self.identity and not expired:
            return False
        taking_over = holder != self.identity
        lease.spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self._duration),
            acquireTime=now if taking_over else spec.acquireTime,
            renewTime=now,
            leaseTransitions=(spec.leaseTransitions or 0) + (1 if taking_over else 0),
        )
        # replace() sends the resourceVersion we read: a compare-and-swap.
        return await self._written(self._client.replace(lease))

    async def _create(self, now: datetime.datetime) -> bool:
        lease = Lease(
            metadata=ObjectMeta(name=self._name, namespace=self._namespace),
            spec=LeaseSpec(
                holderIdentity=self.identity,
                leaseDurationSeconds=int(self._duration),
                acquireTime=now,
                renewTime=now,
                leaseTransitions=0,
            ),
        )
        return await self._written(self._client.create(lease))

    async def _written(self, write: Awaitable[Lease]) -> bool:
        """Whether the write won (a 409: another replica wrote first); a win is observed."""
        try:
            written = await write
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        assert written.metadata is not None
        self._observed_rv, self._observed_at = (
            written.metadata.resourceVersion or "",
            time.monotonic(),
        )
        return True

    async def _release(self) -> None:
        """Hand the Lease back at once, so a successor need not wait out its duration.
        Bounded: a process on its way out must not hang on an absent apiserver."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._retry):
                lease = await self._client.get(Lease, self._name, namespace=self._namespace)
                if lease.spec is None or lease.spec.holderIdentity != self.identity:
                    return
                lease.spec.holderIdentity = None
                lease.spec.leaseDurationSeconds = 1
                await self._client.replace(lease)
