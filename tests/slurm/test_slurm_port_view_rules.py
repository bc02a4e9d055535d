"""The cached view's own rules, on a fake transport and a fake clock.

Real slurmrestd behaviour (the 24.11 defect, outages, restarts) is covered by
test_slurm_port_contract.py; here: diffing, staleness by age, bounded
subscriber queues, and pausing incremental reads a server keeps failing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx2
import pytest

from sunk.slurm import (
    Change,
    JobEvent,
    Node,
    NodeEvent,
    Resync,
    RetryPolicy,
    SlurmClient,
    SlurmStaleError,
    SlurmView,
    StaticToken,
    ViewState,
)
from sunk.slurm.view import diff

OPENAPI = {"paths": {"/slurm/v0.0.42/nodes/": {"get": {}}}}


def node(name: str, *state: str) -> Node:
    return Node(name=name, state=state or ("IDLE",))


def test_diff() -> None:
    old = {"a": node("a"), "b": node("b"), "c": node("c")}
    new = {"a": node("a"), "b": node("b", "IDLE", "DRAIN"), "d": node("d")}
    assert [(c, k) for c, k, _, _ in diff(old, new)] == [
        (Change.CHANGED, "b"),
        (Change.ADDED, "d"),
        (Change.REMOVED, "c"),
    ]


class FakeSlurm:
    """Nodes as slurmrestd lists them; `broken_update_time` answers those with a 500."""

    def __init__(self) -> None:
        self.nodes = [{"name": "n1", "state": ["IDLE"]}]
        self.broken_update_time = False
        self.down = False
        self.busy = 0  # this many more reads answer as slurmrestd does when slurmctld is slow
        self.requests: list[str] = []
        self.last_update = 100

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if self.down:
            raise httpx2.ConnectError("refused")
        if request.url.path == "/openapi/v3":
            return httpx2.Response(200, content=json.dumps(OPENAPI).encode())
        since = request.url.params.get("update_time")
        self.requests.append("incremental" if since else "full")
        if self.busy:
            self.busy -= 1
            return _partitions_500()
        if since and self.broken_update_time:
            return _partitions_500()
        if since and int(since) >= self.last_update:
            return httpx2.Response(304)
        body = {"nodes": self.nodes, "last_update": {"set": True, "number": self.last_update}}
        return httpx2.Response(200, content=json.dumps(body).encode())


def _partitions_500() -> httpx2.Response:
    body = {"errors": [{"description": "Unable to query partitions", "error_number": -1}]}
    return httpx2.Response(500, content=json.dumps(body).encode())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client_of(serve: Callable[[httpx2.Request], httpx2.Response]) -> SlurmClient:
    return SlurmClient(
        "http://slurm",
        StaticToken("root", "t"),
        transport=httpx2.MockTransport(serve),
        retry=RetryPolicy(attempts=1),
    )


def view_over(fake: FakeSlurm, clock: Clock) -> SlurmView:
    return SlurmView(client_of(fake), interval=3600, watch_jobs=False, stale_after=5, clock=clock)


async def test_stale_by_age_even_without_errors() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    await view.refresh()
    assert view.fresh
    assert view.node("n1") == node("n1")
    clock.now += 6  # the poll loop is stuck, or slow: the data is old either way
    assert view.state is ViewState.STALE
    with pytest.raises(SlurmStaleError, match="no recent poll"):
        view.nodes()
    assert view.node("n1", allow_stale=True) == node("n1")
    await view.refresh()
    assert view.fresh
    await view.client.aclose()


async def test_failure_marks_stale_and_recovery_rereads_everything() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    events = view.subscribe()
    await view.refresh()
    fake.down = True
    with pytest.raises(Exception, match="unavailable"):
        await view.refresh()
    assert view.state is ViewState.STALE
    fake.down = False
    fake.nodes = [{"name": "n2", "state": ["IDLE"]}]
    fake.last_update = 200
    await view.refresh()
    seen = []
    while (event := events.get_nowait()) is not None:
        seen.append(event)
    kinds = [(type(e).__name__, getattr(e, "change", getattr(e, "state", None))) for e in seen]
    assert kinds == [
        ("NodeEvent", Change.ADDED),
        ("StateEvent", ViewState.FRESH),
        ("StateEvent", ViewState.STALE),
        ("NodeEvent", Change.ADDED),
        ("NodeEvent", Change.REMOVED),
        ("StateEvent", ViewState.FRESH),
    ]
    await view.client.aclose()


async def test_a_slow_subscriber_gets_resync_instead_of_a_backlog() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    events = view.subscribe(maxsize=2)
    fake.nodes = [{"name": f"n{i}", "state": ["IDLE"]} for i in range(5)]
    await view.refresh()
    assert isinstance(events.get_nowait(), Resync)
    assert events.dropped > 0
    events.close()
    fake.nodes = []
    fake.last_update += 1
    await view.refresh()
    assert events.get_nowait() is None  # closed: no more events
    await view.client.aclose()


async def test_incremental_reads_a_server_keeps_failing_pause() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    await view._sync(full=False)  # first read: full
    await view._sync(full=False)  # unchanged: 304
    assert fake.requests == ["full", "incremental"]
    assert view.stats.unchanged == 1
    fake.broken_update_time = True
    fake.requests.clear()
    for _ in range(4):  # a second apart: fails, falls back, still tries
        await view._sync(full=False)
        clock.now += 1
    assert fake.requests == ["incremental", "full"] * 4
    assert view.fresh  # never stale: every fallback read succeeded
    clock.now += 1  # failing for 5 s now: the next failure pauses them
    await view._sync(full=False)
    fake.requests.clear()
    await view._sync(full=False)
    assert fake.requests == ["full"]
    assert view.stats.fallbacks == 5
    clock.now += 31  # pause over: try again
    fake.broken_update_time = False
    fake.requests.clear()
    await view._sync(full=False)
    assert fake.requests == ["incremental"]
    await view.client.aclose()


async def test_node_events_carry_old_and_new() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    await view.refresh()
    events = view.subscribe(replay=False)
    fake.nodes = [{"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "r"}]
    fake.last_update += 1
    await view._sync(full=False)
    event = events.get_nowait()
    assert isinstance(event, NodeEvent)
    assert event.change is Change.CHANGED
    assert event.old == node("n1")
    assert event.new is not None
    assert event.new.draining
    assert event.new.reason == "r"
    await view.client.aclose()


async def test_closing_ends_iteration_for_a_waiting_subscriber() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    events = view.subscribe()

    async def consume() -> list[object]:
        return [event async for event in events]

    task = asyncio.create_task(consume())
    await view.refresh()
    await asyncio.sleep(0)
    events.close()
    seen = await asyncio.wait_for(task, 1)
    assert [type(e).__name__ for e in seen] == ["NodeEvent", "StateEvent"]
    await view.client.aclose()


async def test_poll_now_cuts_the_wait_short() -> None:
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)  # polls once an hour unless woken
    await view.start()
    assert view.fresh
    polled = len(fake.requests)
    view.poll_now()
    async with asyncio.timeout(2):
        while len(fake.requests) == polled:
            await asyncio.sleep(0.01)
    await view.stop()
    assert view.state is ViewState.CLOSED
    await view.client.aclose()


async def test_a_read_slurmctld_answered_too_late_is_retried_before_stale() -> None:
    """24.11 answers 500/errno -1 to a full read when slurmctld is too busy to answer in time."""
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    await view.refresh()
    events = view.subscribe(replay=False)
    fake.busy = 2
    await view.refresh()
    assert view.fresh
    assert view.stats.retries == 2
    assert events.get_nowait() is None  # no STALE, no FRESH: nothing happened to subscribers
    fake.busy = 3  # still failing after the retries: now it is stale
    with pytest.raises(Exception, match="Unable to query partitions"):
        await view.refresh()
    assert view.state is ViewState.STALE
    await view.client.aclose()


async def test_a_start_cancelled_before_the_first_read_leaves_no_poll_task() -> None:
    hung = asyncio.Event()

    async def never_answers(request: httpx2.Request) -> httpx2.Response:
        await hung.wait()
        raise AssertionError("unreachable")

    client = SlurmClient(
        "http://slurm", StaticToken("root", "t"), transport=httpx2.MockTransport(never_answers)
    )
    view = SlurmView(client, interval=3600, watch_jobs=False)
    starting = asyncio.create_task(view.start())
    await asyncio.sleep(0.05)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert view.state is ViewState.CLOSED
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "slurm-view"]
    await client.aclose()


async def test_read_share_spaces_polls_that_read_whole_lists() -> None:
    """Each read "takes" 0.5 s by the view's clock and brings a changed list: with
    read_share 0.1 the next poll waits 4.5 s, without it the view polls on."""

    def busy_cluster(read_share: float | None) -> tuple[FakeSlurm, SlurmView]:
        fake, clock = FakeSlurm(), Clock()
        serve = fake.__call__

        def slow_and_changing(request: httpx2.Request) -> httpx2.Response:
            clock.now += 0.5
            fake.last_update += 1
            return serve(request)

        view = SlurmView(
            client_of(slow_and_changing),
            interval=0.01,
            watch_jobs=False,
            stale_after=60,
            clock=clock,
            read_share=read_share,
        )
        return fake, view

    for read_share in (0.1, None):
        fake, view = busy_cluster(read_share)
        await view.start()
        await asyncio.sleep(0.3)
        await view.stop()
        await view.client.aclose()
        reads = len(fake.requests)
        if read_share:
            assert reads == 1, reads
        else:
            assert reads > 3, reads


async def test_a_full_read_now_and_then_finds_what_incremental_reads_missed() -> None:
    """slurmctld can change a table without moving its update time (26.05
    drops a deleted node so): incremental reads answer "no change" for it."""
    fake, clock = FakeSlurm(), Clock()
    view = view_over(fake, clock)
    view.full_every = 60
    await view._sync(full=False)  # first read: full
    fake.nodes = []  # gone, and last_update stays where it was
    clock.now += 30
    await view._sync(full=False)
    assert view.node("n1") is not None  # "no change" (304)
    clock.now += 30
    await view._sync(full=False)
    assert fake.requests == ["full", "incremental", "full"]
    assert view.node("n1") is None
    await view.client.aclose()


class FakeJobs:
    """Jobs as slurmrestd serves them: the list (full or since `update_time`),
    every job's state (`jobs/state/`, 404 with `no_probe`) and one job."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, object]] = {1: job_row(1, "RUNNING")}
        self.last_update = 100
        self.no_probe = False
        self.state_ids: dict[int, str] = {}  # a row's id as jobs/state writes it, if not the number
        self.state_words: dict[int, list[str]] = {}  # a state as jobs/state words it, if otherwise
        self.requests: list[str] = []

    def set(self, job_id: int, state: str | None) -> None:
        if state is None:
            self.jobs.pop(job_id, None)
        else:
            self.jobs[job_id] = job_row(job_id, state)
        self.last_update += 1

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path == "/openapi/v3":
            return reply({"paths": {"/slurm/v0.0.42/jobs/": {"get": {}}}})
        tail = path.removeprefix("/slurm/v0.0.42/")
        if tail == "jobs/state/":
            self.requests.append("state")
            if self.no_probe:
                return httpx2.Response(404, content=b"not found")
            rows = [
                {
                    "job_id": self.state_ids.get(i, str(i)),
                    "state": self.state_words.get(i, job["job_state"]),
                }
                for i, job in self.jobs.items()
            ]
            return reply({"jobs": rows})
        if tail.startswith("job/"):
            job_id = int(tail.removeprefix("job/"))
            self.requests.append(f"job {job_id}")
            if job_id not in self.jobs:
                problem = {"error_number": 2017, "description": "Invalid job id specified"}
                return reply({"errors": [problem]}, 404)
            return reply({"jobs": [self.jobs[job_id]]})
        since = request.url.params.get("update_time")
        self.requests.append("list since" if since else "list")
        if since and int(since) >= self.last_update:
            return reply({"jobs": [], "last_update": {"set": True, "number": 0}})
        last = {"set": True, "number": self.last_update}
        return reply({"jobs": list(self.jobs.values()), "last_update": last})


