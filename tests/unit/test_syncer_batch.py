"""The syncer's batch writer: one Slurm request per update, however many nodes ask."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import httpx2
import pytest

from sunk.slurm import (
    NodeUpdate,
    SlurmApiError,
    SlurmClient,
    SlurmProblem,
    SlurmUnavailableError,
    StaticToken,
)
from sunk.syncer.batch import BatchWriter

DRAIN_A = NodeUpdate(state="DRAIN", reason="sunk: a")
RESUME = NodeUpdate(state="RESUME")


def refusal(errno: int, text: str) -> SlurmApiError:
    return SlurmApiError("POST", "/slurm/v0.0.42/node/x", 500, (SlurmProblem(errno, text, "", ""),))


class FakeSlurm:
    """Records each request; `refuse` maps a node to the error a request naming it gets."""

    def __init__(self) -> None:
        self.writes: list[tuple[list[str], NodeUpdate]] = []
        self.refuse: dict[str, Exception] = {}
        self.tokens = 0
        self.gate: asyncio.Event | None = None  # while set and clear, writes wait

    async def write(self, names: Sequence[str], update: NodeUpdate) -> None:
        self.writes.append((list(names), update))
        if self.gate is not None:
            await self.gate.wait()
        for name in names:
            if name in self.refuse:
                raise self.refuse[name]

    async def acquire(self) -> None:
        self.tokens += 1


def writer(slurm: FakeSlurm) -> BatchWriter:
    return BatchWriter(slurm.write, slurm.acquire, window=0.0)


async def test_concurrent_drains_with_one_reason_are_one_request() -> None:
    slurm = FakeSlurm()
    batch = writer(slurm)
    names = [f"gpu{i:02}" for i in range(1, 21)]
    await asyncio.gather(*(batch.drain(name, "sunk: a") for name in names))
    assert slurm.writes == [(names, DRAIN_A)]
    assert slurm.tokens == 1  # the rate limit is taken per request, not per node


async def test_different_updates_are_separate_requests() -> None:
    slurm = FakeSlurm()
    batch = writer(slurm)
    await asyncio.gather(
        batch.drain("n1", "sunk: a"),
        batch.drain("n2", "sunk: b"),
        batch.drain("n3", "sunk: a"),
        batch.resume("n4"),
        batch.comment("n5", "hello"),
    )
    assert sorted(slurm.writes, key=lambda w: w[0]) == [
        (["n1", "n3"], DRAIN_A),
        (["n2"], NodeUpdate(state="DRAIN", reason="sunk: b")),
        (["n4"], RESUME),
        (["n5"], NodeUpdate(comment="hello")),
    ]
    assert slurm.tokens == 4


async def test_a_single_change_waits_only_the_window() -> None:
    slurm = FakeSlurm()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    batch = BatchWriter(slurm.write, slurm.acquire, window=0.005, sleep=sleep)
    await asyncio.wait_for(batch.drain("n1", "sunk: a"), 1)
    assert slept == [0.005]
    assert slurm.writes == [(["n1"], DRAIN_A)]


async def test_changes_made_while_a_write_is_in_flight_go_together_next() -> None:
    slurm = FakeSlurm()
    slurm.gate = asyncio.Event()
    batch = writer(slurm)
    first = asyncio.create_task(batch.resume("n1"))
    while not slurm.writes:
        await asyncio.sleep(0)
    later = [asyncio.create_task(batch.resume(f"n{i}")) for i in range(2, 6)]
    await asyncio.sleep(0.01)
    assert len(slurm.writes) == 1  # the others wait for the write in flight
    assert not first.done()
    slurm.gate.set()
    await asyncio.gather(first, *later)
    assert slurm.writes == [(["n1"], RESUME), (["n2", "n3", "n4", "n5"], RESUME)]
    assert slurm.tokens == 2


async def test_a_refused_bulk_write_is_retried_per_node_and_fails_only_the_bad_one() -> None:
    slurm = FakeSlurm()
    slurm.refuse["bad"] = refusal(2018, "Invalid node name specified")
    batch = writer(slurm)
    results = await asyncio.gather(
        *(batch.drain(name, "sunk: a") for name in ("n1", "bad", "n2")), return_exceptions=True
    )
    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], SlurmApiError)
    assert results[1].errno == 2018
    assert slurm.writes[0] == (["n1", "bad", "n2"], DRAIN_A)
    assert sorted(names[0] for names, _ in slurm.writes[1:]) == ["bad", "n1", "n2"]
    assert slurm.tokens == 4  # one for the bulk request, one per node after it


@pytest.mark.parametrize("errno", [2028, 2180])
async def test_a_resume_refused_as_not_drained_is_done_for_the_whole_request(errno: int) -> None:
    """Slurm resumes all the nodes it can of a hostlist and then says no for the
    one already resumed (a repeat): done, with no request per node after it."""
    slurm = FakeSlurm()
    slurm.refuse = {"n2": refusal(errno, "Invalid node state")}
    batch = writer(slurm)
    await asyncio.gather(batch.resume("n1"), batch.resume("n2"), batch.resume("n3"))
    assert slurm.writes == [(["n1", "n2", "n3"], NodeUpdate(state="RESUME"))]
    assert slurm.tokens == 1


async def test_failures_of_every_node_alike_are_not_retried_per_node() -> None:
    slurm = FakeSlurm()
    down = SlurmUnavailableError("POST", "/x", "ConnectError", maybe_applied=False)
    slurm.refuse = {"n1": down}
    batch = writer(slurm)
    results = await asyncio.gather(
        batch.drain("n1", "sunk: a"), batch.drain("n2", "sunk: a"), return_exceptions=True
    )
    assert list(results) == [down, down]
    assert len(slurm.writes) == 1
    unreachable = refusal(1800, "Unable to contact slurm controller (connect failure)")
    slurm.refuse = {"n1": unreachable}
    results = await asyncio.gather(
        batch.drain("n1", "sunk: a"), batch.drain("n2", "sunk: a"), return_exceptions=True
    )
    assert list(results) == [unreachable, unreachable]
    assert len(slurm.writes) == 2


async def test_large_batches_are_split_and_a_cancelled_caller_is_left_out() -> None:
    slurm = FakeSlurm()
    batch = BatchWriter(slurm.write, slurm.acquire, window=0.0, max_batch=2)
    gone = asyncio.create_task(batch.drain("gone", "sunk: a"))
    others = [asyncio.create_task(batch.drain(f"n{i}", "sunk: a")) for i in range(1, 4)]
    await asyncio.sleep(0)  # every caller is waiting; none was sent yet
    gone.cancel()
    await asyncio.gather(*others)
    assert [names for names, _ in slurm.writes] == [["n1", "n2"], ["n3"]]


async def test_update_nodes_sends_one_request_with_the_hostlist_encoded() -> None:
    """slurmrestd refuses '[' ',' ']' in a path; it decodes %XX."""
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/openapi/v3":
            paths: dict[str, object] = {"/slurm/v0.0.42/node/{node_name}": {"post": {}}}
            return httpx2.Response(200, content=json.dumps({"paths": paths}).encode())
        seen.append(request)
        return httpx2.Response(200, content=b"{}")

    transport = httpx2.MockTransport(handler)
    async with SlurmClient("http://slurm", StaticToken("root", "t"), transport=transport) as slurm:
        await slurm.update_nodes(["gpu03", "gpu01", "gpu02", "cpu1"], DRAIN_A)
        with pytest.raises(ValueError, match="no nodes"):
            await slurm.update_nodes([], DRAIN_A)
    [request] = seen
    assert request.method == "POST"
    assert request.url.raw_path == b"/slurm/v0.0.42/node/gpu%5B01-03%5D%2Ccpu1"
    assert json.loads(request.content)["reason"] == "sunk: a"
