"""The scheduler's job index (pure): which pods and jobs are each key's, and
that what it remembers stays bounded however long the scheduler runs."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.jobs import CancelsSent, JobIndex, RecentIds
from sunk.scheduler.request import ANNOTATION_JOB_ID, GANG_NAME, GANG_SIZE
from sunk.scheduler.seal import JobSeal
from sunk.slurm.models import Job

pytestmark = pytest.mark.unit

SEAL = JobSeal(b"0123456789abcdef0123456789abcdef", "sunk")
GANG = {GANG_NAME: "g", GANG_SIZE: "2"}


def pod(name: str, *, labels: dict[str, str] | None = None, job_id: int | None = None) -> Pod:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": {ANNOTATION_JOB_ID: str(job_id)} if job_id else {},
    }
    return Pod.from_dict({"metadata": metadata, "spec": {"containers": []}})


def sealed(job_id: int, key: str, state: str = "RUNNING", uid: int = 5000, **fields: Any) -> Job:
    return Job.model_validate(
        {
            "job_id": job_id,
            "job_state": [state],
            "user_id": uid,
            "comment": SEAL.comment(key, uid),
            "batch_flag": True,
            **fields,
        }
    )


def test_recent_ids_keep_the_newest() -> None:
    ids = RecentIds(3)
    for job_id in range(1, 6):
        ids.add(job_id)
    assert len(ids) == 3
    assert 1 not in ids
    assert 2 not in ids
    assert all(i in ids for i in (3, 4, 5))
    ids.add(3)  # seen again: no second entry
    assert len(ids) == 3


def test_a_pod_joining_a_gang_leaves_its_own_key() -> None:
    index = JobIndex(SEAL)
    assert index.pod_changed("ns/a", pod("a")) == (None, "ns/uid-a")
    # Its labels now name a gang: both keys are to be looked at.
    assert index.pod_changed("ns/a", pod("a", labels=GANG)) == ("ns/uid-a", "ns/gang:g")
    assert index.pods_of("ns/gang:g") == {"ns/a"}
    assert index.pods_of("ns/uid-a") == frozenset()
    assert index.pod_changed("ns/a", None) == ("ns/gang:g", None)
    assert index.known_keys() == set()


def test_only_jobs_sealed_for_the_key_are_its_own() -> None:
    index = JobIndex(SEAL)
    index.pod_changed("ns/a", pod("a", job_id=9))  # a job id anyone could write
    mine, theirs = sealed(7, "ns/uid-a"), sealed(9, "ns/uid-b")
    forged = Job.model_validate(
        {"job_id": 8, "job_state": ["RUNNING"], "user_id": 6000, "comment": mine.comment}
    )
    assert index.job_changed(7, None, mine) == "ns/uid-a"
    assert index.job_changed(8, None, forged) is None  # a copied seal, another owner
    assert index.job_changed(9, None, theirs) == "ns/uid-b"
    jobs = {7: mine, 8: forged, 9: theirs}
    assert index.candidates("ns/uid-a", [pod("a", job_id=9)], jobs) == [(7, mine)]
    # An id not in the view is listed, for a direct read to settle.
    assert index.candidates("ns/uid-a", [pod("a", job_id=11)], jobs) == [(7, mine), (11, None)]
    index.drop(7)
    assert index.candidates("ns/uid-a", [pod("a")], jobs) == []


def test_a_refused_allocation_is_no_keys_job() -> None:
    index = JobIndex(SEAL)
    refused = sealed(3, "ns/uid-a", state="FAILED", batch_flag=False)
    assert index.job_changed(3, None, refused) is None
    assert index.known_keys() == set()


def test_a_job_gone_from_slurm_leaves_the_index() -> None:
    index = JobIndex(SEAL)
    job = sealed(7, "ns/uid-a")
    index.job_changed(7, None, job)
    assert index.known_keys() == {"ns/uid-a"}
    assert index.job_changed(7, job, None) == "ns/uid-a"
    assert index.known_keys() == set()
    index.reindex({7: job})
    assert index.known_keys() == {"ns/uid-a"}
    index.reindex({})
    assert index.known_keys() == set()


def test_a_submitted_job_is_a_candidate_before_the_view_shows_it() -> None:
    index = JobIndex(SEAL)
    index.submitted("ns/uid-a", 12, wait=60)
    assert index.candidates("ns/uid-a", [], {}) == [(12, None)]
    assert index.awaited("ns/uid-a", 12)
    assert not index.awaited("ns/uid-a", 13)
    index.submitted("ns/uid-b", 14, wait=0)
    assert not index.awaited("ns/uid-b", 14)


def test_an_uncertain_submit_waits_then_is_asked_about_once() -> None:
    index = JobIndex(SEAL)
    assert index.uncertain_for("ns/uid-a") is None
    index.uncertain("ns/uid-a", wait=60)
    left = index.uncertain_for("ns/uid-a")
    assert left is not None
    assert 59 < left <= 60
    index.uncertain("ns/uid-a", wait=0)
    assert index.uncertain_for("ns/uid-a") == 0.0
    assert index.uncertain_for("ns/uid-a") is None


def test_memory_stays_bounded_as_keys_come_and_go() -> None:
    index = JobIndex(SEAL, ids_kept=50)
    for n in range(1, 1_001):
        name, key = f"p{n}", f"ns/uid-p{n}"
        job = sealed(n, key)
        index.pod_changed(f"ns/{name}", pod(name))
        index.submitted(key, n, wait=0)
        index.job_changed(n, None, job)
        # The pod goes, its job ends and is purged, the scheduler retires the key.
        index.pod_changed(f"ns/{name}", None)
        index.job_changed(n, job, None)
        index.drop(n)
        index.forget(n)
        assert index.retire(key)
    assert index.sizes() == {
        "pods": 0,
        "keys with pods": 0,
        "keys with jobs": 0,
        "submitted": 0,
        "uncertain": 0,
        "dropped": 50,
        "forgotten": 50,
        "submitted by id": 0,
        "unsealed": 0,
    }


def test_a_key_with_pods_is_not_retired() -> None:
    index = JobIndex(SEAL)
    index.pod_changed("ns/a", pod("a"))
    index.submitted("ns/uid-a", 1, wait=0)
    assert not index.retire("ns/uid-a")
    assert index.candidates("ns/uid-a", [], {}) == [(1, None)]


def test_a_job_cancelled_is_not_cancelled_again_until_the_resend_wait() -> None:
    """The view shows a cancel a poll or two later: meanwhile the job is not
    cancelled again, and a cancel that was lost goes again after the wait."""
    cancels = CancelsSent(resend_after=10.0, size=2)
    assert cancels.wait(7, now=100.0) is None
    cancels.sent(7, now=100.0)
    assert cancels.wait(7, now=103.0) == 7.0
    assert cancels.wait(7, now=110.0) is None  # lost: sent again
    cancels.sent(7, now=110.0)
    cancels.ended(7)  # the view shows it ended
    assert cancels.wait(7, now=111.0) is None
    for job_id in (1, 2, 3):
        cancels.sent(job_id, now=120.0)
    assert len(cancels) == 2
    assert cancels.wait(1, now=121.0) is None  # the oldest is let go first
    assert cancels.wait(3, now=121.0) == 9.0


def test_a_job_it_submitted_that_loses_its_seal_is_marked_for_cancelling() -> None:
    """A tenant may rewrite their own job's comment (`scontrol update job
    comment=...`): the scheduler no longer knows it for the key's, submits anew,
    and must end the old one, or every look would leave one more job."""
    index = JobIndex(SEAL)
    key = "ns/uid-p"
    index.pod_changed("ns/p", pod("p"))
    index.submitted(key, 41, wait=0)
    job = sealed(41, key)
    assert index.job_changed(41, None, job) == key
    assert index.unsealed(key) == []
    rewritten = sealed(41, key, comment="mine now")
    assert index.job_changed(41, job, rewritten) == key
    assert index.unsealed(key) == [(41, rewritten)]
    assert index.candidates(key, [], {41: rewritten}) == []
    index.reindex({41: rewritten})
    assert index.unsealed(key) == [(41, rewritten)]
    assert index.job_changed(41, rewritten, None) is None  # Slurm forgot it
    assert index.unsealed(key) == []


def test_a_comment_the_seal_cannot_read_is_skipped_not_fatal() -> None:
    class Broken(JobSeal):
        def key_of(self, job: Job) -> str | None:
            if job.comment == "boom":
                raise TypeError("a reader's bug")
            return super().key_of(job)

    index = JobIndex(Broken(b"0123456789abcdef0123456789abcdef", "sunk"))
    index.reindex(
        {1: sealed(1, "ns/uid-a"), 2: Job(job_id=2, comment="boom"), 3: sealed(3, "ns/uid-b")}
    )
    assert index.sizes()["keys with jobs"] == 2
    assert index.job_changed(2, None, Job(job_id=2, comment="boom")) is None
