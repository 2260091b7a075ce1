"""One client connection speaking Service Bus over AMQP 1.0: the bridge between the engine and the core.

Theory of operation
-------------------
``ServiceBusConnection`` owns a sans-IO ``amqp.Connection`` (server role) and reacts to its events. The
transport feeds bytes in and writes ``data_to_send`` out; core futures complete on other threads, so their
results come back through ``schedule`` (the transport's thread-safe callback) before touching the engine.

Every link the client attaches gets a role here, decided by its address (SERVICEBUS_AMQP.md §1.1); each role's
work is a part of this class in its own module (a mixin: the state lives on the connection, listed in
``__init__``), and this module keeps the connection, its sessions, the attach and detach of every link, and the
dispatch of deliveries to the roles:

    $cbs (both directions)          → claims: put-token validates a SAS token and authorizes entity paths
                                       (nodes.py)
    <entity>/$management            → request/response pairs dispatched through ``management.OPERATIONS``
                                       (nodes.py)
    client sender  → queue / topic  → ``_on_send``: decode (single or 0x80013700 batch), route, store, then
                                       settle accepted (or rejected with the domain error's condition)
                                       (sending.py)
    client receiver ← queue / sub   → ``_pump``: on credit, lock messages through a core ``Receiver`` and
                                       transfer them (tag = lock token, .NET byte order); dispositions
                                       settle in the core and are echoed settled with the same outcome
                                       (receiving.py)
    coordinator                     → AMQP transactions: declare, discharge, transactional sends and
                                       settlements over a core ``Transaction`` (coordinator.py)

In memory: per connection, its links (bounded by ``limits.max_links``), the tokens it put (``MAX_TOKENS``), the
sends and completes of the socket read being handled, and what each role keeps (said in its module).

A link to an entity is attached only when the connection holds a token (or PLAIN credentials) covering it with
the right the link needs (Send for senders, Listen for receivers; each ``$management`` operation its own:
``access/authority.py``); otherwise, and for unknown entities, the attach is refused the way the service refuses it
(null source and target, then a detach with the condition), which the SDK turns into the right exception. Limits
(``limits.py``): channel-max and handle-max are announced and enforced by the engine, links per connection here.

Message size: a sender link's attach advertises the entity's largest message as ``max-message-size`` and its
largest batch as ``com.microsoft:max-message-batch-size`` (Namespace.message_size_limits); the engine bounds every
delivery by them while it arrives (a batch by the batch bound) and reports one that passes as
``DeliveryTooLarge``, refused here with ``amqp:link:message-size-exceeded`` (the SDK's ``MessageSizeExceededError``);
nothing of it is stored and the link and connection go on. Links of ``$cbs`` and ``$management`` are bounded by the
namespace's largest message (the connection's hard limit).

Protocol errors: the engine closes the connection (or ends the session, or detaches the link) with the AMQP
condition; here that is logged as one WARNING line naming the connection, and everything the connection held
(receivers, held sessions, transactions, per-link state) is released.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .. import stalltrace
from ..access import sas
from ..access.authority import LISTEN, SEND, Authority, missing_right
from ..access.directory import NamespaceDirectory
from ..amqp import events as ev
from ..amqp.codec import DecodeError
from ..amqp.connection import Connection, Role
from ..amqp.message import BATCH_MESSAGE_FORMAT, decode_message
from ..amqp.performatives import Accepted, Coordinator, Error, Rejected, TransactionalState
from ..amqp.types import Int, Symbol
from ..entity.entity import QueueEntity, TopicEntity
from ..entity.receiver import Receiver
from ..entity.sessions import SessionReceiver
from ..model.authorization import AccessRight
from ..model.errors import QuotaExceeded, ShardbusError, Unauthorized
from ..model.message import Message
from ..namespace import Namespace
from .coordinator import CoordinatorLinks, _Txn
from .limits import DEFAULT_LIMITS, ConnectionLimits
from .links import _SENDER_CREDIT_LOW, CBS, MANAGEMENT_SUFFIX, SENDER_CREDIT, _error, _log_failure, entity_path, log
from .nodes import NodeLinks
from .receiving import ReceiveLinks, _ReceiveLink
from .sending import SendLinks

MAX_BATCH_SIZE_PROPERTY = Symbol("com.microsoft:max-message-batch-size")
WINDOW = 0x7FFFFFFF
_DELIVERY_RECEIVED = ev.DeliveryReceived
_LOGGED_EVENTS = frozenset((ev.LinkAttachRequested, ev.LinkDetached))  # logged (debug) as they come


class ServiceBusConnection(SendLinks, ReceiveLinks, CoordinatorLinks, NodeLinks):
    """The ``EventHandler`` an ``amqp.transport.AmqpProtocol`` drives for one client connection."""

    def __init__(
        self, directory: NamespaceDirectory, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits = DEFAULT_LIMITS
    ) -> None:
        self.amqp = Connection(
            Role.SERVER,
            f"shardbus-{uuid.uuid4()}",
            max_frame_size=1048576,
            channel_max=limits.channel_max,
            idle_timeout=limits.silence_allowed,
            idle_timeout_advertised=limits.idle_timeout,
            handle_max=limits.handle_max,
        )
        self.limits = limits
        self.refusal: str | None = None  # set when the listener is full: the open is answered with a close
        self._links: set[Any] = set()  # every link attached (or being refused) and not yet detached
        self.directory = directory
        self.namespace: Namespace | None = None
        self.authority: Authority | None = None
        self.hostname: str | None = None
        self.loop = loop
        self.protocol: Any = None
        self.authorized: list[sas.SasClaims] = []
        self.plain: tuple[str, str] | None = None  # SASL PLAIN key name and key: rights are looked up per link
        self._receivers: dict[Any, _ReceiveLink] = {}
        self._senders: dict[Any, QueueEntity | TopicEntity] = {}
        self._cbs_out: dict[Any, Any] = {}  # session -> our sending $cbs link
        self._mgmt_out: dict[tuple[Any, str], Any] = {}  # (session, node) -> our sending management link
        self._mgmt_receivers: dict[tuple[int, int], Receiver] = {}
        self._sessions: dict[tuple[int, str], SessionReceiver] = {}  # held sessions, for $management calls
        # a read's sends by entity, in arrival order: (entity, events, their messages)
        self._pending_sends: dict[Any, tuple[Any, list[ev.DeliveryReceived], list[list[Message]]]] = {}
        self._sends_read_at = (0.0, 0.0)  # (``stalltrace.SENDS``) when the read came and its first send was decoded
        # a read's accepts: (ref, receiver, lock token's int, settled), or a range's run of one link as
        # (refs, receiver, their ints, settled) (``ReceiveLinks._on_disposition``)
        self._pending_completes: list[tuple[Any, Any, Any, bool]] = []
        # accepted echoes of remote partitions' verdicts, by session, sent once a ``_later`` batch has run
        # (``ReceiveLinks._group_verdict``): cleared every batch, so at most one batch's deliveries
        self._verdict_echoes: dict[int, tuple[Any, list[int]]] = {}
        self._watched: Future | None = None  # the settlement write ``_log_failure_of`` saw last
        self._coordinators: set[Any] = set()
        self._transactions: dict[bytes, _Txn] = {}
        self._later_fns: list[Callable[[], None]] = []  # for the loop, from other threads (``_later``)
        self._later_lock = threading.Lock()
        self.closed = False

    # ------------------------------------------------------------------------------------------------------
    # EventHandler
    # ------------------------------------------------------------------------------------------------------
    def handle_event(self, protocol: Any, event: ev.Event) -> None:
        self.handle_events(protocol, (event,))

    def handle_events(self, protocol: Any, events: list[ev.Event] | tuple[ev.Event, ...]) -> None:
        """Each of a read's events to its handler (``_HANDLERS``), in order; settlements gathered so far are
        completed before any other kind of event. One shortcut: a send on a client's sender link (a
        ``DeliveryReceived`` without a state, no settlements waiting) goes straight to ``_on_send``, with
        ``_on_delivery``'s credit top-up. A read of a sender's window is a run of them, and the general dispatch
        cost two Python calls per message; ``_on_sends`` takes the run of sends that follows in one loop."""
        self.protocol = protocol
        senders = self._senders
        e: Any
        i = 0
        n = len(events)
        while i < n:
            e = events[i]
            cls = e.__class__
            if cls is _DELIVERY_RECEIVED and e.state is None and not self._pending_completes and e.link in senders:
                i = self._on_sends(events, i)  # this send and those after it, up to the first other event
                continue
            i += 1
            handler = _HANDLERS.get(cls)
            if handler is None:
                continue
            if self._pending_completes and handler is not ServiceBusConnection._on_disposition:
                self._flush_completes()  # settle what came before this event first (a detach, say)
            if cls in _LOGGED_EVENTS:
                log.debug("%s", cls.__name__, extra=self._context(e.link))
            try:
                handler(self, e)
            except ShardbusError as exc:  # a refusal already answered on the wire; nothing else to do
                log.info("refused: %s", exc, extra=self._context(getattr(e, "link", None)))

    def _context(self, link: Any = None) -> dict[str, Any]:
        """Log record fields naming this connection (and link), for structured logs (logs.py)."""
        context: dict[str, Any] = {"connection": self.amqp.container_id}
        if link is not None:
            context["link"] = getattr(link, "name", None)
        return context

    def events_done(self, protocol: Any) -> None:
        """Every event of one socket read is handled: store its sends and complete its settlements together
        (one store operation per partition); the answers go out in the read's write."""
        if self._pending_sends:
            self._flush_sends()
        if self._pending_completes:
            self._flush_completes()

    def connection_lost(self, protocol: Any) -> None:
        self._cleanup()
        self.protocol = None  # no cycle with the protocol: a closed connection goes by reference counting

    def _flush(self) -> None:
        if self.protocol is not None:
            self.protocol.flush()

    def _log_failure_of(self, future: Future) -> None:
        """Log if a settlement's write fails. Settlements that linger together share their write's future (see
        store/committer.py), so one watch covers a run of them."""
        if future is not self._watched:
            self._watched = future
            future.add_done_callback(_log_failure)

    def _later(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the connection's event loop (from any thread), then write what it produced. Calls made
        while earlier ones wait run in the same loop callback and share one write: one wake-up and one send
        per batch instead of per call (answers from workers and disks arrive in bursts)."""
        with self._later_lock:
            self._later_fns.append(fn)
            if len(self._later_fns) > 1:
                return
        try:
            self.loop.call_soon_threadsafe(self._run_later)
        except RuntimeError:  # the loop closed while the broker stops: nobody is left to answer
            pass

    def _run_later(self) -> None:
        with self._later_lock:
            fns, self._later_fns = self._later_fns, []
        for fn in fns:
            if self.closed or self.amqp.is_done:
                break
            try:
                fn()
            except Exception:  # a bug in one connection closes that connection only
                log.exception("internal error", extra=self._context())
                self.amqp.close(Error(condition=Symbol("amqp:internal-error"), description="internal error"))
        if self._verdict_echoes:
            echoes, self._verdict_echoes = self._verdict_echoes, {}
            if not (self.closed or self.amqp.is_done):
                self._send_echoes(echoes)
        if self.protocol is not None:
            self.protocol.flush_now()  # a burst's callback already: no need to wait for another loop turn
        if stalltrace.SENDS:
            stalltrace.sends_written()

    # ------------------------------------------------------------------------------------------------------
    # connection, SASL, sessions
    # ------------------------------------------------------------------------------------------------------
    def _use_namespace(self, hostname: str | None) -> None:
        self.namespace, self.authority = self.directory.resolve(hostname)
        # No delivery on any link may pass the namespace's largest message (sender links bound theirs lower).
        self.amqp.max_message_size = self.namespace.quotas.max_message_size_bytes

    def _on_sasl(self, e: ev.SaslInit) -> None:
        self._use_namespace(e.hostname)
        self.hostname = e.hostname or self.hostname
        if e.mechanism == "PLAIN":
            if self.authority.plain_known(e.username, e.password):
                self.plain = (str(e.username), str(e.password))
            else:
                self.amqp.reject_sasl()
                return
        self.amqp.accept_sasl()

    def _on_open(self, e: ev.ConnectionOpened) -> None:
        if self.namespace is None or e.open.hostname:
            self._use_namespace(e.open.hostname)
            self.hostname = e.open.hostname or self.hostname
        self.amqp.open()
        if self.refusal is not None:
            self.amqp.close(Error(condition=Symbol("amqp:resource-limit-exceeded"), description=self.refusal))

    def _on_closed(self, e: ev.ConnectionClosed) -> None:
        if e.reply_needed:
            self.amqp.close()
        elif not e.by_peer and e.error is not None:
            self._log_refusal("closed the connection", e.error)
        self._cleanup()

    def _log_refusal(self, what: str, error: Error, link: Any = None) -> None:
        """One line per protocol error of the peer's (or refusal of its connection): the condition and why,
        without a traceback; authentication failures are routine and logged at INFO."""
        level = logging.INFO if str(error.condition) == "amqp:unauthorized-access" else logging.WARNING
        log.log(level, "%s: %s: %s", what, error.condition, error.description, extra=self._context(link))

    def _on_begin(self, e: ev.SessionBeginRequested) -> None:
        self.amqp.begin(e.session, incoming_window=WINDOW, outgoing_window=WINDOW, handle_max=self.limits.handle_max)

    def _on_end(self, e: ev.SessionEnded) -> None:
        session = e.session
        for link in [lk for lk in self._receivers if lk.session is session]:
            self._drop_receiver(link)
        self._links = {lk for lk in self._links if lk.session is not session}
        for link in [lk for lk in self._senders if lk.session is session]:
            del self._senders[link]
        self._cbs_out.pop(session, None)
        for key in [k for k in self._mgmt_out if k[0] is session]:
            del self._mgmt_out[key]
        self._coordinators = {lk for lk in self._coordinators if lk.session is not session}
        if not e.by_peer and e.error is not None:
            self._log_refusal("ended a session", e.error)
        if e.reply_needed:
            self.amqp.end(session)

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        for link in list(self._receivers):
            self._drop_receiver(link)
        for receiver in self._mgmt_receivers.values():
            receiver.close()
        for txn in self._transactions.values():  # never discharged: nothing of it may happen
            txn.transaction.rollback()
        self._transactions.clear()
        self._mgmt_receivers.clear()
        self._sessions.clear()
        self._senders.clear()
        self._cbs_out.clear()
        self._mgmt_out.clear()
        self._coordinators.clear()
        self._pending_sends.clear()
        self.authorized.clear()

    # ------------------------------------------------------------------------------------------------------
    # links
    # ------------------------------------------------------------------------------------------------------
    def _refuse(self, link: Any, exc: BaseException) -> None:
        self.amqp.attach_reply(link, source=None, target=None)
        self.amqp.detach(link, closed=True, error=_error(exc))

    def _check_access(self, path: str, right: AccessRight | None) -> None:
        """Refuse unless a token put on $cbs (or the PLAIN credentials) covers ``path`` with ``right`` (None: any
        right, enough to attach a ``$management`` link whose operations are checked one by one)."""
        address = path[: -len(MANAGEMENT_SUFFIX)] if path.lower().endswith(MANAGEMENT_SUFFIX) else path
        granted: set[AccessRight] = set()
        if self.plain is not None:
            granted.update(self._authority.plain_rights(self.plain[0], self.plain[1], address))
        now = time.time()
        for claims in self.authorized:
            if claims.expiry > now and sas.covers(claims, address):
                granted.update(claims.rights)
        if not granted:
            raise Unauthorized(
                f"Unauthorized access to '{address}': put a SAS token covering it on $cbs first (claims-based "
                "security), or connect with SASL PLAIN and a key that gives rights there."
            )
        if right is not None and right not in granted:
            raise missing_right(right, self._resource(address))

    def _resource(self, address: str) -> str:
        return f"sb://{(self.hostname or 'localhost').split(':')[0]}/{address}"

    @property
    def _authority(self) -> Authority:
        if self.authority is None:
            self._use_namespace(None)
        return self.authority

    def _on_attach(self, e: ev.LinkAttachRequested) -> None:
        link, attach = e.link, e.attach
        if len(self._links) >= self.limits.max_links:
            self._refuse(
                link,
                QuotaExceeded(
                    f"This connection already has {len(self._links)} links, the broker's limit per connection; "
                    "detach one or open another connection."
                ),
            )
            return
        self._links.add(link)
        client_sends = not attach.role  # the client's role: False = sender
        if client_sends and isinstance(attach.target, Coordinator):
            self.amqp.attach_reply(link)  # AMQP transactions: declare and discharge arrive on this link
            self._coordinators.add(link)
            self.amqp.flow(link, link_credit=SENDER_CREDIT)
            return
        address = (attach.target if client_sends else attach.source) or None
        address_value = getattr(address, "address", None)
        path = entity_path(address_value)
        try:
            if path == CBS:
                self.amqp.attach_reply(link)
                if not client_sends:
                    self._cbs_out[link.session] = link
                else:
                    self.amqp.flow(link, link_credit=SENDER_CREDIT)
                return
            if path.lower().endswith(MANAGEMENT_SUFFIX):
                self._check_access(path, None)
                node = path[: -len(MANAGEMENT_SUFFIX)]
                self._resolve_management_target(node)
                self.amqp.attach_reply(link)
                if client_sends:
                    self.amqp.flow(link, link_credit=SENDER_CREDIT)
                else:
                    self._mgmt_out[(link.session, path.lower())] = link
                return
            self._check_access(path, SEND if client_sends else LISTEN)
            if client_sends:
                entity = self._ns._sender_entity(path)
                # The service advertises the entity's largest message as the link's max-message-size and its
                # largest batch in a property the SDK reads (a premium batch stays at 1 MB); the engine refuses
                # a delivery as soon as it passes either (see the module docstring).
                largest, batch = self._ns.message_size_limits(entity.description)
                self.amqp.attach_reply(link, max_message_size=largest, properties={MAX_BATCH_SIZE_PROPERTY: Int(batch)})
                if batch < largest:
                    link.format_limits = {BATCH_MESSAGE_FORMAT: batch}
                self._senders[link] = entity
                self.amqp.flow(link, link_credit=SENDER_CREDIT)
            else:
                self._attach_receiver(link, attach, path)
        except ShardbusError as exc:
            self._refuse(link, exc)

    @property
    def _ns(self) -> Namespace:
        if self.namespace is None:
            self._use_namespace(None)
        return self.namespace

    def _on_detach(self, e: ev.LinkDetached) -> None:
        link = e.link
        self._links.discard(link)
        if not e.by_peer and e.error is not None:
            self._log_refusal("detached a link", e.error, link)
        if link in self._receivers:
            self._drop_receiver(link)
        self._senders.pop(link, None)
        for table in (self._cbs_out, self._mgmt_out):
            for key in [k for k, v in table.items() if v is link]:
                del table[key]
        if e.reply_needed:
            self.amqp.detach(link, closed=e.closed)

    # ------------------------------------------------------------------------------------------------------
    # deliveries from the client
    # ------------------------------------------------------------------------------------------------------
    def _on_delivery(self, e: ev.DeliveryReceived) -> None:
        link = e.link
        if link.link_credit < _SENDER_CREDIT_LOW:  # keep credit-respecting clients sending
            self.amqp.flow(link, link_credit=SENDER_CREDIT)
        entity = self._senders.get(link)
        if entity is not None:
            state = e.state
            if state is not None and isinstance(state, TransactionalState):  # a send's state is nearly always None
                self._on_transactional_send(e, entity)
            else:
                self._on_send(e, entity)
            return
        if link in self._coordinators:
            self._on_coordinator(e)
            return
        try:
            request = decode_message(e.payload)
        except DecodeError as exc:
            self._settle(e, Rejected(error=Error(condition=Symbol("amqp:decode-error"), description=str(exc))))
            return
        path = entity_path(getattr(link.target, "address", None))
        self._settle(e, Accepted())
        if path == CBS:
            self._on_put_token(link, request)
        elif path.lower().endswith(MANAGEMENT_SUFFIX):
            txn_id = e.state.txn_id if isinstance(e.state, TransactionalState) else None
            self._on_management(link, path, request, txn_id)

    def _settle(self, e: ev.DeliveryReceived, state: Any) -> None:
        if not e.settled:
            self.amqp.settle(e.link, e.delivery_id, state)


_HANDLERS: dict[type, Callable[[ServiceBusConnection, Any], None]] = {
    ev.SaslInit: ServiceBusConnection._on_sasl,
    ev.ConnectionOpened: ServiceBusConnection._on_open,
    ev.ConnectionClosed: ServiceBusConnection._on_closed,
    ev.SessionBeginRequested: ServiceBusConnection._on_begin,
    ev.SessionEnded: ServiceBusConnection._on_end,
    ev.LinkAttachRequested: ServiceBusConnection._on_attach,
    ev.LinkDetached: ServiceBusConnection._on_detach,
    ev.DeliveryReceived: ServiceBusConnection._on_delivery,
    ev.DeliveryTooLarge: ServiceBusConnection._on_too_large,
    ev.FlowReceived: ServiceBusConnection._on_flow,
    ev.DispositionReceived: ServiceBusConnection._on_disposition,
}

__all__ = ["ServiceBusConnection", "entity_path"]
