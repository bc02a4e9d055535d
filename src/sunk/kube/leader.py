"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

As in client-go: a candidate takes the Lease when it is free or when its
holder has not renewed it for `lease_duration`, measured on the candidate's
own clock from when it last *saw the Lease change* (never by comparing the
holder's timestamps with local time, so clock skew cannot make two leaders).
Every write is a compare-and-swap on resourceVersion. The leader renews every
`retry_period`; if it cannot renew within `renew_deadline` it stops leading
(its work is cancelled) before anyone else may take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger(__name__)


class LostLeadership(Exception):
    """The Lease could not be renewed in time; the work was stopped."""


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

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait to become leader, then run `lead()` while renewing.

        Returns when `lead()` returns (the Lease is released); raises
        LostLeadership if renewal fails (after cancelling `lead()`).
        """
        # Polling is the protocol: the Lease itself is the only signal.
        while not await self._try_acquire_or_renew():  # noqa: ASYNC110
            await asyncio.sleep(self._retry)
        self.is_leader = True
        log.info("%s leads %s/%s", self.identity, self._namespace, self._name)
        work = asyncio.create_task(lead())
        renewing = asyncio.create_task(self._renew_until_lost())
        try:
            done, _ = await asyncio.wait({work, renewing}, return_when=asyncio.FIRST_COMPLETED)
            if renewing in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                raise LostLeadership(f"{self.identity} lost {self._namespace}/{self._name}")
            await work  # propagate its exception, if any
        finally:
            self.is_leader = False
            renewing.cancel()
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, LostLeadership):
                await renewing
            await self._release()

    async def _renew_until_lost(self) -> None:
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self._retry)
            try:
                renewed = await self._try_acquire_or_renew()
            except Exception:
                log.exception("renewing %s/%s failed", self._namespace, self._name)
                renewed = False
            if renewed:
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal > self._deadline:
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
        try:
            # replace() sends the resourceVersion we read: a compare-and-swap.
            updated = await self._client.replace(lease)
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        assert updated.metadata is not None
        self._observed_rv, self._observed_at = (
            updated.metadata.resourceVersion or "",
            time.monotonic(),
        )
        return True

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
        try:
            created = await self._client.create(lease)
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        assert created.metadata is not None
        self._observed_rv, self._observed_at = (
            created.metadata.resourceVersion or "",
            time.monotonic(),
        )
        return True

    async def _release(self) -> None:
        """Hand the Lease back at once, so a successor need not wait out its duration."""
        with contextlib.suppress(Exception):
            lease = await self._client.get(Lease, self._name, namespace=self._namespace)
            if lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity = None
            lease.spec.leaseDurationSeconds = 1
            await self._client.replace(lease)
