"""Encoder and decoder for the AMQP 1.0 type system (OASIS AMQP 1.0 part 1).

Decoding is table driven: ``_DEC[constructor_byte](buf, pos, depth) -> (value, new_pos)`` with ``buf`` always
an immutable ``bytes`` object (cheap slicing, ``struct.unpack_from`` straight on it). Internal decoders do no
defensive checks for fixed-width reads: running off the end raises ``IndexError``/``struct.error`` which the
public entry points (``decode``, ``decode_value`` and ``guarded``) turn into a single ``DecodeError``. What
cannot be caught that way is checked explicitly, because it would otherwise be silently wrong or dangerous:

* variable-width and compound lengths must fit inside the buffer (slices never raise);
* compound element counts must not exceed the bytes available (no huge allocations from a tiny frame);
* compound sizes must match what their elements consumed;
* nesting depth is bounded by ``MAX_DEPTH`` (no ``RecursionError``).

Encoding always picks the smallest encoding (``uint0``/``smalluint``, ``list0``/``list8``, ``str8`` ...) and
describes composite types with small-ulong descriptors ``0x00 0x53 <code>`` as the Azure SDK's decoder needs.
The type mapping of plain Python values is documented in ``shardbus.amqp.types``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from .types import (
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

__all__ = [
    "LOW_LEVEL_ERRORS",
    "MAX_DEPTH",
    "DecodeError",
    "EncodeError",
    "decode",
    "decode_at",
    "decode_value",
    "encode",
    "encode_into",
    "skip_at",
]

MAX_DEPTH = 64
"""Maximum nesting of compound/described values accepted by the decoder (the SDK and .NET use 64)."""


class DecodeError(ValueError):
    """Malformed AMQP input. The only exception the public decoding functions raise."""


class EncodeError(ValueError):
    """A value that cannot be represented in AMQP (wrong type, out of range)."""


LOW_LEVEL_ERRORS: tuple[type[BaseException], ...] = (
    IndexError,
    struct.error,
    ValueError,
    TypeError,
    KeyError,
    OverflowError,
    RecursionError,
    MemoryError,
)
"""Errors raised by the unchecked internal decoders; callers of ``decode_at`` map them to DecodeError."""

_H = struct.Struct(">H").unpack_from
_h = struct.Struct(">h").unpack_from
_I = struct.Struct(">I").unpack_from
_i = struct.Struct(">i").unpack_from
_Q = struct.Struct(">Q").unpack_from
_q = struct.Struct(">q").unpack_from
_f = struct.Struct(">f").unpack_from
_d = struct.Struct(">d").unpack_from
_II = struct.Struct(">II").unpack_from

_pH = struct.Struct(">H").pack
_ph = struct.Struct(">h").pack
_pI = struct.Struct(">I").pack
_pi = struct.Struct(">i").pack
_pQ = struct.Struct(">Q").pack
_pq = struct.Struct(">q").pack
_pf = struct.Struct(">f").pack
_pd = struct.Struct(">d").pack
_pII = struct.Struct(">II").pack
_pBI = struct.Struct(">BI").pack
_pBq = struct.Struct(">Bq").pack
_pBi = struct.Struct(">Bi").pack
_pBd = struct.Struct(">Bd").pack
_pBQ = struct.Struct(">BQ").pack

# Pre-built instances for the one-byte encodings: decoding a smalluint is then a tuple lookup.
_UBYTES = tuple(UByte(i) for i in range(256))
_BYTES = tuple(Byte(i - 256 if i > 127 else i) for i in range(256))
_UINTS = tuple(UInt(i) for i in range(256))
_ULONGS = tuple(ULong(i) for i in range(256))
_SMALLINTS = tuple(i - 256 if i > 127 else i for i in range(256))
_LONGS = tuple(Long(i - 256 if i > 127 else i) for i in range(256))
_UINT0 = _UINTS[0]
_ULONG0 = _ULONGS[0]

Decoder = Callable[[bytes, int, int], tuple[Any, int]]

# The explicit-width integers check their range in ``__new__``; a value read from its own wire width always fits,
# so the decoders build them with ``int.__new__`` directly (about half the cost).
_int_new = int.__new__


# --------------------------------------------------------------------------------------------- decoding


def _d_bad(b: bytes, p: int, d: int) -> tuple[Any, int]:
    raise DecodeError(f"invalid constructor 0x{b[p - 1]:02x} at offset {p - 1}")


def _d_null(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return None, p


def _d_true(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return True, p


def _d_false(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return False, p


def _d_uint0(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _UINT0, p


def _d_ulong0(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _ULONG0, p


def _d_list0(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return [], p


def _d_bool(b: bytes, p: int, d: int) -> tuple[Any, int]:
    v = b[p]
    if v > 1:
        raise DecodeError("boolean byte must be 0 or 1")
    return v == 1, p + 1


def _d_ubyte(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _UBYTES[b[p]], p + 1


def _d_byte(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _BYTES[b[p]], p + 1


def _d_smalluint(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _UINTS[b[p]], p + 1


def _d_smallulong(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _ULONGS[b[p]], p + 1


def _d_smallint(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _SMALLINTS[b[p]], p + 1


def _d_smalllong(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _LONGS[b[p]], p + 1


def _d_ushort(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(UShort, _H(b, p)[0]), p + 2


def _d_short(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(Short, _h(b, p)[0]), p + 2


def _d_uint(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(UInt, _I(b, p)[0]), p + 4


def _d_int(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _i(b, p)[0], p + 4


def _d_float(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return Float(_f(b, p)[0]), p + 4


def _d_char(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return Char(chr(_I(b, p)[0])), p + 4  # chr() refuses what is past U+10FFFF, Char() a surrogate


def _fixed_raw(b: bytes, p: int, n: int) -> bytes:
    e = p + n
    if e > len(b):
        raise DecodeError("truncated value")
    return b[p:e]


def _d_dec32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return Decimal32(_fixed_raw(b, p, 4)), p + 4


def _d_dec64(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return Decimal64(_fixed_raw(b, p, 8)), p + 8


def _d_dec128(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return Decimal128(_fixed_raw(b, p, 16)), p + 16


def _d_ulong(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(ULong, _Q(b, p)[0]), p + 8


def _d_long(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(Long, _q(b, p)[0]), p + 8


def _d_double(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _d(b, p)[0], p + 8


def _d_timestamp(b: bytes, p: int, d: int) -> tuple[Any, int]:
    return _int_new(Timestamp, _q(b, p)[0]), p + 8


_UUID = uuid.UUID
_UUID_UNKNOWN = uuid.SafeUUID.unknown
_object_new = object.__new__
_object_setattr = object.__setattr__
_from_bytes = int.from_bytes


def _d_uuid(b: bytes, p: int, d: int) -> tuple[Any, int]:
    e = p + 16
    if e > len(b):
        raise DecodeError("truncated value")
    # What ``UUID(bytes=...)`` ends with, without its argument checks (16 bytes by construction): half the cost
    u = _object_new(_UUID)
    _object_setattr(u, "int", _from_bytes(b[p:e], "big"))
    _object_setattr(u, "is_safe", _UUID_UNKNOWN)
    return u, e


def _d_vbin8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 1
    e = s + b[p]
    if e > len(b):
        raise DecodeError("binary length exceeds buffer")
    return b[s:e], e


def _d_vbin32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 4
    e = s + _I(b, p)[0]
    if e > len(b):
        raise DecodeError("binary length exceeds buffer")
    return b[s:e], e


def _d_str8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 1
    e = s + b[p]
    if e > len(b):
        raise DecodeError("string length exceeds buffer")
    return b[s:e].decode("utf-8"), e


def _d_str32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 4
    e = s + _I(b, p)[0]
    if e > len(b):
        raise DecodeError("string length exceeds buffer")
    return b[s:e].decode("utf-8"), e


_SYMBOLS: dict[bytes, Symbol] = {}
"""Interned symbols: the same few (annotation keys, content types) recur in every message."""
_SYMBOL_CACHE_MAX = 4096


def _symbol(raw: bytes) -> Symbol:
    sym = _SYMBOLS.get(raw)
    if sym is None:
        sym = Symbol(raw.decode("ascii"))
        if len(_SYMBOLS) < _SYMBOL_CACHE_MAX and len(raw) <= 128:
            _SYMBOLS[raw] = sym
    return sym


def _d_sym8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 1
    e = s + b[p]
    if e > len(b):
        raise DecodeError("symbol length exceeds buffer")
    return _symbol(b[s:e]), e


def _d_sym32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    s = p + 4
    e = s + _I(b, p)[0]
    if e > len(b):
        raise DecodeError("symbol length exceeds buffer")
    return _symbol(b[s:e]), e


def _list_items(b: bytes, p: int, end: int, count: int, d: int) -> list[Any]:
    if count > end - p:
        raise DecodeError("compound count exceeds its size")
    if d > MAX_DEPTH:
        raise DecodeError("nesting too deep")
    dec = _DEC
    out = [None] * count
    for i in range(count):
        c = b[p]
        if c == 0x40:  # inline the commonest constructors of performative fields
            p += 1
        elif c == 0xA1:
            s = p + 2
            e = s + b[p + 1]
            if e > end:
                raise DecodeError("string length exceeds its compound")
            out[i] = b[s:e].decode("utf-8")
            p = e
        elif c == 0x52:
            out[i] = _UINTS[b[p + 1]]
            p += 2
        else:
            out[i], p = dec[c](b, p + 1, d)
    if p != end:
        raise DecodeError("compound size does not match its contents")
    return out


def _d_list8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    end = p + 1 + b[p]
    if end > len(b) or b[p] == 0:
        raise DecodeError("list size exceeds buffer")
    return _list_items(b, p + 2, end, b[p + 1], d + 1), end


def _d_list32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    size, count = _II(b, p)
    end = p + 4 + size
    if end > len(b) or size < 4:
        raise DecodeError("list size exceeds buffer")
    return _list_items(b, p + 8, end, count, d + 1), end


def _map_items(b: bytes, p: int, end: int, count: int, d: int) -> dict[Any, Any]:
    if count & 1:
        raise DecodeError("map with an odd number of elements")
    if count > end - p:
        raise DecodeError("compound count exceeds its size")
    if d > MAX_DEPTH:
        raise DecodeError("nesting too deep")
    dec = _DEC
    symbols = _SYMBOLS
    out = {}
    for _ in range(count >> 1):
        c = b[p]
        if c == 0xA3 or c == 0xA1:  # symbol/string keys: inline
            s = p + 2
            e = s + b[p + 1]
            if e > end:
                raise DecodeError("key length exceeds its compound")
            if c == 0xA3:
                raw = b[s:e]
                k = symbols.get(raw)  # an annotation key seen before: no call
                if k is None:
                    k = _symbol(raw)
            else:
                k = b[s:e].decode("utf-8")
            p = e
        else:
            k, p = dec[c](b, p + 1, d)
        # the commonest values inline: strings (application properties), the broker's annotations (a timestamp,
        # a long sequence number) and small ints; each as its ``_DEC`` decoder reads it
        c = b[p]
        if c == 0xA1:
            s = p + 2
            e = s + b[p + 1]
            if e > end:
                raise DecodeError("string length exceeds its compound")
            v = b[s:e].decode("utf-8")
            p = e
        elif c == 0x83:
            v = _int_new(Timestamp, _q(b, p + 1)[0])
            p += 9
        elif c == 0x81:
            v = _int_new(Long, _q(b, p + 1)[0])
            p += 9
        elif c == 0x54:
            v = _SMALLINTS[b[p + 1]]
            p += 2
        else:
            v, p = dec[c](b, p + 1, d)
        out[k] = v
    if p != end:
        raise DecodeError("compound size does not match its contents")
    return out


def _d_map8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    end = p + 1 + b[p]
    if end > len(b) or b[p] == 0:
        raise DecodeError("map size exceeds buffer")
    return _map_items(b, p + 2, end, b[p + 1], d + 1), end


def _d_map32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    size, count = _II(b, p)
    end = p + 4 + size
    if end > len(b) or size < 4:
        raise DecodeError("map size exceeds buffer")
    return _map_items(b, p + 8, end, count, d + 1), end


def _array_items(b: bytes, p: int, end: int, count: int, d: int) -> Array:
    if d > MAX_DEPTH:
        raise DecodeError("nesting too deep")
    if count > end - p:
        raise DecodeError("array count exceeds its size")
    if p == end:
        if count:
            raise DecodeError("array without element constructor")
        return Array(type(None))
    ctor = b[p]
    p += 1
    descriptor = None
    if ctor == 0:
        descriptor, p = _decode_descriptor(b, p, d)
        ctor = b[p]
        p += 1
        if ctor == 0:
            raise DecodeError("nested described array elements are not supported")
    fn = _DEC[ctor]
    if fn is _d_bad:
        raise DecodeError(f"invalid array element constructor 0x{ctor:02x}")
    items = [None] * count
    for i in range(count):
        items[i], p = fn(b, p, d)
    if p != end:
        raise DecodeError("array size does not match its contents")
    if descriptor is not None:
        return Array(Described, [Described(descriptor, v) for v in items])
    return Array(_CTOR_TYPE[ctor], items)


def _d_array8(b: bytes, p: int, d: int) -> tuple[Any, int]:
    end = p + 1 + b[p]
    if end > len(b) or b[p] == 0:
        raise DecodeError("array size exceeds buffer")
    return _array_items(b, p + 2, end, b[p + 1], d + 1), end


def _d_array32(b: bytes, p: int, d: int) -> tuple[Any, int]:
    size, count = _II(b, p)
    end = p + 4 + size
    if end > len(b) or size < 4:
        raise DecodeError("array size exceeds buffer")
    return _array_items(b, p + 8, end, count, d + 1), end


def _decode_descriptor(b: bytes, p: int, d: int) -> tuple[int | str, int]:
    c = b[p]
    if c == 0x53:
        return b[p + 1], p + 2
    if c == 0x80:
        return _Q(b, p + 1)[0], p + 9
    if c == 0x44:
        return 0, p + 1
    if c == 0xA3 or c == 0xB3:
        return _DEC[c](b, p + 1, d)
    raise DecodeError(f"descriptor must be a ulong or a symbol, got constructor 0x{c:02x}")


def _d_described(b: bytes, p: int, d: int) -> tuple[Any, int]:
    if d >= MAX_DEPTH:
        raise DecodeError("nesting too deep")
    desc, p = _decode_descriptor(b, p, d)
    v, p = _DEC[b[p]](b, p + 1, d + 1)
    return Described(desc, v), p


_DEC: list[Decoder] = [_d_bad] * 256
for _code, _fn in {
    0x00: _d_described,
    0x40: _d_null,
    0x41: _d_true,
    0x42: _d_false,
    0x43: _d_uint0,
    0x44: _d_ulong0,
    0x45: _d_list0,
    0x50: _d_ubyte,
    0x51: _d_byte,
    0x52: _d_smalluint,
    0x53: _d_smallulong,
    0x54: _d_smallint,
    0x55: _d_smalllong,
    0x56: _d_bool,
    0x60: _d_ushort,
    0x61: _d_short,
    0x70: _d_uint,
    0x71: _d_int,
    0x72: _d_float,
    0x73: _d_char,
    0x74: _d_dec32,
    0x80: _d_ulong,
    0x81: _d_long,
    0x82: _d_double,
    0x83: _d_timestamp,
    0x84: _d_dec64,
    0x94: _d_dec128,
    0x98: _d_uuid,
    0xA0: _d_vbin8,
    0xA1: _d_str8,
    0xA3: _d_sym8,
    0xB0: _d_vbin32,
    0xB1: _d_str32,
    0xB3: _d_sym32,
    0xC0: _d_list8,
    0xC1: _d_map8,
    0xD0: _d_list32,
    0xD1: _d_map32,
    0xE0: _d_array8,
    0xF0: _d_array32,
}.items():
    _DEC[_code] = _fn

_CTOR_TYPE: dict[int, type] = {
    0x40: type(None),
    0x41: bool,
    0x42: bool,
    0x56: bool,
    0x43: UInt,
    0x52: UInt,
    0x70: UInt,
    0x44: ULong,
    0x53: ULong,
    0x80: ULong,
    0x45: list,
    0xC0: list,
    0xD0: list,
    0xC1: dict,
    0xD1: dict,
    0xE0: Array,
    0xF0: Array,
    0x50: UByte,
    0x51: Byte,
    0x54: Int,
    0x71: Int,
    0x55: Long,
    0x81: Long,
    0x60: UShort,
    0x61: Short,
    0x72: Float,
    0x82: float,
    0x73: Char,
    0x74: Decimal32,
    0x84: Decimal64,
    0x94: Decimal128,
    0x83: Timestamp,
    0x98: uuid.UUID,
    0xA0: bytes,
    0xB0: bytes,
    0xA1: str,
    0xB1: str,
    0xA3: Symbol,
    0xB3: Symbol,
}


def decode_at(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    """Decode one value at ``pos`` of ``buf`` (must be ``bytes``) and return it with the position after it.

    Unchecked fast path for the other modules of this package: it may raise any of ``LOW_LEVEL_ERRORS``,
    which the caller must map to ``DecodeError`` (one ``try`` around a whole frame is cheaper than checks
    on every read).
    """
    return _DEC[buf[pos]](buf, pos + 1, depth)


def decode_value(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode the value that starts at ``pos``; return ``(value, position after it)``. Raises only DecodeError."""
    buf = data if type(data) is bytes else bytes(data)
    try:
        return _DEC[buf[pos]](buf, pos + 1, 0)
    except DecodeError:
        raise
    except LOW_LEVEL_ERRORS as exc:
        raise DecodeError(f"malformed AMQP value: {exc!r}") from None


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode exactly one value that must fill ``data``. Raises only DecodeError."""
    value, end = decode_value(data, 0)
    if end != len(data):
        raise DecodeError(f"{len(data) - end} trailing bytes after value")
    return value


# Byte width of the encoded value after each fixed-width constructor (for skipping without decoding).
_FIXED_WIDTH: dict[int, int] = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}  # fmt: skip


def skip_at(buf: bytes, pos: int, depth: int = 0) -> int:
    """Return the position just after the value at ``pos`` without building it (cheap section scanning).

    Like ``decode_at`` it may raise ``LOW_LEVEL_ERRORS``; lengths are checked against the buffer.
    """
    c = buf[pos]
    p = pos + 1
    if c == 0:
        if depth >= MAX_DEPTH:
            raise DecodeError("nesting too deep")
        p = skip_at(buf, p, depth + 1)
        return skip_at(buf, p, depth + 1)
    w = _FIXED_WIDTH.get(c)
    if w is not None:
        end = p + w
    elif c in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
        end = p + 1 + buf[p]
    elif c in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
        end = p + 4 + _I(buf, p)[0]
    else:
        raise DecodeError(f"invalid constructor 0x{c:02x}")
    if end > len(buf):
        raise DecodeError("value exceeds buffer")
    return end


# --------------------------------------------------------------------------------------------- encoding

Encoder = Callable[[bytearray, Any], None]


def _e_null(out: bytearray, v: Any) -> None:
    out.append(0x40)


def _e_bool(out: bytearray, v: Any) -> None:
    out.append(0x41 if v else 0x42)


def _e_int(out: bytearray, v: int) -> None:
    """Plain ``int``: AMQP int when it fits, then long, then ulong (documented in types.py)."""
    if -128 <= v <= 127:
        out += bytes((0x54, v & 0xFF))
    elif -0x80000000 <= v <= 0x7FFFFFFF:
        out += _pBi(0x71, v)
    elif -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
        out += _pBq(0x81, v)
    elif 0 <= v <= 0xFFFFFFFFFFFFFFFF:
        out += _pBQ(0x80, v)
    else:
        raise EncodeError(f"integer {v} does not fit any AMQP integer type")


def _check(v: int, lo: int, hi: int, name: str) -> None:
    if not lo <= v <= hi:
        raise EncodeError(f"{v} out of range for {name}")


def e_ubyte(out: bytearray, v: int) -> None:
    """Encode ``v`` as ubyte."""
    _check(v, 0, 0xFF, "ubyte")
    out += bytes((0x50, v))


def e_ushort(out: bytearray, v: int) -> None:
    """Encode ``v`` as ushort."""
    _check(v, 0, 0xFFFF, "ushort")
    out.append(0x60)
    out += _pH(v)


def e_uint(out: bytearray, v: int) -> None:
    """Encode ``v`` as uint in its smallest form (uint0, smalluint, uint)."""
    if v == 0:
        out.append(0x43)
    elif 0 < v < 256:
        out += bytes((0x52, v))
    else:
        _check(v, 0, 0xFFFFFFFF, "uint")
        out.append(0x70)
        out += _pI(v)


def e_ulong(out: bytearray, v: int) -> None:
    """Encode ``v`` as ulong in its smallest form (ulong0, smallulong, ulong)."""
    if v == 0:
        out.append(0x44)
    elif 0 < v < 256:
        out += bytes((0x53, v))
    else:
        _check(v, 0, 0xFFFFFFFFFFFFFFFF, "ulong")
        out.append(0x80)
        out += _pQ(v)


def e_byte(out: bytearray, v: int) -> None:
    """Encode ``v`` as byte."""
    _check(v, -128, 127, "byte")
    out += bytes((0x51, v & 0xFF))


def e_short(out: bytearray, v: int) -> None:
    """Encode ``v`` as short."""
    _check(v, -0x8000, 0x7FFF, "short")
    out.append(0x61)
    out += _ph(v)


def e_int(out: bytearray, v: int) -> None:
    """Encode ``v`` as int in its smallest form (smallint, int)."""
    if -128 <= v <= 127:
        out += bytes((0x54, v & 0xFF))
    else:
        _check(v, -0x80000000, 0x7FFFFFFF, "int")
        out += _pBi(0x71, v)


def e_long(out: bytearray, v: int) -> None:
    """Encode ``v`` as long in its smallest form (smalllong, long)."""
    if -128 <= v <= 127:
        out += bytes((0x55, v & 0xFF))
    else:
        _check(v, -0x8000000000000000, 0x7FFFFFFFFFFFFFFF, "long")
        out += _pBq(0x81, v)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def datetime_to_ms(dt: datetime) -> int:
    """Milliseconds since the Unix epoch; naive datetimes are taken as UTC."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _MS


