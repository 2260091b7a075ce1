"""AMQP 1.0 messages (part 3.2): the bare/annotated message sections <-> ``AmqpMessage``.

A message on the wire is a sequence of described sections: header 0x70, delivery-annotations 0x71,
message-annotations 0x72, properties 0x73, application-properties 0x74, then a body of one or more ``data``
(0x75) sections, one or more ``amqp-sequence`` (0x76) sections or a single ``amqp-value`` (0x77), then a footer
0x78. Sections are always written in that order with small-ulong descriptors; on reading any order is
accepted (the Azure SDK writes delivery-annotations last) and multiple data sections are preserved.

A broker rarely needs the whole message. ``scan_sections`` locates sections without decoding them, and
``set_message_annotations`` re-encodes only the message-annotations section of an encoded message (to stamp
``x-opt-sequence-number`` and friends) while copying every other byte through untouched.

``decode_message`` reads the usual encodings of header and properties with decoders generated per class (as
performatives.py does for transfers), falling back to the general decoder for anything else; it keeps the header
sections it has read, with their fields (at most 256, cleared when full: a broker sends the same few).

Service Bus batches (message-format ``0x80013700``) are an envelope whose ``data`` sections each hold one
complete encoded message: ``split_batch`` and ``build_batch`` take them apart and put them together.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import codec
from .codec import DecodeError, e_binary, e_list, e_map, e_symbol_map
from .performatives import ANY, BINARY, BOOL, STRING, SYMBOL, TIMESTAMP, UBYTE, UINT, Composite, _define
from .types import Timestamp, UInt, ULong

__all__ = [
    "BATCH_MESSAGE_FORMAT",
    "AmqpMessage",
    "BodyType",
    "Header",
    "Properties",
    "Section",
    "build_batch",
    "decode_message",
    "encode_message",
    "scan_sections",
    "set_message_annotations",
    "split_batch",
]

BATCH_MESSAGE_FORMAT = 0x80013700
"""Microsoft's batch message format: each data section of the envelope is one complete message."""

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78

_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


class BodyType(enum.IntEnum):
    """Which body sections a message has. DATA: ``body`` is ``list[bytes]``; SEQUENCE: ``list[list]``;
    VALUE: ``body`` is the value itself; NONE: no body section at all."""

    NONE = 0
    DATA = 1
    SEQUENCE = 2
    VALUE = 3


@dataclass(slots=True)
class Header(Composite):
    """``header`` section. Default-valued fields are written explicitly: the SDK reads them positionally."""

    durable: bool = False
    priority: int = 4
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0


@dataclass(slots=True)
class Properties(Composite):
    """``properties`` section (message-id, correlation-id: any of ulong/uuid/binary/string)."""

    message_id: Any = None
    user_id: bytes | None = None
    to: Any = None
    subject: str | None = None
    reply_to: Any = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


_HEADER_KINDS = [BOOL, UBYTE, UINT, BOOL, UINT]
_PROPERTIES_KINDS = [ANY, BINARY, ANY, STRING, ANY, ANY, SYMBOL, SYMBOL, TIMESTAMP, TIMESTAMP, STRING, UINT, STRING]
_define(Header, HEADER, "amqp:header:list", _HEADER_KINDS)
_define(Properties, PROPERTIES, "amqp:properties:list", _PROPERTIES_KINDS)
Header._TRIM_DEFAULTS = False


# ------------------------------------------------------------------------------------- fast section decoders
#
# Every delivery our client receives has a header and properties, and most messages the broker decodes with
# ``decode_message`` a properties section; the general path builds their field list (``_list_items``: a decoder
# call per field) and then checks it (``from_fields``). For a list0, or a list8 of the usual encodings, these
# generated decoders read the fields straight into the object instead. They return None for anything else and for
# anything malformed (their caller also turns any exception into None), and the general path then decides, with
# its own errors: the fast path never accepts what the general one rejects, and gives the same values of the same
# types for what it accepts (tests/amqp/test_message_decode.py compares the two).