def job_row(job_id: int, state: str) -> dict[str, object]:
    return {"job_id": job_id, "job_state": [state], "nodes": "n1" if state == "RUNNING" else ""}


def reply(body: dict[str, object], status: int = 200) -> httpx2.Response:
    return httpx2.Response(status, content=json.dumps(body).encode())


def probing_view(fake: FakeJobs, clock: Clock) -> SlurmView:
    return SlurmView(
        client_of(fake),
        interval=3600,
        watch_nodes=False,
        stale_after=3600,
        clock=clock,
        job_probe=True,
        detail_every=5,
    )


async def test_a_state_probe_reads_only_the_jobs_that_moved() -> None:
    fake, clock = FakeJobs(), Clock()
    view = probing_view(fake, clock)
    await view._sync(full=False)  # the first read: the list
    events = view.subscribe(replay=False)
    fake.set(2, "PENDING")  # new
    fake.set(1, None)  # gone
    await view._sync(full=False)
    assert fake.requests == ["list", "state", "job 2"]
    assert view.job(1) is None
    assert view.job(2) is not None
    seen = []
    while (event := events.get_nowait()) is not None:
        if isinstance(event, JobEvent):
            seen.append((event.change, event.job_id))
    assert set(seen) == {(Change.ADDED, 2), (Change.REMOVED, 1)}
    fake.requests.clear()
    await view._sync(full=False)  # nothing moved: the probe alone
    assert fake.requests == ["state"]
    await view.client.aclose()


