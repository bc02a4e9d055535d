"""SchedulerSlurm over sunk's Slurm port: the cached view for deciding, the
client (with each tenant's token) for acting."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from sunk.scheduler.slurm_port import EVERYTHING, JobChange, NoTenantToken, Placed
from sunk.slurm.auth import TenantCredentials
from sunk.slurm.channel import SlurmChannel, tell
from sunk.slurm.client import SlurmClient
from sunk.slurm.errors import SlurmApiError, SlurmNotFoundError
from sunk.slurm.models import Job, JobSpec
from sunk.slurm.view import JobEvent, Resync, SlurmView, StateEvent

log = logging.getLogger(__name__)


class SlurmPortForScheduler(SlurmChannel):
    def __init__(self, client: SlurmClient, view: SlurmView, tenants: TenantCredentials) -> None:
        super().__init__(client, view)
        self._tenants = tenants

    def jobs(self, *, allow_stale: bool = False) -> Mapping[int, Job]:
        return self._view.jobs(allow_stale=allow_stale)

    async def follow(self, on_change: Callable[[JobChange | None], None]) -> None:
        with contextlib.closing(self._view.subscribe(replay=False)) as subscription:
            async for event in subscription:
                if isinstance(event, JobEvent):
                    tell(on_change, JobChange(event.job_id, event.old, event.new))
                elif isinstance(event, StateEvent | Resync):
                    tell(on_change, EVERYTHING)

    async def refresh(self) -> None:
        await self._view.refresh()

    async def read_job(self, job_id: int) -> Job | None:
        # Through the view: the job it read is cached, so its next state probe
        # need not read the job again.
        return await self._view.refresh_job(job_id)

    def _as_owner(self, uid: int) -> SlurmClient:
        """The client that acts as a job's owner: an allocation runs as the
        token's user, whatever `user_id` says (measured on 24.11), and only the
        owner's token may end a job."""
        return self._client.acting_as(self._tenants.for_uid(uid))

    async def check_owner(self, uid: int) -> None:
        try:
            await self._as_owner(uid).credentials.token()
        except (OSError, ValueError) as exc:
            raise NoTenantToken(uid, str(exc)) from exc

    async def place(self, uid: int, spec: JobSpec) -> Placed:
        slurm = self._as_owner(uid)
        try:
            allocation = spec.model_copy(update={"script": None, "immediate": True})
            return Placed((await slurm.allocate(allocation)).job_id, allocated=True)
        except SlurmApiError as exc:
            if exc.transient:
                raise
            # Busy nodes, a higher-priority job waiting, or a bad request: the
            # batch job queues, or is refused with Slurm's own message.
            log.debug("no immediate allocation (%s): queueing a batch placeholder", exc)
        return Placed((await slurm.submit(spec)).job_id, allocated=False)

    async def end(self, uid: int, job_id: int, job: Job) -> None:
        slurm = self._as_owner(uid)
        try:
            with contextlib.suppress(SlurmNotFoundError):
                if job.batch_flag and job.state == "RUNNING":
                    await self._release(slurm, job_id)
                await slurm.cancel(job_id)
        except (OSError, ValueError) as exc:
            raise NoTenantToken(uid, str(exc)) from exc
        self._view.poll_now()

    async def _release(self, slurm: SlurmClient, job_id: int) -> None:
        """A placeholder ends at once on SIGUSR1; a plain cancel would hold the
        node for KillWait (it ignores SIGTERM on purpose)."""
        try:
            await slurm.signal(job_id, "SIGUSR1", full=True)
        except SlurmApiError as exc:
            log.warning("could not signal job %d (%s): it ends after KillWait", job_id, exc)
