"""Service Bus messages on the wire ⇄ ``shardbus.Message`` (SERVICEBUS_AMQP.md §3.5 and §4.4).

Inbound, the broker-owned ``x-opt-*`` annotations a client may echo back (a re-sent received message keeps
them) are dropped, and the ones a sender may set (partition key, scheduled enqueue time) become message fields (the
scheduled time only when it is an AMQP timestamp, the one type the service honours).
Outbound, the broker's annotations are stamped: sequence number, enqueued time, locked-until, partition key,
state (for peek), and dead-letter reason and description become application properties, as the service does.

The mapping of a message's fields to sections and the annotation names are ``message_wire``'s, which the client
shares; this module adds the broker's side (what is dropped, what is stamped) and the fast paths every message takes.
AMQP value types without a Python counterpart (symbol, long, timestamp, char, array, described, ...) are kept by the
store through ``store/amqp_values.py``, registered where a process starts.
"""

from __future__ import annotations

import struct
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
    HEADER,
    PROPERTIES,
    AmqpMessage,
    Header,
    Properties,
    Section,
    decode_message,
    encode_message,
    split_batch,
)
from ..amqp.message import BodyType as WireBody
from ..message_wire import (
    BROKER_OWNED,
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    ENQUEUE_SEQUENCE,
    ENQUEUED_TIME,
    LOCK_TOKEN,
    LOCKED_UNTIL,
    MESSAGE_STATE,
    PARTITION_KEY,
    SCHEDULED_TIME,
    SEQUENCE_NUMBER,
    encode_sections,
    read_properties,
)
from ..model.message import BodyType, Message, MessageState, datetime_to_ms, new_message

__all__ = [
    "BROKER_OWNED",
    "DEAD_LETTER_DESCRIPTION",
    "DEAD_LETTER_REASON",
    "LOCK_TOKEN",
    "PARTITION_KEY",
    "SCHEDULED_TIME",
    "decode_batch_to_messages",
    "decode_to_message",
    "encode_deliveries",
    "encode_delivery",
    "to_message",
]

# The milliseconds a ``datetime`` can hold (years 1 to 9999)
_MIN_MS = int(datetime(1, 1, 1, tzinfo=UTC).timestamp() * 1000)
_MAX_MS = int(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000)


def _scheduled_time(value: Any) -> datetime | None:
    """The time an ``x-opt-scheduled-enqueue-time`` annotation asks for, or None when it asks for none the service
    would honour: only an AMQP timestamp counts. The service ignores any other value (azure-sdk-for-js#27396:
    "The service ignores the value when it is not valid"; a plain integer does not schedule either,
    azure-uamqp-python#57), and so does this, instead of failing the send."""
    if type(value) is not t.Timestamp or not _MIN_MS <= value <= _MAX_MS:
        return None
    return datetime.fromtimestamp(value / 1000, UTC)


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
        read_properties(m, p)
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
                m.scheduled_enqueue_time = _scheduled_time(value)
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


_DATA_BODY = BodyType.DATA  # a module constant: reading an Enum member off its class costs several globals
_UNCHANGING = frozenset({PROPERTIES, APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER})
_DEC = codec._DEC
_LISTS = frozenset((0x45, 0xC0, 0xD0))
_MAPS = frozenset((0xC1, 0xD1))


# Fields of the properties list (in wire order) that may hold a string or symbol: message-id, to, reply-to and
# correlation-id (any type), subject, group-id and reply-to-group-id (string), content-type and
# content-encoding (symbol, a string accepted); and those that may hold a uuid (any type).
_TEXT_FIELDS = (True, False, True, True, True, True, True, True, False, False, True, False, True)
_UUID_FIELDS = (True, False, True, False, True, True, False, False, False, False, False, False, False)
_uuid_of = _DEC[0x98]
_uint32 = struct.Struct(">I").unpack_from
# A message's first eight bytes: a section's descriptor and constructor as one 32-bit value (0x00 0x53 code ctor),
# then (a list8) its size, and its count and first field's constructor as one 16-bit value, then that field's size
_BYTES8 = struct.Struct(">IBHB").unpack_from
_PROPERTIES_LIST8 = 0x00530000 | PROPERTIES << 8 | 0xC0
_DATA_HEAD = struct.Struct(">II").unpack_from  # a section's descriptor and constructor, then 4 bytes
_DATA_VBIN32 = 0x00530000 | DATA << 8 | 0xB0
_DATA_VBIN8 = 0x00530000 | DATA << 8 | 0xA0
_PROPERTY_NAMES = [f.name for f in Properties.__dataclass_fields__.values()]