# What reads one field's value into ``f`` (``p`` at its constructor), as the general decoder reads it.
_READ: dict[int, tuple[str, ...]] = {
    0x41: ("{f} = True", "p += 1"),
    0x42: ("{f} = False", "p += 1"),
    0x56: ("{f} = b[p + 1]", "if {f} > 1:", "    return None", "{f} = {f} == 1", "p += 2"),
    0x50: ("{f} = _UBYTES[b[p + 1]]", "p += 2"),
    0x52: ("{f} = _UINTS[b[p + 1]]", "p += 2"),
    0x43: ("{f} = _UINT0", "p += 1"),
    0x70: ("{f} = _int_new(_UInt, _I(b, p + 1)[0])", "p += 5"),
    0x53: ("{f} = _ULONGS[b[p + 1]]", "p += 2"),
    0x44: ("{f} = _ULONG0", "p += 1"),
    0x80: ("{f} = _int_new(_ULong, _Q(b, p + 1)[0])", "p += 9"),
    0x83: ("{f} = _int_new(_Timestamp, _q(b, p + 1)[0])", "p += 9"),
    0x98: ("{f}, p = _d_uuid(b, p + 1, 0)",),
    0xA0: ("s = p + 2", "p = s + b[p + 1]", "{f} = b[s:p]"),
    0xB0: ("s = p + 5", "p = s + _I(b, p + 1)[0]", "{f} = b[s:p]"),
    0xA1: ("s = p + 2", "p = s + b[p + 1]", "{f} = b[s:p].decode('utf-8')"),
    0xA3: (
        "s = p + 2",
        "p = s + b[p + 1]",
        "x = b[s:p]",
        "{f} = _SYMBOLS.get(x)",
        "if {f} is None:",
        "    {f} = _symbol(x)",
    ),
}
# The constructors each kind of field accepts here, most common first: all give values its type check passes.
_KIND_CTORS: dict[Any, tuple[int, ...]] = {
    BOOL: (0x42, 0x41, 0x56),
    UBYTE: (0x50,),
    UINT: (0x52, 0x43, 0x70),
    TIMESTAMP: (0x83,),
    BINARY: (0xA0, 0xB0),
    STRING: (0xA1, 0xA3),
    SYMBOL: (0xA3, 0xA1),
    ANY: (0xA1, 0x98, 0x53, 0x44, 0x80, 0xA0, 0xA3, 0x52, 0x43, 0x70),
}
_NULL = 0x40


def _make_section_decoder(cls: Any, kinds: list[Any]) -> Callable[[bytes, int], tuple[Any, int] | None]:
    """Generate ``fast(buf, p) -> (instance of cls, end) | None`` for the composite's list at ``p`` (its
    constructor): a list0, or a list8 of at most as many fields as ``cls`` has, each null (its default) or one of
    the constructors ``_KIND_CTORS`` gives for its kind."""
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(names) == len(kinds) and not hasattr(cls, "__post_init__") and not cls._MANDATORY
    n = len(names)
    lines = [
        "def fast(b, p):",
        "    c = b[p]",
        "    if c == 0xC0:",
        "        end = p + 2 + b[p + 1]",
        "        count = b[p + 2]",
        f"        if b[p + 1] == 0 or end > len(b) or count > {n}:",
        "            return None",
        "        p += 3",
        "    elif c == 0x45:",
        "        end = p = p + 1",
        "        count = 0",
        "    else:",
        "        return None",
    ]
    for i, kind in enumerate(kinds):
        default = repr(cls._DEFAULTS[i])  # None, False or a small int: a constant, the value from_fields gives
        ctors = _KIND_CTORS[kind]
        # null first for an optional field (usually absent), last for one usually set (the message-id, header's)
        order = (_NULL, *ctors) if cls._DEFAULTS[i] is None and i else (*ctors, _NULL)
        lines += [f"    if count > {i}:", "        c = b[p]"]
        for j, ctor in enumerate(order):
            lines.append(f"        {'el' if j else ''}if c == 0x{ctor:02X}:")
            read = ("{f} = " + default, "p += 1") if ctor == _NULL else _READ[ctor]
            if ctor == _NULL and i < n - 1:
                # nothing but nulls left (the SDK writes all 13 properties, most null): the rest at once
                read = (
                    "{f} = " + default,
                    f"if end - p == count - {i} and b.count(0x40, p, end) == end - p:",
                    "    p = end",
                    f"    count = {i + 1}",
                    "else:",
                    "    p += 1",
                )
            lines += ["            " + x.format(f=f"f{i}") for x in read]
        lines += ["        else:", "            return None", "    else:", f"        f{i} = {default}"]
    lines += ["    if p != end:", "        return None", "    o = _object_new(cls)"]
    lines += [f"    o.{name} = f{i}" for i, name in enumerate(names)]
    lines.append("    return o, end")
    env: dict[str, Any] = {
        "cls": cls,
        "_object_new": object.__new__,
        "_int_new": int.__new__,
        "_UBYTES": codec._UBYTES,
        "_UINTS": codec._UINTS,
        "_UINT0": codec._UINTS[0],
        "_ULONGS": codec._ULONGS,
        "_ULONG0": codec._ULONGS[0],
        "_UInt": UInt,
        "_ULong": ULong,
        "_Timestamp": Timestamp,
        "_I": codec._I,
        "_Q": codec._Q,
        "_q": codec._q,
        "_d_uuid": codec._d_uuid,
        "_SYMBOLS": codec._SYMBOLS,
        "_symbol": codec._symbol,
    }
    exec("\n".join(lines), env)
    return env["fast"]  # type: ignore[no-any-return]


