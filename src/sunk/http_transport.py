"""The HTTP transport under sunk's clients (lightkube's and the Slurm port's).

httpx2 over httpcore2, with one change to httpcore2's network streams, for two
costs that showed in the scheduler's profile (py-spy over a burst of 1,000
pods, where sunk's own decisions no longer show):

- A request with a body went out in two or three `send` calls (its head, its
  body, an empty end), each a loopback delivery and, to the apiserver, a TLS
  record on both sides: 18 % of the scheduler's CPU was in `send`. Here a
  request's writes are held until its response is first read (HTTP/1.1 sends
  nothing else on the connection meanwhile) and go out in one `send`.
- Before and after every request the connection pool asks each idle
  connection whether its socket has turned readable (the server closed it);
  anyio finds the socket by building a table of every attribute of the stream,
  TLS ones included, each time: 12 %. Here the socket is found once.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2 import SOCKET_OPTION, AnyIOBackend, AsyncNetworkBackend, AsyncNetworkStream

# A body larger than this goes out as it comes, not held whole.
HELD_AT_MOST = 64 * 1024


def readable(sock: socket.socket | None) -> bool:
    """Would a read return at once? On an idle connection: the server closed it
    (a socket gone counts as closed)."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class OneSendStream(AsyncNetworkStream):
    """A connection's stream whose writes go out together at the next read."""

    def __init__(self, stream: AsyncNetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._timeout: float | None = None
        # The same socket under TLS: start_tls wraps it, it does not replace it.
        self._socket: socket.socket | None = stream.get_extra_info("socket")

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        self._timeout = timeout
        if self._held_bytes >= HELD_AT_MOST:
            await self._send_held()

    async def _send_held(self) -> None:
        if not self._held:
            return
        data = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        await self._stream.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._send_held()
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held.clear()
        self._held_bytes = 0
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncNetworkStream:
        await self._send_held()
        return OneSendStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return readable(self._socket)
        if info == "socket":
            return self._socket
        return self._stream.get_extra_info(info)


class OneSendBackend(AsyncNetworkBackend):
    """httpcore2's asyncio backend, its streams wrapped in `OneSendStream`."""

    def __init__(self, backend: AsyncNetworkBackend | None = None) -> None:
        self._backend = backend or AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return OneSendStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return OneSendStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def http_transport(
    *, verify: ssl.SSLContext | bool = True, limits: httpx2.Limits, trust_env: bool = False
) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport (no proxy: a client mounts those), its connections on
    `OneSendBackend`. `trust_env`: certificates named by SSL_CERT_FILE/DIR are trusted."""
    ssl_context = httpx2.create_ssl_context(verify=verify, trust_env=trust_env)
    transport = httpx2.AsyncHTTPTransport(verify=ssl_context, limits=limits)
    # httpx2 does not take a network backend; httpcore2's pool does, so the
    # transport gets a pool built as its own would be, with the backend.
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=OneSendBackend(),
    )
    return transport