def _plain_properties(buf: bytes, p: int) -> tuple[list[Any], int] | None:
    """The fields of a properties section's list8 at ``p`` (its constructor byte) when every field is null, a
    str8/sym8 where text is allowed or a uuid where any type is: what a Service Bus sender sets. The values and
    types are the general decoder's; None for anything else, which that decoder then handles."""
    if buf[p] != 0xC0:
        return None
    end = p + 2 + buf[p + 1]
    count = buf[p + 2]
    if count > 13 or end > len(buf):
        return None
    out: list[Any] = [None] * 13
    # a message-id alone, as our client sends it (the SDK adds 12 nulls, which the loop below takes at once)
    if count == 1 and buf[p + 3] == 0xA1 and p + 5 + buf[p + 4] == end:
        out[0] = buf[p + 5 : end].decode("utf-8")
        return out, end
    p += 3
    for i in range(count):
        c = buf[p]
        if c == 0x40:
            if buf.count(0x40, p, end) == end - p == count - i:  # only nulls left (the SDK sets 1 of 13)
                p = end
                break
            p += 1
        elif (c == 0xA1 or c == 0xA3) and _TEXT_FIELDS[i]:
            s = p + 2
            e = s + buf[p + 1]
            if e > end:
                return None
            out[i] = buf[s:e].decode("utf-8") if c == 0xA1 else codec._symbol(buf[s:e])
            p = e
        elif c == 0x98 and _UUID_FIELDS[i]:
            out[i], p = _uuid_of(buf, p + 1, 1)
        else:
            return None
    return (out, p) if p == end else None


# The time to live of header sections as they came: a sender repeats the same few (durable=true, one ttl), and a
# header's list costs the general decoder more than the rest of a plain message; bounded, as ``_HEADERS``.
_HEADER_TTLS: dict[bytes, int] = {}
_ID_ONLY: list[Any] = []  # ``_decode_plain``'s properties when they hold a message-id alone (kept in ``message_id``)


def _data_span(buf: bytes, p: int) -> tuple[int, int]:
    """Where the binary of the data section at ``p`` starts and ends in ``buf`` (an end of -1: not a vbin8 or
    vbin32, which ``_decode_plain`` leaves to the general decoder)."""
    c = buf[p + 3]
    if c == 0xB0:
        return p + 8, p + 8 + _uint32(buf, p + 4)[0]
    if c == 0xA0:
        return p + 5, p + 5 + buf[p + 4]
    return 0, -1


