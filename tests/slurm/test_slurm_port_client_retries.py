"""Retry, auth-renewal and concurrency rules of SlurmClient, on a fake transport.

The replies are copies of what real slurmrestd sends (see the contract
tests); what is tested here is only the client's own policy: which failures
are retried, which never are, and how many requests are in flight.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest

from sunk.slurm import (
    JobSpec,
    JwtMinter,
    RetryPolicy,
    SlurmApiError,
    SlurmAuthError,
    SlurmClient,
    SlurmUnavailableError,
    StaticKey,
    StaticToken,
)

OPENAPI = {
    "paths": {f"/slurm/v0.0.42/{p}": {"get": {}, "post": {}} for p in ("nodes/", "job/submit")}
}
NODES = {"nodes": [{"name": "n1", "state": ["IDLE"]}], "last_update": {"set": True, "number": 5}}
Handler = Callable[[httpx2.Request], Awaitable[httpx2.Response] | httpx2.Response]


def reply(status: int, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.Response(status, content=json.dumps(body).encode())


def slurm_error(errno: int, text: str) -> dict[str, Any]:
    return {"errors": [{"description": text, "error_number": errno, "error": text, "source": "x"}]}


class Fake:
    """Serves /openapi/v3 and hands every other request to `then`, counting them."""

    def __init__(self, then: Handler) -> None:
        self.then = then
        self.calls: list[str] = []

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/openapi/v3":
            return reply(200, OPENAPI)
        self.calls.append(request.method)
        result = self.then(request)
        return await result if not isinstance(result, httpx2.Response) else result


def client(fake: Fake, **kwargs: Any) -> SlurmClient:
    return SlurmClient(
        "http://slurm",
        kwargs.pop("credentials", StaticToken("root", "t")),
        transport=httpx2.MockTransport(fake),
        retry=kwargs.pop("retry", RetryPolicy(attempts=3, base_delay=0.0)),
        **kwargs,
    )


def sequence(*steps: httpx2.Response | Exception) -> Handler:
    remaining = list(steps)

    def handler(request: httpx2.Request) -> httpx2.Response:
        step = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        if isinstance(step, Exception):
            raise step
        return step

    return handler


async def test_reads_are_retried_on_connection_errors_and_transient_5xx() -> None:
    fake = Fake(
        sequence(
            httpx2.ConnectError("refused"),
            reply(502, slurm_error(1800, "Unable to contact slurm controller")),
            httpx2.ReadError("reset"),  # a reused keep-alive connection the server closed
            reply(200, NODES),
        )
    )
    async with client(fake, retry=RetryPolicy(attempts=4, base_delay=0.0)) as slurm:
        listing = await slurm.nodes()
    assert listing is not None
    assert [n.name for n in listing.items] == ["n1"]
    assert len(fake.calls) == 4
    assert slurm.stats.retries == 3


async def test_giving_up_says_unavailable() -> None:
    fake = Fake(sequence(httpx2.ConnectError("refused")))
    async with client(fake) as slurm:
        with pytest.raises(SlurmUnavailableError) as error:
            await slurm.nodes()
    assert not error.value.maybe_applied
    assert len(fake.calls) == 3


async def test_4xx_and_slurms_definitive_answers_are_never_retried() -> None:
    for status, errno in ((422, 2000), (500, 2028), (404, 2017)):
        fake = Fake(sequence(reply(status, slurm_error(errno, "no"))))
        async with client(fake) as slurm:
            with pytest.raises(SlurmApiError) as error:
                await slurm.nodes()
        assert error.value.errno == errno
        assert fake.calls == ["GET"]


async def test_submit_is_never_resent_once_it_may_have_arrived() -> None:
    spec = JobSpec(script="#!/bin/sh\ntrue\n")
    for failure in (httpx2.ReadError("reset"), httpx2.ReadTimeout("slow")):
        fake = Fake(sequence(failure, reply(200, {"job_id": 1})))
        async with client(fake) as slurm:
            with pytest.raises(SlurmUnavailableError) as error:
                await slurm.submit(spec)
        assert error.value.maybe_applied
        assert fake.calls == ["POST"]
    # slurmctld's "receive error": it may have acted. Not resent either.
    fake = Fake(sequence(reply(502, slurm_error(1802, "receive")), reply(200, {"job_id": 1})))
    async with client(fake) as slurm:
        with pytest.raises(SlurmApiError) as api_error:
            await slurm.submit(spec)
    assert api_error.value.transient
    assert fake.calls == ["POST"]


async def test_submit_is_resent_when_it_provably_never_arrived() -> None:
    spec = JobSpec(script="#!/bin/sh\ntrue\n")
    fake = Fake(
        sequence(
            httpx2.ConnectError("refused"),
            reply(502, slurm_error(1800, "Unable to contact slurm controller (connect failure)")),
            reply(200, {"job_id": 42, "step_id": "batch"}),
        )
    )
    async with client(fake) as slurm:
        result = await slurm.submit(spec)
    assert result.job_id == 42
    assert fake.calls == ["POST", "POST", "POST"]


async def test_a_rejected_token_is_renewed_once() -> None:
    minter = JwtMinter(StaticKey(b"k" * 32), "root")
    fake = Fake(
        sequence(reply(511, slurm_error(1007, "Protocol authentication error")), reply(200, NODES))
    )
    async with client(fake, credentials=minter) as slurm:
        assert await slurm.nodes() is not None
    assert minter.minted == 2

    fake = Fake(sequence(reply(511, slurm_error(1007, "Protocol authentication error"))))
    async with client(fake, credentials=minter) as slurm:
        with pytest.raises(SlurmAuthError) as error:
            await slurm.nodes()
    assert error.value.errno == 1007
    assert len(fake.calls) == 2  # once renewed, then believed


async def test_errors_inside_200_replies_fail_the_call() -> None:
    fake = Fake(sequence(reply(200, {**NODES, **slurm_error(-1, "Unable to query partitions")})))
    async with client(fake) as slurm:
        with pytest.raises(SlurmApiError) as error:
            await slurm.nodes()
    assert error.value.status == 200
    assert error.value.message == "Unable to query partitions"


async def test_at_most_max_concurrency_requests_in_flight() -> None:
    in_flight = 0
    peak = 0

    async def slow(request: httpx2.Request) -> httpx2.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return reply(200, NODES)

    fake = Fake(slow)
    async with client(fake, max_concurrency=3) as slurm:
        await slurm.negotiate()
        await asyncio.gather(*(slurm.nodes() for _ in range(20)))
    assert peak == 3
    assert len(fake.calls) == 20