def e_timestamp(out: bytearray, v: int | datetime) -> None:
    """Encode an int (ms since epoch) or a datetime as timestamp."""
    if isinstance(v, datetime):
        v = datetime_to_ms(v)
    _check(v, -0x8000000000000000, 0x7FFFFFFFFFFFFFFF, "timestamp")
    out += _pBq(0x83, v)


def _e_float32(out: bytearray, v: float) -> None:
    out.append(0x72)
    out += _pf(v)


def _e_double(out: bytearray, v: float) -> None:
    out += _pBd(0x82, v)


def _e_char(out: bytearray, v: str) -> None:
    out.append(0x73)
    out += _pI(ord(v))


def _e_raw(ctor: int) -> Encoder:
    def enc(out: bytearray, v: bytes) -> None:
        out.append(ctor)
        out += v

    return enc


def _e_uuid(out: bytearray, v: uuid.UUID) -> None:
    out.append(0x98)
    out += v.bytes


def e_binary(out: bytearray, v: bytes | bytearray | memoryview) -> None:
    """Encode as binary (vbin8 / vbin32)."""
    n = len(v)
    if n < 256:
        out += bytes((0xA0, n))
    else:
        out += _pBI(0xB0, n)
    out += v


def e_string(out: bytearray, v: str) -> None:
    """Encode as string (str8-utf8 / str32-utf8)."""
    data = v.encode("utf-8")
    n = len(data)
    if n < 256:
        out += bytes((0xA1, n))
    else:
        out += _pBI(0xB1, n)
    out += data