_fast_header = _make_section_decoder(Header, _HEADER_KINDS)
_fast_properties = _make_section_decoder(Properties, _PROPERTIES_KINDS)


@dataclass(slots=True)
class AmqpMessage:
    """A decoded (or to-be-encoded) AMQP message. Maps hold decoded keys (``Symbol`` for annotations)."""

    header: Header | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: Properties | None = None
    application_properties: dict[Any, Any] | None = None
    body: Any = None
    body_type: BodyType = BodyType.NONE
    footer: dict[Any, Any] | None = None

    @classmethod
    def with_data(cls, *chunks: bytes, **kwargs: Any) -> AmqpMessage:
        """A message whose body is one data section per chunk."""
        return cls(body=list(chunks), body_type=BodyType.DATA, **kwargs)

    @classmethod
    def with_value(cls, value: Any, **kwargs: Any) -> AmqpMessage:
        """A message whose body is a single amqp-value section."""
        return cls(body=value, body_type=BodyType.VALUE, **kwargs)

    @property
    def data(self) -> bytes | None:
        """All data sections joined (``None`` when the body is not data)."""
        if self.body_type != BodyType.DATA:
            return None
        return self.body[0] if len(self.body) == 1 else b"".join(self.body)

    def encode(self) -> bytes:
        """Encoded sections in spec order."""
        return encode_message(self)


def encode_message(msg: AmqpMessage) -> bytes:
    """Encode ``msg`` section by section, in spec order, with small-ulong descriptors."""
    out = bytearray()
    if msg.header is not None:
        msg.header.encode_into(out)
    if msg.delivery_annotations is not None:
        out += b"\x00\x53\x71"
        e_symbol_map(out, msg.delivery_annotations)
    if msg.message_annotations is not None:
        out += b"\x00\x53\x72"
        e_symbol_map(out, msg.message_annotations)
    if msg.properties is not None:
        msg.properties.encode_into(out)
    if msg.application_properties is not None:
        out += b"\x00\x53\x74"
        e_map(out, msg.application_properties)
    bt = msg.body_type
    if bt == BodyType.DATA:
        for chunk in msg.body:
            out += b"\x00\x53\x75"
            e_binary(out, chunk)
    elif bt == BodyType.VALUE:
        out += b"\x00\x53\x77"
        codec.encode_into(out, msg.body)
    elif bt == BodyType.SEQUENCE:
        for seq in msg.body:
            out += b"\x00\x53\x76"
            e_list(out, seq)
    if msg.footer is not None:
        out += b"\x00\x53\x78"
        e_symbol_map(out, msg.footer)
    return bytes(out)


def _section_code(buf: bytes, p: int) -> tuple[int, int]:
    """Read a section descriptor at ``p``; return (code, position of the section value)."""
    if buf[p] != 0:
        raise DecodeError(f"expected a message section at offset {p}")
    if buf[p + 1] == 0x53:
        code = buf[p + 2]
        p += 3
    else:
        desc, p = codec._decode_descriptor(buf, p + 1, 0)
        code = _SECTION_NAMES.get(desc, -1) if isinstance(desc, str) else desc
    if not HEADER <= code <= FOOTER:
        raise DecodeError(f"unknown message section {code!r}")
    return code, p


def _expect(v: Any, t: type, what: str) -> Any:
    if not isinstance(v, t):
        raise DecodeError(f"{what} section must be a {t.__name__}")
    return v


