"""``decode_message``'s fast paths (generated header/properties decoders, the header cache, the inline data body
and map values) against its general path: the same values of the same types, and the same error for what either
refuses. The fast path runs first in each comparison, so later messages also meet headers it has cached."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.amqp import codec
from shardbus.amqp import message as wire_message
from shardbus.amqp.codec import DecodeError
from shardbus.amqp.message import AmqpMessage, BodyType, Header, Properties, decode_message, scan_sections
from shardbus.amqp.types import Array, Described, Long, Symbol, Timestamp, UByte, UInt, ULong


def _general(payload: bytes, sections: list[Any] | None = None) -> AmqpMessage:
    """``decode_message`` with its generated section decoders and its header cache turned off (every list through
    ``from_fields``)."""
    fast = wire_message._fast_header, wire_message._fast_properties, wire_message._HEADER_FIELDS
    wire_message._fast_header = wire_message._fast_properties = lambda b, p: None
    wire_message._HEADER_FIELDS = {}
    try:
        return decode_message(payload, sections)
    finally:
        wire_message._fast_header, wire_message._fast_properties, wire_message._HEADER_FIELDS = fast


def _typed(v: Any) -> Any:
    """``v`` with the type of every value in it, so that ``UInt(1)`` and ``1`` compare different."""
    if isinstance(v, AmqpMessage | Header | Properties):
        return (type(v).__name__, [(k, _typed(getattr(v, k))) for k in v.__dataclass_fields__])
    if isinstance(v, dict):
        return (dict, [(_typed(k), _typed(x)) for k, x in v.items()])
    if isinstance(v, list | tuple):
        return (type(v), [_typed(x) for x in v])
    if isinstance(v, float):
        return (type(v), repr(v))  # NaN is not equal to itself
    return (type(v), v)


def _outcome(fn: Any, payload: bytes) -> Any:
    sections: list[Any] = []
    try:
        return _typed(fn(payload, sections)), sections
    except DecodeError as exc:
        return DecodeError, str(exc)


def _same(payload: bytes) -> None:
    assert _outcome(decode_message, payload) == _outcome(_general, payload)


BODY = bytes(range(256)) * 4


def _corpus() -> list[bytes]:
    """Messages of every section kind and body type, with usual and unusual encodings."""
    props = [
        Properties(message_id="5b4f3c1e-0000-4000-8000-000000000001"),
        Properties(message_id=uuid.UUID(int=5), correlation_id=ULong(7), to="q", reply_to=b"r"),
        Properties(
            message_id=ULong(300),
            user_id=b"u" * 300,
            to=Symbol("t"),
            subject="s\u00e9",
            reply_to="r",
            correlation_id=b"c",
            content_type=Symbol("application/json"),
            content_encoding="gzip",
            absolute_expiry_time=Timestamp(-5),
            creation_time=Timestamp(1_790_000_000_000),
            group_id="g",
            group_sequence=UInt(70000),
            reply_to_group_id="rg",
        ),
        Properties(message_id=Long(-3), correlation_id=1.5, to=Array(Symbol, ["a"])),  # ANY: odd types
        Properties(message_id="x" * 300),  # a list32
        Properties(),
    ]
    headers = [
        None,
        Header(),
        Header(durable=True, priority=9, ttl=60000, first_acquirer=True, delivery_count=3),
        Header(ttl=2**32 - 1, delivery_count=70000),
    ]
    annotations = {
        Symbol("x-opt-sequence-number"): Long(123456),
        Symbol("x-opt-enqueued-time"): Timestamp(1_790_000_000_000),
        Symbol("x-opt-locked-until"): Timestamp(-1),
        Symbol("x-opt-partition-key"): "pk",
        Symbol("x-small"): Long(-2),
        ULong(9): -7,
        Symbol("x-nested"): {"a": [1, Described(Symbol("d"), None)]},
    }
    bodies = [
        {"body": [BODY], "body_type": BodyType.DATA},
        {"body": [b"a", b"", BODY], "body_type": BodyType.DATA},
        {"body": {"k": [1, 2]}, "body_type": BodyType.VALUE},
        {"body": None, "body_type": BodyType.VALUE},
        {"body": [[1, "a"], []], "body_type": BodyType.SEQUENCE},
        {},
    ]
    out = []
    for i, body in enumerate(bodies):
        for j, header in enumerate(headers):
            for k, prop in enumerate([*props, None]):
                m = AmqpMessage(header=header, properties=prop, **body)
                if (i + j + k) % 2:
                    m.message_annotations = annotations
                    m.application_properties = {"tenant": "contoso", "priority": 5, "n": None, "t": Timestamp(1)}
                if (i + j + k) % 3 == 0:
                    m.delivery_annotations = {Symbol("d"): 1}
                    m.footer = {Symbol("f"): b"z"}
                out.append(m.encode())
    # encodings our encoder does not write: fields as another client may send them
    out += [
        bytes.fromhex("005370c00705425004404243") + bytes.fromhex("005375a003616263"),  # the broker's header
        bytes.fromhex("005370c0070541500440414300537545"),  # data section not a binary: refused
        bytes.fromhex("005370c00705565201520152015603"),  # boolean byte 3: refused
        bytes.fromhex("005370c004025652"),  # priority as smalluint (from_fields takes any int)
        bytes.fromhex("005370c0080656015005404143" + "40"),  # six header fields: the sixth ignored
        bytes.fromhex("005370d00000000600000001" + "41" + "4141"),  # a list32 header
        bytes.fromhex("00537345"),  # properties as list0
        bytes.fromhex("005373c00102a14141"),  # string length past its compound
        bytes.fromhex("005373c00301a102ff"),  # invalid UTF-8
        bytes.fromhex("005373c00301a302e9"),  # non-ASCII symbol
        bytes.fromhex("005373c00e01980000000000000000000000000000"),  # truncated uuid
        bytes.fromhex("005373c0040241a101"),  # message-id true (ANY) then a bad user-id
        bytes.fromhex("005373c00302a04040"),  # a null message-id, then a user-id running past its list
        bytes.fromhex("005373c00f0d" + "40" * 13),  # 13 nulls
        bytes.fromhex("005373c00f0e" + "40" * 14),  # 14 fields: one more than properties has
        bytes.fromhex("005373c002014183") + b"\x00" * 8,  # message-id true; timestamp outside the list
        bytes.fromhex("005373c00b0940404040404040408300") + b"\x00" * 7,  # an absolute-expiry-time
        bytes.fromhex("005373c004024052" + "01"),  # user-id as a uint: refused
        bytes.fromhex("0053730045"),  # a properties section that is not a list: refused
        bytes.fromhex("00a3146d6573736167652d6865616465723a6c697374c00302") + b"\x41\x50",  # symbolic descriptor
        bytes.fromhex("005375b0000000ff61"),  # vbin32 past the buffer
        bytes.fromhex("005375b00000"),  # vbin32 size truncated
        bytes.fromhex("005372c10b02a30178810000000000000001"),  # map with a long, one byte short
        bytes.fromhex("005372c10c02a30178830000000000000001"),  # map with a timestamp
        bytes.fromhex("005372c10402a301785412"),  # smallint value
        bytes.fromhex("005372c10402a3017854"),  # smallint value truncated
    ]
    return out


CORPUS = _corpus()


@pytest.mark.parametrize("payload", CORPUS, ids=range(len(CORPUS)))
def test_fast_and_general_paths_agree(payload: bytes) -> None:
    _same(payload)


def test_corpus_takes_the_fast_paths() -> None:
    """The corpus is not all refused: the generated decoders accept most of its headers and properties."""
    accepted = 0
    for payload in CORPUS:
        try:
            sections = scan_sections(payload)
        except DecodeError:
            continue
        for s in sections:
            fast = {0x70: wire_message._fast_header, 0x73: wire_message._fast_properties}.get(s.code)
            if fast is not None:
                try:
                    accepted += fast(payload, s.value_start) is not None
                except Exception:
                    pass
    assert accepted > 200


def _mutations(payload: bytes) -> Iterator[bytes]:
    for i in range(len(payload)):
        yield payload[:i]
        for delta in (1, 0x40, 0x80):
            yield payload[:i] + bytes(((payload[i] + delta) & 0xFF,)) + payload[i + 1 :]


def test_mutated_messages_agree() -> None:
    """Every truncation and many single-byte changes of a few messages: same result or same error."""
    small = [p for p in CORPUS if len(p) < 200][:40]
    for payload in small:
        for mutated in _mutations(payload):
            _same(mutated)


_ANY = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.uuids(),
    st.integers(0, 2**64 - 1).map(ULong),
    st.text(alphabet="abc", max_size=5).map(Symbol),
    st.integers(0, 2**32 - 1).map(UInt),
    st.booleans(),
)
_TEXT = st.one_of(st.none(), st.text(max_size=300), st.text(alphabet="xyz", max_size=5).map(Symbol))
_SYMBOL = st.one_of(st.none(), st.text(alphabet="abc/+;=", max_size=300))
_TIME = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1).map(Timestamp))


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        Properties,
        message_id=_ANY,
        user_id=st.one_of(st.none(), st.binary(max_size=300)),
        to=_ANY,
        subject=_TEXT,
        reply_to=_ANY,
        correlation_id=_ANY,
        content_type=_SYMBOL,
        content_encoding=_SYMBOL,
        absolute_expiry_time=_TIME,
        creation_time=_TIME,
        group_id=_TEXT,
        group_sequence=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
        reply_to_group_id=_TEXT,
    ),
    st.one_of(
        st.none(),
        st.builds(
            Header,
            durable=st.booleans(),
            priority=st.integers(0, 255).map(UByte),
            ttl=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
            first_acquirer=st.booleans(),
            delivery_count=st.integers(0, 2**32 - 1),
        ),
    ),
    st.dictionaries(
        st.text(alphabet="xyz-", min_size=1, max_size=8).map(Symbol),
        st.one_of(st.integers(-(2**63), 2**63 - 1).map(Long), st.integers(-(2**63), 2**63 - 1).map(Timestamp)),
        max_size=5,
    ),
    st.data(),
)
def test_generated_messages_agree(properties: Properties, header: Header | None, annotations: dict, data: Any) -> None:
    payload = AmqpMessage(
        header=header,
        properties=properties,
        message_annotations=annotations or None,
        body=[BODY[: data.draw(st.integers(0, 1024))]],
        body_type=BodyType.DATA,
    ).encode()
    _same(payload)
    assert decode_message(payload).properties == properties
    cut = data.draw(st.integers(0, len(payload)))
    _same(payload[:cut])


def test_map_values_read_inline_as_their_decoders_read_them() -> None:
    values = [Long(-(2**63)), Long(5), Timestamp(-1), Timestamp(2**63 - 1), -128, 127, "s", None, UInt(3)]
    m = {Symbol(f"k{i}"): v for i, v in enumerate(values)}
    got = codec.decode(codec.encode(m))
    assert _typed(got) == _typed({Symbol(f"k{i}"): codec.decode(codec.encode(v)) for i, v in enumerate(values)})
    assert [type(v) for v in got.values()] == [Long, Long, Timestamp, Timestamp, int, int, str, type(None), UInt]


def test_uuids_decode_as_uuid_makes_them() -> None:
    for raw in (bytes(16), bytes(range(16)), b"\xff" * 16):
        got = codec.decode(b"\x98" + raw)
        want = uuid.UUID(bytes=raw)
        assert type(got) is uuid.UUID and got == want and hash(got) == hash(want) and str(got) == str(want)
        assert got.is_safe == want.is_safe and got.bytes == raw
    with pytest.raises(DecodeError):
        codec.decode(b"\x98" + bytes(15))
