"""Codec: every primitive round-trips, smallest encodings are chosen, malformed input only raises DecodeError."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.amqp.codec import MAX_DEPTH, DecodeError, EncodeError, decode, decode_value, encode, skip_at
from shardbus.amqp.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

# (value, exact expected encoding)
EXACT = [
    (None, b"\x40"),
    (True, b"\x41"),
    (False, b"\x42"),
    (UByte(7), b"\x50\x07"),
    (UShort(0x1234), b"\x60\x12\x34"),
    (UInt(0), b"\x43"),
    (UInt(200), b"\x52\xc8"),
    (UInt(70000), b"\x70\x00\x01\x11\x70"),
    (ULong(0), b"\x44"),
    (ULong(255), b"\x53\xff"),
    (ULong(2**40), b"\x80\x00\x00\x01\x00\x00\x00\x00\x00"),
    (Byte(-1), b"\x51\xff"),
    (Short(-2), b"\x61\xff\xfe"),
    (-3, b"\x54\xfd"),
    (Int(1000), b"\x71\x00\x00\x03\xe8"),
    (Long(-3), b"\x55\xfd"),
    (Long(2**40), b"\x81\x00\x00\x01\x00\x00\x00\x00\x00"),
    (2**40, b"\x81\x00\x00\x01\x00\x00\x00\x00\x00"),
    (2**63, b"\x80\x80\x00\x00\x00\x00\x00\x00\x00"),
    (Float(1.5), b"\x72\x3f\xc0\x00\x00"),
    (1.5, b"\x82\x3f\xf8\x00\x00\x00\x00\x00\x00"),
    (Char("A"), b"\x73\x00\x00\x00\x41"),
    (Timestamp(1), b"\x83\x00\x00\x00\x00\x00\x00\x00\x01"),
    (Decimal32(b"\x01\x02\x03\x04"), b"\x74\x01\x02\x03\x04"),
    (Decimal64(b"\x00" * 8), b"\x84" + b"\x00" * 8),
    (Decimal128(b"\x01" * 16), b"\x94" + b"\x01" * 16),
    (uuid.UUID(int=1), b"\x98" + b"\x00" * 15 + b"\x01"),
    (b"ab", b"\xa0\x02ab"),
    (b"x" * 256, b"\xb0\x00\x00\x01\x00" + b"x" * 256),
    ("hé", b"\xa1\x03h\xc3\xa9"),
    ("y" * 300, b"\xb1\x00\x00\x01\x2c" + b"y" * 300),
    (Symbol("abc"), b"\xa3\x03abc"),
    (Symbol("s" * 256), b"\xb3\x00\x00\x01\x00" + b"s" * 256),
    ([], b"\x45"),
    ([True], b"\xc0\x02\x01\x41"),
    ({}, b"\xc1\x01\x00"),
    ({Symbol("a"): 1}, b"\xc1\x06\x02\xa3\x01a\x54\x01"),
    (Array(Symbol, ["a", "bc"]), b"\xe0\x07\x02\xa3\x01a\x02bc"),
    (Array(UInt, [1]), b"\xe0\x06\x01\x70\x00\x00\x00\x01"),
    (Described(0x24, []), b"\x00\x53\x24\x45"),
    (Described(Symbol("amqp:accepted:list"), []), b"\x00\xa3\x12amqp:accepted:list\x45"),
    (Described(0x0000013700000001, "f"), b"\x00\x80\x00\x00\x01\x37\x00\x00\x00\x01\xa1\x01f"),
]


@pytest.mark.parametrize(("value", "wire"), EXACT, ids=[repr(v)[:40] for v, _ in EXACT])
def test_exact_encoding_and_round_trip(value: object, wire: bytes) -> None:
    assert encode(value) == wire
    back = decode(wire)
    assert back == value
    if (value is not None and not isinstance(value, (int, Described))) or isinstance(value, (bool, UInt)):
        assert type(back) is type(value) or (isinstance(value, (bytes, str)) and isinstance(back, type(value)))


def test_decoded_types_re_encode_identically() -> None:
    for _, wire in EXACT:
        assert encode(decode(wire)) == wire


def test_all_constructors_decode() -> None:
    """Non-smallest encodings (uint as 0x70, list32, map32, array32, str32 ...) decode too."""
    cases = {
        b"\x70\x00\x00\x00\x05": 5,
        b"\x80\x00\x00\x00\x00\x00\x00\x00\x05": 5,
        b"\x56\x01": True,
        b"\x56\x00": False,
        b"\x71\xff\xff\xff\xff": -1,
        b"\x81\xff\xff\xff\xff\xff\xff\xff\xff": -1,
        b"\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x41": [True],
        b"\xd1\x00\x00\x00\x07\x00\x00\x00\x02\x54\x01\x41": {1: True},
        b"\xf0\x00\x00\x00\x07\x00\x00\x00\x02\x50\x01\x02": [1, 2],
        b"\xb0\x00\x00\x00\x01z": b"z",
        b"\xb1\x00\x00\x00\x01z": "z",
        b"\xb3\x00\x00\x00\x01z": "z",
        b"\x82\x7f\xf8\x00\x00\x00\x00\x00\x00": None,  # NaN, checked below
    }
    for wire, expected in cases.items():
        got = decode(wire)
        if expected is None:
            assert math.isnan(got)
        else:
            assert got == expected


def test_array_of_described() -> None:
    arr = Array(Described, [Described(0x24, []), Described(0x24, [UInt(1)])])
    wire = encode(arr)
    assert wire[2:6] == b"\x02\x00\x53\x24"
    back = decode(wire)
    assert back.element_type is Described
    assert back == arr


def test_array_variants_round_trip() -> None:
    for arr in [
        Array(Long, [1, -(2**40)]),
        Array(int, [1, 2**40]),
        Array(uuid.UUID, [uuid.UUID(int=5)]),
        Array(Timestamp, [datetime(2020, 1, 1, tzinfo=UTC), 5]),
        Array(str, ["a" * 300, "b"]),
        Array(bytes, [b"x"]),
        Array(bool, [True, False]),
        Array(list, [[1], []]),
        Array(dict, [{"a": 1}]),
        Array(Array, [Array(UInt, [1])]),
        Array(float, [1.0]),
        Array(Float, [2.0]),
        Array(Symbol, ["x"] * 300),
    ]:
        back = decode(encode(arr))
        assert list(back) == [x if not isinstance(x, datetime) else 1577836800000 for x in arr]


def test_datetime_encodes_as_timestamp() -> None:
    assert decode(encode(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC))) == Timestamp(1000)
    assert decode(encode(datetime(1970, 1, 1, 0, 0, 2))) == 2000


def test_large_compounds_use_32_bit_forms() -> None:
    big = list(range(300))
    assert encode(big)[0] == 0xD0
    assert decode(encode(big)) == big
    bigmap = {str(i): i for i in range(200)}
    assert encode(bigmap)[0] == 0xD1
    assert decode(encode(bigmap)) == bigmap


def test_encode_errors() -> None:
    with pytest.raises(EncodeError):
        encode(2**64)
    with pytest.raises(EncodeError):
        encode(Symbol("é"))
    with pytest.raises(EncodeError):
        encode(object())
    with pytest.raises(OverflowError):
        UInt(-1)


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"\xff",
        b"\x70\x00",
        b"\xa1\x05ab",
        b"\xb0\xff\xff\xff\xff",
        b"\xc0\x05\x02\x41",
        b"\xd0\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\xc1\x02\x01\x41",  # odd map count
        b"\xc0\x03\x01\x41\x41",  # size/content mismatch
        b"\xe0\x02\x05\x40",  # array count beyond its size
        b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40",
        b"\xa1\x02\xff\xfe",  # invalid utf-8
        b"\xa3\x01\xe9",  # non-ascii symbol
        b"\x56\x02",
        b"\x00\x41\x41",  # boolean descriptor
        b"\x73\x7f\xff\xff\xff",  # invalid char
        b"\x73\x00\x00\xdb\x48",  # a surrogate is no character
        b"\xc1\x04\x02\x45\x41",  # unhashable map key
        b"\x41\x41",  # trailing bytes
    ],
)
def test_malformed_raises_decode_error(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(wire)


def test_nesting_depth_is_bounded() -> None:
    deep = b"\xc0\x02\x01" * 5000 + b"\x45"
    with pytest.raises(DecodeError):
        decode_value(deep)
    deep_described = b"\x00\x53\x01" * 5000 + b"\x40"
    with pytest.raises(DecodeError):
        decode(deep_described)
    ok = [[[]]]
    assert decode(encode(ok)) == ok
    nested: list = []
    for _ in range(MAX_DEPTH - 2):
        nested = [nested]
    assert decode(encode(nested)) == nested


def test_skip_at_matches_decode() -> None:
    for _, wire in EXACT:
        assert skip_at(wire, 0) == len(wire)


# ------------------------------------------------------------------------------------ property tests

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**64 - 1).map(ULong),
    st.integers(0, 2**32 - 1).map(UInt),
    st.integers(0, 255).map(UByte),
    st.integers(0, 65535).map(UShort),
    st.integers(-128, 127).map(Byte),
    st.integers(-32768, 32767).map(Short),
    st.integers(-(2**63), 2**63 - 1).map(Long),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    st.floats(allow_nan=False),
    st.floats(allow_nan=False, width=32).map(Float),
    st.text(),
    st.text(alphabet=st.characters(max_codepoint=127)).map(Symbol),
    st.binary(),
    st.uuids(),
    st.characters(exclude_categories=("Cs",)).map(Char),
    st.binary(min_size=4, max_size=4).map(Decimal32),
)
keys = st.one_of(st.text(), st.text(alphabet=st.characters(max_codepoint=127)).map(Symbol), st.integers(-5, 5))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(keys, children, max_size=5),
        st.lists(st.text(), max_size=5).map(lambda x: Array(str, x)),
        st.lists(st.integers(0, 2**32 - 1), max_size=5).map(lambda x: Array(UInt, x)),
        st.tuples(st.integers(0, 2**64 - 1) | st.text(alphabet="abc:").map(Symbol), children).map(
            lambda t: Described(*t)
        ),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(values)
def test_round_trip_property(value: object) -> None:
    wire = encode(value)
    back = decode(wire)
    assert back == value
    assert encode(back) == wire
    assert skip_at(wire, 0) == len(wire)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError:
        pass


@settings(max_examples=400, deadline=None)
@given(values, st.data())
def test_fuzz_mutated_encodings(value: object, data: st.DataObject) -> None:
    wire = bytearray(encode(value))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        wire = wire[: data.draw(st.integers(0, len(wire)))]
    try:
        decode(bytes(wire))
    except DecodeError:
        pass
