"""The network listener: AMQP, HTTPS and HTTP on one port, told apart by a connection's first byte.

Every connection starts with a ``_Sniffer``; its first ``data_received`` decides, once, and hands the transport
(and those bytes) to the protocol that serves it, so later reads go straight there:

    'A' (the AMQP/SASL header)          → an engine ``AmqpProtocol`` driving a ``ServiceBusConnection``
    0x16 (a TLS ClientHello)            → HTTPS: ``http.HttpProtocol`` over TLS (the admin client's ATOM API)
    an HTTP method's first letter       → plain HTTP (``GET /health`` and the same API, for curl and probes)
    anything else                       → AMQP, whose engine answers a bad header the way AMQP requires

One connection's failure never reaches another: the engine turns a peer's protocol violation into a ``close``
with an AMQP error for that connection only, and a bug while handling one connection's event closes that
connection with ``amqp:internal-error``.

It sits above both front ends (``endpoint/`` and ``http/``), which know nothing of each other.

Limits (``endpoint/limits.ConnectionLimits``, where they are explained): AMQP connections beyond ``max_connections`` are
refused with ``amqp:resource-limit-exceeded`` once they open; sockets beyond that plus ``ACCEPT_SLACK`` are
dropped unread; a socket that has not opened its AMQP connection (or sent its first bytes) within
``handshake_timeout`` is dropped. What is kept per connection is its protocol object, in ``connections``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from .access.directory import NamespaceDirectory
from .amqp.transport import AmqpProtocol
from .endpoint.connection import ServiceBusConnection
from .endpoint.limits import ACCEPT_SLACK, DEFAULT_LIMITS, ConnectionLimits
from .http.protocol import HttpProtocol
from .metrics import CONNECTIONS

log = logging.getLogger("shardbus.listener")


class _ServerProtocol(AmqpProtocol):
    def __init__(self, server: AmqpServer) -> None:
        handler = ServiceBusConnection(server.directory, server.loop, server.limits)
        super().__init__(handler.amqp, handler)
        self.server = server
        self.counted = server.amqp_connections < server.limits.max_connections
        if self.counted:
            server.amqp_connections += 1
        else:
            handler.refusal = (
                f"The broker serves at most {server.limits.max_connections} connections (shardbus serve "
                "--max-connections); retry later."
            )
            log.warning("connection refused: %s connections already open", server.amqp_connections)
        self._handshake = server.loop.call_later(server.limits.handshake_timeout, self._handshake_expired)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small replies (dispositions) must not wait for Nagle's algorithm
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server.connections.add(self)
        CONNECTIONS.inc()
        super().connection_made(transport)

    def _handshake_expired(self) -> None:
        """No ``open`` in time (or a refused connection that lingers): drop the socket."""
        if self.transport is not None and (not self.conn.open_received or not self.counted):
            log.info("connection dropped: no AMQP open within %s s", self.server.limits.handshake_timeout)
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            super().data_received(data)
        except Exception:  # already answered with amqp:internal-error by the engine adapter
            log.exception("connection failed while handling input")
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        CONNECTIONS.dec()
        self._handshake.cancel()
        if self.counted:
            self.counted = False
            self.server.amqp_connections -= 1
        super().connection_lost(exc)


TLS_HANDSHAKE = 0x16
HTTP_FIRST_BYTES = frozenset(b"GPDHOCT")  # GET PUT POST PATCH DELETE HEAD OPTIONS CONNECT TRACE


class _Sniffer(asyncio.Protocol):
    """A new connection until its first bytes arrive; then the protocol they call for takes over."""

    __slots__ = ("server", "timer", "transport")

    def __init__(self, server: AmqpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        if len(server.connections) >= server.limits.max_connections + ACCEPT_SLACK:
            transport.abort()  # far over the limit: not even read (see limits.py)
            return
        self.transport = transport  # type: ignore[assignment]
        server.connections.add(self)
        self.timer = server.loop.call_later(server.limits.handshake_timeout, self._silent)

    def _silent(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        server, transport = self.server, self.transport
        assert transport is not None
        server.connections.discard(self)
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
        protocol = server.protocol_for(data[0])
        if protocol is None:
            transport.close()
            return
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()


class AmqpServer:
    """Listens on ``host:port`` and serves every namespace in ``directory`` over AMQP, and with ``http`` (an
    ``http.HttpFrontend``) also HTTP, plus HTTPS when ``tls`` is given."""

    def __init__(
        self,
        directory: NamespaceDirectory,
        host: str = "127.0.0.1",
        port: int = 5672,
        http: Any = None,
        tls: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        """``reuse_port``: share the port with other processes doing the same (SO_REUSEPORT; the kernel spreads
        new connections over them), as the front ends of ``shardbus serve --frontends M`` do. ``limits``: what
        clients may hold (limits.py)."""
        self.limits = limits
        self.amqp_connections = 0  # AMQP connections counted against limits.max_connections
        self.directory = directory
        self.host = host
        self.port = port
        self.http = http
        self.tls = tls
        self.reuse_port = reuse_port
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.connections: set[Any] = set()  # every open connection's protocol (each has a ``transport``)
        self._server: asyncio.base_events.Server | None = None

    def protocol_for(self, first_byte: int) -> asyncio.Protocol | None:
        """The protocol for a connection whose first byte is ``first_byte`` (None: close it)."""
        if first_byte == 0x41:  # 'A': the AMQP or SASL protocol header, the hot path
            return _ServerProtocol(self)
        if first_byte == TLS_HANDSHAKE or first_byte in HTTP_FIRST_BYTES:
            if self.http is None or (first_byte == TLS_HANDSHAKE and self.tls is None):
                return None
            tls = self.tls if first_byte == TLS_HANDSHAKE else None
            return HttpProtocol(self.http, tls, self.connections)
        return _ServerProtocol(self)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Sniffer(self),
            self.host,
            self.port,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
            backlog=4096,  # the kernel caps it at net.core.somaxconn
        )
        sockets = self._server.sockets or []
        if sockets and self.port == 0:
            self.port = sockets[0].getsockname()[1]
        if self.http is not None:
            self.http.ready = True

    async def stop(self) -> None:
        if self.http is not None:
            self.http.ready = False
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            await self._server.wait_closed()