def _decode_plain(buf: bytes) -> Message | None:
    """One pass from bytes to ``Message`` for what nearly every sender sends: optionally a header (a time to live,
    or durable=true as AMQP clients set it for a persistent message), properties, optionally
    application-properties, then one data section, in that order, nothing else. None for anything else (or
    anything malformed), which the general path then decodes, refuses or reports exactly as before. Every section
    after the header is unchanging: deliveries carry what precedes the body as it came, behind a header of their own
    (see ``_unchanging_parts``)."""
    n = len(buf)
    p = kept = ttl = 0  # ``kept``: where deliveries' own sections start (after the header); ttl 0: none
    props: list[Any] | None = None  # the properties' 13 fields
    app: dict[Any, Any] | None = None
    body: bytes | None = None
    try:
        # Our client's message (bench/scale.py's, the Spark connector's): properties holding a message-id alone,
        # then one data section. The loop below's steps for it, without the loop: the same checks, on bytes read
        # eight at a time (one unpack costs about what one index into ``buf`` does).
        if n >= 8:
            section, size, one_str, k = _BYTES8(buf, 0)
            if section == _PROPERTIES_LIST8 and one_str == 0x01A1:  # a list8 of one field, a str8-utf8
                q = 5 + size
                if 8 + k == q and n - q >= 8:
                    section, length = _DATA_HEAD(buf, q)  # a vbin32's length, or a vbin8's and 3 bytes
                    # ``_data_span``'s two cases
                    if section == _DATA_VBIN32:
                        start = q + 8
                        end = start + length
                    elif section == _DATA_VBIN8:
                        start = q + 5
                        end = start + (length >> 24)
                    else:
                        end = -1
                    if end == n:
                        m = new_message(buf[start:], buf[8:q].decode("utf-8"))
                        m.wire_sections = buf[:start]
                        return m
        if buf[2] == HEADER and buf[0] == 0 and buf[1] == 0x53 and buf[3] in _LISTS:
            p = 5 + buf[4] if buf[3] == 0xC0 else 4 if buf[3] == 0x45 else 0
            ttl = _HEADER_TTLS.get(buf[:p]) if p else None
            if ttl is None:  # a header not seen before (or a list32): decoded and checked as the general path does
                fields, p = _DEC[buf[3]](buf, 4, 1)
                ttl = Header.from_fields(fields).ttl or 0
                if len(_HEADER_TTLS) >= 1024:
                    _HEADER_TTLS.clear()
                _HEADER_TTLS[buf[:p]] = ttl
            kept = p  # deliveries keep what follows the header
        while p < n:
            if buf[p] != 0 or buf[p + 1] != 0x53:
                return None
            code = buf[p + 2]
            c = buf[p + 3]
            if code == DATA:  # the last section: nothing may follow it
                start, end = _data_span(buf, p)
                if end != n:
                    return None
                body = buf[start:end]
                break
            elif code == PROPERTIES and props is None and app is None and c in _LISTS:
                end = p + 5 + buf[p + 4]
                if c == 0xC0 and buf[p + 5] == 1 and buf[p + 6] == 0xA1 and p + 8 + buf[p + 7] == end:
                    # a message-id alone, as our client sends it: ``_plain_properties``' first case written out
                    message_id = buf[p + 8 : end].decode("utf-8")
                    props = _ID_ONLY
                    p = end
                    continue
                plain = _plain_properties(buf, p + 3)
                if plain is None:  # other field types: the general decoder, with its checks
                    fields, p = _DEC[c](buf, p + 4, 1)
                    checked = Properties.from_fields(fields)
                    props = [getattr(checked, name) for name in _PROPERTY_NAMES]
                else:
                    props, p = plain
            elif code == APPLICATION_PROPERTIES and app is None and c in _MAPS:
                app, p = _DEC[c](buf, p + 4, 1)
            else:
                return None
    except Exception:  # malformed: the general path raises the right DecodeError
        return None
    if body is None:
        return None
    if props is None:
        m = new_message(body)
    elif props is _ID_ONLY:
        m = new_message(body, message_id)
    else:
        message_id, _, to, subject, reply_to, correlation_id, ct, _, _, _, session_id, _, rgid = props
        content_type = None if ct is None else str(ct)
        # positional, in Message's field order: body, message-id, session-id, partition-key, correlation-id,
        # subject, content-type, to, reply-to, reply-to-session-id
        m = new_message(body, message_id, session_id, None, correlation_id, subject, content_type, to, reply_to, rgid)
    if app:
        m.application_properties = {str(k): v for k, v in app.items()}
    if ttl:
        m.time_to_live = timedelta(milliseconds=ttl)
    m.wire_sections = buf[kept:start]  # up to the body's first byte (see ``_unchanging_parts``)
    return m


