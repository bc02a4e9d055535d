"""The work queue keeps client-go's promises."""

from __future__ import annotations

import asyncio
import logging

import httpx2
import pytest
from lightkube import ApiError

from sunk.kube.workqueue import Result, ShutDown, Stale, WorkQueue, routine_failure, run_workers


async def test_a_key_is_queued_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(10):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert [await queue.get(), await queue.get()] == ["a", "b"]


async def test_a_key_added_while_processing_comes_back_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # an event arrives while a worker reconciles "a"
    assert len(queue) == 0  # never two workers on one key
    queue.done(key)
    assert await queue.get() == "a"


async def test_failures_back_off_exponentially_until_forgotten() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    loop = asyncio.get_running_loop()
    delays = []
    for _ in range(4):
        start = loop.time()
        queue.add_rate_limited("a")
        key = await queue.get()
        delays.append(loop.time() - start)
        queue.done(key)
    assert queue.failures("a") == 4
    assert delays[0] >= 0.009
    assert delays[1] >= 0.019
    assert delays[3] < 0.1  # capped at max_delay
    queue.forget("a")
    assert queue.failures("a") == 0


async def test_add_after_keeps_the_earliest_time() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 10)
    queue.add_after("a", 0.01)
    queue.add_after("a", 5)
    key = await asyncio.wait_for(queue.get(), 1)
    assert key == "a"


async def test_shut_down_wakes_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.shut_down()
    with pytest.raises(ShutDown):
        await waiter


async def test_workers_retry_failures_and_honour_requeue_after() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.001)
    seen: list[str] = []
    attempts = {"bad": 0}

    async def reconcile(key: str) -> Result | None:
        seen.append(key)
        if key == "bad":
            attempts["bad"] += 1
            if attempts["bad"] < 3:
                raise RuntimeError("transient")
        if key == "again" and seen.count("again") == 1:
            return Result(requeue_after=0.01)
        if seen.count("bad") == 3 and seen.count("again") == 2:
            queue.shut_down()
        return None

    for key in ("bad", "good", "again"):
        queue.add(key)
    await asyncio.wait_for(run_workers(queue, reconcile, workers=2), 5)
    assert seen.count("bad") == 3  # one bad key did not stop the others
    assert seen.count("good") == 1
    assert seen.count("again") == 2


async def test_routine_failures_are_retried_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 409 from a resourceVersion guard is ordinary work: said in one line and
    retried; an unexpected error keeps its traceback."""
    queue: WorkQueue[str] = WorkQueue(base_delay=0.001)
    conflict = ApiError(
        response=httpx2.Response(
            409,
            json={"kind": "Status", "code": 409, "message": "the object has been modified"},
            request=httpx2.Request("PATCH", "https://apiserver/api/v1/nodes/n1"),
        )
    )
    failures: dict[str, list[Exception]] = {"n1": [conflict], "n2": [RuntimeError("bug")]}
    done: list[str] = []

    async def reconcile(key: str) -> None:
        if failures[key]:
            raise failures[key].pop()
        done.append(key)
        if len(done) == 2:
            queue.shut_down()

    queue.add("n1")
    queue.add("n2")
    with caplog.at_level(logging.INFO, logger="sunk.kube.workqueue"):
        await asyncio.wait_for(run_workers(queue, reconcile, workers=1), 5)
    assert sorted(done) == ["n1", "n2"]
    [routine] = [r for r in caplog.records if "n1" in r.getMessage()]
    assert routine.levelno == logging.INFO
    assert routine.exc_info is None
    assert "changed meanwhile" in routine.getMessage()
    [unexpected] = [r for r in caplog.records if "n2" in r.getMessage()]
    assert unexpected.levelno == logging.ERROR
    assert unexpected.exc_info is not None


def test_a_stale_read_is_routine() -> None:
    """A JSON patch whose resourceVersion test fails answers 422; the syncer says
    Stale, and the retry is no news."""
    assert routine_failure(Stale("node n1 changed since it was read")) == (
        "node n1 changed since it was read"
    )
    assert routine_failure(RuntimeError("bug")) is None
