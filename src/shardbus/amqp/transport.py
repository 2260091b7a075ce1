"""asyncio adapter: drives a sans-IO ``Connection`` over a socket (server and client), plus a small client.

``AmqpProtocol`` is an ``asyncio.Protocol`` (callbacks, no per-connection task: cheapest way to run many
connections). On every ``data_received`` it feeds the bytes to the connection, hands each event to the handler,
then writes ``data_to_send()`` (all the answers of that read in one ``transport.write``) and closes the socket once
the connection is done. A handler that acts later (after awaiting something) calls ``flush()``, which only
schedules the write (``call_soon``, once): everything the connection produces until the loop gets to it goes out
in one write, one syscall per connection and loop turn instead of one per reply (a lone request waits for no
timer, only for the callbacks already queued). A callback that is itself the end of such a batch calls
``flush_now()``. It keeps one timer for the connection's idle-timeout bookkeeping, moved only when the deadline
comes earlier (a late timer finds nothing due and is set again).

``AmqpClient`` is a minimal asyncio client on top: connect with SASL ANONYMOUS/PLAIN, open a session, attach
senders and receivers, send a message and await its outcome, grant credit and receive deliveries. It is meant for
our own tools, tests and benchmarks, not as a full-featured SDK.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from . import events as E
from .connection import Connection, Role
from .errors import LocalProtocolError
from .link import Link
from .performatives import RECEIVER, SENDER, Accepted, Error, SndSettleMode, Source, Target
from .session import Session

__all__ = [
    "AmqpClient",
    "AmqpProtocol",
    "ClientReceiver",
    "ClientSender",
    "ClientSession",
    "EventHandler",
    "install_uvloop",
    "serve",
]


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is importable; returns whether it was installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class EventHandler(Protocol):
    """What an application plugs into ``AmqpProtocol``: called for each event, in order.

    A handler may also define ``events_done(protocol)``: called once the events of one read (or timer tick) are
    all handled, before their answers are written. A handler that gathers work across a read (every settlement
    or send that one socket read brought) does it there, and its answers share the read's write. And it may
    define ``handle_events(protocol, events)``: then called with each list of events instead of ``handle_event``
    for each (it handles them all, in order), so that a run of like events costs no call per event here."""

    def handle_event(self, protocol: AmqpProtocol, event: E.Event) -> None: ...

    def connection_lost(self, protocol: AmqpProtocol) -> None: ...


class AmqpProtocol(asyncio.Protocol):
    """Runs one ``Connection`` over an asyncio transport."""

    def __init__(self, connection: Connection, handler: EventHandler) -> None:
        self.conn = connection
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_scheduled = False
        self._events_done: Callable[[AmqpProtocol], None] | None = getattr(handler, "events_done", None)
        self._handle_events: Callable[[AmqpProtocol, list[E.Event]], None] | None = getattr(
            handler, "handle_events", None
        )

    # ---------------------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self._dispatch()
        self._write()  # answers made while handling the read go out now, together

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._dispatch()
        self._write()  # now: the transport closes itself when this returns
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.conn.is_done:
            self.conn.receive_data(b"")
            self._dispatch()
        self.handler.connection_lost(self)
        # Nothing reaches the handler after this (no reads, the timer is cancelled, writes are refused), and a
        # handler usually refers back to its protocol: forget it, so that a closed connection is freed by
        # reference counting at once instead of waiting, in a cycle, for a full garbage collection.
        self.handler = None  # type: ignore[assignment]
        self._events_done = None
        self._handle_events = None
        self.conn.release()

    # ---------------------------------------------------------------------------------------- helpers

    def _dispatch(self) -> None:
        events = self.conn.next_events()
        if not events:
            return
        try:
            while events:
                if self._handle_events is not None:
                    self._handle_events(self, events)
                else:
                    for ev in events:
                        self.handler.handle_event(self, ev)
                # An answer may have let the connection read on (accept_sasl resumes frames the client pipelined
                # after its sasl-init): their events are this read's too. (The list itself, read without a call:
                # this runs once per read.)
                events = self.conn.next_events() if self.conn._events else None
            if self._events_done is not None:
                self._events_done(self)
        except Exception as exc:  # an application bug must not leave the peer hanging
            self.conn.close(Error("amqp:internal-error", f"{type(exc).__name__}: {exc}"))
            raise

    def flush(self) -> None:
        """Write pending output at the end of this loop turn (see the module docstring); call on the loop."""
        if self._write_scheduled or self.transport is None or self._closed:
            return
        self._write_scheduled = True
        self._loop.call_soon(self._write)  # type: ignore[union-attr]

    def flush_now(self) -> None:
        """Write pending output at once: for callers that run at the end of a loop turn themselves (a callback
        scheduled to batch work), where deferring once more would only cost another turn."""
        if self.transport is not None and not self._closed:
            self._write()

    def _write(self) -> None:
        """Write pending output, close the socket when the connection is done, re-arm the timer."""
        self._write_scheduled = False
        if self.transport is None or self._closed:
            return
        data = self.conn.data_to_send()
        if data:
            self.transport.write(data)
        if self.conn.is_done:
            self._closed = True
            self.transport.close()
            return
        # Re-arm the timer (every read ends here: written out, not a method of its own)
        deadline = self.conn.next_deadline()
        if deadline is None:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return  # it fires early, finds nothing due and is set again: cheaper than moving it per write
            self._timer.cancel()
        # Connection deadlines are time.monotonic(); asyncio's loop.time() is monotonic too.
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)  # type: ignore[union-attr]

    def _on_timer(self) -> None:
        self._timer = None
        self.conn.tick()
        self._dispatch()
        self._write()


async def serve(
    handler_factory: Callable[[], EventHandler],
    host: str = "127.0.0.1",
    port: int = 5672,
    *,
    connection_factory: Callable[[], Connection] | None = None,
) -> asyncio.Server:
    """Listen for AMQP connections; each gets a server ``Connection`` and a handler from the factories."""
    loop = asyncio.get_running_loop()

    def make() -> AmqpProtocol:
        conn = connection_factory() if connection_factory else Connection(Role.SERVER, f"shardbus-{uuid.uuid4()}")
        return AmqpProtocol(conn, handler_factory())

    return await loop.create_server(make, host, port)


# ================================================================================================ client


class AmqpClientError(Exception):
    """The peer refused or closed something the client was waiting for; ``error`` is the peer's, if it sent one."""

    def __init__(self, message: str, error: Any = None) -> None:
        super().__init__(message)
        self.error = error


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


