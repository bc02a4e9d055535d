"""Which pods and which Slurm jobs belong to each work key: the scheduler's memory.

A key (`<namespace>/<pod uid>` or `<namespace>/gang:<name>`) gathers the pods
of one allocation and the jobs sealed for it. The index holds only what it
can rebuild or what stays bounded, so a scheduler that runs for months does
not grow with every job it has seen:

- pods by key: from the pod informer's events (as many as there are pods);
- jobs by key: from the Slurm view's job events, rebuilt whole from the
  view after a resync (as many as Slurm keeps);
- jobs this process submitted, until their key has nothing left; and by id,
  the newest `ids_kept`, so one that later shows without its seal (its owner
  rewrote the comment: `scontrol update job comment=...`) is cancelled, not
  left to run beside the job submitted in its place;
- keys whose submit may have been taken, until the wait is over;
- job ids dropped by the scheduler or forgotten by Slurm: the newest
  `ids_kept` of each (`RecentIds`);
- jobs this process asked Slurm to end, until the view shows them ended
  (`CancelsSent`, the newest `ids_kept`).

No I/O: the loop (`controller.py`) feeds it events and asks it questions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from lightkube.resources.core_v1 import Pod

from sunk.scheduler.decide import pod_annotations
from sunk.scheduler.request import ANNOTATION_JOB_ID, InvalidPod, gang_of, job_key
from sunk.scheduler.seal import JobSeal
from sunk.slurm.models import Job

log = logging.getLogger(__name__)

# Job ids remembered (forgotten by Slurm, dropped by the scheduler): about a day
# of ended pods on a busy cluster, a few hundred kilobytes each.
IDS_KEPT = 100_000


Id = TypeVar("Id", bound=Hashable)


class RecentIds(Generic[Id]):
    """A set of ids (job ids, pod uids) that keeps the newest `size`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ids: dict[Id, None] = {}  # insertion order: oldest first

    def add(self, job_id: Id) -> None:
        self._ids[job_id] = None
        if len(self._ids) > self._size:
            del self._ids[next(iter(self._ids))]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class CancelsSent:
    """Jobs this process asked Slurm to end, and when.

    The view shows a cancel a poll or two later (seconds while a thousand pods
    are deleted at once), and a pod event or a job event meanwhile must not
    cancel the job again: one DELETE per job. A cancel that was lost (the job
    still runs `resend_after` seconds later) is sent again."""

    def __init__(self, resend_after: float, size: int = IDS_KEPT) -> None:
        self._resend_after = resend_after
        self._size = size
        self._sent: dict[int, float] = {}  # job id → monotonic time; oldest first

    def sent(self, job_id: int, now: float) -> None:
        self._sent.pop(job_id, None)
        self._sent[job_id] = now
        if len(self._sent) > self._size:
            del self._sent[next(iter(self._sent))]

    def wait(self, job_id: int, now: float) -> float | None:
        """Seconds before this job may be cancelled again; None: now."""
        sent = self._sent.get(job_id)
        if sent is None or (left := sent + self._resend_after - now) <= 0:
            return None
        return left

    def ended(self, job_id: int) -> None:
        self._sent.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._sent)


def pod_key(pod: Pod) -> str:
    """The pod's work key (by the pod alone if its gang labels are malformed)."""
    assert pod.metadata is not None
    try:
        gang = gang_of(pod)
    except InvalidPod:
        gang = None
    uid = pod.metadata.uid or ""
    return job_key(pod.metadata.namespace or "default", uid, gang)


def refused_allocation(job: Job) -> bool:
    """An immediate allocation Slurm could not start: it leaves a FAILED record
    that never had nodes. Not a job of its key (the batch placeholder is)."""
    return not job.batch_flag and job.state == "FAILED" and not job.nodes


