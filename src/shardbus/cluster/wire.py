"""What crosses the wire between front ends and partition brokers in other processes or hosts.

The transport is AMQP 1.0 on our own engine (``amqp/``): one connection per front end and worker, a request link
and a reply link, pre-settled transfers. Each transfer is a plain AMQP message whose only section is one ``data``
section; inside it a MessagePack array names the call and carries its arguments. MessagePack because the values
are our own Python objects (messages with every broker field, settlements, settings) that the store already packs
this way (``store/records.py``): one encoder for disk and wire, and no AMQP type mapping of broker fields to keep
in step with the model.

Frames (the MessagePack array in the data section):

    request  [id, partition key, now, operation, args]     front end -> worker
    reply    [id, ok, value | [error class, text], health]  worker -> front end
    event    [0, partition key, slot]                       worker -> front end: the slot gained messages

``now`` is the caller's clock (workers started with ``clock="caller"`` run on it, so tests can move time);
``health`` is None while the partition is healthy, else the reason it is not.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from typing import Any

import msgpack

from ..model import errors as domain_errors
from ..model.entities import RuntimeProperties
from ..model.errors import InternalError, ShardbusError
from ..model.message import BodyType, Message, MessageState, SubQueue
from ..partition.broker import PartitionConfig, Settle, SlotSettings, SlotStats
from ..store import records

_EXT_MESSAGE = 20
_EXT_RECORD = 21  # a registered dataclass: (tag, field values...)
_EXT_ENUM = 22  # (tag, value) of the model's IntEnums, which would otherwise arrive as plain ints

_MESSAGE_FIELDS = Message.__slots__
_ENUMS: dict[int, type] = {1: SubQueue, 2: MessageState, 3: BodyType}
_ENUM_TAGS = {cls: tag for tag, cls in _ENUMS.items()}

# Dataclasses that travel as their field values; the tag is part of the protocol, never reuse one.
_RECORDS: dict[int, type] = {1: Settle, 2: SlotSettings, 3: PartitionConfig, 4: SlotStats, 5: RuntimeProperties}
_RECORD_TAGS = {cls: tag for tag, cls in _RECORDS.items()}
_RECORD_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _RECORDS.values()}

_DATA_SECTION = b"\x00\x53\x75\xb0"  # described type 0x75 (data), binary with a 4-byte length


def _default(value: Any) -> Any:
    if isinstance(value, Message):
        return msgpack.ExtType(_EXT_MESSAGE, _pack([getattr(value, name) for name in _MESSAGE_FIELDS]))
    cls = type(value)
    if cls is tuple:
        return list(value)
    tag = _ENUM_TAGS.get(cls)
    if tag is not None:
        return msgpack.ExtType(_EXT_ENUM, bytes([tag, int(value)]))
    tag = _RECORD_TAGS.get(cls)
    if tag is not None:
        return msgpack.ExtType(_EXT_RECORD, _pack([tag, *(getattr(value, f) for f in _RECORD_FIELDS[cls])]))
    return records._default(value)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_MESSAGE:
        values = _unpack(data)
        m = Message.__new__(Message)
        for name, value in zip(_MESSAGE_FIELDS, values, strict=True):
            setattr(m, name, value)
        return m
    if code == _EXT_ENUM:
        return _ENUMS[data[0]](data[1])
    if code == _EXT_RECORD:
        tag, *values = _unpack(data)
        cls = _RECORDS[tag]
        return cls(**dict(zip(_RECORD_FIELDS[cls], values, strict=True)))
    return records._ext_hook(code, data)


def _pack(value: Any) -> bytes:
    # strict types: int and str subclasses (AMQP types in annotations, the model's enums) keep their type
    return msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True)


def _unpack(data: bytes) -> Any:
    # lists stay lists (tuples are not kept apart): callers that need tuples convert
    return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False, raw=False)


def encode_frame(frame: list[Any]) -> bytes:
    """A frame as the payload of one AMQP transfer: a bare message of one data section."""
    body = _pack(frame)
    return _DATA_SECTION + struct.pack(">I", len(body)) + body


def decode_frame(payload: bytes) -> list[Any]:
    if payload[:4] != _DATA_SECTION:
        raise ValueError("not a shardbus cluster frame (expected one data section)")
    (size,) = struct.unpack_from(">I", payload, 4)
    return _unpack(payload[8 : 8 + size])


def encode_error(exc: BaseException) -> list[str]:
    name = type(exc).__name__ if isinstance(exc, ShardbusError) else "InternalError"
    return [name, str(exc) if isinstance(exc, ShardbusError) else f"{type(exc).__name__}: {exc}"]


def decode_error(value: list[str]) -> ShardbusError:
    """The domain error a worker raised, as the same class here (the one error table, model/errors.py)."""
    name, text = value
    cls = getattr(domain_errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ShardbusError)):
        cls = InternalError
    return cls(text)


def as_uuid(value: Any) -> uuid.UUID | None:
    return value if value is None or isinstance(value, uuid.UUID) else uuid.UUID(bytes=value)