async def test_the_list_is_read_when_details_are_due_or_many_jobs_moved() -> None:
    fake, clock = FakeJobs(), Clock()
    view = probing_view(fake, clock)
    await view._sync(full=False)
    clock.now += 6  # detail_every is over: what a state does not show (preempt_time)
    fake.set(1, "RUNNING")
    await view._sync(full=False)
    assert fake.requests == ["list", "list since"]
    fake.requests.clear()
    for job_id in range(2, 50):  # more moved than one-job reads are worth
        fake.set(job_id, "PENDING")
    await view._sync(full=False)
    assert fake.requests == ["state", "list since"]
    assert len(view.jobs()) == 49
    await view.client.aclose()


async def test_no_probe_where_slurmrestd_has_none_or_rows_name_no_single_job() -> None:
    fake, clock = FakeJobs(), Clock()
    fake.state_ids = {1: "1_3"}  # an array task's row
    view = probing_view(fake, clock)
    await view._sync(full=False)
    await view._sync(full=False)
    assert fake.requests == ["list", "state", "list since"]
    fake.requests.clear()
    fake.no_probe = True  # an older slurmrestd: lists from then on
    await view._sync(full=False)
    await view._sync(full=False)
    assert fake.requests == ["state", "list since", "list since"]
    assert not view.job_probe
    await view.client.aclose()


