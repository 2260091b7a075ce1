"""Session endpoint state machine (AMQP 1.0 part 2.5): begin/end, windows, handles, delivery ids.

Theory of operation
-------------------
A ``Session`` is mapped to one local channel (ours, used in frames we send) and one remote channel (the peer's,
seen on frames we receive). Its state moves:

    UNMAPPED --local begin--> BEGIN_SENT --peer begin--> MAPPED
    UNMAPPED --peer begin---> BEGIN_RCVD --local begin--> MAPPED
    MAPPED   --local end----> END_SENT   --peer end----> ENDED
    MAPPED   --peer end-----> END_RCVD   --local end----> ENDED

In END_SENT every frame but ``end`` is discarded (the peer may not have seen our end yet). After the peer's
``end`` the connection forgets the remote channel but remembers that it was ended, so frames that still arrive
on it (the Azure SDK sends management detaches *after* its end) are ignored rather than treated as errors.

Session flow control (2.5.6) counts transfer *frames*: ``next_outgoing_id``/``remote_incoming_window`` limit what
we send, ``next_incoming_id``/``incoming_window`` what we accept. When our incoming window falls below half of
its configured size the session refreshes it with a ``flow`` automatically (``auto_flow``), so the application
only deals with link credit. Delivery ids (per session, per direction) and the unsettled maps also live here.

Frames arrive through ``on_frame``/``on_transfer`` and ``on_begin``/``on_end`` (called by the connection),
except plain single-frame transfers in a run, which ``transfer_run.take_transfers`` takes in one loop (a sender's
steady state, where the layers cost four or five calls and as many objects per frame): it makes
the same changes to the window, the ids and the unsettled map as ``on_transfer``, which takes every other transfer;
application actions come through the ``Connection`` methods, which call the ``local_*`` methods here and put the
returned performatives on the wire. Those methods, without a leading underscore but not for the application, are
the engine's internal interface between connection, session and link (each typed; the rest stays private here).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import Condition, ConnectionViolation, LocalProtocolError, SessionViolation
from .events import (
    DeliveryAborted,
    DeliveryReceived,
    DeliveryRef,
    DeliveryTooLarge,
    DispositionReceived,
    Event,
    FlowReceived,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
)
from .link import ABORTED, Link, LinkState, serial_diff
from .performatives import (
    RECEIVER,
    SENDER,
    Attach,
    Begin,
    Composite,
    Detach,
    Disposition,
    Flow,
    Transfer,
)

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Session", "SessionState"]

_MASK = 0xFFFFFFFF
_new_ref = tuple.__new__  # DeliveryRef(...) without the NamedTuple's Python-level __new__
_new_event = object.__new__


class SessionState(enum.Enum):
    """Begin/end state of a session end."""

    UNMAPPED = "UNMAPPED"
    BEGIN_SENT = "BEGIN_SENT"
    BEGIN_RCVD = "BEGIN_RCVD"
    MAPPED = "MAPPED"
    END_SENT = "END_SENT"
    END_RCVD = "END_RCVD"
    ENDED = "ENDED"


# Members that per-delivery code compares with, as module constants: in Python 3.11 reading a member off an
# Enum class costs about ten times a global (EnumType defines __getattr__, which slows every class attribute).
_MAPPED = SessionState.MAPPED
_END_SENT = SessionState.END_SENT
_END_RCVD = SessionState.END_RCVD


def _ids(first: int, last: int, count: int) -> Iterable[int]:
    """The delivery ids ``first`` .. ``last`` (``count`` = ``(last - first) & _MASK``), wrapped as serial numbers: a
    range's ints as they are (one object each, where ``(first + i) & _MASK`` made two) unless the range wraps."""
    if first <= last:
        return range(first, last + 1)
    return [(first + i) & _MASK for i in range(count + 1)]


