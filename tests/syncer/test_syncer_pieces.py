"""The syncer's small pieces without a test bed: write limits and which changes become Events."""

from __future__ import annotations

import asyncio

import pytest
from lightkube.models.core_v1 import NodeCondition

from sunk.syncer.controller import state_event
from sunk.syncer.decide import Condition
from sunk.syncer.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    for _ in range(3):
        assert bucket.delay() == 0
        bucket._tokens -= 1
    assert bucket.delay() == pytest.approx(0.1)
    clock.now = 0.05
    assert bucket.delay() == pytest.approx(0.05)
    clock.now = 10
    assert bucket.delay() == 0
    assert bucket._tokens == 3  # never more than the burst


async def test_acquire_waits_for_a_token_and_unlimited_never_waits() -> None:
    bucket = TokenBucket(rate=50, burst=2)
    started = asyncio.get_running_loop().time()
    for _ in range(4):
        await bucket.acquire()
    # Two from the burst, two more at 50/s: at least ~40 ms.
    assert asyncio.get_running_loop().time() - started >= 0.035
    assert bucket.waited > 0
    unlimited = TokenBucket(rate=0, burst=1)
    for _ in range(1000):
        await unlimited.acquire()
    assert unlimited.waited == 0


def have(kind: str, status: str, reason: str = "") -> NodeCondition:
    return NodeCondition(type=kind, status=status, reason=reason)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (
            None,
            Condition("SlurmDrain", "True", "SlurmDrain", "bad DIMM"),
            ("SlurmDrained", "Warning"),
        ),
        (None, Condition("SlurmDrain", "True", "SunkDrain", "sunk/syncer: x"), None),
        (
            have("SlurmDrain", "True", "SlurmDrain"),
            Condition("SlurmDrain", "False", "NotDrained", ""),
            ("SlurmDrainCleared", "Normal"),
        ),
        (
            have("SlurmDrain", "True", "SunkDrain"),
            Condition("SlurmDrain", "False", "NotDrained", ""),
            None,
        ),
        (
            have("SlurmNotResponding", "False"),
            Condition("SlurmNotResponding", "True", "NotResponding", ""),
            ("SlurmNotResponding", "Warning"),
        ),
        (
            have("SlurmDown", "True"),
            Condition("SlurmDown", "False", "IDLE", ""),
            ("SlurmUp", "Normal"),
        ),
        (None, Condition("SlurmDown", "False", "IDLE", ""), None),
        (have("SlurmDown", "True"), Condition("SlurmDown", "True", "DOWN", "x"), None),
        (None, Condition("SlurmAllocated", "True", "ALLOCATED", ""), None),
    ],
)
def test_which_slurm_changes_are_told_as_events(
    before: NodeCondition | None, after: Condition, expected: tuple[str, str] | None
) -> None:
    assert state_event(before, after) == expected