_TRANSFER_ROOM = 64  # more than a transfer's frame header and performative take with a 4-byte tag


class _SendWindow:
    """One ``ClientSender.send_many`` call: its payloads, sent in order with at most ``window`` unsettled at a
    time. It stands in ``AmqpClient._outcomes`` for each of its transfers (the engine resolves an outcome with
    ``done``/``set_result``/``set_exception``, as it would a future): no coroutine, future or timer per message.
    The room that a read's dispositions make is filled once the read's events are handled
    (``AmqpClient.events_done``), in one loop, and those transfers go out in the read's one write.

    Holds the caller's payload list (already in memory) and one counter per state; nothing grows with time.
    ``future`` resolves once every payload sent is settled, with ``(refused, first refusal)`` (an outcome other
    than ``Accepted``); after a refusal no further payload is sent, those in flight are waited for.
    """

    __slots__ = (
        "_last",
        "_next",
        "_queued",
        "_refusal",
        "_refused",
        "_sender",
        "_timeout",
        "_timer",
        "future",
        "in_flight",
        "payloads",
        "window",
    )

    def __init__(self, sender: ClientSender, payloads: list[bytes], window: int, timeout: float | None) -> None:
        self._sender = sender
        self.payloads = payloads
        self.window = window
        self._next = 0  # index of the next payload to send
        self.in_flight = 0
        self._queued = False  # in AmqpClient._refill: to be filled when the read's events are done
        self._refused = False
        self._refusal: Any = None  # the first outcome other than Accepted (may itself be None: no outcome)
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = loop.create_future()
        self._timeout = timeout
        self._last = loop.time()  # when the last outcome came (or the call began): the timeout counts from it
        self._timer: asyncio.TimerHandle | None = None
        if timeout is not None:
            self._timer = loop.call_at(self._last + timeout, self._check_time)

    def fill(self) -> None:
        """Send payloads while the window, the link's credit and the session's window allow."""
        self._queued = False
        if self._refused or self.future.done():
            return
        sender = self._sender
        link = sender.link
        session = link.session
        client = sender._session.client
        conn = client._conn
        i, payloads = self._next, self.payloads
        count = min(self.window - self.in_flight, len(payloads) - i, link.credit, session.remote_incoming_window)
        if count <= 0:
            return
        batch = payloads[i : i + count]
        tag = sender._next_tag
        try:
            if max(map(len, batch)) + _TRANSFER_ROOM <= conn.remote_max_frame_size:
                # one frame each: the engine's batch path, its checks and records done once for them all
                first = conn.send_deliveries(
                    link, [(t.to_bytes(4, "big"), p) for t, p in enumerate(batch, tag)], settled=False
                )
            else:  # a payload of several frames: one at a time, each checked against the session's window
                first = session.next_delivery_id
                count = 0
                for t, p in enumerate(batch, tag):
                    if link.credit <= 0 or session.remote_incoming_window <= 0:
                        break
                    conn.send_transfer(link, t.to_bytes(4, "big"), p, settled=False)
                    count += 1
        except LocalProtocolError as exc:  # the link or session is going: no outcome will come
            self._finish(AmqpClientError(f"cannot send: {exc}"))
            return
        sender._next_tag = tag + count
        key = id(session)
        outcomes = client._outcomes
        for did in range(first, first + count):
            outcomes[(key, did & 0xFFFFFFFF)] = self
        self._next = i + count
        self.in_flight += count
        client._flush()

    # ---- the outcome protocol of AmqpClient._outcomes
    def done(self) -> bool:
        return self.future.done()

    def set_result(self, state: Any) -> None:
        self.in_flight -= 1
        if not self._refused and not isinstance(state, Accepted):
            self._refused = True
            self._refusal = state
        if self._timer is not None:
            self._last = self._sender._loop.time()
        if self._next < len(self.payloads) and not self._refused:
            if not self._queued:
                self._queued = True
                self._sender._session.client._refill.append(self)
        elif self.in_flight <= 0:
            self._finish(None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(exc)

    def exception(self) -> BaseException | None:
        return self.future.exception()

    def _finish(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self in self._sender._windows:
            self._sender._windows.remove(self)
        if not self.future.done():
            if exc is None:
                self.future.set_result((self._refused, self._refusal))
            else:
                self.future.set_exception(exc)

    def _check_time(self) -> None:
        """No outcome for ``timeout`` s (none due, or no credit to send): fail, as a lone send would."""
        self._timer = None
        if self.future.done():
            return
        loop = self._sender._loop
        due = self._last + self._timeout  # type: ignore[operator]
        if loop.time() >= due:
            self._finish(TimeoutError())
        else:
            self._timer = loop.call_at(due, self._check_time)


class ClientSender:
    """A sending link of ``AmqpClient``."""

    def __init__(self, session: ClientSession, link: Link) -> None:
        self._session = session
        self.link = link
        self._next_tag = 1  # delivery tags: 4-byte big-endian numbers, 1 up
        self._credit = asyncio.Event()
        self._windows: list[_SendWindow] = []  # the send_many calls in progress (usually one)
        self._loop = asyncio.get_running_loop()

    async def send_many(
        self, payloads: list[bytes], *, window: int = 100, timeout: float | None = 60
    ) -> tuple[bool, Any]:
        """Send encoded messages in order, unsettled, at most ``window`` awaiting their outcome at a time; return
        ``(False, None)`` when every one was accepted, else ``(True, outcome)`` with the first outcome other
        than ``Accepted`` (once it came no further payload is sent; those in flight are waited for). ``timeout``:
        TimeoutError when no outcome came for that long while some were due; AmqpClientError when the connection
        or the link goes. Calls may overlap on one link (each has its own window; they share the credit)."""
        self._session.client._check_alive()
        if not payloads:
            return False, None
        w = _SendWindow(self, payloads, window, timeout)
        self._windows.append(w)
        w.fill()
        return await w.future

    async def send(
        self,
        payload: bytes,
        *,
        message_format: int = 0,
        settled: bool = False,
        state: Any = None,
        timeout: float | None = 60,
    ) -> Any:
        """Send one encoded message (``state``: e.g. a transactional-state); wait for credit, then (unless
        pre-settled) for the outcome."""
        client = self._session.client
        while self.link.credit <= 0 or self.link.session.remote_incoming_window <= 0:
            client._check_alive()
            self._credit.clear()
            await asyncio.wait_for(self._credit.wait(), timeout)
        tag = self._next_tag.to_bytes(4, "big")
        self._next_tag += 1
        did = client._conn.send_transfer(
            self.link, tag, payload, settled=settled, message_format=message_format, state=state
        )
        if settled:
            client._flush()
            return None
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        client._outcomes[(id(self.link.session), did)] = fut
        client._flush()
        if timeout is None:
            return await fut
        # A timer of our own, not ``wait_for`` (a waiter future, a callback and a timer): every unsettled
        # send waits here, and a sender keeps hundreds in flight.
        timer = loop.call_later(timeout, _time_out, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def close(self) -> None:
        """Detach (closed=true) and wait for the peer's answer."""
        await self._session.client._detach(self.link)


class _Deliveries(collections.deque):  # type: ignore[type-arg]
    """A receiver's arrived deliveries, oldest first: a deque (appended and popped in C, no future per delivery
    as ``asyncio.Queue.put_nowait`` makes when a getter waits), with the ``asyncio.Queue`` names that callers
    taking a read's deliveries as they are use (``empty``, ``get_nowait``, ``qsize``). It holds what the link's
    credit let the peer send and nobody took yet: bounded by the credit granted."""

    __slots__ = ()
    get_nowait = collections.deque.popleft
    qsize = collections.deque.__len__

    def empty(self) -> bool:
        return not self


class ClientReceiver:
    """A receiving link of ``AmqpClient``. Deliveries arrive in ``receive()`` order.

    One waiter future at a time stands for whoever waits (``wait``): a delivery or a flow on the link, or the
    link or connection going, resolves it; no task, queue getter or ``wait_for`` per wait."""

    def __init__(self, session: ClientSession, link: Link) -> None:
        self._session = session
        self.link = link
        self.deliveries: _Deliveries = _Deliveries()
        self._waiter: asyncio.Future[None] | None = None

    def grant(self, credit: int, drain: bool = False) -> None:
        """Set the link credit (absolute)."""
        client = self._session.client
        client._conn.flow(self.link, link_credit=credit, drain=drain)
        client._flush()

    async def wait(self, timeout: float | None) -> None:
        """Return once a delivery or a flow came on the link, the link or connection went, or ``timeout`` s
        passed (whichever first; the caller looks at what it waits for itself). Callers waiting together share
        the waiter; each has its own timer, which wakes them all (they look again and wait on)."""
        loop = asyncio.get_running_loop()
        fut = self._waiter
        shared = fut is not None and not fut.done()
        if not shared:
            fut = self._waiter = loop.create_future()
        assert fut is not None
        timer = None if timeout is None else loop.call_later(timeout, _wake, fut)
        try:
            # a shared waiter is shielded: one caller cancelled must not cancel the others' wait
            await (asyncio.shield(fut) if shared else fut)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not shared or (task is not None and task.cancelling()):
                raise  # this caller was cancelled (not only the waiter it shared, by its creator's cancel)
        finally:
            if self._waiter is fut:
                self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)

    async def receive(self, timeout: float | None = 60) -> E.DeliveryReceived:
        """The next delivery (grant credit first); TimeoutError when none came within ``timeout`` s."""
        if not self.deliveries:
            loop = asyncio.get_running_loop()
            until = None if timeout is None else loop.time() + timeout
            while not self.deliveries:
                left = None if until is None else until - loop.time()
                if left is not None and left <= 0:
                    raise TimeoutError()
                await self.wait(left)
        return self.deliveries.popleft()

    def settle(self, delivery: E.DeliveryReceived, state: Any) -> None:
        """Settle a delivery with an outcome (e.g. ``Accepted()``)."""
        client = self._session.client
        client._conn.settle(self.link, delivery.delivery_id, state)
        client._flush()

    async def close(self) -> None:
        """Detach (closed=true) and wait for the peer's answer."""
        await self._session.client._detach(self.link)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ClientSession:
    """A session of ``AmqpClient``."""

    def __init__(self, client: AmqpClient, session: Session) -> None:
        self.client = client
        self.session = session

    async def _attach(self, name: str, role: bool, source: Any, target: Any, **kw: Any) -> Link:
        c = self.client
        link = c._conn.attach(self.session, name, role, source=source, target=target, **kw)
        loop = asyncio.get_running_loop()
        fut = c._attach_waiters[id(link)] = loop.create_future()
        # A peer that refuses the link answers with an attach without source and target and a detach carrying
        # the reason, often in one read: the detach's waiter must be in place before either is handled.
        refusal = c._detach_waiters[id(link)] = loop.create_future()
        c._flush()
        try:
            attach = await asyncio.wait_for(fut, c.timeout)
            if attach.source is None and attach.target is None:
                error = await asyncio.wait_for(refusal, c.timeout)
                reason = "" if error is None else f": {error.description} ({error.condition})"
                raise AmqpClientError(f"peer refused link {name!r}{reason}", error)
        finally:
            if c._detach_waiters.get(id(link)) is refusal:
                del c._detach_waiters[id(link)]
            if refusal.done() and not refusal.cancelled():
                refusal.exception()  # read: a connection that closed meanwhile failed it, and nobody else waits
        return link

    async def sender(self, address: str, *, name: str | None = None, settled: bool = False) -> ClientSender:
        """Attach a sending link to ``address``."""
        mode = SndSettleMode.SETTLED if settled else SndSettleMode.UNSETTLED
        link = await self._attach(
            name or f"sender-{uuid.uuid4()}",
            SENDER,
            Source(address=None),
            Target(address=address),
            snd_settle_mode=mode,
        )
        sender = ClientSender(self, link)
        self.client._senders[id(link)] = sender
        return sender

    async def receiver(
        self, address: str, *, name: str | None = None, credit: int = 0, filters: dict[Any, Any] | None = None
    ) -> ClientReceiver:
        """Attach a receiving link from ``address``; optionally grant ``credit`` right away."""
        link = await self._attach(
            name or f"receiver-{uuid.uuid4()}", RECEIVER, Source(address=address, filter=filters), Target(address=None)
        )
        receiver = ClientReceiver(self, link)
        self.client._receivers[id(link)] = receiver
        if credit:
            receiver.grant(credit)
        return receiver


class AmqpClient:
    """Minimal asyncio AMQP 1.0 client built on ``Connection`` and ``AmqpProtocol``."""

    def __init__(self, conn: Connection, timeout: float = 60) -> None:
        self._conn = conn
        self.timeout = timeout
        self._protocol: AmqpProtocol | None = None
        self._opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._begin_waiters: dict[int, asyncio.Future[Any]] = {}
        self._attach_waiters: dict[int, asyncio.Future[Any]] = {}
        self._detach_waiters: dict[int, asyncio.Future[Any]] = {}
        self._outcomes: dict[tuple[int, int], asyncio.Future[Any]] = {}
        self._senders: dict[int, ClientSender] = {}
        self._receivers: dict[int, ClientReceiver] = {}
        self._refill: list[_SendWindow] = []  # send windows that this read's outcomes made room in

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 5672,
        *,
        sasl_mechanism: str | None = "ANONYMOUS",
        username: str | None = None,
        password: str | None = None,
        hostname: str | None = None,
        container_id: str | None = None,
        timeout: float = 60,
        **connection_options: Any,
    ) -> AmqpClient:
        """Open a TCP connection, run SASL and the open handshake."""
        conn = Connection(
            Role.CLIENT,
            container_id or f"shardbus-client-{uuid.uuid4()}",
            hostname=hostname or host,
            sasl_mechanism=sasl_mechanism,
            username=username,
            password=password,
            **connection_options,
        )
        client = cls(conn, timeout)
        conn.open()
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: AmqpProtocol(conn, client), host, port)
        client._protocol = protocol
        await asyncio.wait_for(asyncio.shield(client._opened), timeout)
        return client

    # ------------------------------------------------------------------------------------ public API

    async def session(self, **begin_options: Any) -> ClientSession:
        """Begin a session and wait for the peer's answer."""
        s = self._conn.begin(**begin_options)
        fut = asyncio.get_running_loop().create_future()
        self._begin_waiters[id(s)] = fut
        self._flush()
        await asyncio.wait_for(fut, self.timeout)
        return ClientSession(self, s)

    async def close(self, error: Error | None = None) -> None:
        """Close the connection and wait for the peer's close (or the socket to go)."""
        if not self._conn.close_sent:
            self._conn.close(error)
            self._flush()
        with contextlib.suppress(asyncio.TimeoutError, AmqpClientError):
            await asyncio.wait_for(asyncio.shield(self._closed), self.timeout)
        if self._protocol and self._protocol.transport:
            self._protocol.transport.close()

    # --------------------------------------------------------------------------------- EventHandler

    def handle_event(self, protocol: AmqpProtocol, ev: E.Event) -> None:
        conn = self._conn
        if isinstance(ev, E.DeliveryReceived):
            r = self._receivers.get(id(ev.link))
            if r is not None:
                r.deliveries.append(ev)
                if r._waiter is not None:
                    r._wake()
        elif isinstance(ev, E.DispositionReceived):
            for ref in ev.deliveries:
                fut = self._outcomes.pop((id(ev.session), ref.delivery_id), None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.state)
        elif isinstance(ev, E.FlowReceived):
            if ev.link is not None:
                s = self._senders.get(id(ev.link))
                if s is not None:
                    s._credit.set()
                r = self._receivers.get(id(ev.link))
                if r is not None and r._waiter is not None:
                    r._wake()  # e.g. the answer to a drain: the credit is spent
            for sender in self._senders.values():
                if sender.link.session is ev.session:
                    sender._credit.set()
                    for window in sender._windows:  # credit or session window came: send what waited for it
                        window.fill()
        elif isinstance(ev, E.ConnectionOpened):
            if not self._opened.done():
                self._opened.set_result(ev.open)
        elif isinstance(ev, E.SessionBegun):
            self._resolve(self._begin_waiters, id(ev.session), ev.begin)
        elif isinstance(ev, E.LinkAttached):
            self._resolve(self._attach_waiters, id(ev.link), ev.attach)
        elif isinstance(ev, E.LinkDetached):
            if ev.reply_needed:
                conn.detach(ev.link, closed=ev.closed)
            self._fail(self._attach_waiters.pop(id(ev.link), None), ev.error)
            self._resolve(self._detach_waiters, id(ev.link), ev.error)
            sender = self._senders.pop(id(ev.link), None)
            for window in [] if sender is None else list(sender._windows):  # no outcome comes on a detached link
                window.set_exception(AmqpClientError(f"detached: {ev.error}", ev.error))
            receiver = self._receivers.pop(id(ev.link), None)
            if receiver is not None:
                receiver._wake()  # a waiter stops waiting for what a detached link cannot bring
        elif isinstance(ev, E.SessionEnded):
            if ev.reply_needed:
                conn.end(ev.session)
        elif isinstance(ev, E.ConnectionClosed):
            if ev.reply_needed:
                conn.close()
            self._shutdown(ev.error)
        elif isinstance(ev, E.LinkAttachRequested):
            conn.detach(ev.link, error=Error("amqp:not-allowed", "client accepts no incoming links"))
        elif isinstance(ev, E.SessionBeginRequested):
            conn.end(ev.session, Error("amqp:not-allowed", "client accepts no incoming sessions"))

    def events_done(self, protocol: AmqpProtocol) -> None:
        """A read's events are handled: fill the send windows its outcomes made room in (before its write)."""
        if self._refill:
            refill, self._refill = self._refill, []
            for window in refill:
                window.fill()

    def connection_lost(self, protocol: AmqpProtocol) -> None:
        self._shutdown(self._conn.error)

    # ------------------------------------------------------------------------------------- internals

    def _flush(self) -> None:
        if self._protocol is not None:
            self._protocol.flush()

    def _check_alive(self) -> None:
        if self._conn.is_done:
            raise AmqpClientError(f"connection closed: {self._conn.error}")

    async def _detach(self, link: Link) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._detach_waiters[id(link)] = fut
        self._conn.detach(link)
        self._flush()
        await asyncio.wait_for(fut, self.timeout)

    @staticmethod
    def _resolve(waiters: dict[int, asyncio.Future[Any]], key: int, value: Any) -> None:
        fut = waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    @staticmethod
    def _fail(fut: asyncio.Future[Any] | None, error: Any) -> None:
        if fut is not None and not fut.done():
            fut.set_exception(AmqpClientError(f"detached: {error}"))

    def _shutdown(self, error: Any) -> None:
        exc = AmqpClientError(f"connection closed: {error}")
        for fut in itertools.chain(
            [self._opened],
            self._begin_waiters.values(),
            self._attach_waiters.values(),
            self._detach_waiters.values(),
            self._outcomes.values(),
        ):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: nobody may be awaiting it any more
        for receiver in self._receivers.values():
            receiver._wake()
        for sender in list(self._senders.values()):
            sender._credit.set()
            for window in list(sender._windows):  # one waiting for credit has nothing in _outcomes
                window.set_exception(exc)
        if not self._closed.done():
            self._closed.set_result(error)