def e_symbol(out: bytearray, v: str) -> None:
    """Encode as symbol (sym8 / sym32); symbols are ASCII."""
    try:
        data = v.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol {v!r} is not ASCII") from None
    n = len(data)
    if n < 256:
        out += bytes((0xA3, n))
    else:
        out += _pBI(0xB3, n)
    out += data


def _finish_compound(out: bytearray, body: bytearray | bytes, count: int, small: int, large: int) -> None:
    n = len(body)
    if n < 255 and count < 256:
        out += bytes((small, n + 1, count))
    else:
        out.append(large)
        out += _pII(n + 4, count)
    out += body


def e_list(out: bytearray, v: list[Any] | tuple[Any, ...]) -> None:
    """Encode a list (list0 / list8 / list32) of generically encoded items."""
    if not v:
        out.append(0x45)
        return
    body = bytearray()
    enc = _ENC
    for x in v:
        (enc.get(type(x)) or _resolve(type(x)))(body, x)
    _finish_compound(out, body, len(v), 0xC0, 0xD0)


def e_map(out: bytearray, v: dict[Any, Any]) -> None:
    """Encode a dict as map8 / map32 with generically encoded keys and values."""
    body = bytearray()
    enc = _ENC
    for k, x in v.items():
        (enc.get(type(k)) or _resolve(type(k)))(body, k)
        (enc.get(type(x)) or _resolve(type(x)))(body, x)
    _finish_compound(out, body, 2 * len(v), 0xC1, 0xD1)