def decode_to_message(payload: bytes) -> Message:
    """Decode an inbound message, keeping the sender's encoding of its unchanging sections for deliveries."""
    if type(payload) is bytes:
        m = _decode_plain(payload)
        if m is not None:
            return m
    sections: list[Section] = []
    m = to_message(decode_message(payload, sections))
    kept = [s for s in sections if s.code in _UNCHANGING]
    if m.body_type is _DATA_BODY:
        # Kept up to the body's first byte (see ``_unchanging_parts``), so only when the body is one data section at
        # the end; several data sections or a footer are re-encoded, as they are after a restart.
        if [s.code for s in kept].count(DATA) == 1 and kept[-1].code == DATA:
            data = kept.pop()
            data_head = payload[data.start : data.end - len(m.body)]  # descriptor, constructor and size
            m.wire_sections = b"".join([*[payload[s.start : s.end] for s in kept], data_head])
    elif kept and kept[-1].end == len(payload) and len(kept) == len(sections) - sections.index(kept[0]):
        m.wire_sections = payload[kept[0].start :]  # the usual layout: one slice instead of a join
    else:
        m.wire_sections = b"".join([payload[s.start : s.end] for s in kept])
    return m


def decode_batch_to_messages(payload: bytes) -> list[Message]:
    """The messages of a ``0x80013700`` batch envelope: ``[decode_to_message(m) for m in split_batch(payload)]``
    in one pass over the envelope, for the usual envelope (small-ulong descriptors, data sections as vbin).
    Anything else takes that general path, with its errors."""
    if type(payload) is bytes:
        buf = payload
        n = len(buf)
        p = 0
        inner: list[bytes] = []
        try:
            while p < n:
                if buf[p] != 0 or buf[p + 1] != 0x53:
                    break
                code = buf[p + 2]
                c = buf[p + 3]
                if code == DATA and c == 0xB0:
                    start = p + 8
                    end = start + int.from_bytes(buf[p + 4 : start], "big")
                elif code == DATA and c == 0xA0:
                    start = p + 5
                    end = start + buf[p + 4]
                elif code in (AMQP_VALUE, AMQP_SEQUENCE, DATA) or not HEADER <= code <= FOOTER:
                    break
                else:
                    start, end = -1, codec.skip_at(buf, p + 3)
                if end > n:
                    break
                if start >= 0:
                    inner.append(buf[start:end])
                p = end
        except Exception:  # malformed: the general path raises the right DecodeError
            p = -1
        if p == n:
            # ``decode_to_message`` of each, its fast path called here: one Python call fewer per message
            out = []
            for data in inner:
                m = _decode_plain(data)
                out.append(decode_to_message(data) if m is None else m)
            return out
    return [decode_to_message(m) for m in split_batch(payload)]


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


_pack_long = struct.Struct(">Bq").pack  # a long or timestamp constructor and its 8 bytes
_HEADERS: dict[tuple[int | None, int], bytes] = {}  # encoded header sections by (ttl, delivery-count)


def _long(v: int) -> bytes:
    """``v`` as ``codec.e_long`` writes it (smalllong when it fits)."""
    return bytes((0x55, v & 0xFF)) if -128 <= v <= 127 else _pack_long(0x81, v)


def _header(ttl: int | None, delivery_count: int) -> bytes:
    """The encoded header section of a delivery; only a few (ttl, count) pairs occur, so they are kept."""
    key = (ttl, delivery_count)
    found = _HEADERS.get(key)
    if found is None:
        if len(_HEADERS) >= 4096:
            _HEADERS.clear()
        found = _HEADERS[key] = Header(ttl=ttl, delivery_count=delivery_count).encode()
    return found


def _delivery_head(m: Message, ttl: int | None, delivery_count: int, tail: tuple[bytes, ...] = ()) -> bytes:
    """Header and message-annotations of a delivery whose message has no annotations of its own, written
    directly: what ``encode_message`` would give for the same values (in the same order), at a fraction of the
    cost, and every delivery pays for it. ``tail`` (the rest of the message) is joined on in the same copy."""
    parts = [
        _SEQUENCE_NUMBER_KEY,
        _long(m.sequence_number),  # type: ignore[arg-type]
        _ENQUEUED_TIME_KEY,
        _pack_long(0x83, m.enqueued_time_ms),
    ]
    if m.enqueued_sequence_number is not None:
        parts += (_ENQUEUE_SEQUENCE_KEY, _long(m.enqueued_sequence_number))
    if m.locked_until_ms is not None:
        parts += (_LOCKED_UNTIL_KEY, _pack_long(0x83, m.locked_until_ms))
    key = m.partition_key if m.partition_key is not None else m.session_id
    count = len(parts)
    if key is not None or m.scheduled_enqueue_time is not None or m.dead_letter_source is not None:
        ma = bytearray(b"".join(parts))
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
        body = bytes(ma)
    else:
        body = b"".join(parts)
    n = len(body)
    if n < 255 and count < 256:
        size = bytes((0xC1, n + 1, count))
    else:
        size = b"\xd1" + (n + 4).to_bytes(4, "big") + count.to_bytes(4, "big")
    return b"".join((_header(ttl, delivery_count), b"\x00\x53\x72", size, body, *tail))


