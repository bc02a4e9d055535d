"""What one HTTP request costs sunk's client, in CPU: sunk's transport beside others.

    .venv/bin/python bench/http_client.py [--requests 3000] [--rounds 3]

The HTTP client is most of the scheduler's own CPU in a burst (py-spy, in
docs/benchmarks.md), so this isolates it: a canned HTTP/1.1 server in another
process (its CPU is not counted) answers every request with a Slurm-job-sized
JSON body (~1.8 kB), and the client sends `--requests` GETs and as many small
POSTs from 8 concurrent tasks over 8 kept connections, as the Slurm client
does. Printed per client: CPU microseconds per request (process time over the
phase), each round and their spread. Clients: sunk's transport
(`sunk.http_transport`, httpx2 over httpcore2 with one send per request),
httpx2's own transport, and aiohttp when it is installed (it is not a sunk
dependency: the comparison is what a switch would save).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import httpx2

from sunk.http_transport import http_transport

CONCURRENCY = 8
BODY = json.dumps(
    {"jobs": [{"job_id": 1, "name": "x" * 50, "nodes": "tb1", **{f"f{i}": i for i in range(150)}}]}
).encode()
REPLY = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    + BODY
)


class Canned(asyncio.Protocol):
    """Answers each complete request (head and Content-Length body) with REPLY."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buffer[:end].lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(REPLY)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


Send = Callable[[int], Awaitable[bytes]]


async def cpu_per_request(send: Send, count: int) -> float:
    for i in range(100):  # connections opened, code paths warm
        await send(i)

    async def worker(first: int) -> None:
        for i in range(first, count, CONCURRENCY):
            await send(i)

    started = time.process_time()
    await asyncio.gather(*(worker(k) for k in range(CONCURRENCY)))
    return (time.process_time() - started) / count * 1e6


async def httpx_client(
    stack: AsyncExitStack, url: str, transport: httpx2.AsyncBaseTransport | None
) -> list[Send]:
    limits = httpx2.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    client = await stack.enter_async_context(
        httpx2.AsyncClient(base_url=url, limits=limits, transport=transport)
    )
    headers = {"X-SLURM-USER-TOKEN": "t" * 200, "Content-Type": "application/json"}

    async def get(i: int) -> bytes:
        reply = await client.get(f"/slurm/v0.0.45/job/{i}", headers=headers)
        reply.raise_for_status()
        return reply.content

    async def post(i: int) -> bytes:
        reply = await client.post(
            "/slurm/v0.0.45/job/allocate", content=b'{"job":{}}', headers=headers
        )
        reply.raise_for_status()
        return reply.content

    return [get, post]


async def aiohttp_client(stack: AsyncExitStack, url: str) -> list[Send] | None:
    try:
        import aiohttp  # type: ignore[import-not-found]
    except ImportError:
        return None
    session = await stack.enter_async_context(
        aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=CONCURRENCY))
    )
    headers = {"X-SLURM-USER-TOKEN": "t" * 200, "Content-Type": "application/json"}

    async def get(i: int) -> bytes:
        async with session.get(f"/slurm/v0.0.45/job/{i}", headers=headers) as reply:
            reply.raise_for_status()
            return bytes(await reply.read())

    async def post(i: int) -> bytes:
        async with session.post(
            "/slurm/v0.0.45/job/allocate", data=b'{"job":{}}', headers=headers
        ) as reply:
            reply.raise_for_status()
            return bytes(await reply.read())

    return [get, post]


async def measure(url: str, count: int, rounds: int) -> None:
    limits = httpx2.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with AsyncExitStack() as stack:
        clients: dict[str, list[Send] | None] = {
            "sunk's transport (httpx2, httpcore2, one send)": await httpx_client(
                stack, url, http_transport(limits=limits)
            ),
            "httpx2's own transport": await httpx_client(stack, url, None),
            "aiohttp (not a sunk dependency)": await aiohttp_client(stack, url),
        }
        await compare(clients, count, rounds)


async def compare(clients: dict[str, list[Send] | None], count: int, rounds: int) -> None:
    for name, sends in clients.items():
        if sends is None:
            print(f"{name}: not installed")
            continue
        for verb, send in zip(("GET", "POST"), sends, strict=True):
            figures = [await cpu_per_request(send, count) for _ in range(rounds)]
            each = " / ".join(f"{f:.0f}" for f in figures)
            print(f"{name}, {verb}: {each} µs CPU per request ({count} requests a round)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port))
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(args.port)], stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "ready"
        asyncio.run(measure(f"http://127.0.0.1:{args.port}", args.requests, args.rounds))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