def e_symbol_map(out: bytearray, v: dict[Any, Any]) -> None:
    """Encode a map whose ``str`` keys must be symbols (``fields``, annotations, filter-sets).

    Integer keys (allowed for annotations) keep their own encoding as ulong.
    """
    body = bytearray()
    enc = _ENC
    for k, x in v.items():
        if isinstance(k, str):
            e_symbol(body, k)
        elif isinstance(k, int) and not isinstance(k, bool):
            e_ulong(body, k)
        else:
            raise EncodeError(f"map key {k!r} must be a symbol")
        (enc.get(type(x)) or _resolve(type(x)))(body, x)
    _finish_compound(out, body, 2 * len(v), 0xC1, 0xD1)


def e_described(out: bytearray, v: Described) -> None:
    """Encode a ``Described``; int descriptors become small ulongs when they fit."""
    d = v.descriptor
    if isinstance(d, str):
        out.append(0)
        e_symbol(out, d)
    elif 0 <= d < 256:
        out += bytes((0, 0x53, d))
    else:
        out.append(0)
        _check(d, 0, 0xFFFFFFFFFFFFFFFF, "descriptor")
        out += _pBQ(0x80, d)
    x = v.value
    (_ENC.get(type(x)) or _resolve(type(x)))(out, x)


# ---- arrays: one constructor, then each item's bytes without it