# The message-annotations bytes every delivery has: the sequence number's and the enqueued time's keys and the
# time's constructor, with the size of their values but the sequence number's (``encode_deliveries``)
_ALWAYS_SIZE = len(_SEQUENCE_NUMBER_KEY) + len(_ENQUEUED_TIME_KEY) + 9
# Made once, since building a few bytes from their values costs more than a lookup: a smalllong by value + 128,
# and the message-annotations section's descriptor and map8 header by its size + 256 x its count of keys and values
_SMALL_LONGS = tuple(bytes((0x55, v & 0xFF)) for v in range(-128, 128))
_MAP8_HEADS: dict[int, bytes] = {
    size + 256 * count: bytes((0x00, 0x53, 0x72, 0xC1, size + 1, count))
    for count in (4, 6, 8)
    for size in range(_ALWAYS_SIZE, 255)
}


# The message-annotations of the commonest delivery (``encode_deliveries``): a sequence number beyond a smalllong,
# the enqueued time, the same number as the enqueue sequence number (a message not forwarded) and the lock's end,
# packed in one call: each key with its value's constructor, then the 8 bytes of the value
_PLAIN_PREFIX = (
    _MAP8_HEADS[_ALWAYS_SIZE + 9 + len(_ENQUEUE_SEQUENCE_KEY) + 9 + len(_LOCKED_UNTIL_KEY) + 9 + 256 * 8]
    + _SEQUENCE_NUMBER_KEY
    + b"\x81"
)
_ENQUEUED_83 = _ENQUEUED_TIME_KEY + b"\x83"
_ENQUEUE_SEQUENCE_81 = _ENQUEUE_SEQUENCE_KEY + b"\x81"
_LOCKED_UNTIL_83 = _LOCKED_UNTIL_KEY + b"\x83"
_pack_plain_annotations = struct.Struct(
    f">{len(_PLAIN_PREFIX)}sq{len(_ENQUEUED_83)}sq{len(_ENQUEUE_SEQUENCE_81)}sq{len(_LOCKED_UNTIL_83)}sq"
).pack


