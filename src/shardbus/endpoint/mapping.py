"""Service Bus messages on the wire ⇄ ``shardbus.Message`` (SERVICEBUS_AMQP.md §3.5 and §4.4).

Inbound, the broker-owned ``x-opt-*`` annotations a client may echo back (a re-sent received message keeps
them) are dropped, and the ones a sender may set (partition key, scheduled enqueue time) become message fields.
Outbound, the broker's annotations are stamped: sequence number, enqueued time, locked-until, partition key,
state (for peek), and dead-letter reason and description become application properties, as the service does.

AMQP value types without a Python counterpart (symbol, long, timestamp, ...) are registered with the store's
packer, so application properties keep their exact AMQP types across storage.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ..amqp import codec
from ..amqp import types as t
from ..amqp.message import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    FOOTER,
    PROPERTIES,
    AmqpMessage,
    Header,
    Properties,
    Section,
    decode_message,
    encode_message,
)
from ..amqp.message import BodyType as WireBody
from ..model.message import BodyType, Message, MessageState, datetime_to_ms
from ..store.records import register_type

PARTITION_KEY = t.Symbol("x-opt-partition-key")
SCHEDULED_TIME = t.Symbol("x-opt-scheduled-enqueue-time")
SEQUENCE_NUMBER = t.Symbol("x-opt-sequence-number")
ENQUEUED_TIME = t.Symbol("x-opt-enqueued-time")
LOCKED_UNTIL = t.Symbol("x-opt-locked-until")
ENQUEUE_SEQUENCE = t.Symbol("x-opt-enqueue-sequence-number")
MESSAGE_STATE = t.Symbol("x-opt-message-state")
DEAD_LETTER_SOURCE = t.Symbol("x-opt-deadletter-source")
LOCK_TOKEN = t.Symbol("x-opt-lock-token")
BROKER_OWNED = frozenset(
    {
        "x-opt-sequence-number",
        "x-opt-enqueued-time",
        "x-opt-locked-until",
        "x-opt-lock-token",
        "x-opt-message-state",
        "x-opt-enqueue-sequence-number",
        "x-opt-deadletter-source",
        "x-opt-partition-id",
        "x-opt-via-partition-key",
    }
)
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"

_TYPES = (t.Symbol, t.UByte, t.UShort, t.UInt, t.ULong, t.Byte, t.Short, t.Int, t.Long, t.Timestamp, t.Float)
for _tag, _cls in enumerate(_TYPES, start=1):
    register_type(_tag, _cls, (float if _cls is t.Float else str if _cls is t.Symbol else int), _cls)


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return datetime_to_ms(value)
    return int(value)


def to_message(amqp: AmqpMessage) -> Message:
    """A decoded inbound message as the core's ``Message``."""
    m = Message()
    bt = amqp.body_type
    if bt == WireBody.DATA:
        m.body = amqp.body[0] if len(amqp.body) == 1 else b"".join(amqp.body)
    elif bt == WireBody.VALUE:
        m.body, m.body_type = codec.encode(amqp.body), BodyType.VALUE
    elif bt == WireBody.SEQUENCE:
        m.body, m.body_type = codec.encode(amqp.body), BodyType.SEQUENCE
    else:
        m.body_type = BodyType.NONE
    p = amqp.properties
    if p is not None:
        m.message_id = p.message_id
        m.to = p.to
        m.subject = p.subject
        m.reply_to = p.reply_to
        m.correlation_id = p.correlation_id
        m.content_type = None if p.content_type is None else str(p.content_type)
        m.session_id = p.group_id
        m.reply_to_session_id = p.reply_to_group_id
    h = amqp.header
    if h is not None and h.ttl:
        m.time_to_live = timedelta(milliseconds=h.ttl)
    ma = amqp.message_annotations
    if ma:
        extra = {}
        for key, value in ma.items():
            name = str(key)
            if name == "x-opt-partition-key":
                m.partition_key = None if value is None else str(value)
            elif name == "x-opt-scheduled-enqueue-time":
                ms = _ms(value)
                m.scheduled_enqueue_time = None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
            elif name not in BROKER_OWNED:
                extra[name] = value
        m.annotations = extra or None
    if amqp.application_properties:
        m.application_properties = {str(k): v for k, v in amqp.application_properties.items()}
    return m