def _fixed_array(ctor: int, pack: Callable[[Any], bytes]) -> Callable[[list[Any]], tuple[bytes, bytes]]:
    def parts(items: list[Any]) -> tuple[bytes, bytes]:
        try:
            return bytes((ctor,)), b"".join([pack(x) for x in items])
        except struct.error as exc:
            raise EncodeError(f"array item out of range: {exc}") from None

    return parts


def _var_array(small: int, large: int, conv: Callable[[Any], bytes]) -> Callable[[list[Any]], tuple[bytes, bytes]]:
    def parts(items: list[Any]) -> tuple[bytes, bytes]:
        datas = [conv(x) for x in items]
        if all(len(x) < 256 for x in datas):
            return bytes((small,)), b"".join([bytes((len(x),)) + x for x in datas])
        return bytes((large,)), b"".join([_pI(len(x)) + x for x in datas])

    return parts


def _sym_bytes(x: str) -> bytes:
    try:
        return x.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol {x!r} is not ASCII") from None


def _compound_array(ctor: int) -> Callable[[list[Any]], tuple[bytes, bytes]]:
    """Arrays of lists/maps/arrays: every item in the 32-bit form so all share one constructor."""

    def parts(items: list[Any]) -> tuple[bytes, bytes]:
        body = bytearray()
        for x in items:
            tmp = bytearray()
            encode_into(tmp, x)
            if tmp[0] == 0x45:  # list0 -> empty list32
                body += _pII(4, 0)
            elif tmp[0] in (0xC0, 0xC1, 0xE0):
                body += _pII(tmp[1] + 3, tmp[2]) + tmp[3:]
            elif tmp[0] in (0xD0, 0xD1, 0xF0):
                body += tmp[1:]
            else:
                raise EncodeError(f"array item {x!r} does not match the array's compound type")
        return bytes((ctor,)), bytes(body)

    return parts