async def test_refresh_job_caches_what_it_read() -> None:
    fake, clock = FakeJobs(), Clock()
    view = probing_view(fake, clock)
    await view._sync(full=False)
    fake.set(7, "RUNNING")
    job = await view.refresh_job(7)
    assert job is not None
    assert view.job(7) == job
    fake.requests.clear()
    await view._sync(full=False)  # the probe finds it cached already: no second read
    assert fake.requests == ["state"]
    fake.set(7, None)
    assert await view.refresh_job(7) is None
    assert view.job(7) is None
    await view.client.aclose()


async def test_a_probe_leaves_a_job_to_the_refresh_job_reading_it() -> None:
    """The scheduler reads the job it has just allocated; a probe meanwhile does
    not read it too, and the next probe reads it if it moved after that read."""
    fake, clock = FakeJobs(), Clock()
    release = asyncio.Event()

    async def serve(request: httpx2.Request) -> httpx2.Response:
        response = fake(request)  # the job as it is when the read reaches Slurm
        if request.url.path.endswith("/job/7"):
            await release.wait()
        return response

    view = probing_view(serve, clock)  # type: ignore[arg-type]
    await view._sync(full=False)
    fake.set(7, "RUNNING")
    reading = asyncio.create_task(view.refresh_job(7))
    await asyncio.sleep(0.01)
    fake.set(7, "COMPLETED")
    fake.requests.clear()
    await view._sync(full=False)
    assert fake.requests == ["state"]
    release.set()
    read = await reading
    assert read is not None
    assert read.job_state == ("RUNNING",)
    fake.requests.clear()
    await view._sync(full=False)  # Slurm's state differs from that read: read it
    assert fake.requests == ["state", "job 7"]
    job = view.job(7)
    assert job is not None
    assert job.job_state == ("COMPLETED",)
    fake.requests.clear()
    await view._sync(full=False)
    assert fake.requests == ["state"]
    await view.client.aclose()


