"""The mapping's fast paths give exactly what the general paths give: the one-pass decoder of plain messages and
batch envelopes, and the directly written delivery head."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardbus.amqp import types as t
from shardbus.amqp.codec import DecodeError
from shardbus.amqp.message import (
    AmqpMessage,
    BodyType,
    Header,
    Properties,
    build_batch,
    decode_message,
    encode_message,
    scan_sections,
    split_batch,
)
from shardbus.endpoint import mapping
from shardbus.endpoint.mapping import decode_batch_to_messages, decode_to_message, encode_delivery, to_message
from shardbus.model.message import Message
from shardbus.model.routing import new_lock_tokens, uuid_of_bytes_le, uuid_of_int


def _general(payload: bytes) -> Message:
    return decode_to_message(bytearray(payload))  # not ``bytes``: always the general path


def _fields(m: Message) -> dict[str, Any]:
    out = {name: getattr(m, name) for name in Message.__slots__}
    out["wire_sections"] = None if m.wire_sections is None else bytes(m.wire_sections)
    return out


MESSAGES = [
    AmqpMessage(body=[b"x" * 10], body_type=BodyType.DATA),
    AmqpMessage(body=[b"y" * 1024], body_type=BodyType.DATA, properties=Properties(message_id="id-1")),
    AmqpMessage(
        properties=Properties(
            message_id=uuid.uuid4(),
            to="somewhere",
            subject="s",
            reply_to="r",
            correlation_id=t.ULong(7),
            content_type=t.Symbol("application/json"),
            group_id="session-1",
            reply_to_group_id="session-2",
        ),
        application_properties={"a": 1, "b": "two", "c": t.Long(3), "d": None},
        body=[b"z" * 300],
        body_type=BodyType.DATA,
    ),
    AmqpMessage(properties=Properties(message_id="m"), application_properties={}, body=[b""], body_type=BodyType.DATA),
    # a header first (a time to live; durable=true, as an AMQP client marks a persistent message): the fast path too
    AmqpMessage(header=Header(ttl=5000), body=[b"h"], body_type=BodyType.DATA),
    AmqpMessage(
        header=Header(durable=True), properties=Properties(message_id="d"), body=[b"d" * 1024], body_type=BodyType.DATA
    ),
    AmqpMessage(
        header=Header(ttl=0, priority=9, first_acquirer=True, delivery_count=3),
        properties=Properties(message_id="t", creation_time=t.Timestamp(5), absolute_expiry_time=t.Timestamp(9)),
        application_properties={"a": 1},
        body=[b"\xfe\xff" * 3],
        body_type=BodyType.DATA,
    ),
    # general path only: annotations, several data sections, value and sequence bodies, no body
    AmqpMessage(message_annotations={t.Symbol("x-opt-partition-key"): "k"}, body=[b"a"], body_type=BodyType.DATA),
    AmqpMessage(body=[b"one", b"two"], body_type=BodyType.DATA),
    AmqpMessage(properties=Properties(message_id="v"), body={"k": 1}, body_type=BodyType.VALUE),
    AmqpMessage(body=[[1, 2]], body_type=BodyType.SEQUENCE),
    AmqpMessage(properties=Properties(message_id="none")),
]


@pytest.mark.parametrize("amqp", MESSAGES)
def test_decode_fast_path_matches_general_path(amqp: AmqpMessage) -> None:
    payload = encode_message(amqp)
    assert _fields(decode_to_message(payload)) == _fields(_general(payload))


def test_decode_application_properties_before_properties_is_still_decoded() -> None:
    props = encode_message(AmqpMessage(properties=Properties(message_id="p")))
    rest = encode_message(AmqpMessage(application_properties={"a": 1}, body=[b"b"], body_type=BodyType.DATA))
    payload = rest[: rest.index(b"\x00\x53\x75")] + props + rest[rest.index(b"\x00\x53\x75") :]
    assert _fields(decode_to_message(payload)) == _fields(_general(payload))
    assert decode_to_message(payload).application_properties == {"a": 1}


def test_odd_headers_get_the_general_paths_answer() -> None:
    for payload in (
        b"\x00\x53\x70\x45\x00\x53\x70\x45\x00\x53\x75\xa0\x00",  # two (empty) headers
        b"\x00\x53\x73\x45\x00\x53\x70\x45\x00\x53\x75\xa0\x01x",  # a header after the properties
    ):
        assert _fields(decode_to_message(payload)) == _fields(_general(payload))


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x53\x75\xb0\x00\x00\x00\x09ab",  # data shorter than its length
        b"\x00\x53\x73\xc0\x03\x01\x71",  # truncated properties
        b"\x00\x53\x73\xc0\x02\x01\x56\x01\x00\x53\x75\xa0\x00",  # message-id of a wrong type
        b"\x00\x53\x99\x45",  # unknown section
        b"\x00\x53\x70\xc0\x02\x01\xa1",  # truncated header
        b"\x00\x53\x70\xc0\x03\x01\x56\x07\x00\x53\x75\xa0\x00",  # durable of a wrong type
    ],
)
def test_decode_malformed_raises_as_before(payload: bytes) -> None:
    with pytest.raises(DecodeError) as fast:
        decode_to_message(payload)
    with pytest.raises(DecodeError) as general:
        _general(payload)
    assert type(fast.value) is type(general.value)


def test_batch_fast_path_matches_split_batch() -> None:
    inner = [encode_message(m) for m in MESSAGES]
    for envelope in (build_batch(inner), build_batch(inner[:1]), build_batch([])):
        fast = decode_batch_to_messages(envelope)
        general = [_general(p) for p in split_batch(envelope)]
        assert [_fields(m) for m in fast] == [_fields(m) for m in general]


def test_batch_with_a_value_body_is_refused() -> None:
    envelope = encode_message(AmqpMessage(body="no", body_type=BodyType.VALUE))
    with pytest.raises(DecodeError):
        decode_batch_to_messages(envelope)
    with pytest.raises(DecodeError):
        decode_batch_to_messages(b"\x00\x53\x10\x45")


def _generic_head(m: Message, ttl: int | None, count: int) -> bytes:
    annotations: dict[Any, Any] = {mapping.SEQUENCE_NUMBER: t.Long(m.sequence_number)}
    annotations[mapping.ENQUEUED_TIME] = t.Timestamp(m.enqueued_time_ms)
    if m.enqueued_sequence_number is not None:
        annotations[mapping.ENQUEUE_SEQUENCE] = t.Long(m.enqueued_sequence_number)
    if m.locked_until_ms is not None:
        annotations[mapping.LOCKED_UNTIL] = t.Timestamp(m.locked_until_ms)
    key = m.partition_key if m.partition_key is not None else m.session_id
    if key is not None:
        annotations[mapping.PARTITION_KEY] = key
    if m.scheduled_enqueue_time is not None:
        annotations[mapping.SCHEDULED_TIME] = t.Timestamp(int(m.scheduled_enqueue_time.timestamp() * 1000))
    if m.dead_letter_source is not None:
        annotations[mapping.DEAD_LETTER_SOURCE] = m.dead_letter_source
    return encode_message(AmqpMessage(header=Header(ttl=ttl, delivery_count=count), message_annotations=annotations))


@pytest.mark.parametrize("seq", [1, 127, 128, -5, 2**40, (3 << 48) | 12345])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"partition_key": "pk"},
        {"session_id": "s" * 300},
        {"scheduled_enqueue_time": datetime(2030, 1, 1, tzinfo=UTC)},
        {"dead_letter_source": "q/$deadletterqueue"},
        {"locked_until_ms": None, "enqueued_sequence_number": None},
    ],
)
def test_delivery_head_matches_generic_encoding(seq: int, extra: dict[str, Any]) -> None:
    m = Message(b"body", message_id="m")
    m.sequence_number = seq
    m.enqueued_time_ms = 1_700_000_000_000
    m.enqueued_sequence_number = seq + 1
    m.locked_until_ms = 1_700_000_060_000
    for k, v in extra.items():
        setattr(m, k, v)
    for ttl, count in ((None, 0), (5000, 3), (2**32 - 1, 300)):
        assert mapping._delivery_head(m, ttl, count) == _generic_head(m, ttl, count)


def test_encode_delivery_of_a_decoded_message_keeps_its_sections() -> None:
    payload = encode_message(MESSAGES[2])
    m = decode_to_message(payload)
    m.sequence_number, m.enqueued_time_ms, m.delivery_count = 9, 1_700_000_000_000, 1
    m.time_to_live = timedelta(seconds=1)
    assert encode_delivery(m).endswith(payload)


@pytest.mark.parametrize("decode", [decode_to_message, _general], ids=["fast", "general"])
@pytest.mark.parametrize("amqp", MESSAGES)
def test_a_delivery_carries_the_senders_sections_without_a_second_copy_of_its_body(amqp: AmqpMessage, decode) -> None:
    payload = encode_message(amqp)
    m = decode(payload)
    m.sequence_number, m.enqueued_time_ms = 9, 1_700_000_000_000
    delivered = decode_message(encode_delivery(m))
    assert to_message(delivered).body == m.body
    if m.wire_sections is not None:
        assert delivered.properties == decode_message(payload).properties
        assert delivered.application_properties == decode_message(payload).application_properties
    if amqp.body_type == BodyType.DATA:
        if m.wire_sections is not None:  # kept: the body is written after them, never kept twice
            assert m.body not in m.wire_sections or not m.body
            unchanging = next(s.start for s in scan_sections(payload) if s.code in mapping._UNCHANGING)
            assert encode_delivery(m).endswith(payload[unchanging:])
        else:  # several data sections: re-encoded as one, as after a restart
            assert len(amqp.body) > 1
            assert delivered.body == [b"".join(amqp.body)]


def test_fast_uuids_equal_the_constructors() -> None:
    for token in new_lock_tokens(5, 50):
        assert token.int & 0xFFFF == 5
        assert uuid_of_int(token.int) == uuid.UUID(int=token.int)
        assert hash(uuid_of_int(token.int)) == hash(uuid.UUID(int=token.int))
        assert str(token) == str(uuid.UUID(int=token.int))
        assert uuid_of_bytes_le(token.bytes_le) == uuid.UUID(bytes_le=token.bytes_le)
        assert uuid_of_int(token.int).is_safe == uuid.UUID(int=token.int).is_safe
    assert len(set(new_lock_tokens(1, 1000))) == 1000
    assert new_lock_tokens(1, 0) == []


def test_observing_many_values_at_once_matches_observe() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from shardbus.endpoint.receiving import _observe_all

    values = [0.0, 0.0005, 0.0007, 0.001, 0.003, 0.5, 2.5, 3.0, 100.0, 0.0005]
    buckets = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
    one, many = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", buckets=buckets, registry=one)
    b = Histogram("h", "h", buckets=buckets, registry=many)
    same = [0.03, 0.04, 0.035]  # all in one bucket: its shortcut
    for v in values + same:
        a.observe(v)
    _observe_all(b, values)
    _observe_all(b, same)
    _observe_all(b, [])

    def exposition(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert exposition(one) == exposition(many)


def _properties_then_body(*fields: bytes) -> bytes:
    """A properties section (list8 of the given encoded fields) and a data section, written by hand."""
    items = b"".join(fields)
    return b"\x00\x53\x73\xc0" + bytes((len(items) + 1, len(fields))) + items + b"\x00\x53\x75\xa0\x01b"


_NULL = b"\x40"
_UUID = b"\x98" + bytes(range(16))


@pytest.mark.parametrize(
    "payload",
    [
        _properties_then_body(b"\xa3\x02id"),  # a symbol message-id
        _properties_then_body(b"\xa1\x02id"),  # a string message-id alone, in a one-field list (our client's)
        _properties_then_body(b"\xa1\x00"),  # an empty one
        b"\x00\x53\x70\xc0\x02\x01\x41" + _properties_then_body(b"\xa1\x02id"),  # behind a header (durable)
        _properties_then_body(b"\xa1\x02id") + b"\x00\x53\x75\xa0\x01c",  # a second data section: general
        # a second properties section: the general path
        _properties_then_body(b"\xa1\x02id")[:-6] + _properties_then_body(b"\xa1\x01j"),
        b"\x00\x53\x73\xc0\x05\x01\xa1\x02id\x40\x00\x53\x75\xa0\x01b",  # one field, then a byte past it
        _properties_then_body("é-ü".encode().join([b"\xa1\x05", b""])),  # multi-byte UTF-8
        _properties_then_body(_UUID, _NULL, _UUID, b"\xa3\x01s", _UUID, _UUID, b"\xa1\x01c", b"\xa3\x01e"),
        _properties_then_body(*[_NULL] * 10, b"\xa1\x01g", _NULL, b"\xa3\x01r"),  # group ids, as text and symbol
        _properties_then_body(_NULL, _NULL, _NULL, _UUID),  # a uuid subject: refused
        _properties_then_body(_NULL, b"\xa1\x01u"),  # a string user-id: refused
        _properties_then_body(*[_NULL] * 8, b"\xa1\x01t"),  # a string expiry time: refused
        _properties_then_body(b"\xa1\x02\xff\xfe"),  # invalid UTF-8: refused
        _properties_then_body(*[_NULL] * 14),  # more fields than the section has: ignored
        _properties_then_body(b"\xa1\x09short"),  # a string running past its list
        _properties_then_body(b"\xa1\x01m", *[_NULL] * 12),  # the SDK's: a message-id, then only nulls
        _properties_then_body(b"\xa1\x01m", *[_NULL] * 9, b"\xa1\x01s"),  # nulls, then a session-id
        b"\x00\x53\x73\xc0\x06\x02\xa1\x01m\x40\x40\x00\x53\x75\xa0\x01b",  # more nulls than its count
        # our client's shape (a message-id alone, then the body) taken whole, and its near misses
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xb0\x00\x00\x00\x03abc",  # a vbin32 body
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xb0\x00\x00\x00\x04abc",  # a body cut short
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xa0\x01",  # a body cut short, vbin8
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xa0\x00x",  # a byte after the body
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x74\xc1\x01\x00\x00\x53\x75\xa0\x00",  # app props
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x77\xa1\x01v",  # a value body
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id",  # no body
        b"\x00\x53\x73\xc0\x04\x01\xa1\x03id\x00\x53\x75\xa0\x00",  # an id past its list
        # its bodies read eight bytes at a time: short ones (fewer than 8 bytes after the properties), long ones
        *[b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xa0" + bytes((k,)) + b"x" * k for k in (0, 1, 2, 3, 4, 255)],
        *[
            b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xb0" + k.to_bytes(4, "big") + b"y" * k
            for k in (0, 1, 1024)
        ],
        b"\x00\x53\x73\xc0\x03\x01\xa1\x00\x00\x53\x75\xa0\x00",  # an empty id and body: 13 bytes in all
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xa0\x03xy",  # a vbin8 body cut short
        b"\x00\x53\x73\xc0\x04\x01\xa1\x02id\x00\x53\x75\xb1\x00\x00\x00\x00",  # not a binary constructor
        b"\x00\x53\x75\xa0\x00",  # a body alone, shorter than 8 bytes
    ],
)
def test_plain_properties_give_the_general_paths_values_types_and_errors(payload: bytes) -> None:
    try:
        general = _general(payload)
    except DecodeError as exc:
        with pytest.raises(type(exc)):
            decode_to_message(payload)
        return
    fast = decode_to_message(payload)
    assert _fields(fast) == _fields(general)
    assert {k: type(v) for k, v in _fields(fast).items()} == {k: type(v) for k, v in _fields(general).items()}