def _wire_ttl_and_count(m: Message, peek: bool) -> tuple[int | None, int]:
    """header.ttl (None: never expires, as far as a client can tell) and header.delivery-count of a delivery."""
    ttl = None
    if m.expires_at_ms is not None:
        start = m.enqueued_time_ms
        if m.state is MessageState.SCHEDULED and m.scheduled_enqueue_time is not None:
            start = max(start, datetime_to_ms(m.scheduled_enqueue_time))
        ttl = m.expires_at_ms - start
        if not 0 <= ttl < 2**32:  # header.ttl is a uint; longer TTLs are "never" for a client
            ttl = None
    # The wire's delivery-count counts earlier failed deliveries; the core counts this one too.
    delivery_count = m.delivery_count - 1 if (m.lock_token is not None and not peek) else m.delivery_count
    return ttl, max(0, delivery_count)


_UNCHANGING = frozenset({PROPERTIES, APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER})


def decode_to_message(payload: bytes) -> Message:
    """Decode an inbound message, keeping the sender's encoding of its unchanging sections for deliveries."""
    sections: list[Section] = []
    m = to_message(decode_message(payload, sections))
    kept = [s for s in sections if s.code in _UNCHANGING]
    if kept and kept[-1].end == len(payload) and len(kept) == len(sections) - sections.index(kept[0]):
        m.wire_sections = payload[kept[0].start :]  # the usual layout: one slice instead of a join
    else:
        m.wire_sections = b"".join([payload[s.start : s.end] for s in kept])
    return m


def _key(name: t.Symbol) -> bytes:
    out = bytearray()
    codec.e_symbol(out, name)
    return bytes(out)


_SEQUENCE_NUMBER_KEY = _key(SEQUENCE_NUMBER)
_ENQUEUED_TIME_KEY = _key(ENQUEUED_TIME)
_ENQUEUE_SEQUENCE_KEY = _key(ENQUEUE_SEQUENCE)
_LOCKED_UNTIL_KEY = _key(LOCKED_UNTIL)
_PARTITION_KEY_KEY = _key(PARTITION_KEY)
_SCHEDULED_TIME_KEY = _key(SCHEDULED_TIME)
_DEAD_LETTER_SOURCE_KEY = _key(DEAD_LETTER_SOURCE)


def _delivery_head(m: Message, ttl: int | None, delivery_count: int) -> bytes:
    """Header and message-annotations of a delivery whose message has no annotations of its own, written
    directly: what ``encode_message`` would give for the same values (in the same order), at a fraction of the
    cost, and every delivery pays for it."""
    ma = bytearray(_SEQUENCE_NUMBER_KEY)
    codec.e_long(ma, m.sequence_number)  # type: ignore[arg-type]
    ma += _ENQUEUED_TIME_KEY
    codec.e_timestamp(ma, m.enqueued_time_ms)  # type: ignore[arg-type]
    count = 4
    if m.enqueued_sequence_number is not None:
        ma += _ENQUEUE_SEQUENCE_KEY
        codec.e_long(ma, m.enqueued_sequence_number)
        count += 2
    if m.locked_until_ms is not None:
        ma += _LOCKED_UNTIL_KEY
        codec.e_timestamp(ma, m.locked_until_ms)
        count += 2
    key = m.partition_key if m.partition_key is not None else m.session_id
    if key is not None:
        ma += _PARTITION_KEY_KEY
        codec.e_string(ma, key)
        count += 2
    if m.scheduled_enqueue_time is not None:
        ma += _SCHEDULED_TIME_KEY
        codec.e_timestamp(ma, datetime_to_ms(m.scheduled_enqueue_time))
        count += 2
    if m.dead_letter_source is not None:
        ma += _DEAD_LETTER_SOURCE_KEY
        codec.e_string(ma, m.dead_letter_source)
        count += 2
    out = bytearray()
    Header(ttl=ttl, delivery_count=delivery_count).encode_into(out)
    out += b"\x00\x53\x72"
    codec._finish_compound(out, ma, count, 0xC1, 0xD1)
    return bytes(out)