def _int_array(items: list[Any]) -> tuple[bytes, bytes]:
    if all(-0x80000000 <= x <= 0x7FFFFFFF for x in items):
        return _ARRAY_PARTS[Int](items)
    return _ARRAY_PARTS[Long](items)


def _ts_pack(x: int | datetime) -> bytes:
    return _pq(datetime_to_ms(x) if isinstance(x, datetime) else x)


_ARRAY_PARTS: dict[type, Callable[[list[Any]], tuple[bytes, bytes]]] = {
    bool: _fixed_array(0x56, lambda x: b"\x01" if x else b"\x00"),
    UByte: _fixed_array(0x50, struct.Struct(">B").pack),
    UShort: _fixed_array(0x60, _pH),
    UInt: _fixed_array(0x70, _pI),
    ULong: _fixed_array(0x80, _pQ),
    Byte: _fixed_array(0x51, struct.Struct(">b").pack),
    Short: _fixed_array(0x61, _ph),
    Int: _fixed_array(0x71, _pi),
    Long: _fixed_array(0x81, _pq),
    Timestamp: _fixed_array(0x83, _ts_pack),
    Float: _fixed_array(0x72, _pf),
    float: _fixed_array(0x82, _pd),
    Char: _fixed_array(0x73, lambda x: _pI(ord(x))),
    Decimal32: _fixed_array(0x74, bytes),
    Decimal64: _fixed_array(0x84, bytes),
    Decimal128: _fixed_array(0x94, bytes),
    uuid.UUID: _fixed_array(0x98, lambda x: x.bytes),
    type(None): _fixed_array(0x40, lambda x: b""),
    bytes: _var_array(0xA0, 0xB0, bytes),
    str: _var_array(0xA1, 0xB1, lambda x: x.encode("utf-8")),
    Symbol: _var_array(0xA3, 0xB3, _sym_bytes),
    list: _compound_array(0xD0),
    dict: _compound_array(0xD1),
    Array: _compound_array(0xF0),
    int: _int_array,
}


