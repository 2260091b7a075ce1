"""AMQP 1.0 type-system values and how plain Python values map onto them.

AMQP has many more primitive types than Python: four unsigned and four signed integer widths, two float
widths, symbols next to strings, timestamps, and so on. A peer cares about the exact wire type (a .NET client
that expects ``long`` for ``x-opt-sequence-number`` fails on an ``int``), so every AMQP type that has no
natural Python counterpart gets a thin subclass of the closest builtin here. The subclasses cost nothing on
arithmetic and compare equal to the builtin value, so application code can mostly ignore them.

Plain Python values encode as follows (see ``codec.encode``):

=====================  ==========================================================================
Python value           AMQP type
=====================  ==========================================================================
``None``               null
``bool``               boolean
``int``                ``int`` (32-bit) when it fits, else ``long``, else ``ulong``; larger -> error.
                       This is what the Azure SDKs send for user integers, so values round-trip
                       with them. Use ``Long(5)`` etc. when the peer needs an exact width.
``float``              double
``str``                string (``Symbol`` for symbol)
``bytes``/bytearray    binary
``uuid.UUID``          uuid
``datetime``           timestamp (ms since the Unix epoch; naive datetimes are taken as UTC)
``dict``               map
``list``/``tuple``     list
``Array``              array (homogeneous; element type explicit)
``Described``          described value
=====================  ==========================================================================

Decoding is the inverse: each AMQP type decodes to the class that encodes back to the same type. ``int``
decodes to a plain ``int``; ``long`` to ``Long``, ``uint`` to ``UInt`` and so on; ``double`` to ``float``;
``string`` to ``str``; ``binary`` to ``bytes``. Hence ``encode(decode(b))`` re-produces ``b`` whenever ``b``
uses the smallest encodings, which is what the round-trip property tests check.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Described",
    "Float",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
]


class Symbol(str):
    """An AMQP ``symbol``: an ASCII string from a constrained domain (capabilities, annotation keys...)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class _FixedInt(int):
    """Base of the explicit-width integers; subclasses set the range checked at construction."""

    __slots__ = ()
    MIN = 0
    MAX = 0

    def __new__(cls, value: int = 0) -> Any:
        v = int.__new__(cls, value)
        if not cls.MIN <= v <= cls.MAX:
            raise OverflowError(f"{value} out of range for {cls.__name__}")
        return v

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class UByte(_FixedInt):
    """AMQP ``ubyte`` (8-bit unsigned)."""

    __slots__ = ()
    MIN, MAX = 0, 0xFF


class UShort(_FixedInt):
    """AMQP ``ushort`` (16-bit unsigned)."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFF


class UInt(_FixedInt):
    """AMQP ``uint`` (32-bit unsigned)."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFFFFFF


class ULong(_FixedInt):
    """AMQP ``ulong`` (64-bit unsigned)."""

    __slots__ = ()
    MIN, MAX = 0, 0xFFFFFFFFFFFFFFFF


class Byte(_FixedInt):
    """AMQP ``byte`` (8-bit signed)."""

    __slots__ = ()
    MIN, MAX = -0x80, 0x7F


class Short(_FixedInt):
    """AMQP ``short`` (16-bit signed)."""

    __slots__ = ()
    MIN, MAX = -0x8000, 0x7FFF


class Int(_FixedInt):
    """AMQP ``int`` (32-bit signed). Plain ``int`` values that fit already encode as this."""

    __slots__ = ()
    MIN, MAX = -0x80000000, 0x7FFFFFFF


class Long(_FixedInt):
    """AMQP ``long`` (64-bit signed)."""

    __slots__ = ()
    MIN, MAX = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Timestamp(_FixedInt):
    """AMQP ``timestamp``: signed 64-bit milliseconds since the Unix epoch."""

    __slots__ = ()
    MIN, MAX = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Float(float):
    """AMQP ``float`` (IEEE 754 binary32). Plain ``float`` is ``double``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


class Char(str):
    """AMQP ``char``: a single Unicode code point (UTF-32BE on the wire).

    The Azure SDK's decoder cannot read ``char``; never send it to one.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> Char:
        if len(value) != 1:
            raise ValueError("Char holds exactly one code point")
        if "\ud800" <= value <= "\udfff":
            raise ValueError("a surrogate is not a character")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str.__repr__(self)})"


class _RawDecimal(bytes):
    """IEEE 754 decimal placeholders: the raw big-endian bytes, carried through without interpretation.

    Service Bus never uses decimals; keeping the bytes lets a broker forward them unchanged.
    """

    __slots__ = ()
    WIDTH = 0

    def __new__(cls, raw: bytes) -> Any:
        if len(raw) != cls.WIDTH:
            raise ValueError(f"{cls.__name__} needs {cls.WIDTH} bytes")
        return bytes.__new__(cls, raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({bytes(self).hex()})"


class Decimal32(_RawDecimal):
    """AMQP ``decimal32`` (raw 4 bytes). Not decodable by the Azure SDK."""

    __slots__ = ()
    WIDTH = 4


class Decimal64(_RawDecimal):
    """AMQP ``decimal64`` (raw 8 bytes). Not decodable by the Azure SDK."""

    __slots__ = ()
    WIDTH = 8


class Decimal128(_RawDecimal):
    """AMQP ``decimal128`` (raw 16 bytes)."""

    __slots__ = ()
    WIDTH = 16


class Described:
    """A described value: ``descriptor`` (an int code, encoded as a small ulong, or a ``Symbol``) and ``value``.

    Known composite types (performatives, outcomes, message sections) have their own classes; this is the
    generic form for everything else, e.g. filters in a source's filter-set.
    """

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: int | str, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Described)
            and self.descriptor == other.descriptor
            and type(self.descriptor) is type(other.descriptor)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.descriptor, repr(self.value)))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class Array(list):
    """An AMQP ``array``: a list whose items all share one AMQP type, ``element_type``.

    ``element_type`` is the Python class whose encoding the items take: ``Symbol``, ``str``, ``bytes``,
    ``UInt``, ``Long``, ``int`` (int, or long if any item needs it), ``uuid.UUID``, ``Timestamp``, ``bool``,
    ``float``, ``list``, ``dict``, ``Array`` or ``Described`` (every item a ``Described`` with the same
    descriptor). It is a ``list`` subclass, so ``"ANONYMOUS" in mechanisms`` just works; equality with a
    plain list ignores the element type.
    """

    __slots__ = ("element_type",)

    def __init__(self, element_type: type, items: Any = ()) -> None:
        super().__init__(items)
        self.element_type = element_type

    def __repr__(self) -> str:
        return f"Array({self.element_type.__name__}, {list.__repr__(self)})"
