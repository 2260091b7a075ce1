"""A blocking client for shardbus's own tools (the Spark connector, the CLI, benchmarks), on our AMQP engine.

It speaks the same AMQP 1.0 as the SDK (SASL PLAIN with the connection string's key, sender links, the entity's
``$management`` node) plus shardbus's own management operations: ``range-offsets``, ``browse-range`` and
``complete-below`` (see endpoint/management.py). Its event loop runs in a daemon thread, so callers need not be
async; one client holds one connection and is safe to use from several threads.

Sends are pipelined single transfers (``send``), not batch envelopes: the broker stores the transfers of one
socket read with one write per partition anyway, and a batch would have to fit one partition, which messages
keyed by distinct message ids (duplicate detection) do not.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
import uuid
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from .amqp import codec
from .amqp import types as t
from .amqp.message import MESSAGE_ANNOTATIONS, AmqpMessage, BodyType, Header, Properties, decode_message
from .amqp.performatives import (
    RECEIVER,
    Accepted,
    Error,
    Modified,
    Rejected,
    Released,
    SndSettleMode,
    Source,
    Target,
)
from .amqp.transport import AmqpClient, ClientReceiver, ClientSender, ClientSession
from .message_wire import ENQUEUED_TIME, PARTITION_KEY, SEQUENCE_NUMBER, encode_sections
from .model.routing import SET_UUID_INT, SET_UUID_SAFE, TAG_ORDER, UUID_ORDER

T = TypeVar("T")

SEND_WINDOW = 512  # transfers in flight per send() call


class ClientError(Exception):
    """The broker refused a request; ``condition`` is its AMQP error condition."""

    def __init__(self, condition: str | None, description: str, status: int | None = None) -> None:
        super().__init__(f"{condition or status}: {description}")
        self.condition = condition
        self.description = description
        self.status = status


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    host: str
    port: int
    key_name: str
    key: str

    @classmethod
    def parse(cls, connection_string: str) -> ConnectionSettings:
        """``Endpoint=sb://host[:port];SharedAccessKeyName=...;SharedAccessKey=...[;...]``, or
        ``amqp://user:password@host[:port]`` for a plain AMQP 1.0 broker (SASL PLAIN with that user; the
        benchmarks drive RabbitMQ with the same client this way)."""
        if connection_string.startswith("amqp://"):
            url = urlsplit(connection_string)
            if url.username is None or url.password is None:
                raise ValueError("An amqp:// address needs user:password@ (SASL PLAIN).")
            return cls(url.hostname or "localhost", url.port or 5672, unquote(url.username), unquote(url.password))
        parts = {}
        for item in connection_string.split(";"):
            if "=" in item:
                name, _, value = item.partition("=")
                parts[name.strip().lower()] = value.strip()
        try:
            endpoint = urlsplit(parts["endpoint"])
            return cls(
                endpoint.hostname or "localhost",
                endpoint.port or 5672,
                parts["sharedaccesskeyname"],
                parts["sharedaccesskey"],
            )
        except KeyError as exc:
            raise ValueError(f"The connection string has no {exc.args[0]!r}.") from None


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """What ``range-offsets`` says of one partition (partition-relative sequence numbers)."""

    partition: int
    healthy: bool
    first: int = 0  # the lowest readable sequence number (== end when none)
    end: int = 0  # every readable message is below it; new ones arrive at or above it
    mark: int = 1  # everything below was completed by complete-below
    count: int = 0  # readable messages (from where the request said)


@dataclass(slots=True)
class OutgoingMessage:
    """A message to send: the fields a Service Bus sender may set."""

    body: bytes = b""
    message_id: str | None = None
    partition_key: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    time_to_live_ms: int | None = None
    application_properties: dict[str, Any] | None = None
    # shardbus stores every message durably whatever the header says; a plain AMQP broker (RabbitMQ) keeps a
    # message without header durable=true in memory only, so a fair comparison must be able to ask for it.
    durable: bool = False

    def encode(self) -> bytes:
        """The message as the SDK encodes it (``message_wire``: the mapping the broker reads it back with)."""
        annotations = None if self.partition_key is None else {PARTITION_KEY: self.partition_key}
        header = None
        if self.time_to_live_ms is not None or self.durable:
            header = Header(durable=self.durable, ttl=self.time_to_live_ms)
        return encode_sections(
            self,
            header=header,
            annotations=annotations,
            application_properties=self.application_properties,
            body=[self.body],
        )


def body_bytes(body: bytes, body_type: int) -> bytes:
    """A browsed message's body as bytes: data as is; an amqp-value of bytes or text as its bytes; any other
    value or sequence section as its AMQP encoding (``body-type`` 1 value, 2 sequence, 3 none: model BodyType)."""
    if body_type == 1:
        value = codec.decode(body)
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
    if body_type == 3:
        return b""
    return body


_ANNOTATIONS_SLOT = AmqpMessage.__dict__["message_annotations"]  # the dataclass's slot, read and set directly
_map_items = codec._map_items  # the map decoder decode_message uses for annotations (checks sizes and counts)
_SIZE_COUNT = struct.Struct(">II").unpack_from


class _LazyAnnotations(AmqpMessage):
    """A received message whose message annotations stay encoded until read: the broker's four (sequence
    number, enqueued time, enqueue sequence number, locked-until) cost about half of a 1 KB delivery's decode,
    and a consumer that reads only the body and properties never needs them. Reading ``message_annotations``
    (``ReceivedMessage.sequence_number``, ``annotation``, ``encode``, equality) decodes them once, in place; the
    slot holds the encoded map (bytes, a slice of the delivery) until then. Nothing else differs from
    ``AmqpMessage``: it compares equal to one with the same sections."""

    __slots__ = ()

    @property  # type: ignore[override]
    def message_annotations(self) -> dict[Any, Any] | None:
        value = _ANNOTATIONS_SLOT.__get__(self, AmqpMessage)
        if type(value) is bytes:  # a map8 or map32 (_decode_received made sure), read as decode_message would
            if value[0] == 0xC1:
                value = _map_items(value, 3, len(value), value[2], 2)
            else:
                size, count = _SIZE_COUNT(value, 1)
                if size + 5 != len(value):
                    raise codec.DecodeError("map size exceeds buffer")
                value = _map_items(value, 9, len(value), count, 2)
            _ANNOTATIONS_SLOT.__set__(self, value)
        return value  # type: ignore[no-any-return]

    @message_annotations.setter
    def message_annotations(self, value: dict[Any, Any] | None) -> None:
        _ANNOTATIONS_SLOT.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AmqpMessage):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _MESSAGE_FIELDS)

    __hash__ = None  # type: ignore[assignment]  # as the dataclass's (mutable, compared by value)


_MESSAGE_FIELDS = tuple(AmqpMessage.__dataclass_fields__)


_HEADER_LIST8 = b"\x00\x53\x70\xc0"  # a header section's descriptor and a list8's constructor
_ANNOTATIONS_MAP8 = b"\x00\x53\x72\xc1"  # a message-annotations section's, and a map8's


def _decode_received(payload: bytes) -> AmqpMessage:
    """``decode_message``, but a message-annotations map is left encoded until read (``_LazyAnnotations``): the
    sections before it (header, delivery annotations) are skipped to find it, it is cut out of what is decoded,
    and its bytes wait in the message. Anything unusual (no such map, a malformed section) is decoded as usual,
    and raises as usual."""
    buf = payload if type(payload) is bytes else bytes(payload)
    n = len(buf)
    # A shardbus delivery: a list8 header, then the map8 annotations (the loop below's first two steps, at once)
    if n > 10 and buf[3] == 0xC0 and buf.startswith(_HEADER_LIST8):
        p = 5 + buf[4]
        end = p + 5 + buf[p + 4] if buf.startswith(_ANNOTATIONS_MAP8, p) and p + 5 <= n else 0
        if p + 5 <= end <= n:
            m = decode_message(buf[:p] + buf[end:])
            _ANNOTATIONS_SLOT.__set__(m, buf[p + 3 : end])
            m.__class__ = _LazyAnnotations
            return m
    p = 0
    try:
        while p + 4 <= n and buf[p] == 0 and buf[p + 1] == 0x53:
            code = buf[p + 2]
            c = buf[p + 3]
            if c == 0xC0 or c == 0xC1:  # list8 / map8: the broker's header and annotations
                end = p + 5 + buf[p + 4]
            else:
                end = codec.skip_at(buf, p + 3)
            if end > n:
                break
            if code == MESSAGE_ANNOTATIONS:
                if c != 0xC1 and c != 0xD1:  # not a map (e.g. null): as usual
                    break
                m = decode_message(buf[:p] + buf[end:])
                _ANNOTATIONS_SLOT.__set__(m, buf[p + 3 : end])
                m.__class__ = _LazyAnnotations
                return m
            if code > MESSAGE_ANNOTATIONS:
                break
            p = end
    except (codec.DecodeError, *codec.LOW_LEVEL_ERRORS):
        pass
    return decode_message(buf)


SESSION_FILTER = "com.microsoft:session-filter"  # a receiver's source filter: which session (null: any)


@dataclass(slots=True)
class ReceivedMessage:
    """A message as peek or receive returns it: the decoded AMQP message, and for a peek-lock receive the
    delivery that settles it (``lock_token`` is its delivery tag, as the service sends it)."""

    message: AmqpMessage
    lock_token: uuid.UUID | None = None
    delivery: Any = None  # the link's DeliveryReceived (peek-lock receives only)

    def annotation(self, name: str) -> Any:
        for key, value in (self.message.message_annotations or {}).items():
            if str(key) == name:
                return value
        return None

    @property
    def sequence_number(self) -> int:
        return int(self.annotation(SEQUENCE_NUMBER) or 0)

    @property
    def enqueued_time_ms(self) -> int | None:
        value = self.annotation(ENQUEUED_TIME)
        return None if value is None else _ms(value)

    @property
    def body(self) -> bytes:
        """Data sections joined; an amqp-value of bytes or text as its bytes; other bodies AMQP-encoded."""
        m = self.message
        if m.body_type == BodyType.DATA:
            return b"".join(bytes(part) for part in m.body)
        if m.body_type == BodyType.VALUE and isinstance(m.body, bytes | bytearray | str):
            return m.body.encode("utf-8") if isinstance(m.body, str) else bytes(m.body)
        if m.body_type == BodyType.NONE:
            return b""
        return codec.encode(m.body)


# ``MessageReceiver._take``'s parts of a ``ReceivedMessage`` and its lock token (``routing.uuid_of_bytes_le``)
_new = object.__new__
_UUID = uuid.UUID
_SET_UUID_INT, _SET_UUID_SAFE, _SAFE_UNKNOWN = SET_UUID_INT, SET_UUID_SAFE, uuid.SafeUUID.unknown
_from_bytes = int.from_bytes
_uuid_pack, _tag_unpack = UUID_ORDER.pack, TAG_ORDER.unpack


def _ms(value: Any) -> int:
    """A timestamp annotation (datetime or ms since the epoch) in ms since the epoch."""
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)


class MessageReceiver:
    """A receiving link on one entity (or sub-queue) in peek-lock or receive-and-delete mode, used from blocking
    code. Make it with ``ShardbusClient.receiver``; close it (or use it as a context manager) to give back what
    was received and not settled."""

    def __init__(self, client: ShardbusClient, link: ClientReceiver, receive_and_delete: bool) -> None:
        self._client = client
        self._link = link
        self.receive_and_delete = receive_and_delete

    def receive(self, max_count: int = 1, max_wait: float = 5.0, idle: float = 0.25) -> list[ReceivedMessage]:
        """Up to ``max_count`` messages: waits up to ``max_wait`` s for the first, then stops once none came for
        ``idle`` s. Never loses a message: credit left over is drained, and what was in flight is returned."""
        return self._client._call(self._receive(max_count, max_wait, idle))

    def _take(self, queued: Any, got: list[ReceivedMessage]) -> None:
        """Every delivery queued on the link, appended to ``got`` as the caller gets it. Decoded on the client's
        loop as they arrive: while the broker still makes the rest of the batch, not after it (the link has no
        credit left while the caller decodes). One call per socket read, not per delivery."""
        append, take = got.append, queued.popleft
        if self.receive_and_delete:
            while queued:
                append(ReceivedMessage(_decode_received(take().payload)))
            return
        new, received, set_int, set_safe = _new, ReceivedMessage, _SET_UUID_INT, _SET_UUID_SAFE
        while queued:
            d = take()
            tag = d.delivery_tag
            # ``ReceivedMessage(message, uuid_of_bytes_le(tag), d)`` without the dataclass's ``__init__`` and the
            # token's call: every delivery a peek-lock receive takes comes here
            r = new(received)
            r.message = _decode_received(d.payload)
            if len(tag) == 16:
                token = new(_UUID)
                set_int(token, _from_bytes(_uuid_pack(*_tag_unpack(tag)), "big"))
                set_safe(token, _SAFE_UNKNOWN)
                r.lock_token = token
            else:  # another AMQP broker's delivery tags are not lock tokens, but its deliveries still need settling
                r.lock_token = None
            r.delivery = d
            append(r)

    def complete(self, messages: Iterable[ReceivedMessage]) -> None:
        """Complete peek-locked messages; raises ClientError when the broker refuses one (e.g. lock lost)."""
        self._settle(messages, Accepted())

    def release(self, messages: Iterable[ReceivedMessage]) -> None:
        """Give peek-locked messages back without counting a delivery."""
        self._settle(messages, Released())

    def abandon(self, messages: Iterable[ReceivedMessage]) -> None:
        """Give peek-locked messages back, counting the delivery (max-delivery-count applies)."""
        self._settle(messages, Modified(delivery_failed=True))

    def dead_letter(
        self, messages: Iterable[ReceivedMessage], reason: str | None = None, description: str | None = None
    ) -> None:
        """Move peek-locked messages to the dead-letter queue with a reason (as the SDK's dead_letter_message)."""
        info = {t.Symbol("DeadLetterReason"): reason, t.Symbol("DeadLetterErrorDescription"): description}
        error = Error(condition=t.Symbol("com.microsoft:dead-letter"), description=description, info=info)
        self._settle(messages, Rejected(error=error))

    def close(self) -> None:
        if not self._client._closed:
            try:
                self._client._call(self._link.close())
            except Exception:
                pass  # the broker gives back unsettled messages when the link or connection goes anyway

    def __enter__(self) -> MessageReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The deliveries' session carries no sends of ours, so the broker's disposition echoes (keyed by session and
    # delivery id in AmqpClient._outcomes) cannot be mistaken for the outcome of a transfer we sent.
    def _settle(self, messages: Iterable[ReceivedMessage], outcome: Any) -> None:
        deliveries = [m.delivery for m in messages if m.delivery is not None]
        if deliveries:
            self._client._call(self._settle_async(deliveries, outcome))

    async def _settle_async(self, deliveries: list[Any], outcome: Any) -> None:
        amqp = self._link._session.client
        link = self._link.link
        session = id(link.session)
        ids = [d.delivery_id for d in deliveries]
        one_run = ids == [*range(ids[0], ids[0] + len(ids))]  # in order, none twice: a whole receive's batch
        if not one_run:
            ids = sorted(set(ids))  # a message named twice is settled once
        echoes = _Echoes(len(ids), asyncio.get_running_loop().create_future())
        amqp._outcomes.update(zip(zip(itertools.repeat(session), ids), itertools.repeat(echoes)))
        # One disposition per run of consecutive delivery ids (AMQP's first..last), as a batch of a receive
        # usually is: a frame for the broker to read and echo per run instead of per message. Only ids of ours
        # are covered; the broker echoes each run, which resolves every delivery of it.
        first = prev = ids[0]
        if one_run:
            last = ids[-1]
            amqp._conn.disposition(link, first, None if last == first else last, settled=False, state=outcome)
        else:
            for did in [*ids[1:], None]:
                if did is not None and did == prev + 1:
                    prev = did
                    continue
                amqp._conn.disposition(link, first, None if prev == first else prev, settled=False, state=outcome)
                if did is not None:
                    first = prev = did
        amqp._flush()
        refusal = await asyncio.wait_for(echoes.future, self._client.timeout)
        if refusal is not None:
            raise ClientError(str(refusal.error.condition), str(refusal.error.description))

    async def _receive(self, max_count: int, max_wait: float, idle: float) -> list[ReceivedMessage]:
        link = self._link
        got: list[ReceivedMessage] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait
        link.grant(max_count)
        queued = link.deliveries
        last = None  # when deliveries were last taken: a partial batch ends ``idle`` s after
        while True:
            # What the socket reads brought is queued already: taken as it is, in one loop (never more than
            # max_count arrive: that is the credit granted). The link's waiter is one future per wait, woken by
            # the read that brings deliveries: a wake-up per read, no task or timer per delivery.
            if queued:
                self._take(queued, got)
                last = loop.time()
            if len(got) >= max_count:
                break
            now = loop.time()
            until = deadline if last is None else min(deadline, last + idle)
            if now >= until:
                break
            await link.wait(until - now)
        if len(got) < max_count and link.link.attached:
            # Take the unused credit back (drain) and wait until the broker says it is spent, so nothing
            # arrives after we return: a receive-and-delete delivery arriving later would be lost. The
            # broker's answer is a flow on the link, which wakes the waiter (as any delivery before it does).
            link.grant(link.link.link_credit, drain=True)
            until = loop.time() + self._client.timeout
            while link.link.link_credit > 0 and link.link.attached and (left := until - loop.time()) > 0:
                await link.wait(left)
        self._take(queued, got)
        return got


class _Echoes:
    """The broker's echoes of one settle call, standing in ``AmqpClient._outcomes`` for each of its delivery ids
    (the engine resolves an outcome with ``done``/``set_result``/``set_exception``, as it would a future): one
    future for the call, resolved by the last echo, instead of a future per delivery gathered (a future, a done
    callback and a list slot per message settled). Its result is the first refusal (``Rejected`` with an error),
    or None when every delivery was accepted as asked."""

    __slots__ = ("_left", "_refusal", "future")

    def __init__(self, count: int, future: asyncio.Future[Rejected | None]) -> None:
        self.future = future
        self._left = count
        self._refusal: Rejected | None = None

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, state: Any) -> None:
        if self._refusal is None and isinstance(state, Rejected) and state.error is not None:
            self._refusal = state
        self._left -= 1
        if self._left <= 0 and not self.future.done():
            self.future.set_result(self._refusal)

    def set_exception(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def exception(self) -> BaseException | None:
        return self.future.exception()


class _Node:
    """The request/response link pair of one entity's ``$management`` node."""

    def __init__(self, sender: ClientSender, receiver: ClientReceiver, address: str) -> None:
        self.sender = sender
        self.receiver = receiver
        self.address = address
        self.pending: dict[str, asyncio.Future[AmqpMessage]] = {}
        self.reader: asyncio.Task[None] | None = None

    async def read_replies(self) -> None:
        while True:
            delivery = await self.receiver.receive(timeout=None)
            reply = decode_message(delivery.payload)
            correlation = reply.properties.correlation_id if reply.properties else None
            fut = self.pending.pop(str(correlation), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
            if self.receiver.link.credit < 16:
                self.receiver.grant(64)


class ShardbusClient:
    """One AMQP connection to a shardbus namespace, used from blocking code."""

    def __init__(self, connection_string: str, *, timeout: float = 30.0) -> None:
        self.settings = ConnectionSettings.parse(connection_string)
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shardbus-client", daemon=True)
        self._thread.start()
        self._amqp: AmqpClient | None = None
        self._session: ClientSession | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._nodes: dict[str, _Node] = {}
        self._senders: dict[str, ClientSender] = {}
        self._receive_session: tuple[AmqpClient, ClientSession] | None = None
        self._ids = itertools.count(1)
        self._closed = False

    # ------------------------------------------------------------------------------------ public API
    def range_offsets(self, entity: str, count_from: dict[int, int] | None = None) -> list[PartitionOffsets]:
        """Per partition: first readable, end, completed mark, and how many readable messages are at or above
        ``count_from[partition]`` (all of them when not given). Partition-relative sequence numbers."""
        request = {"from": {t.Int(p): t.Long(s) for p, s in count_from.items()}} if count_from else {}
        body = self._call(self._request(entity, "com.shardbus:range-offsets", request))
        out = []
        for item in body["partitions"]:
            item = {str(k): v for k, v in item.items()}
            if item.get("healthy"):
                fields = (int(item[k]) for k in ("first", "end", "mark", "count"))
                out.append(PartitionOffsets(int(item["partition"]), True, *fields))
            else:
                out.append(PartitionOffsets(int(item["partition"]), False))
        return out

    def browse_range(
        self, entity: str, partition: int, start: int, end: int, max_count: int, columns: list[str] | None = None
    ) -> dict[str, Any]:
        """Up to ``max_count`` messages of one partition with ``start <= sequence number < end`` (partition-
        relative), oldest first, without locking: a map of column name -> list (all of management.RANGE_COLUMNS,
        or the ``columns`` named), plus ``count`` and the partition's completed ``mark``."""
        request: dict[str, Any] = {
            "partition": t.Int(partition),
            "from-sequence-number": t.Long(start),
            "to-sequence-number": t.Long(end),
            "message-count": t.Int(max_count),
        }
        if columns:
            request["columns"] = list(columns)
        body = self._call(self._request(entity, "com.shardbus:browse-range", request))
        return {str(k): v for k, v in body.items()}

    def complete_below(self, entity: str, marks: dict[int, int]) -> None:
        """Complete every message below ``marks[partition]`` in each partition (cumulative, idempotent)."""
        if marks:
            request = {"marks": {t.Int(p): t.Long(m) for p, m in marks.items()}}
            self._call(self._request(entity, "com.shardbus:complete-below", request))

    def peek(self, entity: str, max_count: int = 1, from_sequence_number: int = 0) -> list[ReceivedMessage]:
        """The service's peek (``com.microsoft:peek-message``): up to ``max_count`` messages without locking,
        from the partition ``from_sequence_number`` names on (an exhausted partition passes to the next), so
        paging with ``last.sequence_number + 1`` walks the whole entity. Empty when nothing is left."""
        request = {"from-sequence-number": t.Long(from_sequence_number), "message-count": t.Int(max_count)}
        body = self._call(self._request(entity, "com.microsoft:peek-message", request))
        out = []
        for entry in body.get("messages") or []:
            entry = {str(k): v for k, v in entry.items()}
            out.append(ReceivedMessage(decode_message(bytes(entry["message"]))))
        return out

    def receiver(
        self,
        entity: str,
        *,
        receive_and_delete: bool = False,
        session_id: str | None = None,
        any_session: bool = False,
        session_wait: float = 5.0,
    ) -> MessageReceiver:
        """A receiving link on ``entity`` (``queue``, ``topic/Subscriptions/sub``, optionally with
        ``/$DeadLetterQueue``): peek-lock unless ``receive_and_delete``. On a session-enabled entity name the
        session (``session_id``) or take the next available one (``any_session``, waiting up to
        ``session_wait`` s; the broker refuses the link when none comes)."""
        filters = None
        properties = None
        if session_id is not None or any_session:
            filters = {t.Symbol(SESSION_FILTER): session_id}
            if session_id is None:
                properties = {t.Symbol("com.microsoft:timeout"): t.UInt(int(session_wait * 1000))}
        link = self._call(self._attach_receiver(entity, receive_and_delete, filters, properties))
        return MessageReceiver(self, link, receive_and_delete)

    def send(self, entity: str, messages: Iterable[OutgoingMessage | bytes], *, window: int = SEND_WINDOW) -> int:
        """Send messages (or already-encoded AMQP messages) and wait until every one is stored; returns the
        count. At most ``window`` transfers are in flight (unacknowledged) at a time. Raises ClientError on the
        first refusal (the others may or may not be stored)."""
        if window < 1:
            raise ValueError("window must be at least 1")
        payloads = [m if isinstance(m, bytes) else m.encode() for m in messages]
        if payloads:
            self._call(self._send(entity, payloads, window))
        return len(payloads)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(self.timeout)
        except Exception:
            pass  # closing is best effort: the socket goes with the loop anyway
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout)
        self._loop.close()

    def __enter__(self) -> ShardbusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- internals
    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClientError(None, "the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _shutdown(self) -> None:
        for node in self._nodes.values():
            if node.reader is not None:
                node.reader.cancel()
        if self._amqp is not None:
            await self._amqp.close()

    async def _ensure_session(self) -> ClientSession:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._amqp is not None and self._amqp._conn.is_done:
                self._amqp = self._session = None  # the connection broke: start over
                self._nodes.clear()
                self._senders.clear()
            if self._session is None:
                s = self.settings
                self._amqp = await asyncio.wait_for(
                    AmqpClient.connect(
                        s.host,
                        s.port,
                        sasl_mechanism="PLAIN",
                        username=s.key_name,
                        password=s.key,
                        hostname=s.host,
                        timeout=self.timeout,
                    ),
                    self.timeout,
                )
                self._session = await self._amqp.session(incoming_window=0x7FFFFFFF)
            return self._session

    async def _attach_receiver(
        self,
        entity: str,
        receive_and_delete: bool,
        filters: dict[Any, Any] | None = None,
        properties: dict[Any, Any] | None = None,
    ) -> ClientReceiver:
        await self._ensure_session()
        amqp = self._amqp
        assert amqp is not None
        # Receivers get a session of their own (see MessageReceiver._settle); a new connection needs a new one.
        if self._receive_session is None or self._receive_session[0] is not amqp:
            self._receive_session = (amqp, await amqp.session(incoming_window=0x7FFFFFFF))
        session = self._receive_session[1]
        mode = SndSettleMode.SETTLED if receive_and_delete else SndSettleMode.UNSETTLED
        link = await session._attach(
            f"receiver-{uuid.uuid4()}",
            RECEIVER,
            Source(address=entity, filter=filters),
            Target(address=None),
            snd_settle_mode=mode,
            properties=properties,
        )
        receiver = ClientReceiver(session, link)
        amqp._receivers[id(link)] = receiver
        return receiver

    async def _node(self, entity: str) -> _Node:
        node = self._nodes.get(entity)
        if node is None:
            session = await self._ensure_session()
            address = f"{entity}/$management"
            sender = await session.sender(address)
            receiver = await session.receiver(address, credit=64)
            node = self._nodes[entity] = _Node(sender, receiver, address)
            node.reader = asyncio.get_running_loop().create_task(node.read_replies())
        return node

    async def _request(self, entity: str, operation: str, body: dict[str, Any]) -> dict[Any, Any]:
        node = await self._node(entity)
        message_id = f"shardbus-{next(self._ids)}"
        request = AmqpMessage(
            properties=Properties(message_id=message_id, reply_to=node.address),
            application_properties={"operation": operation},
            body=body,
            body_type=BodyType.VALUE,
        )
        fut = asyncio.get_running_loop().create_future()
        node.pending[message_id] = fut
        try:
            await node.sender.send(request.encode(), timeout=self.timeout)
            reply = await asyncio.wait_for(fut, self.timeout)
        finally:
            node.pending.pop(message_id, None)
        app = {str(k): v for k, v in (reply.application_properties or {}).items()}
        status = int(app.get("statusCode", 500))
        if status >= 300:
            condition = app.get("errorCondition")
            raise ClientError(None if condition is None else str(condition), str(app.get("statusDescription")), status)
        return reply.body if isinstance(reply.body, dict) else {}

    async def _send(self, entity: str, payloads: list[bytes], window: int = SEND_WINDOW) -> None:
        sender = self._senders.get(entity)
        if sender is None:
            session = await self._ensure_session()
            sender = self._senders[entity] = await session.sender(entity, name=f"sender-{uuid.uuid4()}")
        # One window for the whole call (ClientSender.send_many): each outcome that comes back sends the next
        # payload, with no coroutine, future or timer per message; it stops sending at the first refusal.
        refused, outcome = await sender.send_many(payloads, window=window, timeout=self.timeout)
        if refused:
            error = outcome.error if isinstance(outcome, Rejected) else None
            if error is not None:
                raise ClientError(str(error.condition), str(error.description))
            raise ClientError(None, f"send not accepted: {outcome}")
