"""AMQP 1.0 messages (part 3.2): the bare/annotated message sections <-> ``AmqpMessage``.

A message on the wire is a sequence of described sections: header 0x70, delivery-annotations 0x71,
message-annotations 0x72, properties 0x73, application-properties 0x74, then a body of one or more ``data``
(0x75) sections, one or more ``amqp-sequence`` (0x76) sections or a single ``amqp-value`` (0x77), then a footer
0x78. Sections are always written in that order with small-ulong descriptors; on reading any order is
accepted (the Azure SDK writes delivery-annotations last) and multiple data sections are preserved.

A broker rarely needs the whole message. ``scan_sections`` locates sections without decoding them, and
``set_message_annotations`` re-encodes only the message-annotations section of an encoded message (to stamp
``x-opt-sequence-number`` and friends) while copying every other byte through untouched.

Service Bus batches (message-format ``0x80013700``) are an envelope whose ``data`` sections each hold one
complete encoded message: ``split_batch`` and ``build_batch`` take them apart and put them together.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import codec
from .codec import DecodeError, e_binary, e_list, e_map, e_symbol_map
from .performatives import ANY, BINARY, BOOL, STRING, SYMBOL, TIMESTAMP, UBYTE, UINT, Composite, _define

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


_define(Header, HEADER, "amqp:header:list", [BOOL, UBYTE, UINT, BOOL, UINT])
_define(
    Properties,
    PROPERTIES,
    "amqp:properties:list",
    [ANY, BINARY, ANY, STRING, ANY, ANY, SYMBOL, SYMBOL, TIMESTAMP, TIMESTAMP, STRING, UINT, STRING],
)
Header._TRIM_DEFAULTS = False


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


def decode_message(payload: bytes | bytearray | memoryview, sections: list[Section] | None = None) -> AmqpMessage:
    """Decode a complete message. Raises only ``DecodeError``. With ``sections``, also appends where each section
    sits (as ``scan_sections`` would, without a second pass)."""
    buf = payload if type(payload) is bytes else bytes(payload)
    msg = AmqpMessage()
    dec = codec._DEC
    p = 0
    n = len(buf)
    try:
        while p < n:
            start = p
            if buf[p] == 0 and buf[p + 1] == 0x53 and HEADER <= buf[p + 2] <= FOOTER:  # the usual descriptor
                code = buf[p + 2]
                p += 3
            else:
                code, p = _section_code(buf, p)
            value_start = p
            v, p = dec[buf[p]](buf, p + 1, 1)
            if sections is not None:
                sections.append(Section(code, start, value_start, p))
            if code == DATA:
                if type(v) is not bytes:
                    _expect(v, bytes, "data")
                if msg.body_type == BodyType.DATA:
                    msg.body.append(v)
                elif msg.body_type == BodyType.NONE:
                    msg.body = [v]
                    msg.body_type = BodyType.DATA
                else:
                    raise DecodeError("message mixes body section kinds")
            elif code == PROPERTIES:
                msg.properties = Properties.from_fields(v if type(v) is list else _expect(v, list, "properties"))
            elif code == APPLICATION_PROPERTIES:
                msg.application_properties = _expect(v, dict, "application-properties")
            elif code == MESSAGE_ANNOTATIONS:
                msg.message_annotations = _expect(v, dict, "message-annotations")
            elif code == HEADER:
                msg.header = Header.from_fields(_expect(v, list, "header"))
            elif code == AMQP_VALUE:
                if msg.body_type != BodyType.NONE:
                    raise DecodeError("message has more than one body kind or amqp-value section")
                msg.body = v
                msg.body_type = BodyType.VALUE
            elif code == AMQP_SEQUENCE:
                if msg.body_type == BodyType.SEQUENCE:
                    msg.body.append(_expect(v, list, "amqp-sequence"))
                elif msg.body_type == BodyType.NONE:
                    msg.body = [_expect(v, list, "amqp-sequence")]
                    msg.body_type = BodyType.SEQUENCE
                else:
                    raise DecodeError("message mixes body section kinds")
            elif code == DELIVERY_ANNOTATIONS:
                msg.delivery_annotations = _expect(v, dict, "delivery-annotations")
            else:
                msg.footer = _expect(v, dict, "footer")
    except DecodeError:
        raise
    except codec.LOW_LEVEL_ERRORS as exc:
        raise DecodeError(f"malformed message: {exc!r}") from None
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
