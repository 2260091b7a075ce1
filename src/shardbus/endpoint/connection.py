"""One client connection speaking Service Bus over AMQP 1.0: the bridge between the engine and the core.

Theory of operation
-------------------
``ServiceBusConnection`` owns a sans-IO ``amqp.Connection`` (server role) and reacts to its events. The
transport feeds bytes in and writes ``data_to_send`` out; core futures complete on other threads, so their
results come back through ``schedule`` (the transport's thread-safe callback) before touching the engine.

Every link the client attaches gets a role here, decided by its address (SERVICEBUS_AMQP.md §1.1):

    $cbs (both directions)          → claims: put-token validates a SAS token and authorizes entity paths
    <entity>/$management            → request/response pairs dispatched through ``management.OPERATIONS``
    client sender  → queue / topic  → ``_on_send``: decode (single or 0x80013700 batch), route, store, then
                                       settle accepted (or rejected with the domain error's condition)
    client receiver ← queue / sub   → ``_pump``: on credit, lock messages through a core ``Receiver`` and
                                       transfer them (tag = lock token, .NET byte order); dispositions
                                       settle in the core and are echoed settled with the same outcome

A link to an entity is attached only when the connection holds a token (or PLAIN credentials) covering it with
the right the link needs (Send for senders, Listen for receivers; each ``$management`` operation its own:
``authorization.py``); otherwise, and for unknown entities, the attach is refused the way the service refuses it
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
import bisect
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from ..amqp import events as ev
from ..amqp.codec import DecodeError
from ..amqp.connection import Connection, Role
from ..amqp.link import LinkState
from ..amqp.message import BATCH_MESSAGE_FORMAT, AmqpMessage, Properties, decode_message
from ..amqp.message import BodyType as WireBody
from ..amqp.performatives import (
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Error,
    InvalidField,
    Modified,
    Rejected,
    Released,
    SndSettleMode,
    TransactionalState,
    decode_composite,
)
from ..amqp.session import SessionState
from ..amqp.types import Int, Long, Symbol
from ..entity.entity import QueueEntity, Target, TopicEntity
from ..entity.receiver import Receiver
from ..entity.sessions import SessionReceiver, accept_session
from ..entity.transactions import Transaction
from ..metrics import RECEIVE_SECONDS, SEND_SECONDS
from ..model.authorization import AccessRight, AuthorizationRule
from ..model.errors import (
    ArgumentError,
    InvalidOperation,
    OperationTimeout,
    QuotaExceeded,
    ShardbusError,
    Unauthorized,
)
from ..model.message import Message, ReceiveMode
from ..model.routing import partition_of_lock_token, uuid_of_bytes_le
from ..namespace import Namespace
from ..partition.handle import RemoteVerdict
from . import sas
from .authorization import LISTEN, SEND, Authority, management_right, missing_right
from .conditions import condition_of
from .limits import DEFAULT_LIMITS, ConnectionLimits
from .management import OPERATIONS, ManagementContext, ManagementReply
from .mapping import decode_batch_to_messages, decode_to_message, encode_delivery

log = logging.getLogger("shardbus.amqp")
MESSAGE_SIZE_EXCEEDED = Symbol("amqp:link:message-size-exceeded")
MAX_BATCH_SIZE_PROPERTY = Symbol("com.microsoft:max-message-batch-size")
_ACCEPTED = Accepted()  # fieldless, so one instance serves every echo

CBS = "$cbs"
SESSION_FILTER = "com.microsoft:session-filter"
DEFAULT_SESSION_WAIT_MS = 60_000  # how long a next-available session attach waits when the client names no limit
DOTNET_EPOCH_TICKS = 621355968000000000  # .NET ticks at the Unix epoch
TXN_UNKNOWN = Symbol("amqp:transaction:unknown-id")
TXN_ROLLBACK = Symbol("amqp:transaction:rollback")
MANAGEMENT_SUFFIX = "/$management"
DEAD_LETTER_CONDITION = "com.microsoft:dead-letter"
WINDOW = 0x7FFFFFFF
SENDER_CREDIT = 10_000
_SENDER_CREDIT_LOW = SENDER_CREDIT // 2  # a sender's credit is topped up below this
_RECEIVE_AND_DELETE = ReceiveMode.RECEIVE_AND_DELETE  # a module constant: an Enum member off its class is slow
_LINK_ATTACHED = LinkState.ATTACHED
_SESSION_MAPPED = SessionState.MAPPED
_LOGGED_EVENTS = frozenset((ev.LinkAttachRequested, ev.LinkDetached))  # logged (debug) as they come
# What a $management handler raises reading a request body whose fields have the wrong type or shape
_MALFORMED = (TypeError, ValueError, AttributeError, IndexError, KeyError, OverflowError)
# A large answer to a flow is taken and written in chunks that double from FIRST_CHUNK, so the client decodes the
# first deliveries while this loop locks and encodes the next ones, and each chunk is ready before the client has
# eaten the one before (the SDK decodes a delivery about three times slower than we make one). The SDK's
# ``receive_messages(max_message_count=100)`` in receive-and-delete mode took about 700 us longer against shardbus
# than against bench/amqp.py's null endpoint when all 100 were taken at once and the first 8 written early, and
# as long with chunks (a median call of 3.8-4.0 ms against both).
FIRST_CHUNK = 8
MAX_PUMP = 256  # deliveries produced per pump before yielding to other connections
MAX_TOKENS = 1000  # tokens a connection holds at once (one per audience is the SDK's use; older ones go first)


class NamespaceDirectory:
    """Which namespace a connection talks to (by the host name it opened with), and who may do what there.

    ``rules`` gives each namespace's shared access rules: a list of ``AuthorizationRule``, or a plain
    ``{key name: key}`` map whose keys have every right."""

    def __init__(
        self,
        namespaces: dict[str, Namespace],
        default: str,
        rules: dict[str, dict[str, str] | list[AuthorizationRule]],
    ) -> None:
        self.namespaces = {name.lower(): ns for name, ns in namespaces.items()}
        self.default = default.lower()
        self.authorities: dict[str, Authority] = {}
        for name, given in rules.items():
            ns = self.namespaces.get(name.lower())
            if isinstance(given, dict):
                self.authorities[name.lower()] = Authority.of_keys(ns, given)
            else:
                self.authorities[name.lower()] = Authority(ns, given)

    def resolve(self, hostname: str | None) -> tuple[Namespace, Authority]:
        label = (hostname or "").split(":")[0].split(".")[0].lower()
        name = label if label in self.namespaces else self.default
        namespace = self.namespaces[name]
        return namespace, self.authorities.get(name) or Authority(namespace, ())


def _session_filter(value: Any) -> str | None:
    """The session a receiver's ``com.microsoft:session-filter`` names: a string (or UTF-8 binary), or None
    for the next available one; any other value is refused."""
    if value is None:
        return None
    if isinstance(value, str):
        return str(value)  # a symbol too
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise ArgumentError(f"The session filter must be a session id (a string), not {type(value).__name__}.")


def entity_path(address: Any) -> str:
    """``amqps://host:port/q1`` or ``q1`` → ``q1``; node suffixes are kept."""
    # invalid UTF-8 names no entity: replaced, it resolves to none and the link is refused as not found
    text = address.decode("utf-8", "replace") if isinstance(address, bytes) else str(address or "")
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")