def _described_array(items: list[Any]) -> tuple[bytes, bytes]:
    if not items:
        raise EncodeError("an empty array of described values has no descriptor")
    desc = items[0].descriptor
    if any(not isinstance(x, Described) or x.descriptor != desc for x in items):
        raise EncodeError("all items of a described array need the same descriptor")
    values = [x.value for x in items]
    elem = _infer_element_type(values[0])
    ctor, body = _ARRAY_PARTS[elem](values)
    head = bytearray()
    e_described(head, Described(desc, None))
    return bytes(head[:-1]) + ctor, body  # drop the null placeholder value


_ARRAY_PARTS[Described] = _described_array


def _infer_element_type(x: Any) -> type:
    t = type(x)
    if t in _ARRAY_PARTS:
        return t
    for base in (Array, list, dict, str, bytes, int, float, uuid.UUID):
        if isinstance(x, base):
            return base
    raise EncodeError(f"cannot use {t.__name__} as an array element")


def e_array(out: bytearray, v: Array) -> None:
    """Encode an ``Array`` (array8 / array32) with its declared element type."""
    try:
        parts = _ARRAY_PARTS[v.element_type]
    except KeyError:
        raise EncodeError(f"unsupported array element type {v.element_type!r}") from None
    items = list(v)
    for x in items:
        if v.element_type is not type(None) and x is None:
            raise EncodeError("arrays cannot hold nulls")
    try:
        ctor, body = parts(items)
    except (TypeError, AttributeError) as exc:
        raise EncodeError(f"array item does not match element type: {exc}") from None
    n = len(ctor) + len(body)
    count = len(items)
    if n < 255 and count < 256:
        out += bytes((0xE0, n + 1, count))
    else:
        out.append(0xF0)
        out += _pII(n + 4, count)
    out += ctor
    out += body


