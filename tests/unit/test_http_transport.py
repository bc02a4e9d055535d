"""sunk's HTTP transport: a request's writes go out in one send, and a
connection the server closed while idle is found before it is used again.

The stream's rule on a recording stream under it; the whole transport
against a small HTTP server on the loopback (a real socket).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpcore2
import httpx2
import pytest
import pytest_asyncio

from sunk.http_transport import HELD_AT_MOST, OneSendBackend, OneSendStream, http_transport

LIMITS = httpx2.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=60)


class RecordingStream(httpcore2.AsyncNetworkStream):
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.sent.append(buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"

    async def aclose(self) -> None:
        pass

    def get_extra_info(self, info: str) -> Any:
        return None


async def test_a_requests_writes_go_out_together_when_its_reply_is_read() -> None:
    under = RecordingStream()
    stream = OneSendStream(under)
    await stream.write(b"POST /x HTTP/1.1\r\ncontent-length: 4\r\n\r\n")
    await stream.write(b"body")
    await stream.write(b"")  # h11's end of a body of known length
    assert under.sent == []
    await stream.read(65536)
    assert under.sent == [b"POST /x HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody"]
    await stream.read(65536)
    assert len(under.sent) == 1  # nothing held: nothing sent
    await stream.write(b"z" * HELD_AT_MOST)  # a large body is not held whole
    assert len(under.sent) == 2
    assert stream.get_extra_info("is_readable")  # no socket: as good as closed


@dataclass
class LoopbackServer:
    """Answers each request 200 "{}"; records what each read brought, per connection."""

    close_after_reply: bool = False
    reads: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        pending = b""
        try:
            while True:
                chunk = await reader.read(1 << 20)
                if not chunk:
                    return
                self.reads.append(chunk)
                pending += chunk
                head, sep, body = pending.partition(b"\r\n\r\n")
                if not sep:
                    continue
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(body) < length:
                    continue
                pending = body[length:]
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
                if self.close_after_reply:
                    writer.close()
                    return
        finally:
            writer.close()


@pytest_asyncio.fixture
async def loopback() -> AsyncIterator[LoopbackServer]:
    server = LoopbackServer()
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield server


def client_to(server: LoopbackServer) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=f"http://127.0.0.1:{server.port}", transport=http_transport(limits=LIMITS)
    )


async def test_a_request_with_a_body_arrives_in_one_read(loopback: LoopbackServer) -> None:
    async with client_to(loopback) as client:
        for _ in range(5):
            reply = await client.post("/jobs/submit", json={"job": {"name": "x" * 2000}})
            assert reply.json() == {}
    assert len(loopback.reads) == 5  # head and body together, each time
    for read in loopback.reads:
        assert read.startswith(b"POST /jobs/submit ")
        assert json.loads(read.partition(b"\r\n\r\n")[2]) == {"job": {"name": "x" * 2000}}
    assert loopback.connections == 1  # and the connection was kept


async def test_a_large_body_is_not_held_whole(loopback: LoopbackServer) -> None:
    body = b"y" * (3 * HELD_AT_MOST)
    async with client_to(loopback) as client:
        reply = await client.put("/blob", content=body)
    assert reply.status_code == 200
    assert b"".join(loopback.reads).endswith(body)


async def test_a_connection_the_server_closed_while_idle_is_not_used_again(
    loopback: LoopbackServer,
) -> None:
    loopback.close_after_reply = True
    async with client_to(loopback) as client:
        for _ in range(3):
            await client.get("/ping")
            await asyncio.sleep(0.05)  # the server's close reaches the client
            # The next request goes out on a new connection, without an error.
    assert loopback.connections == 3


@pytest.mark.parametrize("verify", [True, False])
def test_the_transport_keeps_the_limits_it_was_given(verify: bool) -> None:
    transport = http_transport(limits=LIMITS, verify=verify)
    pool = transport._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (4, 4)
    assert pool._keepalive_expiry == 60
    assert isinstance(pool._network_backend, OneSendBackend)
