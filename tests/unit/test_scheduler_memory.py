"""What the scheduler remembers about jobs stays bounded however long it runs."""

from __future__ import annotations

from sunk.scheduler.controller import RecentIds


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