async def test_read_share_spaces_the_lists_and_the_probes_go_on_between() -> None:
    """A list read that "takes" 0.5 s keeps the next one 4.5 s away (read_share
    0.1), but the state probes go on at the view's interval meanwhile."""
    fake, clock = FakeJobs(), Clock()

    def slow_lists(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/jobs/"):
            clock.now += 0.5
            fake.last_update += 1  # every list read brings a changed list
        return fake(request)  # a probe "takes" no time: the lists stay 4.5 s away

    view = SlurmView(
        client_of(slow_lists),
        interval=0.01,
        watch_nodes=False,
        stale_after=3600,
        clock=clock,
        read_share=0.1,
        job_probe=True,
        detail_every=0.1,
    )
    await view.start()
    await asyncio.sleep(0.3)
    await view.stop()
    await view.client.aclose()
    kinds = [r for r in fake.requests if r != "state"]
    assert kinds == ["list"]
    assert fake.requests.count("state") > 3


async def test_a_job_the_probe_words_otherwise_is_read_once_not_at_every_poll() -> None:
    fake, clock = FakeJobs(), Clock()
    fake.state_words = {1: ["RUNNING", "SIGNALING"]}  # the probe and the job read disagree
    view = probing_view(fake, clock)
    await view._sync(full=False)
    for _ in range(3):
        await view._sync(full=False)
    assert fake.requests == ["list", "state", "job 1", "state", "state"]
    await view.client.aclose()


async def test_a_node_read_mark_is_passed_by_a_read_begun_after_it_only() -> None:
    """What the syncer wrote shows in the cache once a list read begun after the
    write has come back; one already under way may predate the write."""
    fake, clock = FakeSlurm(), Clock()
    release = asyncio.Event()
    held = False

    async def serve(request: httpx2.Request) -> httpx2.Response:
        if held and request.url.path != "/openapi/v3":
            await release.wait()
        return fake(request)

    view = SlurmView(
        client_of(serve),  # type: ignore[arg-type]
        interval=3600,
        watch_jobs=False,
        stale_after=5,
        clock=clock,
    )
    await view.refresh()
    held = True
    under_way = asyncio.create_task(view._sync(full=False))
    await asyncio.sleep(0.01)
    mark = view.node_read_mark()  # the write came back while that read was under way
    release.set()
    await under_way
    assert not view.nodes_read_since(mark)
    await view._sync(full=False)  # "unchanged" (304) is a read as well
    assert fake.requests[-1] == "incremental"
    assert view.nodes_read_since(mark)
    await view.client.aclose()
