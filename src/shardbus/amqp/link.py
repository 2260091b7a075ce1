"""Link endpoint state machine (AMQP 1.0 part 2.6): attach/detach, credit, delivery-count, reassembly.

Theory of operation
-------------------
A ``Link`` is one end of a link; ``role`` is *our* role (``SENDER``/``RECEIVER``). Its attach state moves:

    DETACHED --local attach--> ATTACH_SENT --peer attach--> ATTACHED
    DETACHED --peer attach---> ATTACH_RCVD --local attach--> ATTACHED
    ATTACHED --local detach--> DETACH_SENT --peer detach--> DETACHED
    ATTACHED --peer detach---> DETACH_RCVD --local detach--> DETACHED

Flow control follows 2.6.7. Both ends keep ``delivery_count`` and ``link_credit``. The sender spends one credit
and advances delivery-count per delivery; a receiver's ``flow`` re-bases the sender's credit as
``delivery_count_rcv + link_credit_rcv - delivery_count_snd``; a sender's ``flow`` re-bases the receiver's credit
the other way round (that is how a completed drain becomes visible). All arithmetic is RFC 1982 serial on 32 bits.

Incoming transfers are reassembled here: frames with ``more=true`` are buffered until the last one, and the
complete payload is returned once. Message size is bounded by ``max_message_size`` (ours, if non-zero, as our
attach advertised it), by ``format_limits`` (a lower bound for some message formats, e.g. batches) and by the
connection's hard limit. A delivery is refused as soon as its accumulated size passes the bound: its buffered
chunks are dropped at once, the delivery is reported (``TOO_LARGE``) for the application to reject, and the
frames that still follow for it are counted and discarded, so a peer never makes us hold more than the bound.

The session (``session.py``) routes frames to links and owns handles and delivery ids; the connection
(``connection.py``) owns the wire. Only this module changes a link's ``state``. A run of plain single-frame
transfers (``transfer_run.py``: a sender's steady state, taken in one loop because the layers cost four or five
calls and as many objects per frame) spends credit and records unsettled deliveries as ``on_transfer`` does for
them; every other transfer comes here.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from .errors import Condition, LinkViolation, LocalProtocolError, SessionViolation
from .performatives import RECEIVER, SENDER, Attach, Flow, SndSettleMode, Transfer

if TYPE_CHECKING:
    from .session import Session

__all__ = ["ABORTED", "TOO_LARGE", "Link", "LinkState"]

_MASK = 0xFFFFFFFF

ABORTED = 1
"""Outcome flag of ``Link.on_transfer``: the sender aborted the delivery."""
TOO_LARGE = 2
"""Outcome flag of ``Link.on_transfer``: the delivery passed the size bound."""
# A delivery of several frames is kept as its frames, joined once at its end, up to this many bytes (the SDK's
# 1 MB batches); past it, in one growing buffer (see ``on_transfer``).
JOIN_BELOW = 8 * 1024 * 1024


def serial_diff(a: int, b: int) -> int:
    """``a - b`` in 32-bit serial-number arithmetic (RFC 1982), as a signed int."""
    d = (a - b) & _MASK
    return d - 0x100000000 if d & 0x80000000 else d


class LinkState(enum.Enum):
    """Attach/detach state of a link end."""

    DETACHED = "DETACHED"
    ATTACH_SENT = "ATTACH_SENT"
    ATTACH_RCVD = "ATTACH_RCVD"
    ATTACHED = "ATTACHED"
    DETACH_SENT = "DETACH_SENT"
    DETACH_RCVD = "DETACH_RCVD"


# Members that per-delivery code compares with, as module constants: in Python 3.11 reading a member off an
# Enum class costs about ten times a global (EnumType defines __getattr__, which slows every class attribute).
_ATTACHED = LinkState.ATTACHED
_DETACH_SENT = LinkState.DETACH_SENT


class Link:
    """One link end. Read its attributes freely; change it only through ``Connection`` methods.

    The methods below the properties (``local_attach``, ``on_attach``, ``local_detach``, ``on_detach``,
    ``on_flow``, ``flow_fields``, ``set_credit``, ``complete_drain``, ``spend_credit``, ``spend_credits``,
    ``on_transfer``) are the engine's internal interface: its ``Session`` and ``Connection`` call them, the
    application never does."""

    __slots__ = (
        "_partial",
        "_partial_size",
        "available",
        "delivery_count",
        "drain",
        "format_limits",
        "handle",
        "initial_delivery_count",
        "link_credit",
        "max_message_size",
        "name",
        "properties",
        "rcv_settle_mode",
        "remote_attach",
        "remote_handle",
        "role",
        "session",
        "snd_settle_mode",
        "source",
        "state",
        "target",
        "unsettled",
    )

    def __init__(self, session: Session, name: str, role: bool) -> None:
        self.session = session
        self.name = name
        self.role = role
        self.state = LinkState.DETACHED
        self.handle: int | None = None
        self.remote_handle: int | None = None
        self.snd_settle_mode = SndSettleMode.MIXED
        self.rcv_settle_mode = 0
        self.source: Any = None
        self.target: Any = None
        self.properties: dict[Any, Any] | None = None
        self.max_message_size = 0
        self.format_limits: dict[int, int] | None = None
        """Lower size bounds for some message formats (message-format -> bytes), e.g. for batches."""
        self.initial_delivery_count = 0
        self.remote_attach: Attach | None = None
        self.delivery_count = 0
        self.link_credit = 0
        self.available = 0
        self.drain = False
        self.unsettled: dict[bytes, int] = {}
        """Unsettled deliveries on this link: delivery-tag -> delivery-id."""
        self._partial: list[Any] | None = None  # [delivery_id, tag, format, settled, state, chunks, batchable]
        self._partial_size = 0

    def __repr__(self) -> str:
        role = "receiver" if self.role else "sender"
        return f"<Link {self.name!r} {role} handle={self.handle} {self.state.value} credit={self.link_credit}>"

    @property
    def is_sender(self) -> bool:
        """True when we send on this link."""
        return not self.role

    @property
    def credit(self) -> int:
        """Deliveries we may still send (sender) or have granted (receiver)."""
        return self.link_credit

    @property
    def attached(self) -> bool:
        """Both attaches exchanged and no detach yet."""
        return self.state is _ATTACHED

    @property
    def remote_source(self) -> Any:
        """The source from the peer's attach (``None`` before it arrived)."""
        return self.remote_attach.source if self.remote_attach else None

    @property
    def remote_target(self) -> Any:
        """The target from the peer's attach."""
        return self.remote_attach.target if self.remote_attach else None

    # ------------------------------------------------------------------------------------ attach / detach

    def _make_attach(self) -> Attach:
        handle = self.handle
        if handle is None:  # the session assigns one before our attach (Session.local_attach)
            raise LocalProtocolError(f"link {self.name!r} has no handle")
        return Attach(
            name=self.name,
            handle=handle,
            role=self.role,
            snd_settle_mode=self.snd_settle_mode,
            rcv_settle_mode=self.rcv_settle_mode,
            source=self.source,
            target=self.target,
            initial_delivery_count=self.initial_delivery_count if self.role == SENDER else None,
            max_message_size=self.max_message_size or None,
            properties=self.properties,
        )

    def local_attach(self) -> Attach:
        if self.state is LinkState.DETACHED:
            self.state = LinkState.ATTACH_SENT
        elif self.state is LinkState.ATTACH_RCVD:
            self.state = LinkState.ATTACHED
        elif self.state is not LinkState.DETACH_RCVD:  # DETACH_RCVD: answering an attach the peer took back
            raise LocalProtocolError(f"cannot attach link in state {self.state.value}")
        if self.role == SENDER:
            self.delivery_count = self.initial_delivery_count
        return self._make_attach()

    def on_attach(self, attach: Attach) -> None:
        """Record the peer's attach (new link or answer to ours)."""
        if self.state is LinkState.DETACHED:
            self.state = LinkState.ATTACH_RCVD
            self.snd_settle_mode = attach.snd_settle_mode
            self.rcv_settle_mode = attach.rcv_settle_mode
        elif self.state is LinkState.ATTACH_SENT:
            self.state = LinkState.ATTACHED
        else:
            raise SessionViolation(Condition.HANDLE_IN_USE, f"unexpected attach for link {self.name!r}")
        self.remote_attach = attach
        self.remote_handle = attach.handle
        if self.role == RECEIVER and attach.initial_delivery_count is not None:
            self.delivery_count = attach.initial_delivery_count

    def local_detach(self) -> None:
        if self.state in (LinkState.ATTACHED, LinkState.ATTACH_SENT, LinkState.ATTACH_RCVD):
            self.state = LinkState.DETACH_SENT
        elif self.state is LinkState.DETACH_RCVD:
            self.state = LinkState.DETACHED
        else:
            raise LocalProtocolError(f"cannot detach link in state {self.state.value}")
        self._partial = None

    def on_detach(self) -> bool:
        """Record the peer's detach; returns True if we still have to answer."""
        self._partial = None
        if self.state is LinkState.DETACH_SENT:
            self.state = LinkState.DETACHED
            return False
        self.state = LinkState.DETACH_RCVD
        return True

    # ---------------------------------------------------------------------------------------------- flow

    def on_flow(self, flow: Flow) -> None:
        """Re-base credit from the peer's link flow state (2.6.7)."""
        if self.role == SENDER:
            dc_rcv = self.initial_delivery_count if flow.delivery_count is None else flow.delivery_count
            credit = 0 if flow.link_credit is None else flow.link_credit
            self.link_credit = max(0, serial_diff((dc_rcv + credit) & _MASK, self.delivery_count))
            self.drain = bool(flow.drain)
        else:
            if flow.delivery_count is not None:
                limit = (self.delivery_count + self.link_credit) & _MASK
                self.delivery_count = flow.delivery_count
                self.link_credit = max(0, serial_diff(limit, flow.delivery_count))
                if self.link_credit == 0:
                    self.drain = False
            if flow.available is not None:
                self.available = flow.available

    def flow_fields(self) -> dict[str, Any]:
        """Link fields of an outgoing flow (the session adds its own)."""
        return {
            "handle": self.handle,
            "delivery_count": self.delivery_count,
            "link_credit": self.link_credit,
            "available": self.available if self.role == SENDER else None,
            "drain": self.drain,
        }

    def set_credit(self, credit: int, drain: bool) -> None:
        if self.role == SENDER:
            raise LocalProtocolError("only a receiving link grants credit")
        self.link_credit = credit
        self.drain = drain

    def complete_drain(self) -> None:
        """Sender has nothing more to send under drain: consume all credit (2.6.7)."""
        if self.role != SENDER:
            raise LocalProtocolError("only a sending link completes a drain")
        self.delivery_count = (self.delivery_count + self.link_credit) & _MASK
        self.link_credit = 0

    # ------------------------------------------------------------------------------------------ delivery

    def spend_credit(self) -> None:
        self.delivery_count = (self.delivery_count + 1) & _MASK
        if self.link_credit > 0:
            self.link_credit -= 1

    def spend_credits(self, count: int) -> None:
        """``spend_credit`` for ``count`` deliveries sent together."""
        self.delivery_count = (self.delivery_count + count) & _MASK
        self.link_credit = max(0, self.link_credit - count)

    def on_transfer(self, t: Transfer, payload: bytes, size_limit: int) -> tuple[Any, ...] | None:
        """Feed one transfer frame. Returns the completed delivery as
        ``(delivery_id, tag, format, settled, state, payload, batchable, flag)`` or None while incomplete (or
        while the rest of a refused delivery is discarded). ``flag`` is 0, ``ABORTED``, or ``TOO_LARGE`` (reported
        once, on the frame that passed the bound; ``payload`` is then ``(size seen so far, bound)``)."""
        if self.role == SENDER:
            raise SessionViolation(Condition.ERRANT_LINK, f"transfer received on our sending link {self.name!r}")
        if self.state is not _ATTACHED:
            if self.state is _DETACH_SENT:
                return None  # in flight while we detach: discard
            if self.state is LinkState.ATTACH_RCVD:  # before our attach, so before any credit: this link's error
                raise LinkViolation(
                    self, Condition.TRANSFER_LIMIT_EXCEEDED, "transfer before the link was attached and given credit"
                )
            raise SessionViolation(Condition.ILLEGAL_STATE, f"transfer on link in state {self.state.value}")
        p = self._partial
        if p is None:
            if t.delivery_id is None or t.delivery_tag is None:
                raise LinkViolation(self, Condition.INVALID_FIELD, "first transfer needs delivery-id and tag")
            if self.format_limits is not None:
                own = self.format_limits.get(t.message_format or 0)
                if own is not None and own < size_limit:
                    size_limit = own
            if not t.more and not t.aborted:  # fast path: single-frame delivery
                self.delivery_count = (self.delivery_count + 1) & _MASK  # _spend_credit, inlined
                if self.link_credit > 0:
                    self.link_credit -= 1
                n = len(payload)
                if n <= size_limit:
                    return (
                        t.delivery_id,
                        t.delivery_tag,
                        t.message_format or 0,
                        t.settled is True,  # None (absent) is False; the decoders give nothing else
                        t.state,
                        payload,
                        t.batchable,
                        0,
                    )
                return (
                    t.delivery_id,
                    t.delivery_tag,
                    t.message_format or 0,
                    t.settled is True,
                    t.state,
                    (n, size_limit),
                    t.batchable,
                    TOO_LARGE,
                )
            p = self._partial = [
                t.delivery_id,
                t.delivery_tag,
                t.message_format or 0,
                bool(t.settled),
                t.state,
                [],  # what arrived (frames, or a bytearray); None once refused and the rest is being discarded
                t.batchable,
                size_limit,
            ]
            self._partial_size = 0
        elif t.delivery_id is not None and t.delivery_id != p[0]:
            raise LinkViolation(self, Condition.INVALID_FIELD, "continuation transfer with another delivery-id")
        else:
            if t.settled:
                p[3] = True
            if t.state is not None:
                p[4] = t.state
        received = p[5]
        if t.aborted:
            self._partial = None
            self.spend_credit()
            return None if received is None else (p[0], p[1], p[2], p[3], p[4], b"", p[6], ABORTED)
        self._partial_size += len(payload)
        if received is None:  # refused already: count and drop what still comes of it
            if not t.more:
                self._partial = None
                self.spend_credit()
            return None
        if self._partial_size > p[7]:
            p[5] = None  # free what was buffered now, not when the last frame comes
            if not t.more:
                self._partial = None
                self.spend_credit()
            return (p[0], p[1], p[2], p[3], p[4], (self._partial_size, p[7]), p[6], TOO_LARGE)
        # Frames joined at the end cost one copy into fresh memory; a growing buffer two (its growth, then the
        # ``bytes``), 0.7 us per message of an SDK batch of 1000. But past ``JOIN_BELOW`` one growing buffer: it grows
        # in place (realloc, mremap), so a 100 MB delivery costs its own size plus the final copy, and no heap of
        # frame-sized blocks lingers after it.
        if type(received) is list:
            received.append(payload)
            if self._partial_size > JOIN_BELOW:
                p[5] = bytearray().join(received)
        else:
            received += payload
        if t.more:
            return None
        self._partial = None
        self.spend_credit()
        received = p[5]
        whole = b"".join(received) if type(received) is list else bytes(received)
        return (p[0], p[1], p[2], p[3], p[4], whole, p[6], 0)
