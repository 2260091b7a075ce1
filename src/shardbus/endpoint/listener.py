"""The network listener: every TCP connection gets an engine ``AmqpProtocol`` driving a ``ServiceBusConnection``.

One connection's failure never reaches another: the engine turns a peer's protocol violation into a ``close``
with an AMQP error for that connection only, and a bug while handling one connection's event closes that
connection with ``amqp:internal-error``.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from ..amqp.transport import AmqpProtocol
from .connection import NamespaceDirectory, ServiceBusConnection

log = logging.getLogger("shardbus.listener")


class _ServerProtocol(AmqpProtocol):
    def __init__(self, server: AmqpServer) -> None:
        handler = ServiceBusConnection(server.directory, server.loop)
        super().__init__(handler.amqp, handler)
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small replies (dispositions) must not wait for Nagle's algorithm
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server.connections.add(self)
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        try:
            super().data_received(data)
        except Exception:  # already answered with amqp:internal-error by the engine adapter
            log.exception("connection failed while handling input")
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        super().connection_lost(exc)


class AmqpServer:
    """Listens on ``host:port`` and serves every namespace in ``directory``."""

    def __init__(self, directory: NamespaceDirectory, host: str = "127.0.0.1", port: int = 5672) -> None:
        self.directory = directory
        self.host = host
        self.port = port
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.connections: set[_ServerProtocol] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _ServerProtocol(self), self.host, self.port, reuse_address=True, backlog=1024
        )
        sockets = self._server.sockets or []
        if sockets and self.port == 0:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            await self._server.wait_closed()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when available (faster I/O), else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()
