"""Events the engine hands to the application (``Connection.next_events()``).

Naming: ``...Requested`` means the peer initiated something and the application must answer (``open``,
``begin``, ``attach``); past tense means something completed. ``reply_needed`` on the closing events says whether
the application still has to answer with its own ``detach``/``end``/``close``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .link import Link
    from .performatives import Attach, Begin, Error, Flow, Open
    from .session import Session

__all__ = [
    "ConnectionClosed",
    "ConnectionOpened",
    "DeliveryAborted",
    "DeliveryReceived",
    "DeliveryRef",
    "DeliveryTooLarge",
    "DispositionReceived",
    "Event",
    "FlowReceived",
    "LinkAttachRequested",
    "LinkAttached",
    "LinkDetached",
    "SaslInit",
    "SaslOutcome",
    "SessionBeginRequested",
    "SessionBegun",
    "SessionEnded",
]


class Event:
    """Base class of all events."""

    __slots__ = ()


@dataclass(slots=True)
class SaslInit(Event):
    """Server side: the client chose a mechanism. Answer with ``accept_sasl()`` or ``reject_sasl()``.

    For PLAIN, ``authzid``/``username``/``password`` are parsed from the initial response.
    """

    mechanism: str
    initial_response: bytes | None
    hostname: str | None
    authzid: str | None = None
    username: str | None = None
    password: str | None = None


@dataclass(slots=True)
class SaslOutcome(Event):
    """Client side: the server's verdict. On failure a ``ConnectionClosed`` follows."""

    code: int
    additional_data: bytes | None


@dataclass(slots=True)
class ConnectionOpened(Event):
    """The peer's ``open`` arrived. A server answers with ``Connection.open()`` (if it has not yet)."""

    open: Open


@dataclass(slots=True)
class ConnectionClosed(Event):
    """The connection is finished (``by_peer``: the peer sent ``close`` or the transport ended).

    ``error`` is the peer's error, or the error we closed with after a protocol violation. ``reply_needed``:
    answer with ``Connection.close()``. After this event, flush ``data_to_send()`` and close the socket once
    ``Connection.is_done``.
    """

    error: Error | None
    by_peer: bool
    reply_needed: bool = False


@dataclass(slots=True)
class SessionBeginRequested(Event):
    """The peer began a session; answer with ``Connection.begin(session)`` or ``end(session)``."""

    session: Session
    begin: Begin


@dataclass(slots=True)
class SessionBegun(Event):
    """The peer answered our ``begin``."""

    session: Session
    begin: Begin


@dataclass(slots=True)
class SessionEnded(Event):
    """The session is ending: the peer sent ``end`` (``by_peer``) or we ended it after a violation."""

    session: Session
    error: Error | None
    by_peer: bool
    reply_needed: bool


@dataclass(slots=True)
class LinkAttachRequested(Event):
    """The peer attached a new link; answer with ``Connection.attach_reply(link, ...)``."""

    link: Link
    attach: Attach


@dataclass(slots=True)
class LinkAttached(Event):
    """The peer answered our ``attach``. ``attach.source``/``target`` may be null (refusal, detach follows)."""

    link: Link
    attach: Attach


@dataclass(slots=True)
class LinkDetached(Event):
    """The link is detaching: by the peer (``by_peer``) or by us after a link-level violation."""

    link: Link
    closed: bool
    error: Error | None
    by_peer: bool
    reply_needed: bool


@dataclass(slots=True)
class FlowReceived(Event):
    """A ``flow`` arrived. For a sending link, ``link.credit`` now says how many deliveries may be sent; the
    application should honour ``link.drain`` (send what it has, then call ``Connection.drained(link)``)."""

    session: Session
    link: Link | None
    flow: Flow


@dataclass(slots=True)
class DeliveryReceived(Event):
    """A complete delivery (all ``more`` frames joined) arrived on a receiving link."""

    link: Link
    delivery_id: int
    delivery_tag: bytes
    settled: bool
    message_format: int
    payload: bytes
    state: Any = None
    batchable: bool = False


@dataclass(slots=True)
class DeliveryAborted(Event):
    """The sender aborted a multi-frame delivery; its partial payload was discarded."""

    link: Link
    delivery_id: int
    delivery_tag: bytes


@dataclass(slots=True)
class DeliveryTooLarge(Event):
    """A delivery passed its link's size bound (``limit``: the link's ``max_message_size``, a format's lower
    bound, or the connection's hard limit) after ``size`` bytes. What had arrived is dropped, the frames that
    still come for it are discarded; unless ``settled``, refuse it with a ``rejected`` disposition carrying
    ``amqp:link:message-size-exceeded``. The link stays attached."""

    link: Link
    delivery_id: int
    delivery_tag: bytes
    settled: bool
    message_format: int
    size: int
    limit: int


class DeliveryRef(NamedTuple):
    """An unsettled delivery known to the engine (immutable; a named tuple because every unsettled delivery
    sent or received makes one, and a frozen dataclass costs four times as much to build)."""

    link: Link
    delivery_id: int
    delivery_tag: bytes


@dataclass(slots=True)
class DispositionReceived(Event):
    """The peer updated (``settled``: and settled) deliveries ``first..last``.

    ``role`` is the peer's role (True: the peer is the receiver, i.e. these are deliveries we sent).
    ``deliveries`` lists the engine's unsettled deliveries in the range (for ranges of deliveries it knows).
    """

    session: Session
    role: bool
    first: int
    last: int
    settled: bool
    state: Any
    batchable: bool
    deliveries: list[DeliveryRef]
