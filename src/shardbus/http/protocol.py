"""HTTP/1.1 over an asyncio transport, plain or TLS, with h11 doing the protocol work.

The listener hands a connection over once its first bytes told HTTP or TLS apart from AMQP, together with those
bytes. ``HttpProtocol`` feeds them (decrypted through an ``ssl.MemoryBIO`` pair when the connection is TLS) to an
``h11.Connection``, collects each request with its body, and awaits the application's response before reading the
next request of a keep-alive connection. The application is any object with ``async handle(HttpRequest)``.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
import ssl
from dataclasses import dataclass, field
from typing import Protocol

import h11

log = logging.getLogger("shardbus.http")

MAX_REQUEST_BODY = 4 * 1024 * 1024
# A connection that sends nothing for this long while no request of it is being answered is closed: kept-alive
# connections nobody uses would otherwise hold their place among the listener's connections (endpoint/limits.py).
IDLE_TIMEOUT = 120.0
SERVER_HEADER = b"shardbus"
_REASONS = {status.value: status.phrase.encode("ascii") for status in http.HTTPStatus}


@dataclass(slots=True)
class HttpRequest:
    method: str
    target: str  # path and query, as sent
    headers: dict[str, str]  # lower-cased names
    body: bytes
    scheme: str  # "http" or "https"

    @property
    def host(self) -> str:
        return self.headers.get("host", "localhost")


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)


class HttpApp(Protocol):
    async def handle(self, request: HttpRequest) -> HttpResponse: ...


class HttpProtocol(asyncio.Protocol):
    """One HTTP (``tls`` None) or HTTPS connection."""

    def __init__(self, app: HttpApp, tls: ssl.SSLContext | None = None, connections: set | None = None) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self._connections = connections if connections is not None else set()
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None
        self._ssl: ssl.SSLObject | None = None
        self._handshaken = tls is None
        if tls is not None:
            self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._ssl = tls.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._request: h11.Request | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._busy = False
        self._task: asyncio.Task | None = None
        self._last_input = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    @property
    def scheme(self) -> str:
        return "http" if self._ssl is None else "https"

    # --- asyncio callbacks -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._connections.add(self)
        loop = asyncio.get_running_loop()
        self._last_input = loop.time()
        self._idle_timer = loop.call_later(IDLE_TIMEOUT, self._check_idle)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a response must not wait for the ACK of the handshake's last flight
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self.transport = None
        if self._task is not None:
            self._task.cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()

    def _check_idle(self) -> None:
        """Close the connection when it has been silent for IDLE_TIMEOUT with no request being answered."""
        if self.transport is None:
            return
        loop = asyncio.get_running_loop()
        silent = loop.time() - self._last_input
        if silent >= IDLE_TIMEOUT and not self._busy:
            self._close()
            return
        self._idle_timer = loop.call_later(max(IDLE_TIMEOUT - silent, 1.0), self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_input = asyncio.get_running_loop().time()
        if self._ssl is None:
            self._h11.receive_data(data)
        else:
            plain = self._decrypt(data)
            if plain is None:
                return
            if plain:
                self._h11.receive_data(plain)
        self._process()

    def eof_received(self) -> bool | None:
        if self._handshaken:
            self._h11.receive_data(b"")
            self._process()
        return False

    # --- TLS ---------------------------------------------------------------------------------------------------
    def _decrypt(self, data: bytes) -> bytes | None:
        """Plaintext that ``data`` completes (b"" if none yet); None when the connection is being closed."""
        assert self._ssl is not None and self._incoming is not None
        self._incoming.write(data)
        try:
            if not self._handshaken:
                try:
                    self._ssl.do_handshake()
                except ssl.SSLWantReadError:
                    return b""
                finally:
                    self._flush_tls()
                self._handshaken = True
            chunks = []
            while True:
                try:
                    chunk = self._ssl.read(65536)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:  # close_notify: the client is done
                    self._h11.receive_data(b"".join(chunks))
                    self._h11.receive_data(b"")
                    self._process()
                    return None
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
        except ssl.SSLError as exc:
            log.debug("TLS failure: %s", exc)
            self._abort()
            return None

    def _flush_tls(self) -> None:
        if self._outgoing is not None and self.transport is not None:
            pending = self._outgoing.read()
            if pending:
                self.transport.write(pending)

    def _write(self, data: bytes) -> None:
        if self.transport is None or not data:
            return
        if self._ssl is None:
            self.transport.write(data)
        else:
            try:
                self._ssl.write(data)
            except ssl.SSLError:
                self._abort()
                return
            self._flush_tls()

    def _close(self) -> None:
        if self.transport is None:
            return
        if self._ssl is not None and self._handshaken:
            try:
                self._ssl.unwrap()
            except ssl.SSLError:
                pass
            self._flush_tls()
        self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- HTTP --------------------------------------------------------------------------------------------------
    def _process(self) -> None:
        while not self._busy and self.transport is not None:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._reject(exc.error_status_hint, str(exc))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._request, self._body, self._body_size = event, [], 0
                if self._h11.they_are_waiting_for_100_continue:
                    self._write(self._h11.send(h11.InformationalResponse(status_code=100, headers=[])))
            elif isinstance(event, h11.Data):
                self._body_size += len(event.data)
                if self._body_size > MAX_REQUEST_BODY:
                    self._reject(413, "request body too large")
                    return
                self._body.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._busy = True
                self._task = asyncio.get_running_loop().create_task(self._respond(self._complete_request()))
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _complete_request(self) -> HttpRequest:
        request = self._request
        assert request is not None
        headers: dict[str, str] = {}
        for name, value in request.headers:
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        return HttpRequest(
            method=request.method.decode("ascii"),
            target=request.target.decode("latin-1"),
            headers=headers,
            body=b"".join(self._body),
            scheme=self.scheme,
        )

    async def _respond(self, request: HttpRequest) -> None:
        try:
            response = await self.app.handle(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("HTTP request %s %s failed", request.method, request.target)
            response = HttpResponse(500, b"internal error", "text/plain")
        self._task = None
        if self.transport is None:
            return
        self._send(response)
        if self._h11.our_state is h11.MUST_CLOSE or self._h11.their_state is h11.MUST_CLOSE:
            self._close()
            return
        try:
            self._h11.start_next_cycle()
        except h11.LocalProtocolError:
            self._close()
            return
        self._busy = False
        self._last_input = asyncio.get_running_loop().time()  # the idle time starts with the answer
        self._process()

    def _send(self, response: HttpResponse) -> None:
        headers = [("server", SERVER_HEADER), ("content-length", str(len(response.body)).encode())]
        if response.content_type:
            headers.append(("content-type", response.content_type.encode("latin-1")))
        headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers)
        try:
            reason = _REASONS.get(response.status, b"")
            out = [self._h11.send(h11.Response(status_code=response.status, headers=headers, reason=reason))]
            if response.body and not (self._request is not None and self._request.method == b"HEAD"):
                out.append(self._h11.send(h11.Data(data=response.body)))
            out.append(self._h11.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            self._close()
            return
        self._write(b"".join(b for b in out if b))  # one write: one TLS record, no Nagle wait between parts

    def _reject(self, status: int, reason: str) -> None:
        """Answer a malformed request, then close."""
        self._busy = True
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = reason.encode("utf-8", "replace")
            self._send(HttpResponse(status, body, "text/plain; charset=utf-8", [("connection", "close")]))
        self._close()