# Header sections as they came (list8 bytes) -> their fields: a broker sends the same few (delivery count, ttl,
# durable) over and over, and reading a header's fields costs more than the lookup; bounded, cleared when full.
_HEADER_FIELDS: dict[bytes | None, tuple[Any, ...]] = {}
_header_fields = Header._GET
_object_new = object.__new__

_BODY_NONE, _BODY_DATA, _BODY_SEQUENCE, _BODY_VALUE = BodyType.NONE, BodyType.DATA, BodyType.SEQUENCE, BodyType.VALUE
_I = codec._I
_map_items = codec._map_items


def decode_message(payload: bytes | bytearray | memoryview, sections: list[Section] | None = None) -> AmqpMessage:
    """Decode a complete message. Raises only ``DecodeError``. With ``sections``, also appends where each section
    sits (as ``scan_sections`` would, without a second pass)."""
    buf = payload if type(payload) is bytes else bytes(payload)
    header = delivery_annotations = message_annotations = properties = application_properties = footer = None
    body: Any = None
    body_type = _BODY_NONE
    dec = codec._DEC
    p = 0
    n = len(buf)
    try:
        while p < n:
            start = p
            if buf[p] == 0 and buf[p + 1] == 0x53 and HEADER <= (code := buf[p + 2]) <= FOOTER:  # the usual one
                p += 3
            else:
                code, p = _section_code(buf, p)
            value_start = p
            c = buf[p]
            # each section decoded and checked in one branch, the commonest first
            if code == DATA:
                if c == 0xB0:  # a vbin32, read here (the usual body)
                    s = p + 5
                    p = s + _I(buf, p + 1)[0]
                    if p > n:
                        raise DecodeError("binary length exceeds buffer")
                    v = buf[s:p]
                else:
                    v, p = dec[c](buf, p + 1, 1)
                    if type(v) is not bytes:
                        _expect(v, bytes, "data")
                if body_type is _BODY_DATA:
                    body.append(v)
                elif body_type is _BODY_NONE:
                    body = [v]
                    body_type = _BODY_DATA
                else:
                    raise DecodeError("message mixes body section kinds")
            elif code == PROPERTIES:
                try:  # the generated decoder; None (or an exception) leaves it to the general path
                    done = _fast_properties(buf, p)
                except Exception:
                    done = None
                if done is None:
                    v, p = dec[c](buf, p + 1, 1)
                    properties = Properties.from_fields(v if type(v) is list else _expect(v, list, "properties"))
                else:
                    properties, p = done
            elif code in (MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES):
                if c == 0xC1:  # codec's map8 decoder, inline: a Python call fewer
                    e = p + 2 + buf[p + 1]
                    if e > n or buf[p + 1] == 0:
                        raise DecodeError("map size exceeds buffer")
                    v = _map_items(buf, p + 3, e, buf[p + 2], 2)
                    p = e
                else:
                    v, p = dec[c](buf, p + 1, 1)
                    if type(v) is not dict:
                        _expect(
                            v, dict, "message-annotations" if code == MESSAGE_ANNOTATIONS else "application-properties"
                        )
                if code == MESSAGE_ANNOTATIONS:
                    message_annotations = v
                else:
                    application_properties = v
            elif code == HEADER:
                raw = buf[p : p + 2 + buf[p + 1]] if c == 0xC0 else None
                known = _HEADER_FIELDS.get(raw)
                if known is not None:  # a header seen before: its fields without reading them
                    header = _object_new(Header)
                    header.durable, header.priority, header.ttl, header.first_acquirer, header.delivery_count = known
                    p += len(raw)  # type: ignore[arg-type]
                else:
                    try:
                        done = _fast_header(buf, p)
                    except Exception:
                        done = None
                    if done is None:
                        v, p = dec[c](buf, p + 1, 1)
                        header = Header.from_fields(_expect(v, list, "header"))
                    else:
                        header, p = done
                        if raw is not None:  # a whole list8, as the decoder just read it
                            if len(_HEADER_FIELDS) >= 256:
                                _HEADER_FIELDS.clear()
                            _HEADER_FIELDS[raw] = _header_fields(header)
            elif code == AMQP_VALUE:
                v, p = dec[c](buf, p + 1, 1)
                if body_type is not _BODY_NONE:
                    raise DecodeError("message has more than one body kind or amqp-value section")
                body = v
                body_type = _BODY_VALUE
            elif code == AMQP_SEQUENCE:
                v, p = dec[c](buf, p + 1, 1)
                if body_type is _BODY_SEQUENCE:
                    body.append(_expect(v, list, "amqp-sequence"))
                elif body_type is _BODY_NONE:
                    body = [_expect(v, list, "amqp-sequence")]
                    body_type = _BODY_SEQUENCE
                else:
                    raise DecodeError("message mixes body section kinds")
            elif code == DELIVERY_ANNOTATIONS:
                v, p = dec[c](buf, p + 1, 1)
                delivery_annotations = _expect(v, dict, "delivery-annotations")
            else:
                v, p = dec[c](buf, p + 1, 1)
                footer = _expect(v, dict, "footer")
            if sections is not None:
                sections.append(Section(code, start, value_start, p))
    except DecodeError:
        raise
    except codec.LOW_LEVEL_ERRORS as exc:
        raise DecodeError(f"malformed message: {exc!r}") from None
    # what AmqpMessage's __init__ does, without that Python call (it has no __post_init__)
    msg = _object_new(AmqpMessage)
    msg.header = header
    msg.delivery_annotations = delivery_annotations
    msg.message_annotations = message_annotations
    msg.properties = properties
    msg.application_properties = application_properties
    msg.body = body
    msg.body_type = body_type
    msg.footer = footer
    return msg


