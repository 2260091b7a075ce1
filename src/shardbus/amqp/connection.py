"""Connection state machine (AMQP 1.0 part 2.4 and the SASL layer of part 5.3), sans-IO in the manner of h11.

Theory of operation
-------------------
``Connection`` never touches a socket. The transport feeds received bytes to ``receive_data`` and sends what
``data_to_send`` returns; the application reads ``next_events`` and acts through methods (``open``, ``begin``,
``attach``, ``send_transfer``, ``disposition``, ``flow``, ``detach``, ``end``, ``close``). The same class
serves both roles.

Input runs through phases:

    HEADER ──(SASL header)──> SASL ──(outcome ok)──> HEADER ──(AMQP header)──> AMQP ──(close/violation)──> DONE
           └──────────────────────(AMQP header, SASL not required)─────────────┘

* Server: on the SASL header it answers with the header and ``sasl-mechanisms``; a ``sasl-init`` becomes a
  ``SaslInit`` event and input pauses until the application calls ``accept_sasl``/``reject_sasl`` (bytes the
  client pipelined meanwhile stay buffered). Each AMQP header is answered at once.
* Client: sends its header at construction, answers ``sasl-mechanisms`` with ``sasl-init`` (ANONYMOUS or
  PLAIN), and queues every AMQP frame the application produces before the SASL outcome, releasing them right
  after the AMQP header: header, open, begin and attaches go out pipelined, as the Azure SDK does.

In the AMQP phase each frame goes through the layers: the reader cuts it out, ``decode_performative`` decodes it,
the session (``session.py``) and its link (``link.py``) take it. One shortcut, for the commonest input a server
has: a run of plain single-frame transfers (a sender's steady state, dozens per read) is taken in one loop,
``transfer_run.take_transfers``, with the same checks, state changes and events and without a frame, performative
or tuple per transfer. It takes only frames whose outcome is plain and leaves every other frame, untouched, to the
layers, so errors and unusual deliveries are decided in one place (see that module).

The open/close handshake is tracked with four flags (``open_sent``, ``open_received``, ``close_sent``,
``close_received``) rather than the spec's 13 named states, which they encode exactly (e.g. OC_PIPE =
open_sent and close_sent before anything was received). Sessions (``session.py``) and links (``link.py``) own
their own machines; this module maps channels to sessions and puts performatives on the wire.

Anything the peer does wrong ends in a ``close`` with an error condition and a ``ConnectionClosed`` event, or,
where the spec scopes the error, only the session or link it concerns ends: a session-level error (window
violation, unattached or reused handle, a begin that answers nothing) sends ``end`` with the condition, a
link-level error (a malformed first transfer, a transfer before the link was answered and given credit) sends
``detach`` closed=true, each with a ``SessionEnded``/``LinkDetached`` event (``by_peer`` False). A session or link
the application has not answered yet is answered first (its ``begin``, or an ``attach`` with null source and
target), since the peer must learn what ends; the application's own answer to it is then stale and does nothing.
What stays connection-wide is what the spec makes so (a channel or handle beyond the announced maximum:
framing-error, 2.7.1/2.7.2) or what cannot be tied to one endpoint (bytes that do not decode, a frame on a channel
that has no session). No exception caused by received bytes ever leaves ``receive_data``. A connection closed
that way drops the events of the same read that it had not handed out yet:
answering them is moot, and answering them would be impossible. Exceptions raised to the caller
(``LocalProtocolError``) are always the application's own misuse of the API.

Stale answers: events are handed out after a whole read is processed, so the peer may already have taken back
what an event asks the application to answer (an ``attach`` followed by its ``detach``, a ``begin`` followed by
its ``end``, anything followed by ``close``). Answering such an event is not misuse: ``begin`` and
``attach_reply`` still send the answer the spec requires before the peer's ``end``/``detach`` is answered, and
``flow``, ``disposition``, ``detach``, ``end`` and ``drained`` do nothing for a link or session that is going away
or on a connection that is closing (nothing may follow ``close``). ``send_transfer`` keeps raising: a delivery that
was not sent must not be mistaken for one that was.

Frame sizes: until the peer's ``open`` has arrived only MIN-MAX-FRAME-SIZE (512 bytes) is accepted (spec 2.4.1;
SASL frames likewise, 5.3.1); a frame header announcing more is refused with ``amqp:connection:framing-error``
at once, before its body is buffered. After the peer's open, our ``max_frame_size`` applies.

Idle timeout: ``tick(now)`` sends a heartbeat when we have been silent for half the peer's idle-time-out, and
closes with ``amqp:resource-limit-exceeded`` when the peer has been silent for longer than ours.
``next_deadline()`` tells the transport when to call ``tick`` next. Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import enum
import struct
import time
from typing import Any

from . import framing
from .codec import DecodeError, EncodeError, encode
from .errors import Condition, ConnectionViolation, LinkViolation, LocalProtocolError, SessionViolation
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    Event,
    LinkDetached,
    SaslInit,
    SaslOutcome,
    SessionBeginRequested,
    SessionBegun,
    SessionEnded,
)
from .framing import AMQP_HEADER, FRAME_AMQP, FRAME_SASL, SASL_HEADER, FrameReader, FramingError
from .link import Link, LinkState
from .performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    InvalidField,
    Open,
    Performative,
    Released,
    SaslCode,
    SaslMechanisms,
    SndSettleMode,
    Transfer,
    decode_performative,
)
from .performatives import SaslInit as SaslInitFrame
from .performatives import SaslOutcome as SaslOutcomeFrame
from .session import Session, SessionState
from .transfer_run import take_transfers
from .types import Symbol

__all__ = ["Connection", "Role"]

_ECHO: Any = object()
_HDR_LEN = 8
_frame_header = struct.Struct(">IBBH").pack  # size, data offset (words), type, channel: as framing writes it


_SESSION_FRAMES = frozenset((Transfer, Disposition, Flow, Attach, Detach))


_SMALL_UINTS = (b"\x43", *(bytes((0x52, i)) for i in range(1, 256)))
_DELIVERY_HEADS: dict[tuple[int, int], Any] = {}  # (constant prefix's length, tag's length) -> its packer


def _delivery_head_packer(prefix: int, tag: int) -> Any:
    """``send_deliveries``' frame head of a one-frame delivery: (frame size, the bytes from the data offset up to
    the delivery-id's constructor, the delivery-id as a uint, the tag's constructor, the tag, the fields after
    it) packed in one call."""
    packer = _DELIVERY_HEADS.get((prefix, tag))
    if packer is None:
        packer = _DELIVERY_HEADS[(prefix, tag)] = struct.Struct(f">I{prefix}sI2s{tag}s2s").pack
    return packer


_pBI = struct.Struct(">BI").pack
_pII = struct.Struct(">II").pack


def _uint(v: int) -> bytes:
    """``v`` as an AMQP uint in its smallest form (as ``codec.e_uint`` writes it)."""
    if 0 <= v < 256:
        return _SMALL_UINTS[v]
    if 0 <= v <= 0xFFFFFFFF:
        return _pBI(0x70, v)
    raise EncodeError(f"{v} out of range for uint")


def _transfer_head(handle: int, delivery_id: int, tag: bytes, message_format: int, settled: bool) -> bytes:
    """The encoded performative of a first transfer without state, byte for byte what ``Transfer.encode`` gives
    (every delivery sent pays for this, and the generic encoder costs several times more); ``tag`` < 256 bytes."""
    body = b"".join(
        (
            _SMALL_UINTS[handle] if 0 <= handle < 256 else _uint(handle),
            _SMALL_UINTS[delivery_id] if 0 <= delivery_id < 256 else _uint(delivery_id),
            bytes((0xA0, len(tag))),
            tag,
            b"\x43" if message_format == 0 else _uint(message_format),
            b"\x41" if settled else b"\x42",
        )
    )
    n = len(body)
    if n < 255:
        return bytes((0x00, 0x53, 0x14, 0xC0, n + 1, 5)) + body
    return b"\x00\x53\x14\xd0" + (n + 4).to_bytes(4, "big") + b"\x00\x00\x00\x05" + body


# Delivery states without fields, encoded once (every settlement echo carries one).
_EMPTY_STATE_BYTES: dict[type, bytes] = {Accepted: Accepted().encode(), Released: Released().encode()}
# The fields after ``first`` of a settled disposition of one delivery with such a state: last null, settled true,
# the state (``disposition`` writes every settlement echo from it).
_SETTLED_ONE: dict[type, bytes] = {cls: b"\x40\x41" + encoded for cls, encoded in _EMPTY_STATE_BYTES.items()}
# What comes before the delivery id in such an echo (frame header, performative and list header, role), by the
# id's encoded length, the tail, the role and the channel: every echo of one shape has the same, so it is looked up
# (``Connection.disposition``). Shared by all connections, and cleared once it holds 256 shapes.
_ECHO_HEADS: dict[tuple[int, bytes, bool, int], bytes] = {}


def _disposition_body(
    role: bool, first: int, last: int | None, settled: bool, state: Any, batchable: bool
) -> bytes | None:
    """The encoded ``disposition``, byte for byte what ``Disposition.encode`` gives (trailing nulls and defaults
    omitted), or None for flags that are not ``bool`` (left to the generic encoder)."""
    if settled.__class__ is not bool or batchable.__class__ is not bool or role.__class__ is not bool:
        return None
    parts = [b"\x41" if role else b"\x42", _uint(first)]
    if batchable:
        count = 6
    elif state is not None:
        count = 5
    elif settled:
        count = 4
    elif last is not None:
        count = 3
    else:
        count = 2
    if count > 2:
        parts.append(b"\x40" if last is None else _uint(last))
    if count > 3:
        parts.append(b"\x41" if settled else b"\x42")
    if count > 4:
        if state is None:
            parts.append(b"\x40")
        else:
            encoded = _EMPTY_STATE_BYTES.get(state.__class__)
            parts.append(encoded if encoded is not None else encode(state))
    if count > 5:
        parts.append(b"\x41")
    body = b"".join(parts)
    n = len(body)
    if n < 255:
        return bytes((0x00, 0x53, 0x15, 0xC0, n + 1, count)) + body
    return b"\x00\x53\x15\xd0" + _pII(n + 4, count) + body


class Role(enum.Enum):
    """Which side of the connection we are."""

    CLIENT = "client"
    SERVER = "server"


class _Phase(enum.Enum):
    HEADER = 1
    SASL = 2
    SASL_PAUSED = 3
    AMQP = 4
    DONE = 5


# Members the per-frame code compares with, as module constants: in Python 3.11 reading a member off an Enum class
# costs about ten times a global (EnumType defines __getattr__, which slows every class attribute).
_AMQP_PHASE = _Phase.AMQP
_DONE_PHASE = _Phase.DONE
_MAPPED = SessionState.MAPPED
_LINK_ATTACHED = LinkState.ATTACHED
_END_SENT = SessionState.END_SENT
_END_RCVD = SessionState.END_RCVD
_ENDED = SessionState.ENDED


def _going(state: SessionState) -> bool:
    """The session is ending or ended (identity tests: an Enum member's hash runs Python code)."""
    return state is _END_SENT or state is _END_RCVD or state is _ENDED


class Connection:
    """A sans-IO AMQP 1.0 connection endpoint.

    Server-side SASL offers ``sasl_mechanisms`` (default ANONYMOUS and PLAIN); ``require_sasl=False`` also
    accepts clients that skip SASL. Client-side ``sasl_mechanism`` is "ANONYMOUS", "PLAIN" (with
    ``username``/``password``) or None for no SASL layer.
    """

    transfer_runs = True
    """Plain transfer frames go through ``transfer_run.take_transfers`` (False: all through the layered path,
    which tests compare it with)."""

    def __init__(
        self,
        role: Role,
        container_id: str,
        *,
        hostname: str | None = None,
        max_frame_size: int = 1048576,
        channel_max: int = 65535,
        idle_timeout: float | None = None,
        idle_timeout_advertised: float | None = None,
        handle_max: int = 0xFFFFFFFF,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: list[Symbol] | None = None,
        desired_capabilities: list[Symbol] | None = None,
        sasl_mechanisms: tuple[str, ...] = ("ANONYMOUS", "PLAIN"),
        require_sasl: bool = False,
        sasl_mechanism: str | None = "ANONYMOUS",
        username: str | None = None,
        password: str | None = None,
        max_message_size: int = 256 * 1024 * 1024,
        now: float | None = None,
    ) -> None:
        if max_frame_size < framing.MIN_MAX_FRAME_SIZE:
            raise ValueError("max_frame_size must be at least 512")
        self.role = role
        self.container_id = container_id
        self.hostname = hostname
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.idle_timeout = idle_timeout
        """Our idle time-out in seconds (None: we never time the peer out)."""
        self.idle_timeout_advertised = idle_timeout_advertised
        self.handle_max = handle_max
        """The handle-max of sessions the peer begins, enforced from their first frame (an attach pipelined
        behind the begin arrives before the application answers it)."""
        """What our ``open`` announces, when not ``idle_timeout`` itself: 2.4.5 advises announcing half the real
        threshold, so that a peer sending just in time is not cut off by network delay."""
        self.properties = properties
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.max_message_size = max_message_size
        """Hard limit on a reassembled incoming delivery, whatever the links say."""
        self.sasl_mechanisms = tuple(sasl_mechanisms)
        self.require_sasl = require_sasl
        self.sasl_mechanism = sasl_mechanism
        self._username = username
        self._password = password

        self.remote_open: Open | None = None
        self.remote_max_frame_size = framing.MIN_MAX_FRAME_SIZE
        self.remote_channel_max = 0
        self.remote_idle_timeout: float | None = None
        self.open_sent = False
        self.open_received = False
        self.close_sent = False
        self.close_received = False
        self._transfer_runs = False  # from the peer's open until its close (``_process``)
        self.sasl_done = False
        self.authenticated_as: SaslInit | None = None
        """Server side: the accepted ``SaslInit`` (mechanism and credentials)."""
        self.error: Error | None = None
        """The error the connection ended with (ours after a violation, or the peer's)."""

        self._reader = FrameReader(framing.MIN_MAX_FRAME_SIZE)  # ours applies once the peer's open arrived
        self._phase = _Phase.HEADER
        self._out = bytearray()
        self._pending_amqp: bytearray | None = None  # client: AMQP output held until the AMQP header is sent
        self._events: list[Event] = []
        self._local_sessions: dict[int, Session] = {}
        self._remote_sessions: dict[int, Session] = {}
        self._ended_remote_channels: set[int] = set()
        t = time.monotonic() if now is None else now
        self._last_received = t
        self._last_sent = t

        if role is Role.CLIENT:
            if sasl_mechanism is not None:
                self._out += SASL_HEADER
                self._pending_amqp = bytearray()
            else:
                self._out += AMQP_HEADER
        self._expect_header = SASL_HEADER if role is Role.CLIENT and sasl_mechanism is not None else AMQP_HEADER

    # ================================================================================== public: I/O

    def receive_data(self, data: bytes | bytearray | memoryview, now: float | None = None) -> None:
        """Feed bytes from the transport; ``b""`` means the peer closed its end. Never raises for bad input."""
        if self._phase is _DONE_PHASE:
            return
        if not data:
            self._transport_lost()
            return
        self._last_received = time.monotonic() if now is None else now
        self._reader.feed(data)
        self._process()

    def next_events(self) -> list[Event]:
        """Events produced since the last call, in order."""
        ev = self._events
        if ev:
            self._events = []
        return ev

    def data_to_send(self, now: float | None = None) -> bytes:
        """Bytes to write to the transport (possibly empty)."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._last_sent = time.monotonic() if now is None else now
        return data

    @property
    def is_done(self) -> bool:
        """True once the connection is finished: flush ``data_to_send()`` and close the socket."""
        return self._phase is _DONE_PHASE

    @property
    def is_open(self) -> bool:
        """Both opens exchanged and no close yet."""
        return self.open_sent and self.open_received and not (self.close_sent or self.close_received)

    @property
    def sessions(self) -> list[Session]:
        """Sessions with a local channel (begun by us or answered)."""
        return list(self._local_sessions.values())

    def release(self) -> None:
        """Forget every session and link: the transport is gone and nothing reaches them again. (Sessions and
        links refer to this connection and to each other; dropped here, a connection lost with links attached
        is freed by reference counting instead of waiting, in a cycle, for a full garbage collection.)"""
        for session in (*self._local_sessions.values(), *self._remote_sessions.values()):
            for table in (session.links, session._by_handle, session._by_remote_handle):
                table.clear()
            session.outgoing_unsettled.clear()
            session.incoming_unsettled.clear()
        self._local_sessions.clear()
        self._remote_sessions.clear()

    # ============================================================================== public: timers

    def tick(self, now: float | None = None) -> None:
        """Run idle-timeout bookkeeping: heartbeat if due, close if the peer went silent."""
        if self._phase is not _AMQP_PHASE:
            return
        now = time.monotonic() if now is None else now
        if self.idle_timeout and now - self._last_received > self.idle_timeout:
            self._fail(Condition.RESOURCE_LIMIT_EXCEEDED, "idle timeout: no frames received")
            return
        heartbeat_due = self.remote_idle_timeout and now - self._last_sent >= self.remote_idle_timeout / 2
        if heartbeat_due and self.open_sent and not self.close_sent:
            self._out += framing.heartbeat_frame()
            self._last_sent = now

    def next_deadline(self) -> float | None:
        """When ``tick`` should next be called (monotonic seconds), or None if no timer is needed."""
        if self._phase is not _AMQP_PHASE:
            return None
        # called after every write: no list, no min()
        ours = self._last_received + self.idle_timeout if self.idle_timeout else None
        if not self.remote_idle_timeout:
            return ours
        theirs = self._last_sent + self.remote_idle_timeout / 2
        return theirs if ours is None or theirs < ours else ours

    # ================================================================================ public: SASL

    def accept_sasl(self) -> None:
        """Server: accept the client's ``sasl-init`` (sends outcome ok) and resume reading."""
        if self.role is not Role.SERVER or self._phase is not _Phase.SASL_PAUSED:
            raise LocalProtocolError("no SASL exchange is waiting for a decision")
        self._send_sasl(SaslOutcomeFrame(code=SaslCode.OK))
        self.sasl_done = True
        self._phase = _Phase.HEADER
        self._process()

    def reject_sasl(self, code: int = SaslCode.AUTH) -> None:
        """Server: refuse authentication; the connection is then done."""
        if self.role is not Role.SERVER or self._phase is not _Phase.SASL_PAUSED:
            raise LocalProtocolError("no SASL exchange is waiting for a decision")
        self._send_sasl(SaslOutcomeFrame(code=code))
        self._finish(Error(Condition.UNAUTHORIZED_ACCESS, "SASL authentication failed"), by_peer=False)

    # ====================================================================== public: connection control

    def open(self) -> None:
        """Send our ``open`` (a server calls this on ``ConnectionOpened``; a client whenever it likes)."""
        if self.open_sent:
            raise LocalProtocolError("open already sent")
        if self._phase is _Phase.DONE:
            return  # finished (a violation, the socket gone) before the application answered: moot
        self.open_sent = True
        announced = self.idle_timeout_advertised or self.idle_timeout
        self._send(
            0,
            Open(
                container_id=self.container_id,
                hostname=self.hostname,
                max_frame_size=self.max_frame_size,
                channel_max=self.channel_max,
                idle_time_out=int(announced * 1000) if announced else None,
                offered_capabilities=self.offered_capabilities,
                desired_capabilities=self.desired_capabilities,
                properties=self.properties,
            ),
        )

    def close(self, error: Error | None = None) -> None:
        """Send ``close`` (to start closing or to answer the peer's). Idempotent."""
        if self.close_sent or self._phase is _Phase.DONE:
            return
        if not self._header_exchange_started():
            self._finish(error, by_peer=False)
            return
        if not self.open_sent:
            self.open()
        self.close_sent = True
        self._send(0, Close(error=error))
        if self.close_received:
            self._phase = _Phase.DONE

    # ========================================================================= public: sessions

    def begin(
        self,
        session: Session | None = None,
        *,
        incoming_window: int = 65536,
        outgoing_window: int = 0x7FFFFFFF,
        handle_max: int = 0xFFFFFFFF,
        properties: dict[Any, Any] | None = None,
        auto_flow: bool = True,
    ) -> Session:
        """Begin a new session, or answer the peer's (pass the ``SessionBeginRequested.session``)."""
        if session is not None and (
            self.closing
            or (session.local_channel is not None and (session.state is _END_SENT or session.state is _ENDED))
        ):
            return session  # stale answer: nothing may follow close, or we ended the session for an error already
        self._require_open_sent()
        if session is None:
            session = Session(
                self,
                incoming_window=incoming_window,
                outgoing_window=outgoing_window,
                handle_max=handle_max,
                auto_flow=auto_flow,
            )
        elif session.connection is not self:
            raise LocalProtocolError("session belongs to another connection")
        else:
            session.configured_incoming_window = session.incoming_window = incoming_window
            session.outgoing_window = outgoing_window
            session.handle_max = handle_max
            session.auto_flow = auto_flow
        session.properties = properties
        limit = self.remote_channel_max if self.open_received else self.channel_max
        ch = 0
        while ch in self._local_sessions:
            ch += 1
        if ch > limit:
            raise LocalProtocolError("no free channel")
        begin = session.local_begin()
        session.local_channel = ch
        self._local_sessions[ch] = session
        self._send(ch, begin)
        return session

    @property
    def closing(self) -> bool:
        """We sent ``close`` or the connection is finished: nothing more may be sent."""
        return self.close_sent or self._phase is _DONE_PHASE

    def end(self, session: Session, error: Error | None = None) -> None:
        """End a session (or answer the peer's end). Does nothing on a closing connection or an ended session."""
        if self.closing or session.state is SessionState.ENDED or session.state is SessionState.END_SENT:
            return
        if session.local_channel is None and session.state in (SessionState.BEGIN_RCVD, SessionState.END_RCVD):
            self.begin(session)  # never answered: the peer gets its begin before our end
        session.local_end()
        ch = session.local_channel
        if ch is not None:
            self._send(ch, End(error=error))
        if session.state is SessionState.ENDED and ch is not None:
            self._local_sessions.pop(ch, None)

    # ============================================================================ public: links

    def attach(
        self,
        session: Session,
        name: str,
        role: bool,
        *,
        source: Any = None,
        target: Any = None,
        snd_settle_mode: int = SndSettleMode.MIXED,
        rcv_settle_mode: int = 0,
        initial_delivery_count: int = 0,
        max_message_size: int = 0,
        properties: dict[Any, Any] | None = None,
    ) -> Link:
        """Attach a new link on ``session`` with our ``role`` (``SENDER``/``RECEIVER``)."""
        link = session.new_link(name, role)
        link.source, link.target = source, target
        link.snd_settle_mode, link.rcv_settle_mode = snd_settle_mode, rcv_settle_mode
        link.initial_delivery_count = initial_delivery_count
        link.max_message_size = max_message_size
        link.properties = properties
        try:
            attach = session.local_attach(link)
        except LocalProtocolError:
            session.links.pop((name, role), None)
            raise
        self._send_on(session, attach)
        return link

    def attach_reply(
        self,
        link: Link,
        *,
        source: Any = _ECHO,
        target: Any = _ECHO,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        initial_delivery_count: int = 0,
        max_message_size: int = 0,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        """Answer a ``LinkAttachRequested``. Source/target default to echoing the peer's; pass ``None`` for
        both (then ``detach`` with an error) to refuse the link the way Service Bus does. Does nothing when the
        link's session is ending or the connection closing; still answers a link the peer has detached
        meanwhile (its detach is answered next)."""
        if self.closing or link.session.state is not _MAPPED:
            return  # stale: the session or connection went away before we answered
        if link.handle is not None and (link.state is LinkState.DETACH_SENT or link.state is LinkState.DETACHED):
            return  # stale: we answered and detached it for an error already (``_link_failed``)
        stale = link.state is LinkState.DETACH_RCVD and link.handle is None
        if (link.state is not LinkState.ATTACH_RCVD and not stale) or link.remote_attach is None:
            raise LocalProtocolError("link is not waiting for an attach reply")
        ra = link.remote_attach
        link.source = ra.source if source is _ECHO else source
        link.target = ra.target if target is _ECHO else target
        if snd_settle_mode is not None:
            link.snd_settle_mode = snd_settle_mode
        if rcv_settle_mode is not None:
            link.rcv_settle_mode = rcv_settle_mode
        link.initial_delivery_count = initial_delivery_count
        link.max_message_size = max_message_size
        link.properties = properties
        session = link.session
        self._send_on(session, session.local_attach(link))

    def detach(self, link: Link, *, closed: bool = True, error: Error | None = None) -> None:
        """Detach a link (or answer the peer's detach). A link still waiting for our attach reply is first
        answered with null source/target, as Service Bus refuses links. No-op once detached or detaching."""
        if link.state is LinkState.DETACHED or link.state is LinkState.DETACH_SENT:
            return
        session = link.session
        if self.closing or session.local_channel is None or session.state is not _MAPPED:
            link.local_detach()
            return
        if link.state is LinkState.ATTACH_RCVD or (link.state is LinkState.DETACH_RCVD and link.handle is None):
            self.attach_reply(link, source=None, target=None)
        self._send(session.local_channel, session.local_detach(link, closed, error))

    def flow(
        self,
        target: Session | Link,
        *,
        link_credit: int | None = None,
        drain: bool | None = None,
        available: int | None = None,
        echo: bool = False,
    ) -> None:
        """Send a flow: session-only for a ``Session``; for a ``Link`` with its state. On a receiving link
        ``link_credit`` sets the credit granted (absolute) and ``drain`` asks the sender to use it up."""
        if isinstance(target, Link):
            link: Link | None = target
            session = target.session
            if self._stale_link(target):
                return
            if link_credit is not None or drain is not None:
                target.set_credit(target.link_credit if link_credit is None else link_credit, bool(drain))
            if available is not None:
                target.available = available
            if target.handle is None or target.state not in (LinkState.ATTACHED, LinkState.ATTACH_SENT):
                raise LocalProtocolError(f"link {target.name!r} is not attached")
        else:
            link, session = None, target
            if self.close_sent or self._phase is _DONE_PHASE or _going(session.state):
                return
        if session.state is not _MAPPED:
            raise LocalProtocolError(f"session is {session.state.value}")
        self._send_on(session, session.make_flow(link, echo))

    def _stale_link(self, link: Link) -> bool:
        """The link, its session or the connection is going away: an answer about it is moot."""
        state = link.state
        if state is _LINK_ATTACHED and link.session.state is _MAPPED and not self.close_sent:
            return self._phase is _DONE_PHASE  # the usual case, in a few identity tests
        return (
            self.closing
            or _going(link.session.state)
            or state is LinkState.DETACH_RCVD
            or state is LinkState.DETACH_SENT
            or (state is LinkState.DETACHED and link.handle is not None)
        )

    def drained(self, link: Link) -> None:
        """Sending link: we have nothing more to send under drain; consume the remaining credit and tell."""
        if self._stale_link(link):
            return
        link.complete_drain()
        self._send_on(link.session, link.session.make_flow(link))

    # ======================================================================= public: deliveries

    def send_transfer(
        self,
        link: Link,
        tag: bytes,
        payload: bytes,
        *,
        settled: bool | None = None,
        message_format: int = 0,
        state: Any = None,
        batchable: bool = False,
        ignore_credit: bool = False,
    ) -> int:
        """Send one delivery (split into ``more`` frames above the peer's max-frame-size). Returns its
        delivery-id. ``ignore_credit`` skips the link-credit and session-window checks (for peers such as the
        Azure SDK that never replenish credit on their ``$cbs``/``$management`` reply links)."""
        session = link.session
        if settled is None:
            settled = link.snd_settle_mode == SndSettleMode.SETTLED
        did = session.next_delivery_id
        lt = len(tag)
        handle = link.handle
        if handle is None:  # not attached by us yet: let the checks say so
            session.check_can_send(link, 1, ignore_credit)
            raise LocalProtocolError(f"link {link.name!r} has no handle")
        if state is None and not batchable and lt < 256:
            # Single-frame fast path: frame header and performative (what _transfer_head encodes) in one join.
            h = _SMALL_UINTS[handle] if 0 <= handle < 256 else _uint(handle)
            d = _SMALL_UINTS[did] if did < 256 else _pBI(0x70, did)
            f = b"\x43" if message_format == 0 else _uint(message_format)
            n = len(h) + len(d) + lt + len(f) + 3
            size = _HDR_LEN + 6 + n + len(payload)
            if n < 255 and size <= self.remote_max_frame_size:
                session.check_can_send(link, 1, ignore_credit)
                out = self._pending_amqp if self._pending_amqp is not None else self._out
                out += b"".join(
                    (
                        _frame_header(size, 2, FRAME_AMQP, session.local_channel),
                        bytes((0x00, 0x53, 0x14, 0xC0, n + 1, 5)),
                        h,
                        d,
                        bytes((0xA0, lt)),
                        tag,
                        f,
                        b"\x41" if settled else b"\x42",
                    )
                )
                out += payload
                session.next_delivery_id = (did + 1) & 0xFFFFFFFF
                session.sent_transfer_frames(1)
                session.record_sent_delivery(link, did, tag, settled)
                return did
            first = _transfer_head(handle, did, tag, message_format, settled)
        else:
            first = Transfer(
                handle=handle,
                delivery_id=did,
                delivery_tag=tag,
                message_format=message_format,
                settled=settled,
                state=state,
                batchable=batchable,
            ).encode()
        max_frame = self.remote_max_frame_size
        if _HDR_LEN + len(first) + len(payload) <= max_frame:
            session.check_can_send(link, 1, ignore_credit)
            frames: list[tuple[bytes, bytes | memoryview]] = [(first, payload)]
        else:
            more_first = Transfer(
                handle=handle,
                delivery_id=did,
                delivery_tag=tag,
                message_format=message_format,
                settled=settled,
                more=True,
                state=state,
                batchable=batchable,
            ).encode()
            cont_more = Transfer(handle=handle, more=True).encode()
            cont_last = Transfer(handle=handle).encode()
            room_first = max_frame - _HDR_LEN - len(more_first)
            room = max_frame - _HDR_LEN - len(cont_more)
            if room_first <= 0 or room <= 0:
                raise LocalProtocolError("peer max-frame-size too small for a transfer")
            view = memoryview(payload)
            frames = [(more_first, view[:room_first])]  # memoryviews: the frames are copied to the output only
            pos = room_first
            n = len(payload)
            while pos < n:
                piece = view[pos : pos + room]
                pos += len(piece)
                frames.append((cont_more if pos < n else cont_last, piece))
            session.check_can_send(link, len(frames), ignore_credit)
        ch = session.local_channel
        out = self._pending_amqp if self._pending_amqp is not None else self._out
        for perf, chunk in frames:  # what framing.encode_frame_into does, inlined: every delivery pays for it
            out += _frame_header(_HDR_LEN + len(perf) + len(chunk), 2, FRAME_AMQP, ch)
            out += perf
            out += chunk
        session.next_delivery_id = (did + 1) & 0xFFFFFFFF
        session.sent_transfer_frames(len(frames))
        session.record_sent_delivery(link, did, tag, settled)
        return did

    def send_deliveries(self, link: Link, deliveries: list[tuple[bytes, bytes]], *, settled: bool) -> int:
        """Send several deliveries on ``link``, each a ``(tag, payload)``, in one pass: what ``send_transfer`` (message
        format 0, no state) does for each in turn, with the checks and the bookkeeping done once. A broker answers
        a receiver's credit with many deliveries at a time, and each paid for its own call, checks and records.
        Returns the delivery-id of the first. Raises ``LocalProtocolError``, having sent nothing, when the link is
        not attached or its credit or the peer's session window cannot take them all (the caller counts a delivery
        larger than the peer's max-frame-size as the frames it takes)."""
        session = link.session
        handle = link.handle
        count = len(deliveries)
        if handle is None:
            session.check_can_send(link, 1, False)
            raise LocalProtocolError(f"link {link.name!r} has no handle")
        if count == 0:
            return session.next_delivery_id
        session.check_can_send(link, count, False)
        if link.link_credit < count:
            raise LocalProtocolError(f"{count} deliveries for {link.link_credit} link credit on {link.name!r}")
        first = did = session.next_delivery_id
        h = _SMALL_UINTS[handle] if 0 <= handle < 256 else _uint(handle)
        tail = b"\x43\x41" if settled else b"\x43\x42"  # message-format 0, settled
        fixed = len(h) + 4  # the performative's fields but the delivery-id and the tag's bytes
        limit = self.remote_max_frame_size
        ch = session.local_channel
        out = self._pending_amqp if self._pending_amqp is not None else self._out
        tags: list[bytes] = []
        if did >= 256 and did + count <= 0xFFFFFFFF:  # every delivery-id a uint of 4 bytes, none wrapping
            # The usual batch (a broker's chunk of deliveries): each frame's head is one struct pack of its size,
            # the constant bytes around the delivery-id and the tag, and the tag; the loop below is left at the
            # first delivery this does not fit (another tag length, several frames), which it takes from there.
            lt = len(deliveries[0][0])
            n = fixed + 5 + lt
            if n < 255:
                before_payload = _HDR_LEN + 6 + n
                room = limit - before_payload
                prefix = bytes((2, FRAME_AMQP, ch >> 8, ch & 0xFF, 0x00, 0x53, 0x14, 0xC0, n + 1, 5)) + h + b"\x70"
                pack = _delivery_head_packer(len(prefix), lt)
                tag_constructor = bytes((0xA0, lt))
                for tag, payload in deliveries:
                    if len(tag) != lt or len(payload) > room:
                        break
                    out += pack(before_payload + len(payload), prefix, did, tag_constructor, tag, tail)
                    out += payload
                    did += 1
                taken = did - first
                if taken == count:
                    session.next_delivery_id = did & 0xFFFFFFFF
                    session.sent_transfer_frames(count)
                    session.record_sent_deliveries(link, first, [tag for tag, _ in deliveries], settled)
                    return first
                if taken:
                    tags = [tag for tag, _ in deliveries[:taken]]
                    deliveries = deliveries[taken:]
        shape = -1  # the tag's length and the delivery-id's encoded length the parts below were made for
        for tag, payload in deliveries:
            lt = len(tag)
            d = _SMALL_UINTS[did] if did < 256 else _pBI(0x70, did)
            if lt + (len(d) << 16) != shape:  # the performative's size and its constant parts: once per batch
                shape = lt + (len(d) << 16)
                n = fixed + len(d) + lt
                if n < 255:
                    performative = bytes((0x00, 0x53, 0x14, 0xC0, n + 1, 5)) + h
                    tag_constructor = bytes((0xA0, lt))
                before_payload = _HDR_LEN + 6 + n
            size = before_payload + len(payload)
            if n >= 255 or size > limit:  # a long tag or a payload of several frames: the general path
                if tags:
                    session.next_delivery_id = did
                    session.sent_transfer_frames(len(tags))
                    session.record_sent_deliveries(link, did - len(tags) & 0xFFFFFFFF, tags, settled)
                    tags = []
                self.send_transfer(link, tag, payload, settled=settled)
                did = session.next_delivery_id
                continue
            out += b"".join((_frame_header(size, 2, FRAME_AMQP, ch), performative, d, tag_constructor, tag, tail))
            out += payload
            tags.append(tag)
            did = (did + 1) & 0xFFFFFFFF
        if tags:
            session.next_delivery_id = did
            session.sent_transfer_frames(len(tags))
            session.record_sent_deliveries(link, did - len(tags) & 0xFFFFFFFF, tags, settled)
        return first

    def disposition(
        self,
        link: Link,
        first: int,
        last: int | None = None,
        *,
        settled: bool = True,
        state: Any = None,
        batchable: bool = False,
    ) -> None:
        """Send a disposition for deliveries ``first..last`` of ``link``'s session, in ``link``'s role. Does
        nothing once the session is ending or the connection closing."""
        session = link.session
        if (session.state is not _MAPPED or self.close_sent or self._phase is _DONE_PHASE) and (
            self.close_sent or self._phase is _DONE_PHASE or _going(session.state)
        ):
            return
        session.local_settle(link, first, first if last is None else last, settled)
        role = link.role
        tail = _SETTLED_ONE.get(state.__class__) if last is None and settled is True and batchable is False else None
        if tail is not None and role.__class__ is bool and 0 <= first <= 0xFFFFFFFF:
            # One delivery settled with a fieldless state (an echo): ``_disposition_body``'s bytes, without its
            # general case
            u = _SMALL_UINTS[first] if first < 256 else _pBI(0x70, first)
            channel = session.local_channel
            head = _ECHO_HEADS.get((len(u), tail, role, channel))
            if head is None:  # the frame header, the performative's list header and the role: once per shape
                n = 1 + len(u) + len(tail)
                head = _frame_header(_HDR_LEN + 6 + n, 2, FRAME_AMQP, channel)
                head += bytes((0x00, 0x53, 0x15, 0xC0, n + 1, 5, 0x41 if role else 0x42))
                if len(_ECHO_HEADS) >= 256:
                    _ECHO_HEADS.clear()
                _ECHO_HEADS[len(u), tail, role, channel] = head
            out = self._pending_amqp if self._pending_amqp is not None else self._out
            out += head
            out += u
            out += tail
            return
        body = _disposition_body(role, first, last, settled, state, batchable)
        if body is None:
            body = Disposition(role, first, last, settled, state, batchable).encode()
        out = self._pending_amqp if self._pending_amqp is not None else self._out
        out += _frame_header(_HDR_LEN + len(body), 2, FRAME_AMQP, session.local_channel)
        out += body

    def settle(self, link: Link, delivery_id: int, state: Any = None) -> None:
        """Settle one delivery with ``state`` (e.g. ``Accepted()``)."""
        self.disposition(link, delivery_id, None, settled=True, state=state)

    # ================================================================================ internals: output

    def _header_exchange_started(self) -> bool:
        return self.role is Role.CLIENT or self._phase in (_Phase.AMQP, _Phase.DONE)

    def _require_open_sent(self) -> None:
        if not self.open_sent:
            raise LocalProtocolError("send open first")
        if self.close_sent or self._phase is _Phase.DONE:
            raise LocalProtocolError("connection is closing")

    def _send(self, channel: int, perf: Composite) -> None:
        body = bytearray(b"\x00\x00\x00\x00\x02\x00\x00\x00")
        perf.encode_into(body)
        n = len(body)
        body[0:4] = n.to_bytes(4, "big")
        body[6:8] = channel.to_bytes(2, "big")
        if self._pending_amqp is not None:
            self._pending_amqp += body
        else:
            self._out += body

    def _send_on(self, session: Session, perf: Composite) -> None:
        """Put ``perf`` on ``session``'s channel (an application's answer: the session must have one)."""
        channel = session.local_channel
        if channel is None:
            raise LocalProtocolError("the session has no channel yet: begin it first")
        self._send(channel, perf)

    def send_for_session(self, session: Session, perf: Composite) -> None:
        """Frames a session produces by itself (echo/window flows); dropped while it has no local channel."""
        if session.local_channel is not None and session.state is _MAPPED:
            self._send(session.local_channel, perf)

    def _send_sasl(self, perf: Composite) -> None:
        self._out += framing.encode_frame(FRAME_SASL, 0, perf.encode())

    # ================================================================================= internals: input

    def _process(self) -> None:
        """Consume buffered input until it runs out, the phase pauses, or the connection is done."""
        reader = self._reader
        try:
            while True:
                phase = self._phase
                if phase is _AMQP_PHASE:  # the steady state: a tight loop over the frames of this read
                    next_frame, on_frame = reader.next_frame, self._on_amqp_frame
                    while True:
                        # A transfer next (its performative code at byte 10 of a frame without extended header) on
                        # an open connection: the run of plain transfers from here goes through ``take_transfers``
                        # (transfer_run.py), the first frame it leaves through the layered path below. (The
                        # reader's buffer is read here directly: a call per frame would cost what the run saves.)
                        buf, pos = reader._buf, reader._pos
                        if len(buf) - pos > 16 and buf[pos + 10] == 0x14 and self._transfer_runs:
                            reader._pos = take_transfers(
                                buf,
                                pos,
                                reader.max_frame_size,
                                self._remote_sessions,
                                self.max_message_size,
                                self._events,
                            )
                        frame = next_frame()
                        if frame is None:
                            return
                        on_frame(frame)
                        if self._phase is not _AMQP_PHASE:
                            break
                elif phase is _Phase.HEADER:
                    header = reader.read_protocol_header()
                    if header is None:
                        return
                    self._on_header(header)
                elif phase is _Phase.SASL:
                    frame = reader.next_frame()
                    if frame is None:
                        return
                    self._on_sasl_frame(frame)
                else:
                    return
        except FramingError as exc:
            self._fail(Condition.FRAMING_ERROR, str(exc))
        except InvalidField as exc:
            self._fail(Condition.INVALID_FIELD, str(exc))
        except DecodeError as exc:
            self._fail(Condition.DECODE_ERROR, str(exc))
        except ConnectionViolation as exc:
            self._fail(exc.condition, exc.description)
        except LocalProtocolError as exc:  # a reply we tried to make in an impossible state
            self._fail(Condition.ILLEGAL_STATE, str(exc))
        except Exception as exc:  # never let peer input kill the caller
            self._fail(Condition.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    def _on_header(self, header: bytes) -> None:
        if self.role is Role.SERVER:
            if header == SASL_HEADER and not self.sasl_done and self.sasl_mechanisms:
                self._out += SASL_HEADER
                self._send_sasl(SaslMechanisms([Symbol(m) for m in self.sasl_mechanisms]))
                self._phase = _Phase.SASL
                return
            if header == AMQP_HEADER and (self.sasl_done or not self.require_sasl):
                self._out += AMQP_HEADER
                self._enter_amqp()
                return
            wanted = SASL_HEADER if self.require_sasl and not self.sasl_done else AMQP_HEADER
            self._out += wanted
            self._finish(Error(Condition.NOT_ALLOWED, f"unsupported protocol header {header!r}"), False)
            return
        if header != self._expect_header:
            self._finish(Error(Condition.NOT_ALLOWED, f"server answered with protocol header {header!r}"), False)
            return
        if header == SASL_HEADER:
            self._phase = _Phase.SASL
        else:
            self._enter_amqp()

    def _enter_amqp(self) -> None:
        self._phase = _Phase.AMQP  # the reader keeps MIN-MAX-FRAME-SIZE until the peer's open (``_on_open``)

    def _on_sasl_frame(self, frame: framing.Frame) -> None:
        if frame.type != FRAME_SASL:
            raise ConnectionViolation(Condition.FRAMING_ERROR, "AMQP frame during SASL negotiation")
        if not frame.body:
            return
        perf, _ = decode_performative(frame.body)
        if self.role is Role.SERVER:
            if not isinstance(perf, SaslInitFrame):
                raise ConnectionViolation(Condition.NOT_ALLOWED, f"unexpected {type(perf).__name__}")
            mech = str(perf.mechanism)
            ev = SaslInit(mech, perf.initial_response, perf.hostname)
            if mech == "PLAIN" and perf.initial_response is not None:
                parts = perf.initial_response.split(b"\x00")
                if len(parts) == 3:
                    try:
                        ev.authzid = parts[0].decode("utf-8") or None
                        ev.username = parts[1].decode("utf-8")
                        ev.password = parts[2].decode("utf-8")
                    except UnicodeDecodeError:
                        pass
            if mech not in self.sasl_mechanisms:
                self._send_sasl(SaslOutcomeFrame(code=SaslCode.AUTH))
                self._finish(Error(Condition.UNAUTHORIZED_ACCESS, f"SASL mechanism {mech} not offered"), False)
                return
            self.authenticated_as = ev
            self._phase = _Phase.SASL_PAUSED
            self._events.append(ev)
            return
        # client
        if isinstance(perf, SaslMechanisms):
            offered = perf.sasl_server_mechanisms or []
            mech = self.sasl_mechanism or "ANONYMOUS"
            if mech not in offered:
                self._finish(Error(Condition.NOT_IMPLEMENTED, f"server does not offer SASL {mech}"), False)
                return
            if mech == "PLAIN":
                resp = b"\x00" + (self._username or "").encode() + b"\x00" + (self._password or "").encode()
            else:
                resp = b""
            self._send_sasl(SaslInitFrame(mechanism=Symbol(mech), initial_response=resp, hostname=self.hostname))
        elif isinstance(perf, SaslOutcomeFrame):
            self._events.append(SaslOutcome(perf.code, perf.additional_data))
            if perf.code != SaslCode.OK:
                self._finish(Error(Condition.UNAUTHORIZED_ACCESS, f"SASL failed with code {perf.code}"), False)
                return
            self.sasl_done = True
            self._out += AMQP_HEADER
            if self._pending_amqp is not None:
                self._out += self._pending_amqp
                self._pending_amqp = None
            self._expect_header = AMQP_HEADER
            self._phase = _Phase.HEADER
        else:
            raise ConnectionViolation(Condition.NOT_IMPLEMENTED, f"unsupported SASL frame {type(perf).__name__}")

    def _on_amqp_frame(self, frame: framing.Frame) -> None:
        ftype, channel, body = frame
        if not body:
            return  # heartbeat
        if ftype != FRAME_AMQP:
            raise ConnectionViolation(Condition.FRAMING_ERROR, f"frame type {ftype} after SASL")
        perf, offset = decode_performative(body)
        if self.close_received:
            return  # nothing may follow close
        if not self.open_received:
            if type(perf) is not Open:
                raise ConnectionViolation(Condition.ILLEGAL_STATE, f"{type(perf).__name__} before open")
            self._on_open(channel, perf)
            return
        session = self._remote_sessions.get(channel)
        t = type(perf)
        if session is not None and t in _SESSION_FRAMES:
            try:
                if t is Transfer and session.state is _MAPPED:  # the commonest frames, one layer less
                    session.on_transfer(perf, body[offset:], self._events)
                elif t is Disposition and session.state is _MAPPED:
                    session.on_disposition(perf, self._events)
                else:
                    session.on_frame(perf, body[offset:] if t is Transfer else b"", self._events)
            except LinkViolation as exc:
                self._link_failed(exc)
            except SessionViolation as exc:
                self._session_failed(session, exc)
            return
        if t is Begin:
            self._on_begin(channel, perf)
        elif t is End:
            self._on_end(channel, perf)
        elif t is Close:
            self._on_close(perf)
        elif t is Open:
            raise ConnectionViolation(Condition.ILLEGAL_STATE, "second open")
        elif isinstance(perf, Performative) and perf.CODE >= 0x40:
            raise ConnectionViolation(Condition.FRAMING_ERROR, "SASL frame after SASL negotiation")
        elif channel in self._ended_remote_channels:
            return  # frames after the peer's end (e.g. the SDK's late management detaches)
        else:
            raise ConnectionViolation(Condition.NOT_FOUND, f"{t.__name__} on unused channel {channel}")

    def _on_open(self, channel: int, perf: Open) -> None:
        if channel != 0:
            raise ConnectionViolation(Condition.NOT_ALLOWED, "open on a channel other than 0")
        if perf.max_frame_size < framing.MIN_MAX_FRAME_SIZE:
            raise ConnectionViolation(Condition.INVALID_FIELD, "max-frame-size below 512")
        self.open_received = True
        self._transfer_runs = self.transfer_runs
        self._reader.max_frame_size = self.max_frame_size
        self.remote_open = perf
        self.remote_max_frame_size = min(perf.max_frame_size, 0xFFFFFFFF)
        self.remote_channel_max = perf.channel_max
        self.remote_idle_timeout = perf.idle_time_out / 1000 if perf.idle_time_out else None
        self._events.append(ConnectionOpened(perf))

    def _on_close(self, perf: Close) -> None:
        self.close_received = True
        self._transfer_runs = False  # nothing may follow close: the layered path discards it
        self.error = perf.error
        reply_needed = not self.close_sent
        if not reply_needed:
            self._phase = _Phase.DONE
        self._events.append(ConnectionClosed(perf.error, by_peer=True, reply_needed=reply_needed))

    def _on_begin(self, channel: int, begin: Begin) -> None:
        if channel > self.channel_max:  # 2.7.1: outside the supported range, close with framing-error
            limit = self.channel_max
            raise ConnectionViolation(Condition.FRAMING_ERROR, f"channel {channel} above channel-max {limit}")
        if channel in self._remote_sessions:
            raise ConnectionViolation(Condition.ILLEGAL_STATE, f"channel {channel} already has a session")
        self._ended_remote_channels.discard(channel)
        if begin.remote_channel is not None:
            session = self._local_sessions.get(begin.remote_channel)
            if session is not None and session.state is SessionState.BEGIN_SENT:
                session.on_begin(begin, channel)
                self._remote_sessions[channel] = session
                self._events.append(SessionBegun(session, begin))
                return
            # A session-level error (the channel is free and the begin well formed): that session is refused,
            # answered and ended at once, and the application never hears of it but for the end.
            session = Session(self, handle_max=self.handle_max)
            session.on_begin(begin, channel)
            self._remote_sessions[channel] = session
            self._session_failed(session, SessionViolation(Condition.ILLEGAL_STATE, "begin answers no begin of ours"))
            return
        session = Session(self, handle_max=self.handle_max)
        session.on_begin(begin, channel)
        self._remote_sessions[channel] = session
        self._events.append(SessionBeginRequested(session, begin))

    def _on_end(self, channel: int, end: End) -> None:
        session = self._remote_sessions.pop(channel, None)
        if session is None:
            if channel in self._ended_remote_channels:
                return
            raise ConnectionViolation(Condition.NOT_FOUND, f"end on unused channel {channel}")
        self._ended_remote_channels.add(channel)
        reply_needed = session.on_end()
        if session.state is SessionState.ENDED and session.local_channel is not None:
            self._local_sessions.pop(session.local_channel, None)
        self._events.append(SessionEnded(session, end.error, by_peer=True, reply_needed=reply_needed))

    def _session_failed(self, session: Session, exc: SessionViolation) -> None:
        """End a session after a session-level violation by the peer (2.5.5: end with the error). A session the
        application has not answered yet is answered first (the peer must learn which channel ends); the
        application's own answer to its ``SessionBeginRequested``, still to come, is then stale (``begin``)."""
        err = Error(exc.condition, exc.description)
        state = session.state
        if state is SessionState.BEGIN_RCVD and session.local_channel is None:
            self.begin(session)
            state = session.state
        if state is _MAPPED and session.local_channel is not None:
            session.local_end()
            self._send(session.local_channel, End(error=err))
            self._events.append(SessionEnded(session, err, by_peer=False, reply_needed=False))
        else:
            raise ConnectionViolation(exc.condition, exc.description)

    def _link_failed(self, exc: LinkViolation) -> None:
        """Detach a link after a link-level violation by the peer (2.6.6: detach closed with the error). A link
        the application has not answered yet gets its attach first, with null source and target (2.6.3: an
        attach is answered before its detach); the application's own answer, still to come, is then stale."""
        link = exc.link
        if not (
            link.state is _LINK_ATTACHED or link.state is LinkState.ATTACH_SENT or link.state is LinkState.ATTACH_RCVD
        ):
            return
        if link.session.state is not _MAPPED:  # its session is not answered yet either: refuse the session
            self._session_failed(link.session, SessionViolation(exc.condition, exc.description))
            return
        err = Error(exc.condition, exc.description)
        self.detach(link, closed=True, error=err)
        self._events.append(LinkDetached(link, True, err, False, False))

    def _fail(self, condition: str, description: str) -> None:
        """Close after a violation by the peer: send close(error) and finish."""
        if self._phase is _Phase.DONE:
            return
        err = Error(Symbol(condition), description)
        if self._phase is _Phase.AMQP and not self.close_sent:
            if not self.open_sent:
                self.open()
            self.close_sent = True
            self._send(0, Close(error=err))
        self._events.clear()  # what this read brought before the violation is moot now (see the module doc)
        self._finish(err, by_peer=False)

    def _finish(self, error: Error | None, by_peer: bool) -> None:
        self.error = error
        self._phase = _Phase.DONE
        if self._pending_amqp is not None:
            self._pending_amqp = None
        self._events.append(ConnectionClosed(error, by_peer=by_peer, reply_needed=False))

    def _transport_lost(self) -> None:
        if self._phase is _Phase.DONE:
            return
        if self.close_received or self.close_sent:
            self._phase = _Phase.DONE
            if not self.close_received:
                self._events.append(ConnectionClosed(None, by_peer=True, reply_needed=False))
            return
        self._finish(None, by_peer=True)
