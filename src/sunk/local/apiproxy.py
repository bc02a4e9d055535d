"""The `kubernetes` Service for pods: a TCP relay from the gateway to the apiserver.

The test bed's apiserver listens on 127.0.0.1 only, which a pod's network
namespace cannot reach. The runtime relays `<gateway>:443` to it (plain TCP:
TLS stays end to end), names the gateway `kubernetes.default.svc` (and the
shorter forms) in every pod's /etc/hosts, and sets KUBERNETES_SERVICE_HOST to
that name, so in-cluster clients connect by a name the serving certificate
carries (its SANs have no gateway address).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

_log = logging.getLogger(__name__)

SERVICE_NAMES = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]
SERVICE_HOST = "kubernetes.default.svc"
SERVICE_PORT = 443


def upstream(server_url: str) -> tuple[str, int]:
    parts = urlsplit(server_url)
    return parts.hostname or "127.0.0.1", parts.port or 443


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class ApiRelay:
    def __init__(self, listen: str, server_url: str) -> None:
        self.listen = listen
        self.target = upstream(server_url)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.listen, SERVICE_PORT)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            _log.debug("apiserver relay: %s", exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
