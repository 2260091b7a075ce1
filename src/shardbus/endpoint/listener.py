"""The network listener: an asyncio server that gives each TCP connection its own ``ServiceBusConnection``.

asyncio's Protocol interface (not streams) keeps the per-read cost low; uvloop is used when installed. One
connection's failure never reaches another: every callback is wrapped, and a connection that breaks the
protocol is closed with an AMQP error by the engine itself.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from .connection import NamespaceDirectory, ServiceBusConnection

log = logging.getLogger("shardbus.listener")


class _Protocol(asyncio.Protocol):
    def __init__(self, server: AmqpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.handler: ServiceBusConnection | None = None
        self._flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        loop = self.server.loop
        peer = str(transport.get_extra_info("peername"))
        self.handler = ServiceBusConnection(
            self.server.directory,
            schedule=loop.call_soon_threadsafe,
            call_later=loop.call_later,
            on_output=self.flush,
            peer=peer,
        )
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.handler.receive_data(data)  # type: ignore[union-attr]
        except Exception:
            log.exception("connection %s failed", self.handler.peer if self.handler else "?")
            self.abort()

    def flush(self) -> None:
        handler, transport = self.handler, self.transport
        if handler is None or transport is None or transport.is_closing():
            return
        out = handler.amqp.data_to_send()
        if out:
            transport.write(out)
        if handler.amqp.is_done:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.handler is not None:
            try:
                self.handler.connection_lost()
            except Exception:
                log.exception("cleanup of connection %s failed", self.handler.peer)
        self.transport = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class AmqpServer:
    """Listens on ``host:port`` and serves every namespace in ``directory``."""

    def __init__(self, directory: NamespaceDirectory, host: str = "127.0.0.1", port: int = 5672) -> None:
        self.directory = directory
        self.host = host
        self.port = port
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.connections: set[_Protocol] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Protocol(self), self.host, self.port, reuse_address=True, backlog=1024
        )
        sockets = self._server.sockets or []
        if sockets and self.port == 0:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.abort()
            await self._server.wait_closed()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when available (faster I/O), else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()


Callback = Callable[[], Any]