class Section(NamedTuple):
    """Where one section sits in an encoded message: ``buf[start:end]`` is the whole section and
    ``buf[value_start:end]`` its encoded value."""

    code: int
    start: int
    value_start: int
    end: int


def scan_sections(payload: bytes) -> list[Section]:
    """Locate every section of an encoded message without decoding values. Raises only ``DecodeError``."""
    buf = payload if type(payload) is bytes else bytes(payload)
    out = []
    p = 0
    n = len(buf)
    try:
        while p < n:
            code, vs = _section_code(buf, p)
            end = codec.skip_at(buf, vs)
            out.append(Section(code, p, vs, end))
            p = end
    except DecodeError:
        raise
    except codec.LOW_LEVEL_ERRORS as exc:
        raise DecodeError(f"malformed message: {exc!r}") from None
    return out


def set_message_annotations(payload: bytes, updates: dict[Any, Any], remove: tuple[Any, ...] = ()) -> bytes:
    """Return ``payload`` with message-annotations merged with ``updates`` (and ``remove`` keys dropped).

    Only the message-annotations section is decoded and re-encoded; it is put where the spec wants it (after
    header and delivery-annotations) and every other section is copied byte for byte.
    """
    sections = scan_sections(payload)
    annotations: dict[Any, Any] = {}
    insert_at = 0
    parts: list[bytes] = []
    for s in sections:
        if s.code == MESSAGE_ANNOTATIONS:
            annotations = _expect(codec.decode(payload[s.value_start : s.end]), dict, "message-annotations")
            continue
        if s.code in (HEADER, DELIVERY_ANNOTATIONS):
            insert_at = len(parts) + 1
        parts.append(payload[s.start : s.end])
    for k in remove:
        annotations.pop(k, None)
    annotations.update(updates)
    ma = bytearray(b"\x00\x53\x72")
    e_symbol_map(ma, annotations)
    parts.insert(insert_at, bytes(ma))
    return b"".join(parts)


def split_batch(payload: bytes) -> list[bytes]:
    """The inner messages of a ``0x80013700`` batch envelope (one per data section), still encoded."""
    buf = payload if type(payload) is bytes else bytes(payload)
    out = []
    for s in scan_sections(buf):
        if s.code == DATA:
            v = codec.decode(buf[s.value_start : s.end])
            out.append(_expect(v, bytes, "data"))
        elif s.code in (AMQP_VALUE, AMQP_SEQUENCE):
            raise DecodeError("a batch envelope body must be data sections")
    return out


def build_batch(
    messages: list[bytes],
    *,
    properties: Properties | None = None,
    message_annotations: dict[Any, Any] | None = None,
) -> bytes:
    """Build a batch envelope around already-encoded ``messages`` (send it with message-format 0x80013700).

    Like the Azure SDK, the envelope's properties default to the first message's message-id and group-id.
    """
    if properties is None and messages:
        first = decode_message(messages[0]).properties
        if first is not None:
            properties = Properties(message_id=first.message_id, group_id=first.group_id)
    return encode_message(
        AmqpMessage(
            properties=properties,
            message_annotations=message_annotations,
            body=list(messages),
            body_type=BodyType.DATA,
        )
    )