class JobIndex:
    def __init__(self, seal: JobSeal, *, ids_kept: int = IDS_KEPT) -> None:
        self._seal = seal
        self._pods_by_key: dict[str, set[str]] = {}  # key → informer keys of its pods
        self._key_of_pod: dict[str, str] = {}
        self._jobs_by_key: dict[str, set[int]] = {}
        # Jobs this process submitted, by key: known before the view shows them.
        self._submitted: dict[str, tuple[int, float]] = {}  # key → (job id, wait until)
        # Keys whose submit failed in a way that may still have been taken, until when.
        self._uncertain: dict[str, float] = {}
        # Jobs cancelled because their gang fell apart before binding: a gang made
        # whole again gets a new job, and the old one is no reason to evict it.
        self._dropped: RecentIds[int] = RecentIds(ids_kept)
        self._forgotten: RecentIds[int] = RecentIds(ids_kept)  # job ids Slurm no longer knows
        # Every job this process submitted, by id → its key (the newest `ids_kept`).
        self._mine: dict[int, str] = {}
        self._ids_kept = ids_kept
        # Jobs of `_mine` that Slurm shows without their seal: job id → (key, job).
        self._unsealed: dict[int, tuple[str, Job]] = {}

    # -- pods ----------------------------------------------------------------------

    def pod_changed(self, pod: str, new: Pod | None) -> tuple[str | None, str | None]:
        """Index the pod (informer key `pod`) under its key now; (the key it
        left, the key it is in), each None if none. Both are to be looked at."""
        old_key = self._key_of_pod.pop(pod, None)
        if old_key is not None:
            members = self._pods_by_key.get(old_key, set())
            members.discard(pod)
            if not members:
                self._pods_by_key.pop(old_key, None)
        new_key = None
        if new is not None:
            new_key = pod_key(new)
            self._key_of_pod[pod] = new_key
            self._pods_by_key.setdefault(new_key, set()).add(pod)
        return old_key, new_key

    def pods_of(self, key: str) -> frozenset[str]:
        """The informer keys of the key's pods."""
        return frozenset(self._pods_by_key.get(key, ()))

    # -- jobs ----------------------------------------------------------------------

    def key_of(self, job_id: int, job: Job) -> str | None:
        """The key `job` is sealed for; None for any other job, whatever its
        comment holds (a job that makes the seal's reader fail is logged and
        skipped: one user's comment must not stop the index for everyone)."""
        try:
            return self._seal.key_of(job)
        except Exception:
            log.exception(
                "job %d: its comment could not be read; not a job of the scheduler's", job_id
            )
            return None

    def job_changed(self, job_id: int, old: Job | None, new: Job | None) -> str | None:
        """Index a job event; the key of the job if it is sealed for one (or was
        submitted by this process for one)."""
        key = None
        if new is None:  # Slurm forgot it
            self._unsealed.pop(job_id, None)
            self._mine.pop(job_id, None)
        elif (mine := self._mine.get(job_id)) is not None:
            key = mine
            if self.key_of(job_id, new) != mine and not refused_allocation(new):
                if job_id not in self._unsealed:
                    log.warning(
                        "job %d, submitted for %s, no longer carries its seal: it is cancelled",
                        job_id,
                        mine,
                    )
                self._unsealed[job_id] = (mine, new)
            else:
                self._unsealed.pop(job_id, None)
        for job in (old, new):
            if job is None or refused_allocation(job):
                continue
            if (found := self.key_of(job_id, job)) is not None:
                key = found
                if job is new:
                    self._jobs_by_key.setdefault(found, set()).add(job_id)
                elif new is None:
                    ids = self._jobs_by_key.get(found, set())
                    ids.discard(job_id)
                    if not ids:
                        self._jobs_by_key.pop(found, None)
        return key

    def reindex(self, jobs: Mapping[int, Job]) -> None:
        """Forget what job events said and index `jobs` (everything Slurm has)."""
        self._jobs_by_key.clear()
        self._unsealed.clear()
        for job_id, job in jobs.items():
            self.job_changed(job_id, None, job)

    def unsealed(self, key: str) -> list[tuple[int, Job]]:
        """Jobs this process submitted for `key` that Slurm now shows without
        their seal (to be cancelled: the key's pods get a job anew)."""
        return [(i, job) for i, (mine, job) in self._unsealed.items() if mine == key]

    def known_keys(self) -> set[str]:
        """Every key with a pod or a job."""
        return set(self._pods_by_key) | set(self._jobs_by_key)

    def submitted(self, key: str, job_id: int, wait: float) -> None:
        """This process submitted `job_id` for `key`; the view should show it within `wait` s."""
        self._submitted[key] = (job_id, time.monotonic() + wait)
        self._uncertain.pop(key, None)
        self._mine[job_id] = key
        if len(self._mine) > self._ids_kept:
            del self._mine[next(iter(self._mine))]

    def awaited(self, key: str, job_id: int) -> bool:
        """Submitted by this process so lately that the view may not show it yet."""
        mine = self._submitted.get(key)
        return mine is not None and mine[0] == job_id and time.monotonic() < mine[1]

    def candidates(
        self, key: str, pods: Sequence[Pod], jobs: Mapping[int, Job]
    ) -> list[tuple[int, Job | None]]:
        """The jobs that may be the key's, oldest first, each with what the view
        has of it (None: not in the view).

        Only a job sealed for `key` counts: a job id on a pod is a hint (anyone who
        can edit the pod can write one), never a claim on that job; an id not in
        the view is listed for a direct read to settle."""
        ids = set(self._jobs_by_key.get(key, ()))
        if (mine := self._submitted.get(key)) is not None:
            ids.add(mine[0])
        for pod in pods:
            if (written := pod_annotations(pod).get(ANNOTATION_JOB_ID, "")).isdigit():
                ids.add(int(written))
        known = [(i, jobs.get(i)) for i in sorted(ids) if i not in self._dropped]
        return [(i, job) for i, job in known if job is None or self.key_of(i, job) == key]

    def drop(self, job_id: int) -> None:
        self._dropped.add(job_id)

    def forget(self, job_id: int) -> None:
        """Slurm answered that it no longer knows the job: it never will again, so
        the sweep asks once, not every cycle for as long as its pod stays."""
        self._forgotten.add(job_id)

    def forgotten(self, job_id: int) -> bool:
        return job_id in self._forgotten

    # -- submits that may have been taken -------------------------------------------

    def uncertain(self, key: str, wait: float) -> None:
        """A submit for `key` failed but may still be taken: none anew for `wait` s."""
        self._uncertain[key] = time.monotonic() + wait

    def uncertain_for(self, key: str) -> float | None:
        """Seconds left before a submit for `key` may be tried again; 0 when the
        wait is over (asked once: the key is certain again after), None if none."""
        until = self._uncertain.get(key)
        if until is None:
            return None
        if (left := until - time.monotonic()) > 0:
            return left
        del self._uncertain[key]
        return 0.0

    def retire(self, key: str) -> bool:
        """Forget the key's own memory if it has no pod left; True if it had none."""
        if self._pods_by_key.get(key):
            return False
        self._submitted.pop(key, None)
        self._uncertain.pop(key, None)
        return True

    def sizes(self) -> dict[str, int]:
        """How much it holds, by map (for tests and a reader's curiosity)."""
        return {
            "pods": len(self._key_of_pod),
            "keys with pods": len(self._pods_by_key),
            "keys with jobs": len(self._jobs_by_key),
            "submitted": len(self._submitted),
            "uncertain": len(self._uncertain),
            "dropped": len(self._dropped),
            "forgotten": len(self._forgotten),
            "submitted by id": len(self._mine),
            "unsealed": len(self._unsealed),
        }
