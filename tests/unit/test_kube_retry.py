"""Start-up calls wait out an apiserver that is away, and only that."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from lightkube import ApiError

from sunk.kube.retry import transient, until_answered


def api_error(code: int) -> ApiError:
    response = httpx2.Response(
        code,
        json={"kind": "Status", "code": code, "message": "m"},
        request=httpx2.Request("GET", "https://apiserver/api"),
    )
    return ApiError(response=response)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx2.ConnectError("All connection attempts failed"), True),
        (httpx2.ReadTimeout("slow"), True),
        (TimeoutError(), True),
        (api_error(503), True),
        (api_error(429), True),
        (api_error(403), False),
        (api_error(404), False),
        (ValueError("bad input"), False),
    ],
)
def test_only_not_now_is_transient(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


async def test_a_call_is_made_again_until_the_apiserver_answers() -> None:
    failures = [httpx2.ConnectError("down"), api_error(503), TimeoutError()]

    async def call() -> str:
        if failures:
            raise failures.pop(0)
        return "answer"

    assert await until_answered("x", call, first_delay=0.001) == "answer"
    assert failures == []


async def test_a_refusal_is_raised_at_once() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise api_error(403)

    with pytest.raises(ApiError):
        await until_answered("x", call, first_delay=0.001)
    assert calls == 1


async def test_an_attempt_that_hangs_is_cut_and_made_again() -> None:
    attempts = 0

    async def call() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await asyncio.sleep(10)
        return "answer"

    assert await until_answered("x", call, attempt_timeout=0.05, first_delay=0.001) == "answer"
    assert attempts == 2