class Session:
    """One session end. Read its attributes freely; act through ``Connection`` methods."""

    def __init__(
        self,
        connection: Connection,
        *,
        incoming_window: int = 65536,
        outgoing_window: int = 0x7FFFFFFF,
        handle_max: int = 0xFFFFFFFF,
        auto_flow: bool = True,
    ) -> None:
        self.connection = connection
        self.state = SessionState.UNMAPPED
        self.local_channel: int | None = None
        self.remote_channel: int | None = None
        self.remote_begin: Begin | None = None
        self.properties: dict[Any, Any] | None = None
        # session flow control (2.5.6)
        self.next_outgoing_id = 0
        self.configured_incoming_window = incoming_window
        self.incoming_window = incoming_window
        self.outgoing_window = outgoing_window
        self.next_incoming_id: int | None = None
        self.remote_incoming_window = 0
        self.remote_outgoing_window = 0
        self.handle_max = handle_max
        self.remote_handle_max = 0xFFFFFFFF
        self.auto_flow = auto_flow
        # deliveries
        self.next_delivery_id = 0
        self.outgoing_unsettled: dict[int, DeliveryRef] = {}
        self.incoming_unsettled: dict[int, DeliveryRef] = {}
        # links
        self.links: dict[tuple[str, bool], Link] = {}
        self._by_handle: dict[int, Link] = {}
        self._by_remote_handle: dict[int, Link] = {}

    def __repr__(self) -> str:
        return f"<Session local={self.local_channel} remote={self.remote_channel} {self.state.value}>"

    @property
    def mapped(self) -> bool:
        """Both begins exchanged and no end yet."""
        return self.state is _MAPPED

    # ------------------------------------------------------------------------------------- begin / end

    def _make_begin(self) -> Begin:
        return Begin(
            remote_channel=self.remote_channel,
            next_outgoing_id=self.next_outgoing_id,
            incoming_window=self.incoming_window,
            outgoing_window=self.outgoing_window,
            handle_max=self.handle_max,
            properties=self.properties,
        )

    def local_begin(self) -> Begin:
        if self.state is SessionState.UNMAPPED:
            self.state = SessionState.BEGIN_SENT
        elif self.state is SessionState.BEGIN_RCVD:
            self.state = SessionState.MAPPED
        elif self.state is SessionState.END_RCVD and self.local_channel is None:
            pass  # the peer ended before we answered its begin: answer it, then its end
        else:
            raise LocalProtocolError(f"cannot begin session in state {self.state.value}")
        return self._make_begin()

    def on_begin(self, begin: Begin, channel: int) -> None:
        if self.state is SessionState.UNMAPPED:
            self.state = SessionState.BEGIN_RCVD
        elif self.state is SessionState.BEGIN_SENT:
            self.state = SessionState.MAPPED
        else:
            raise SessionViolation(Condition.ILLEGAL_STATE, "unexpected begin")
        self.remote_begin = begin
        self.remote_channel = channel
        self.next_incoming_id = begin.next_outgoing_id
        self.remote_incoming_window = begin.incoming_window
        self.remote_outgoing_window = begin.outgoing_window
        self.remote_handle_max = begin.handle_max

    def local_end(self) -> None:
        if self.state in (SessionState.MAPPED, SessionState.BEGIN_SENT, SessionState.BEGIN_RCVD):
            self.state = SessionState.END_SENT
        elif self.state is SessionState.END_RCVD:
            self.state = SessionState.ENDED
        else:
            raise LocalProtocolError(f"cannot end session in state {self.state.value}")
        self._forget_links()

    def on_end(self) -> bool:
        """Record the peer's end; True if we still have to answer."""
        if self.state is SessionState.END_SENT:
            self.state = SessionState.ENDED
            self._forget_links()
            return False
        self.state = SessionState.END_RCVD
        return True

    def _forget_links(self) -> None:
        for link in self.links.values():
            link.state = LinkState.DETACHED
        self._by_remote_handle.clear()
        if self.state is SessionState.ENDED:
            self.links.clear()
            self._by_handle.clear()

    # ------------------------------------------------------------------------------------- link control

    def new_link(self, name: str, role: bool) -> Link:
        key = (name, role)
        if key in self.links:
            raise LocalProtocolError(f"a {'receiver' if role else 'sender'} link named {name!r} already exists")
        link = Link(self, name, role)
        self.links[key] = link
        return link

    def _assign_handle(self, link: Link) -> None:
        h = 0
        while h in self._by_handle:
            h += 1
        if h > self.remote_handle_max:
            raise LocalProtocolError("no free link handle below the peer's handle-max")
        link.handle = h
        self._by_handle[h] = link

    def local_attach(self, link: Link) -> Attach:
        if self.state not in (SessionState.MAPPED, SessionState.BEGIN_SENT):
            raise LocalProtocolError(f"cannot attach on a session in state {self.state.value}")
        if link.handle is None:
            self._assign_handle(link)
        return link.local_attach()

    def local_detach(self, link: Link, closed: bool, error: Any) -> Detach:
        handle = link.handle
        if handle is None:
            raise LocalProtocolError(f"link {link.name!r} was never attached by us")
        link.local_detach()
        d = Detach(handle=handle, closed=closed, error=error)
        if link.state is LinkState.DETACHED:
            self._release(link)
        return d

    def _release(self, link: Link) -> None:
        if link.handle is not None:
            self._by_handle.pop(link.handle, None)
        if link.remote_handle is not None and self._by_remote_handle.get(link.remote_handle) is link:
            del self._by_remote_handle[link.remote_handle]
        self.links.pop((link.name, link.role), None)
        for tag, did in link.unsettled.items():
            if link.role == SENDER:
                self.outgoing_unsettled.pop(did, None)
            else:
                self.incoming_unsettled.pop(did, None)
            del tag
        link.unsettled.clear()

    # ------------------------------------------------------------------------------------------ flow

    def make_flow(self, link: Link | None = None, echo: bool = False) -> Flow:
        f = Flow(
            next_incoming_id=self.next_incoming_id,
            incoming_window=self.incoming_window,
            next_outgoing_id=self.next_outgoing_id,
            outgoing_window=self.outgoing_window,
            echo=echo,
        )
        if link is not None:
            if link.handle is None:
                raise LocalProtocolError("link has no handle")
            lf = link.flow_fields()
            f.handle = lf["handle"]
            f.delivery_count = lf["delivery_count"]
            f.link_credit = lf["link_credit"]
            f.available = lf["available"]
            f.drain = lf["drain"]
        return f

    # ------------------------------------------------------------------------------------- transfers out

    def check_can_send(self, link: Link, frames: int, ignore_credit: bool) -> None:
        if link.role != SENDER:
            raise LocalProtocolError("cannot send on a receiving link")
        if not link.attached:
            raise LocalProtocolError(f"link {link.name!r} is {link.state.value}, not ATTACHED")
        if self.state is not _MAPPED:
            raise LocalProtocolError(f"session is {self.state.value}")
        if not ignore_credit:
            if link.link_credit <= 0:
                raise LocalProtocolError(f"no link credit on {link.name!r}")
            if self.remote_incoming_window < frames:
                raise LocalProtocolError("the peer's session incoming window is exhausted")

    def sent_transfer_frames(self, n: int) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + n) & _MASK
        self.remote_incoming_window -= n

    def record_sent_delivery(self, link: Link, delivery_id: int, tag: bytes, settled: bool) -> None:
        link.spend_credit()
        if not settled:
            self.outgoing_unsettled[delivery_id] = _new_ref(DeliveryRef, (link, delivery_id, tag))
            link.unsettled[tag] = delivery_id

    def record_sent_deliveries(self, link: Link, first: int, tags: list[bytes], settled: bool) -> None:
        """``record_sent_delivery`` for deliveries ``first``, ``first + 1``, ... sent in one pass, one per tag
        (their frames are counted with ``sent_transfer_frames``)."""
        link.spend_credits(len(tags))
        if not settled:
            unsettled, by_tag, did = self.outgoing_unsettled, link.unsettled, first
            for tag in tags:
                unsettled[did] = _new_ref(DeliveryRef, (link, did, tag))
                by_tag[tag] = did
                did = (did + 1) & _MASK

    # ----------------------------------------------------------------------------------- dispositions

    def _settle_range(self, mine: dict[int, DeliveryRef], first: int, last: int, pop: bool) -> list[DeliveryRef]:
        if first == last:  # the common case: one delivery
            ref = mine.pop(first, None) if pop else mine.get(first)
            if ref is None:
                return []
            if pop:
                ref.link.unsettled.pop(ref.delivery_tag, None)
            return [ref]
        count = (last - first) & _MASK
        out: list[DeliveryRef] = []
        if not mine:
            return out
        if count < len(mine):
            if pop:  # a range we settle: each delivery is forgotten as it is found
                take = mine.pop
                for did in _ids(first, last, count):
                    ref = take(did, None)
                    if ref is not None:
                        out.append(ref)
                        ref.link.unsettled.pop(ref.delivery_tag, None)
                return out
            for did in _ids(first, last, count):
                ref = mine.get(did)
                if ref is not None:
                    out.append(ref)
        else:
            for did in [d for d in mine if ((d - first) & _MASK) <= count]:
                out.append(mine.pop(did) if pop else mine[did])
        if pop:
            for ref in out:
                ref.link.unsettled.pop(ref.delivery_tag, None)
        return out

    def local_settle(self, link: Link, first: int, last: int, settled: bool) -> None:
        """Check that a disposition may be sent on ``link`` and forget the deliveries it settles."""
        if self.state is not _MAPPED:
            raise LocalProtocolError(f"session is {self.state.value}")
        if settled:
            mine = self.outgoing_unsettled if link.role == SENDER else self.incoming_unsettled
            if first == last:  # one delivery (an echo of the SDK's settlement): ``_settle_range``'s first case
                ref = mine.pop(first, None)
                if ref is not None:
                    ref.link.unsettled.pop(ref.delivery_tag, None)
            else:
                self._settle_range(mine, first, last, True)

    # ------------------------------------------------------------------------------------ frames in

    def _send_own(self, perf: Composite) -> None:
        """Put a frame the session produces by itself (echo/window flows) on the wire."""
        self.connection.send_for_session(self, perf)

    def _link_for(self, handle: int) -> Link:
        link = self._by_remote_handle.get(handle)
        if link is None:
            raise SessionViolation(Condition.UNATTACHED_HANDLE, f"no link attached with handle {handle}")
        return link

    def on_frame(self, perf: Composite, payload: bytes, events: list[Event]) -> None:
        """Handle a frame for this session (not begin/end, which the connection routes itself)."""
        if self.state is _END_SENT or self.state is _END_RCVD:
            return  # discarding: the peer has not seen our end yet, or has ended and is winding down
        if isinstance(perf, Disposition):  # a mapped session's dispositions and transfers come straight
            self.on_disposition(perf, events)
        elif isinstance(perf, Transfer):
            self.on_transfer(perf, payload, events)
        elif isinstance(perf, Flow):
            self._on_flow(perf, events)
        elif isinstance(perf, Attach):
            self._on_attach(perf, events)
        elif isinstance(perf, Detach):
            self._on_detach(perf, events)
        else:
            raise SessionViolation(Condition.ILLEGAL_STATE, f"unexpected {type(perf).__name__} on a session")

    def _on_attach(self, a: Attach, events: list[Event]) -> None:
        if a.handle > self.handle_max:
            # 2.7.2: "A peer that receives a handle outside the supported range MUST close the connection with the
            # framing-error error-code."
            raise ConnectionViolation(Condition.FRAMING_ERROR, f"handle {a.handle} above handle-max {self.handle_max}")
        if a.handle in self._by_remote_handle:
            raise SessionViolation(Condition.HANDLE_IN_USE, f"handle {a.handle} is in use")
        our_role = not a.role
        link = self.links.get((a.name, our_role))
        if link is not None and link.state is LinkState.ATTACH_SENT:
            link.on_attach(a)
            self._by_remote_handle[a.handle] = link
            events.append(LinkAttached(link, a))
            return
        if link is not None:
            raise SessionViolation(Condition.HANDLE_IN_USE, f"link {a.name!r} is already attached")
        link = self.new_link(a.name, our_role)
        link.on_attach(a)
        self._by_remote_handle[a.handle] = link
        events.append(LinkAttachRequested(link, a))

    def _on_detach(self, d: Detach, events: list[Event]) -> None:
        link = self._by_remote_handle.get(d.handle)
        if link is None:
            return  # detach for a link we already forgot (refused attach, crossed detaches): harmless
        del self._by_remote_handle[d.handle]
        reply_needed = link.on_detach()
        if link.state is LinkState.DETACHED:
            self._release(link)
        events.append(LinkDetached(link, bool(d.closed), d.error, True, reply_needed))

    def _on_flow(self, f: Flow, events: list[Event]) -> None:
        nid = f.next_incoming_id
        if nid is None:
            nid = 0  # peer has not seen our begin yet: our initial next-outgoing-id
        self.remote_incoming_window = (nid + f.incoming_window - self.next_outgoing_id) & _MASK
        if self.remote_incoming_window & 0x80000000:
            self.remote_incoming_window -= 0x100000000
        self.remote_outgoing_window = f.outgoing_window
        link = None
        if f.handle is not None:
            link = self._link_for(f.handle)
            link.on_flow(f)
        if f.echo:
            self._send_own(self.make_flow(link))
        events.append(FlowReceived(self, link, f))

    def on_transfer(self, t: Transfer, payload: bytes, events: list[Event]) -> None:
        window = self.incoming_window - 1
        if window < 0:
            raise SessionViolation(Condition.WINDOW_VIOLATION, "transfer beyond the incoming window")
        link = self._by_remote_handle.get(t.handle)
        if link is None:
            raise SessionViolation(Condition.UNATTACHED_HANDLE, f"no link attached with handle {t.handle}")
        self.incoming_window = window
        next_id = self.next_incoming_id
        if next_id is not None:
            self.next_incoming_id = (next_id + 1) & _MASK
        self.remote_outgoing_window -= 1
        if self.auto_flow and window * 2 < self.configured_incoming_window:
            self.incoming_window = self.configured_incoming_window
            self._send_own(self.make_flow())
        limit = self.connection.max_message_size
        own_limit = link.max_message_size
        if own_limit and own_limit < limit:
            limit = own_limit
        done = link.on_transfer(t, payload, limit)
        if done is None:
            return
        did, tag, fmt, settled, state, data, batchable, flag = done
        if flag:
            if flag == ABORTED:
                events.append(DeliveryAborted(link, did, tag))
                return
            # TOO_LARGE: unsettled, so that the application can refuse it with a disposition
            if not settled:
                self.incoming_unsettled[did] = _new_ref(DeliveryRef, (link, did, tag))
                link.unsettled[tag] = did
            events.append(DeliveryTooLarge(link, did, tag, settled, fmt, *data))
            return
        if not settled:
            self.incoming_unsettled[did] = _new_ref(DeliveryRef, (link, did, tag))
            link.unsettled[tag] = did
        # ``DeliveryReceived(link, did, tag, settled, fmt, data, state, batchable)`` without the dataclass's Python
        # __init__: every transfer makes one
        e = _new_event(DeliveryReceived)
        e.link = link
        e.delivery_id = did
        e.delivery_tag = tag
        e.settled = settled
        e.message_format = fmt
        e.payload = data
        e.state = state
        e.batchable = batchable
        events.append(e)

    def on_disposition(self, d: Disposition, events: list[Event]) -> None:
        """Handle a disposition of this session (the connection calls it directly while the session is mapped:
        every settlement a client sends comes here, most of them one delivery each)."""
        first = d.first
        last = d.last
        # the peer's role says whose deliveries these are: peer receiver => deliveries we sent
        mine = self.outgoing_unsettled if d.role == RECEIVER else self.incoming_unsettled
        settled = bool(d.settled)
        if last is None or last == first:  # one delivery (the SDK's settlements): ``_settle_range``'s first case
            last = first
            ref = mine.pop(first, None) if settled else mine.get(first)
            if ref is None:
                refs = []
            else:
                refs = [ref]
                if settled:
                    ref.link.unsettled.pop(ref.delivery_tag, None)
        elif serial_diff(last, first) < 0:
            raise SessionViolation(Condition.INVALID_FIELD, "disposition with last < first")
        else:
            refs = self._settle_range(mine, first, last, settled)
        # ``DispositionReceived(self, role, first, last, settled, state, batchable, refs)`` without the dataclass's
        # Python __init__, as for ``DeliveryReceived``
        e = _new_event(DispositionReceived)
        e.session = self
        e.role = d.role
        e.first = first
        e.last = last
        e.settled = settled
        e.state = d.state
        e.batchable = bool(d.batchable)
        e.deliveries = refs
        events.append(e)