def encode_deliveries(messages: list[Message]) -> list[bytes]:
    """``encode_delivery`` of each message (as a receiver gets it, not a peek), in one pass: a receiver's credit
    is answered with many deliveries at a time, and the usual one (its sender's sections kept, no annotations
    of its own, no partition key, session, schedule or dead-letter fields) is written here without a call, its
    message-annotations as ``_delivery_head`` writes them."""
    out: list[bytes] = []
    append = out.append
    headers = _HEADERS
    small_longs, map8_heads = _SMALL_LONGS, _MAP8_HEADS
    seq_key, enqueued_key, enqueue_seq_key = _SEQUENCE_NUMBER_KEY, _ENQUEUED_TIME_KEY, _ENQUEUE_SEQUENCE_KEY
    locked_key = _LOCKED_UNTIL_KEY
    data_body = _DATA_BODY
    pack_long = _pack_long
    pack_plain, plain_prefix = _pack_plain_annotations, _PLAIN_PREFIX
    enqueued_83, enqueue_seq_81, locked_83 = _ENQUEUED_83, _ENQUEUE_SEQUENCE_81, _LOCKED_UNTIL_83
    join = b"".join
    last_ttl: int | None = -1
    last_count = -1
    header = b""
    items: list[Any] = messages  # the fields read below are set on every stored message: no None checks
    for m in items:
        sections = m.wire_sections
        if sections is None and m.body_type is data_body:  # read back from the store: no sender's encoding kept
            # kept on the message (for encode_delivery too; a lent one keeps it for its next delivery: the same
            # bytes, made from fields that never change)
            sections = m.wire_sections = stored_sections(m)
        if (
            sections is None
            or m.annotations
            or m.partition_key is not None
            or m.session_id is not None
            or m.scheduled_enqueue_time is not None
            or m.dead_letter_source is not None
            or m.dead_letter_reason is not None
            or m.dead_letter_error_description is not None
        ):
            append(encode_delivery(m))
            continue
        # ``_wire_ttl_and_count``, inlined (not scheduled: the TTL counts from the enqueued time)
        ttl = m.expires_at_ms
        if ttl is not None:
            ttl -= m.enqueued_time_ms
            if not 0 <= ttl < 2**32:
                ttl = None
        count = m.delivery_count - 1 if m.lock_token is not None else m.delivery_count
        if count < 0:
            count = 0
        if count != last_count or ttl != last_ttl:  # a chunk's deliveries mostly share their header
            last_count, last_ttl = count, ttl
            header = headers.get((ttl, count))
            if header is None:
                header = _header(ttl, count)
        seq = m.sequence_number
        locked = m.locked_until_ms
        if seq > 127 and m.enqueued_sequence_number == seq and locked is not None:  # the commonest annotations
            append(
                join(
                    (
                        header,
                        pack_plain(
                            plain_prefix, seq, enqueued_83, m.enqueued_time_ms, enqueue_seq_81, seq, locked_83, locked
                        ),
                        sections,
                        m.body if m.body_type is data_body else b"",
                    )
                )
            )
            continue
        sequence = small_longs[seq + 128] if -128 <= seq <= 127 else pack_long(0x81, seq)
        size = _ALWAYS_SIZE + len(sequence)
        pairs = 4
        enqueue_seq = m.enqueued_sequence_number
        if enqueue_seq is None:
            middle_key = middle = b""
        else:
            middle_key = enqueue_seq_key
            middle = small_longs[enqueue_seq + 128] if -128 <= enqueue_seq <= 127 else pack_long(0x81, enqueue_seq)
            size += len(enqueue_seq_key) + len(middle)
            pairs = 6
        if locked is None:
            lock_key = lock = b""
        else:
            lock_key, lock = locked_key, pack_long(0x83, locked)
            size += len(locked_key) + 9
            pairs += 2
        append(
            b"".join(
                (
                    header,
                    map8_heads[size + 256 * pairs],  # at most 8 keys and values of these sizes: always a map8
                    seq_key,
                    sequence,
                    enqueued_key,
                    pack_long(0x83, m.enqueued_time_ms),
                    middle_key,
                    middle,
                    lock_key,
                    lock,
                    sections,
                    m.body if m.body_type is data_body else b"",
                )
            )
        )
    return out


# The properties fields ``properties_of`` sets, in wire order, each with its encoder (None: never set), as
# ``Properties.encode_into`` writes them
_PROPERTY_ENCODERS = (
    codec.e_any,  # message-id
    None,
    codec.e_any,  # to
    codec.e_string,  # subject
    codec.e_any,  # reply-to
    codec.e_any,  # correlation-id
    codec.e_symbol,  # content-type
    None,
    codec.e_timestamp,  # absolute-expiry-time
    codec.e_timestamp,  # creation-time
    codec.e_string,  # group-id (the session)
    None,
    codec.e_string,  # reply-to-group-id
)


_e_timestamp, _e_symbol = codec.e_timestamp, codec.e_symbol
_pack_str32 = struct.Struct(">BI").pack