def _observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (>= 0), one update per bucket instead of per value: every
    send and delivery is observed, and ``observe`` takes a lock per call. Uses the histogram's own bounds and
    value cells (prometheus_client, pinned), so the exposition is the same as with ``observe``."""
    if not values:
        return
    bounds = histogram._upper_bounds
    counts: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)  # the first bound >= v, as ``observe`` picks it
        counts[i] = counts.get(i, 0) + 1
    histogram._sum.inc(sum(values))
    buckets = histogram._buckets
    for i, n in counts.items():
        buckets[i].inc(n)


def _observe_repeated(histogram: Any, value: float, count: int) -> None:
    """``histogram.observe(value)`` ``count`` times (a group of sends stored together took one time)."""
    histogram._sum.inc(value * count)
    histogram._buckets[bisect.bisect_left(histogram._upper_bounds, value)].inc(count)


def _error(exc: BaseException) -> Error:
    condition, _ = condition_of(exc)
    return Error(condition=condition, description=str(exc) or type(exc).__name__)


class _Txn:
    """A declared AMQP transaction: its core transaction, and the first failure that dooms it."""

    __slots__ = ("failure", "transaction")

    def __init__(self, transaction: Transaction) -> None:
        self.transaction = transaction
        self.failure: str | None = None


class _ReceiveLink:
    """State of a client receiver link: the core receiver and the wake-up hook."""

    __slots__ = ("address", "first_chunk", "listening", "receiver", "timer")

    def __init__(self, receiver: Receiver, address: Any) -> None:
        self.receiver = receiver
        self.address = address
        self.listening = False
        self.timer: Any = None
        # Chunks only where taking them costs no more: a take asks a remote partition for about twice what it
        # wants, so in chunks a flow of 100 needed several round trips to a worker instead of one (and, in a trial
        # with the SDK, twice the front end's loop CPU per message).
        at_once = all(p.answers_at_once for p in receiver.target.partitions)
        self.first_chunk = FIRST_CHUNK if at_once else MAX_PUMP


class ServiceBusConnection:
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
        self._pending_sends: list[tuple[Any, ev.DeliveryReceived, list[Message]]] = []
        self._pending_completes: list[tuple[Any, Any, uuid.UUID, bool]] = []  # (ref, receiver, token, settled)
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
        self.protocol = protocol
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return
        if self._pending_completes and handler is not ServiceBusConnection._on_disposition:
            self._flush_completes()  # settle what came before this event first (a detach, say)
        if type(event) in _LOGGED_EVENTS:
            log.debug("%s", type(event).__name__, extra=self._context(event.link))  # type: ignore[attr-defined]
        try:
            handler(self, event)
        except ShardbusError as exc:  # a refusal already answered on the wire; nothing else to do
            log.info("refused: %s", exc, extra=self._context(getattr(event, "link", None)))

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
        if self.protocol is not None:
            self.protocol.flush_now()  # a burst's callback already: no need to wait for another loop turn

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
        self.amqp.begin(
            e.session, incoming_window=WINDOW, outgoing_window=WINDOW, handle_max=self.limits.handle_max
        )

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

    def _resolve_management_target(self, node: str) -> Any:
        lower = node.lower()
        entity = self._ns._entities.get(lower)
        if entity is not None:
            return entity
        return self._ns.resolve(node)[0]

    def _attach_receiver(self, link: Any, attach: Any, path: str) -> None:
        source = attach.source
        filters = {str(k): v for k, v in (getattr(source, "filter", None) or {}).items()}
        target, sub_queue = self._ns.resolve(path)
        settled = attach.snd_settle_mode == SndSettleMode.SETTLED
        mode = ReceiveMode.RECEIVE_AND_DELETE if settled else ReceiveMode.PEEK_LOCK
        if SESSION_FILTER not in filters:
            self._reply_receiver(link, attach, Receiver(target, mode, sub_queue, self._ns._clock))
            return
        session_id = _session_filter(filters[SESSION_FILTER])
        if session_id is not None:
            self._reply_session(link, attach, SessionReceiver(target, session_id, mode, 0, self._ns._clock))
            return
        properties = {str(k): v for k, v in (attach.properties or {}).items()}
        timeout_ms = properties.get("com.microsoft:timeout")
        if not isinstance(timeout_ms, int | float) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            timeout_ms = DEFAULT_SESSION_WAIT_MS  # none, or not a number of milliseconds
        self._await_session(link, attach, target, mode, time.monotonic() + timeout_ms / 1000)

    def _await_session(self, link: Any, attach: Any, target: Target, mode: ReceiveMode, deadline: float) -> None:
        """Next-available session: accept the first free one, or keep the attach waiting until the deadline."""
        if link.state is not LinkState.ATTACH_RCVD or self.closed:
            return
        try:
            accepted = accept_session(target, None)
        except ShardbusError as exc:
            self._refuse(link, exc)
            return
        if accepted is not None:
            self._reply_session(link, attach, SessionReceiver.holding(target, accepted, mode, self._ns._clock))
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._refuse(link, OperationTimeout(f"No session with messages is available in '{target.path}'."))
            return
        retry = lambda: self._later(lambda: self._await_session(link, attach, target, mode, deadline))  # noqa: E731
        target.add_listener(retry)
        self.loop.call_later(min(remaining, 0.5), lambda: (target.remove_listener(retry), retry()))

    def _reply_receiver(self, link: Any, attach: Any, receiver: Any, **reply: Any) -> None:
        self.amqp.attach_reply(
            link,
            snd_settle_mode=attach.snd_settle_mode,
            rcv_settle_mode=attach.rcv_settle_mode,
            initial_delivery_count=0,
            max_message_size=attach.max_message_size or 0,
            **reply,
        )
        self._receivers[link] = _ReceiveLink(receiver, attach.source.address)

    def _reply_session(self, link: Any, attach: Any, receiver: SessionReceiver) -> None:
        # The SDK needs the source echoed byte for byte, the session id in the filter, and a properties map.
        source = dataclasses.replace(attach.source, filter={Symbol(SESSION_FILTER): receiver.session_id})
        ticks = Long(receiver.locked_until_ms * 10_000 + DOTNET_EPOCH_TICKS)
        self._reply_receiver(
            link, attach, receiver, source=source, properties={Symbol("com.microsoft:locked-until-utc"): ticks}
        )
        self._sessions[(id(receiver.target), receiver.session_id)] = receiver

    def _on_too_large(self, e: ev.DeliveryTooLarge) -> None:
        """Refuse a delivery that passed its link's bound (the engine discards the rest of it); the link goes on."""
        description = (
            f"The received message (delivery-id:{int(e.delivery_id)}, size:{e.size} bytes) exceeds the limit "
            f"({e.limit} bytes) currently allowed on the link."
        )
        log.info("refused: %s", description, extra=self._context(e.link))
        if e.link.link_credit < _SENDER_CREDIT_LOW and e.link in self._senders:
            self.amqp.flow(e.link, link_credit=SENDER_CREDIT)
        if not e.settled:
            self.amqp.settle(e.link, e.delivery_id, Rejected(error=Error(MESSAGE_SIZE_EXCEEDED, description)))

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

    def _drop_receiver(self, link: Any) -> None:
        state = self._receivers.pop(link, None)
        if state is None:
            return
        if state.listening:
            state.receiver.target.remove_listener(state.listening)
        if state.timer is not None:
            state.timer.cancel()
        if isinstance(state.receiver, SessionReceiver):
            self._sessions.pop((id(state.receiver.target), state.receiver.session_id), None)
        state.receiver.close()

    # ------------------------------------------------------------------------------------------------------
    # deliveries from the client
    # ------------------------------------------------------------------------------------------------------
    def _on_delivery(self, e: ev.DeliveryReceived) -> None:
        link = e.link
        if link.link_credit < _SENDER_CREDIT_LOW:  # keep credit-respecting clients sending
            self.amqp.flow(link, link_credit=SENDER_CREDIT)
        entity = self._senders.get(link)
        if entity is not None:
            if isinstance(e.state, TransactionalState):
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

    def _on_send(self, e: ev.DeliveryReceived, entity: QueueEntity | TopicEntity) -> None:
        """Decode now; store together with everything else this socket read brought (see ``_flush_sends``)."""
        try:
            if e.message_format == BATCH_MESSAGE_FORMAT:
                messages = decode_batch_to_messages(e.payload)
            else:
                messages = [decode_to_message(e.payload)]
        except DecodeError as exc:
            self._settle(e, Rejected(error=Error(condition=Symbol("amqp:decode-error"), description=str(exc))))
            return
        # The messages have what they need of the payload: the event, kept until the store answers, need not keep
        # it too (a 100 MB message would otherwise be held twice while it is written).
        e.payload = b""
        self._pending_sends.append((entity, e, messages))  # stored in ``events_done``

    def _flush_sends(self) -> None:
        """Hand all pending sends to the core at once: one store operation per partition, one callback each."""
        pending, self._pending_sends = self._pending_sends, []
        by_entity: dict[int, tuple[Any, list[ev.DeliveryReceived], list[list[Message]]]] = {}
        for entity, event, messages in pending:
            group = by_entity.get(id(entity))
            if group is None:
                group = by_entity[id(entity)] = (entity, [], [])
            group[1].append(event)
            group[2].append(messages)
        started = time.monotonic()
        for entity, events, batches in by_entity.values():

            def done(indices: list[int], outcomes: list[Any], events: list[ev.DeliveryReceived] = events) -> None:
                settled = [(events[i], outcome) for i, outcome in zip(indices, outcomes, strict=True)]
                _observe_repeated(SEND_SECONDS, time.monotonic() - started, len(indices))
                self._later(lambda: self._acknowledge(settled))

            entity.submit_many(batches, done, owned=True)  # decoded here, for this send alone

    def _acknowledge(self, results: list[tuple[ev.DeliveryReceived, BaseException | None]]) -> None:
        """Settle stored sends: consecutive accepted deliveries of one link share a range disposition."""
        link: Any = None  # the link of the run of accepted deliveries, and its first and last delivery ids
        first = last = 0
        for e, exc in results:
            if e.settled:
                continue
            if exc is None and e.link is link and e.delivery_id == last + 1:
                last = e.delivery_id  # the run goes on
                continue
            if link is not None:
                self.amqp.disposition(link, first, last, state=_ACCEPTED)
                link = None
            if exc is None:
                link, first, last = e.link, e.delivery_id, e.delivery_id
            else:
                self._settle(e, Rejected(error=_error(exc)))
        if link is not None:
            self.amqp.disposition(link, first, last, state=_ACCEPTED)

    # ------------------------------------------------------------------------------------------------------
    # $cbs
    # ------------------------------------------------------------------------------------------------------
    def _on_put_token(self, link: Any, request: AmqpMessage) -> None:
        app = {str(k): v for k, v in (request.application_properties or {}).items()}
        token = request.body if request.body_type == WireBody.VALUE else None
        if isinstance(token, bytes):
            token = token.decode("utf-8", "replace")
        try:
            if str(app.get("operation")) != "put-token":
                raise InvalidOperation(f"Unsupported $cbs operation '{app.get('operation')}'.")
            claims = self._authority.validate(token)
            audience = str(app.get("name") or claims.resource)
            if not sas.covers(claims, audience):
                raise Unauthorized(f"The token for '{claims.resource}' does not cover '{audience}'.")
            now = time.time()  # expired tokens go, and a connection keeps at most MAX_TOKENS (refreshes add one each)
            live = [c for c in self.authorized if c.expiry > now]
            self.authorized = [*live[len(live) - MAX_TOKENS + 1 :], claims]
            status, description = 202, "Accepted"
        except ShardbusError as exc:
            status, description = condition_of(exc)[1], str(exc)
        reply_link = self._cbs_out.get(link.session)
        if reply_link is None:
            return
        message_id = request.properties.message_id if request.properties else None
        response = AmqpMessage(
            properties=Properties(correlation_id=message_id),
            application_properties={"status-code": Int(status), "status-description": description},
        )
        self._send_reply(reply_link, response)

    def _send_reply(self, link: Any, message: AmqpMessage) -> None:
        if not link.attached or not link.session.mapped or self.amqp.closing:
            return  # the client took its reply link away (or closed) before the answer: nobody to tell
        self.amqp.send_transfer(link, uuid.uuid4().bytes, message.encode(), settled=True, ignore_credit=True)

    # ------------------------------------------------------------------------------------------------------
    # $management
    # ------------------------------------------------------------------------------------------------------
    def _on_management(self, link: Any, path: str, request: AmqpMessage, txn_id: bytes | None = None) -> None:
        app = {str(k): v for k, v in (request.application_properties or {}).items()}
        operation = str(app.get("operation", ""))
        node = path[: -len(MANAGEMENT_SUFFIX)]
        reply_to = request.properties.reply_to if request.properties else None
        reply_key = (link.session, (entity_path(reply_to) if reply_to else path).lower())
        message_id = request.properties.message_id if request.properties else None
        body = request.body if request.body_type == WireBody.VALUE and isinstance(request.body, dict) else {}
        body = {str(k): v for k, v in body.items()}
        context = ManagementContext(
            self._ns, node, self._management_receiver, lambda t, sid: self._sessions.get((id(t), sid)), app
        )
        context.transaction_id = txn_id

        def respond(reply: ManagementReply) -> None:
            out = self._mgmt_out.get(reply_key) or self._mgmt_out.get((link.session, path.lower()))
            if out is None:
                return
            app_props: dict[str, Any] = {"statusCode": Int(reply.status), "statusDescription": reply.description}
            if reply.condition is not None:
                app_props["errorCondition"] = Symbol(reply.condition)
            response = AmqpMessage(
                properties=Properties(correlation_id=message_id),
                application_properties=app_props,
                body=reply.body,
                body_type=WireBody.VALUE if reply.body is not None else WireBody.NONE,
            )
            self._send_reply(out, response)

        handler = OPERATIONS.get(operation)
        if handler is None:
            respond(ManagementReply.error(InvalidOperation(f"The operation '{operation}' is not supported.")))
            return
        try:
            self._check_access(node, management_right(operation))
            result = handler(context, body)
        except ShardbusError as exc:
            respond(ManagementReply.error(exc))
            return
        except _MALFORMED as exc:  # a field of the wrong type or shape: the handlers read the body as they go
            log.info("malformed $management request: %r", exc, extra=self._context(link))
            respond(ManagementReply.error(ArgumentError(f"The request for '{operation}' is malformed: {exc}.")))
            return
        if isinstance(result, ManagementReply):
            respond(result)
            return

        def done(f: Future) -> None:
            exc = f.exception()
            reply = ManagementReply.error(exc) if exc is not None else f.result()
            self._later(lambda: respond(reply))

        result.add_done_callback(done)

    def _management_receiver(self, target: Target, sub_queue: int) -> Receiver:
        key = (id(target), int(sub_queue))
        receiver = self._mgmt_receivers.get(key)
        if receiver is None or receiver.target is not target:
            receiver = Receiver(target, ReceiveMode.PEEK_LOCK, sub_queue, self._ns._clock)
            self._mgmt_receivers[key] = receiver
        return receiver

    # ------------------------------------------------------------------------------------------------------
    # deliveries to the client
    # ------------------------------------------------------------------------------------------------------
    def _on_flow(self, e: ev.FlowReceived) -> None:
        if e.link is not None:
            if e.link in self._receivers:
                self._pump(e.link)
            return
        for link in [lk for lk in self._receivers if lk.session is e.session]:  # the session window reopened
            self._pump(link)

    def _pump(self, link: Any) -> None:
        """Deliver while the link has credit and the client's session window has room."""
        state = self._receivers.get(link)
        if state is None or link.state is not _LINK_ATTACHED or link.session.state is not _SESSION_MAPPED:
            return  # gone, or going: the client's detach/end is handled next (and drops the receiver)
        if self.amqp.close_sent or self.amqp.is_done:
            return
        receiver = state.receiver
        session = link.session
        sent = 0
        chunk = state.first_chunk

        def more() -> None:  # partitions answer on other threads: never wait for them on this loop
            self._later(lambda: self._pump(link))

        try:
            while link.link_credit > 0 and session.remote_incoming_window > 0 and sent < MAX_PUMP:
                room = min(link.link_credit, session.remote_incoming_window, MAX_PUMP - sent, chunk)
                messages = receiver.take(room, more)
                if not messages:
                    break
                sent += self._transfer(link, receiver, messages)
                if self.protocol is not None and link.link_credit > 0:
                    self.protocol.flush_now()  # not the last chunk: its write follows the event's handling
                chunk *= 2
        except ShardbusError as exc:
            self.amqp.detach(link, closed=True, error=_error(exc))
            self._drop_receiver(link)
            return
        if link.link_credit <= 0 or session.remote_incoming_window <= 0:
            return  # the client's next flow (link credit or session window) pumps again
        if sent < MAX_PUMP:
            if link.drain:
                self.amqp.drained(link)
            else:
                self._wait_for_messages(link, state)
        else:
            self._later(lambda: self._pump(link))  # more to send: yield to other connections first

    def _transfer(self, link: Any, receiver: Receiver | SessionReceiver, messages: list[Message]) -> int:
        """Send what fits in the client's session window; give the rest back. Returns how many were sent."""
        settled = receiver.mode is _RECEIVE_AND_DELETE
        max_frame = self.amqp.remote_max_frame_size
        sent: list[Message] = []
        now_ms = time.time() * 1000
        session = link.session
        send_transfer = self.amqp.send_transfer
        for i, m in enumerate(messages):
            payload = encode_delivery(m)
            frames = len(payload) // max_frame + 1  # what a multi-frame transfer takes of the window
            if frames > session.remote_incoming_window:
                for rest in messages[i:]:
                    receiver.submit_settle("release", rest)
                break
            b = m.lock_token.int.to_bytes(16, "big")  # the token's ``bytes_le`` (.NET order), without its 2 calls
            send_transfer(link, b[3::-1] + b[5:3:-1] + b[7:5:-1] + b[8:], payload, settled=settled)
            sent.append(m)
        _observe_all(RECEIVE_SECONDS, [max(0.0, now_ms - (m.enqueued_time_ms or now_ms)) / 1000 for m in sent])
        if settled and sent:
            for future in receiver.submit_complete(sent):
                self._log_failure_of(future)
        return len(sent)

    def _wait_for_messages(self, link: Any, state: _ReceiveLink) -> None:
        target = state.receiver.target
        if not state.listening:

            def wake() -> None:
                self._later(lambda: self._pump(link))

            state.listening = wake
            target.add_listener(wake)
        # What time makes receivable (lock expiry, scheduled messages) the partitions' upkeep finds every 100 ms
        # and announces like a send, so the timer is only a safety net; asking every partition for its next due
        # time here would block this loop on their workers.
        if state.timer is not None:
            state.timer.cancel()
        state.timer = self.loop.call_later(1.0, lambda: self._later(lambda: self._pump(link)))

    def _on_disposition(self, e: ev.DispositionReceived) -> None:
        if not e.role:
            return  # the client settling what it sent: nothing to do
        for ref in e.deliveries:
            state = self._receivers.get(ref.link)
            if state is None or len(ref.delivery_tag) != 16:
                continue
            token = uuid_of_bytes_le(ref.delivery_tag)
            if type(e.state) is Accepted:
                self._pending_completes.append((ref, state.receiver, token, e.settled))  # see ``events_done``
                continue
            if self._pending_completes:
                self._flush_completes()  # keep settlements in the order the client sent them
            if isinstance(e.state, TransactionalState):
                self._settle_in_transaction(ref, state.receiver, token, e.state, e.settled)
            else:
                self._settle_delivery(ref, state.receiver, token, e.state, e.settled)

    def _flush_completes(self) -> None:
        """Complete what the client accepted, one store operation per receiver and partition (all-or-nothing
        there, so a group with a lost lock is settled one by one to give each delivery its own outcome); echo
        the unsettled ones with range dispositions. Runs while the transport dispatches a read's events, whose
        write follows."""
        pending, self._pending_completes = self._pending_completes, []
        if not pending or self.closed or self.amqp.is_done:
            return
        if len(pending) == 1:  # the SDK completes one message per call: the loop below for one, inlined
            ref, receiver, token, settled = pending[0]
            try:
                future = receiver.submit_complete([token])[0]
            except ShardbusError:
                self._settle_delivery(ref, receiver, token, Accepted(), settled)
                return
            if isinstance(future, RemoteVerdict):
                future.add_done_callback(partial(self._later_verdict, receiver=receiver, items=pending))
                return
            if future is not self._watched:  # ``_log_failure_of``, inlined
                self._log_failure_of(future)
            link = ref.link
            if not settled and link.attached:
                self.amqp.disposition(link, ref.delivery_id, None, state=_ACCEPTED)
            return
        by_key: dict[tuple[int, int], tuple[Any, list[tuple[Any, Any, uuid.UUID, bool]]]] = {}
        for item in pending:
            receiver = item[1]
            key = (id(receiver), partition_of_lock_token(item[2]))
            group = by_key.get(key)
            if group is None:
                group = by_key[key] = (receiver, [])
            group[1].append(item)
        groups = by_key.values()
        echo: dict[int, tuple[Any, list[int]]] = {}  # session -> (a link of it, delivery ids)
        for receiver, items in groups:
            try:
                futures = receiver.submit_complete([token for _, _, token, _ in items])
            except ShardbusError:
                for ref, _, token, settled in items:
                    self._settle_delivery(ref, receiver, token, Accepted(), settled)
                continue
            if any(isinstance(f, RemoteVerdict) for f in futures):
                for future in futures:  # a remote partition's refusal comes with its reply: echo after it
                    future.add_done_callback(partial(self._later_verdict, receiver=receiver, items=items))
                continue
            # As in ``_settle_delivery``: applied and queued, so the echo need not wait for the fsync.
            for future in futures:
                self._log_failure_of(future)
            self._echo_accepted(items, echo)
        self._send_echoes(echo)

    @staticmethod
    def _echo_accepted(items: list[tuple[Any, Any, uuid.UUID, bool]], echo: dict[int, tuple[Any, list[int]]]) -> None:
        """Note the unsettled deliveries of ``items`` for an ``accepted`` echo, by session (``_send_echoes``)."""
        for ref, _, _, settled in items:
            link = ref.link
            if not settled and link.attached:
                noted = echo.get(id(link.session))
                if noted is None:
                    noted = echo[id(link.session)] = (link, [])
                noted[1].append(ref.delivery_id)

    def _send_echoes(self, echo: dict[int, tuple[Any, list[int]]]) -> None:
        """Echo ``accepted`` for the noted deliveries: one range disposition per run of consecutive ids."""
        for link, ids in echo.values():
            # Only ids in the list may be covered: the others in between may be another link's deliveries.
            ids.sort()
            start = prev = ids[0]
            for did in ids[1:]:
                if did != prev + 1:
                    self.amqp.disposition(link, start, None if prev == start else prev, state=_ACCEPTED)
                    start = did
                prev = did
            self.amqp.disposition(link, start, None if prev == start else prev, state=_ACCEPTED)

    # ------------------------------------------------------------------------------------------------------
    # AMQP transactions (a coordinator link declares and discharges; transfers and dispositions carry
    # transactional-state with the txn-id). The work itself is a core ``Transaction``.
    # ------------------------------------------------------------------------------------------------------
    def _on_coordinator(self, e: ev.DeliveryReceived) -> None:
        try:
            body = decode_composite(decode_message(e.payload).body, (Declare, Discharge))
        except (DecodeError, InvalidField) as exc:
            self._settle(e, Rejected(error=Error(condition=Symbol("amqp:decode-error"), description=str(exc))))
            return
        if isinstance(body, Declare):
            txn_id = uuid.uuid4().bytes
            self._transactions[txn_id] = _Txn(self._ns.transaction())
            self._settle(e, Declared(txn_id=txn_id))
            return
        txn = self._transactions.pop(body.txn_id, None)
        if txn is None:
            self._settle(e, Rejected(error=Error(condition=TXN_UNKNOWN, description="Unknown transaction id.")))
            return
        if body.fail:
            txn.transaction.rollback()
            self._settle(e, Accepted())
            return
        if txn.failure is not None:
            txn.transaction.rollback()
            self._settle(e, Rejected(error=Error(condition=TXN_ROLLBACK, description=txn.failure)))
            return
        try:
            future = txn.transaction.submit_commit()
        except ShardbusError as exc:
            self._settle(e, Rejected(error=Error(condition=TXN_ROLLBACK, description=str(exc))))
            return

        def done(f: Future) -> None:
            exc = f.exception()
            outcome = Accepted() if exc is None else Rejected(error=Error(condition=TXN_ROLLBACK, description=str(exc)))
            self._later(lambda: self._settle(e, outcome))

        future.add_done_callback(done)

    def _transaction_of(self, state: TransactionalState) -> _Txn:
        txn = self._transactions.get(state.txn_id)
        if txn is None:
            raise InvalidOperation("The transaction id is unknown (never declared, or already discharged).")
        return txn

    def _on_transactional_send(self, e: ev.DeliveryReceived, entity: QueueEntity | TopicEntity) -> None:
        try:
            txn = self._transaction_of(e.state)
        except ShardbusError as exc:
            self._settle(e, Rejected(error=Error(condition=TXN_UNKNOWN, description=str(exc))))
            return
        try:
            if e.message_format == BATCH_MESSAGE_FORMAT:
                messages = decode_batch_to_messages(e.payload)
            else:
                messages = [decode_to_message(e.payload)]
            txn.transaction.send(entity.path, messages)
        except (DecodeError, ShardbusError) as exc:
            txn.failure = txn.failure or str(exc)  # the discharge will roll everything back
            error = _error(exc) if isinstance(exc, ShardbusError) else Error(condition=Symbol("amqp:decode-error"))
            self._settle(e, TransactionalState(txn_id=e.state.txn_id, outcome=Rejected(error=error)))
            return
        self._settle(e, TransactionalState(txn_id=e.state.txn_id, outcome=Accepted()))

    def _settle_in_transaction(
        self, ref: Any, receiver: Any, token: uuid.UUID, state: TransactionalState, settled: bool
    ) -> None:
        outcome = state.outcome
        try:
            txn = self._transaction_of(state)
            if isinstance(outcome, Accepted):
                txn.transaction.complete(receiver, token)
            elif isinstance(outcome, Modified):
                (txn.transaction.defer if outcome.undeliverable_here else txn.transaction.abandon)(receiver, token)
            elif isinstance(outcome, Rejected):
                info = {str(k): v for k, v in ((outcome.error.info if outcome.error else None) or {}).items()}
                txn.transaction.dead_letter(
                    receiver, token, info.get("DeadLetterReason"), info.get("DeadLetterErrorDescription")
                )
                outcome = Rejected()
            else:
                raise InvalidOperation(f"The outcome {type(outcome).__name__} cannot be part of a transaction.")
        except ShardbusError as exc:
            if state.txn_id in self._transactions:
                self._transactions[state.txn_id].failure = str(exc)
            if not settled:
                self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=Rejected(error=_error(exc)))
            return
        if not settled:
            echo = TransactionalState(txn_id=state.txn_id, outcome=outcome)
            self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=echo)

    def _settle_delivery(self, ref: Any, receiver: Any, token: uuid.UUID, outcome: Any, settled: bool) -> None:
        reason = description = None
        if isinstance(outcome, Accepted):
            kind = "complete"
        elif isinstance(outcome, Released):
            kind = "release"
        elif isinstance(outcome, Modified):
            kind = "defer" if outcome.undeliverable_here else "abandon"
        elif isinstance(outcome, Rejected):
            kind = "dead_letter"
            err = outcome.error
            info = {str(k): v for k, v in ((err.info if err else None) or {}).items()}
            reason = info.get("DeadLetterReason")
            description = info.get("DeadLetterErrorDescription") or (err.description if err else None)
            outcome = Rejected()  # the echo carries no error: an error would mean the dead-lettering failed
        else:
            return
        try:
            future = receiver.submit_settle(kind, token, reason, description)
        except ShardbusError as exc:
            if not settled:
                self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=Rejected(error=_error(exc)))
            return
        # The outcome is applied (the message is no longer deliverable) and its write is queued behind earlier
        # ones, so the echo need not wait for the fsync. Should the write not reach the disk, the message comes
        # back after a restart: at-least-once, as with the service.
        if isinstance(future, RemoteVerdict):
            if not settled:
                future.add_done_callback(lambda f: self._later(lambda: self._echo_verdict(ref, f, outcome)))
            return
        if future is not None:
            self._log_failure_of(future)
        if not settled:
            self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=outcome)

    def _later_verdict(self, future: Future, receiver: Any, items: list[tuple[Any, Any, uuid.UUID, bool]]) -> None:
        self._later(lambda: self._group_verdict(future, receiver, items))

    def _group_verdict(self, future: Future, receiver: Any, items: list[tuple[Any, Any, uuid.UUID, bool]]) -> None:
        """A remote partition answered a grouped complete: echo it, or settle one by one for each own outcome."""
        if future.exception() is None:
            echo: dict[int, tuple[Any, list[int]]] = {}
            self._echo_accepted(items, echo)
            self._send_echoes(echo)  # range dispositions, as for local partitions
            return
        for ref, _, token, settled in items:
            self._settle_delivery(ref, receiver, token, Accepted(), settled)

    def _echo_verdict(self, ref: Any, future: Future, outcome: Any) -> None:
        if not ref.link.attached:
            return
        exc = future.exception()
        state = outcome if exc is None else Rejected(error=_error(exc))
        self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=state)


def _log_failure(f: Future) -> None:
    exc = f.exception()
    if exc is not None:
        log.warning("settlements' store write failed (their messages will be delivered again): %s", exc)


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

__all__ = ["NamespaceDirectory", "ServiceBusConnection", "entity_path"]
