"""What the scheduler needs from Slurm, and nothing more.

A narrow port: the scheduler's loop depends on this Protocol;
`sunk.scheduler.slurm_adapter` implements it over sunk's Slurm REST port.
Every write is made as the job's owner, a tenant's uid: the scheduler's own
Slurm user needs no right to act for another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sunk.slurm.models import Job, JobSpec


@dataclass(frozen=True)
class JobChange:
    """A job appeared, changed or went (`new` None) in the cached view."""

    job_id: int
    old: Job | None
    new: Job | None


# What an on_change callback gets when every job may have changed (the view
# went stale or fresh again, or events were dropped): re-read everything.
EVERYTHING = None


class NoTenantToken(Exception):
    """The scheduler holds no usable token for a uid (just granted: `sunk tokens`
    writes it and the kubelet brings it within a minute; or no longer granted)."""

    def __init__(self, uid: int, reason: str) -> None:
        super().__init__(f"no Slurm token for uid {uid}: {reason}")
        self.uid = uid
        self.reason = reason


@dataclass(frozen=True)
class Placed:
    job_id: int
    # True: an allocation that runs now; False: a batch placeholder that waits.
    allocated: bool


class SchedulerSlurm(Protocol):
    @property
    def fresh(self) -> bool:
        """The cached view is up to date; while it is not, nothing is decided."""
        ...

    @property
    def requests(self) -> int:
        """REST requests made so far (a metric)."""
        ...

    def jobs(self, *, allow_stale: bool = False) -> Mapping[int, Job]:
        """Every job Slurm has, by id, from the cache; raises SlurmStaleError
        while the view is stale unless `allow_stale`."""
        ...

    async def follow(self, on_change: Callable[[JobChange | None], None]) -> None:
        """Until cancelled, call `on_change` with each change to the cached jobs
        from now on, and with EVERYTHING when the view as a whole changed."""
        ...

    async def refresh(self) -> None:
        """A full read, begun after this call: what it shows includes every job
        submitted before. Raises if Slurm cannot be read."""
        ...

    def poll_now(self) -> None:
        """Cut the view's wait short (sunk just changed something)."""
        ...

    async def read_job(self, job_id: int) -> Job | None:
        """The job as it is now (not the cache); None if Slurm no longer knows it."""
        ...

    async def check_owner(self, uid: int) -> None:
        """Raise NoTenantToken unless the scheduler can act as `uid` now."""
        ...

    async def place(self, uid: int, spec: JobSpec) -> Placed:
        """As `uid`: an immediate allocation if Slurm can start one now, else a
        batch placeholder that waits in the queue with Slurm's pending reason.
        Slurm's refusal raises SlurmApiError with its message."""
        ...

    async def end(self, uid: int, job_id: int, job: Job) -> None:
        """As `uid`, end the job at once: a running placeholder is released
        (it ignores SIGTERM, which would hold its nodes for KillWait), then
        cancelled. A job already gone is no error; no token raises NoTenantToken."""
        ...