def encode_delivery(m: Message, *, peek: bool = False) -> bytes:
    """The encoded message a receiver gets (or a peek returns) for ``m``, with the broker's annotations."""
    dead_lettered = m.dead_letter_reason is not None or m.dead_letter_error_description is not None
    if m.wire_sections is not None and not (peek or m.annotations or dead_lettered):
        return _delivery_head(m, *_wire_ttl_and_count(m, peek)) + m.wire_sections
    annotations: dict[Any, Any] = {}
    if m.annotations:
        annotations.update((t.Symbol(k), v) for k, v in m.annotations.items())
    annotations[SEQUENCE_NUMBER] = t.Long(m.sequence_number)
    annotations[ENQUEUED_TIME] = t.Timestamp(m.enqueued_time_ms)
    if m.enqueued_sequence_number is not None:
        annotations[ENQUEUE_SEQUENCE] = t.Long(m.enqueued_sequence_number)
    if m.locked_until_ms is not None and not peek:
        annotations[LOCKED_UNTIL] = t.Timestamp(m.locked_until_ms)
    if m.partition_key is not None:
        annotations[PARTITION_KEY] = m.partition_key
    elif m.session_id is not None:
        annotations[PARTITION_KEY] = m.session_id
    if m.scheduled_enqueue_time is not None:
        annotations[SCHEDULED_TIME] = t.Timestamp(datetime_to_ms(m.scheduled_enqueue_time))
    if peek:
        annotations[MESSAGE_STATE] = t.Int(int(m.state))
    if m.dead_letter_source is not None:
        annotations[DEAD_LETTER_SOURCE] = m.dead_letter_source
    ttl, delivery_count = _wire_ttl_and_count(m, peek)
    app = m.application_properties
    if dead_lettered:
        app = dict(app or {})
        app[DEAD_LETTER_REASON] = m.dead_letter_reason
        app[DEAD_LETTER_DESCRIPTION] = m.dead_letter_error_description
    header = Header(ttl=ttl, delivery_count=delivery_count)
    if m.wire_sections is not None and app is m.application_properties:
        return encode_message(AmqpMessage(header=header, message_annotations=annotations)) + m.wire_sections
    bt = m.body_type
    if bt == BodyType.DATA:
        body, wire_body = [m.body], WireBody.DATA
    elif bt == BodyType.VALUE:
        body, wire_body = codec.decode(m.body), WireBody.VALUE
    elif bt == BodyType.SEQUENCE:
        body, wire_body = codec.decode(m.body), WireBody.SEQUENCE
    else:
        body, wire_body = None, WireBody.NONE
    return encode_message(
        AmqpMessage(
            header=header,
            message_annotations=annotations,
            properties=Properties(
                message_id=m.message_id,
                to=m.to,
                subject=m.subject,
                reply_to=m.reply_to,
                correlation_id=m.correlation_id,
                content_type=None if m.content_type is None else t.Symbol(m.content_type),
                absolute_expiry_time=None if m.expires_at_ms is None or ttl is None else t.Timestamp(m.expires_at_ms),
                creation_time=t.Timestamp(m.enqueued_time_ms),
                group_id=m.session_id,
                reply_to_group_id=m.reply_to_session_id,
            ),
            application_properties=app,
            body=body,
            body_type=wire_body,
        )
    )