def stored_sections(m: Message) -> bytes:
    """What ``wire_sections`` would hold for a data-body message whose sender's encoding is not kept (one read
    back from the store): its properties and application properties as ``encode_delivery``'s general path writes
    them (``properties_of``, with the creation time and absolute expiry time the broker knows), and the data
    section's head. A backlog read from disk is then delivered through the same joins as a message sent moments
    ago, byte for byte what the general path gave, at a third of its cost (15 us a message)."""
    ttl = m.expires_at_ms
    if ttl is not None:  # ``_wire_ttl_and_count``'s, for the unscheduled messages ``encode_deliveries`` writes
        ttl -= m.enqueued_time_ms  # type: ignore[operator]
    expiry = m.expires_at_ms if ttl is not None and 0 <= ttl < 2**32 else None
    values = (
        m.message_id,
        None,
        m.to,
        m.subject,
        m.reply_to,
        m.correlation_id,
        m.content_type,
        None,
        expiry,
        m.enqueued_time_ms,
        m.session_id,
        None,
        m.reply_to_session_id,
    )
    n = len(values)
    while n and values[n - 1] is None:  # trailing nulls are left out
        n -= 1
    fields = bytearray()
    for v, encode in zip(values[:n], _PROPERTY_ENCODERS, strict=False):
        if v is None:
            fields.append(0x40)
        elif encode is _e_timestamp:  # the broker's own ints (ms): no checks needed
            fields += _pack_long(0x83, v)
        elif type(v) is str and encode is not _e_symbol:  # ``e_string``, inlined: the usual message-id and session
            data = v.encode()
            size = len(data)
            fields += bytes((0xA1, size)) if size < 256 else _pack_str32(0xB1, size)
            fields += data
        else:
            encode(fields, v)  # type: ignore[misc]
    out = bytearray(b"\x00\x53\x73")
    codec._finish_compound(out, fields, n, 0xC0, 0xD0)
    if m.application_properties is not None:
        out += b"\x00\x53\x74"
        codec.e_map(out, m.application_properties)
    size = len(m.body)
    out += b"\x00\x53\x75\xa0" + bytes((size,)) if size < 256 else b"\x00\x53\x75" + _pack_str32(0xB0, size)
    return bytes(out)


def _unchanging_parts(m: Message) -> tuple[bytes, ...]:
    """The message's unchanging sections as its sender encoded them, in parts to join after a head. Of a data
    body, ``wire_sections`` ends where the body's bytes begin (the section's descriptor and size are in it) and the
    body follows from ``body``: the message holds it anyway, and a second copy in the kept sections was another
    kilobyte per 1 KB message in memory (and a page fault for every four or so stored)."""
    if m.body_type is _DATA_BODY:
        return (m.wire_sections, m.body)  # type: ignore[return-value]
    return (m.wire_sections,)  # type: ignore[return-value]


def encode_delivery(m: Message, *, peek: bool = False) -> bytes:
    """The encoded message a receiver gets (or a peek returns) for ``m``, with the broker's annotations."""
    dead_lettered = m.dead_letter_reason is not None or m.dead_letter_error_description is not None
    if m.wire_sections is not None and not (peek or m.annotations or dead_lettered):
        ttl, count = _wire_ttl_and_count(m, peek)
        if m.body_type is _DATA_BODY:  # ``_unchanging_parts``, inlined: every delivery comes here
            return _delivery_head(m, ttl, count, (m.wire_sections, m.body))
        return _delivery_head(m, ttl, count, (m.wire_sections,))
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
        head = encode_message(AmqpMessage(header=header, message_annotations=annotations))
        return b"".join((head, *_unchanging_parts(m)))
    bt = m.body_type
    if bt == BodyType.DATA:
        body, wire_body = [m.body], WireBody.DATA
    elif bt == BodyType.VALUE:
        body, wire_body = codec.decode(m.body), WireBody.VALUE
    elif bt == BodyType.SEQUENCE:
        body, wire_body = codec.decode(m.body), WireBody.SEQUENCE
    else:
        body, wire_body = None, WireBody.NONE
    return encode_sections(
        m,
        header=header,
        annotations=annotations,
        application_properties=app,
        body=body,
        body_type=wire_body,
        absolute_expiry_time=None if m.expires_at_ms is None or ttl is None else m.expires_at_ms,
        creation_time=m.enqueued_time_ms,
    )