def e_symbols(out: bytearray, v: Any) -> None:
    """A ``multiple`` symbol field: one symbol, or a symbol array for a list of them."""
    if isinstance(v, str):
        e_symbol(out, v)
    else:
        e_array(out, v if isinstance(v, Array) else Array(Symbol, [Symbol(x) for x in v]))


def e_any(out: bytearray, v: Any) -> None:
    """Generic encoder by Python type (see the mapping in types.py)."""
    (_ENC.get(type(v)) or _resolve(type(v)))(out, v)


_ENC: dict[type, Encoder] = {
    type(None): _e_null,
    bool: _e_bool,
    int: _e_int,
    float: _e_double,
    str: e_string,
    bytes: e_binary,
    bytearray: e_binary,
    memoryview: e_binary,
    Symbol: e_symbol,
    UByte: e_ubyte,
    UShort: e_ushort,
    UInt: e_uint,
    ULong: e_ulong,
    Byte: e_byte,
    Short: e_short,
    Int: e_int,
    Long: e_long,
    Timestamp: e_timestamp,
    Float: _e_float32,
    Char: _e_char,
    Decimal32: _e_raw(0x74),
    Decimal64: _e_raw(0x84),
    Decimal128: _e_raw(0x94),
    uuid.UUID: _e_uuid,
    datetime: e_timestamp,
    list: e_list,
    tuple: e_list,
    dict: e_map,
    Array: e_array,
    Described: e_described,
}


def _e_composite(out: bytearray, v: Any) -> None:
    v.encode_into(out)


def _resolve(t: type) -> Encoder:
    """Find the encoder for a type not in the table (subclasses, composites) and cache it."""
    if hasattr(t, "encode_into"):
        fn: Encoder = _e_composite
    else:
        for base in (bool, Symbol, Array, str, bytes, int, float, list, tuple, dict, datetime, uuid.UUID):
            if issubclass(t, base):
                fn = _ENC[base]
                break
        else:
            raise EncodeError(f"cannot encode values of type {t.__name__}")
    _ENC[t] = fn
    return fn


def encode_into(out: bytearray, value: Any) -> None:
    """Append the AMQP encoding of ``value`` to ``out``."""
    (_ENC.get(type(value)) or _resolve(type(value)))(out, value)


def encode(value: Any) -> bytes:
    """Return the AMQP encoding of ``value``."""
    out = bytearray()
    encode_into(out, value)
    return bytes(out)
