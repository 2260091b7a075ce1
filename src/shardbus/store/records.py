"""Packing a message's user-set fields into the bytes a store keeps (MessagePack).

Only what the sender set is packed; broker-owned fields live in their own columns (see ``base.Row``). Values
MessagePack cannot carry natively (datetime, UUID, timedelta, and the value types a front end registers, such as
AMQP's uint or symbol) use extension types, so application properties keep their types across restarts.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import msgpack

from ..model.message import BodyType, Message, _copy_message

_EXT_DATETIME = 1  # int64 microseconds since epoch, UTC
_EXT_UUID = 2
_EXT_TIMEDELTA = 3  # int64 microseconds
_EXT_PICKLED_TYPE = 4  # (type tag, value) for front-end specific values, see register_type

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

# Front ends may register small value types (e.g. AMQP Symbol) so they survive storage: tag -> (class, to, from)
_registered: dict[int, tuple[type, Any, Any]] = {}
_registered_by_type: dict[type, int] = {}


def register_type(tag: int, cls: type, to_plain: Any, from_plain: Any) -> None:
    """Let values of ``cls`` (e.g. an AMQP symbol) be stored and come back as ``cls``."""
    _registered[tag] = (cls, to_plain, from_plain)
    _registered_by_type[cls] = tag


KEEP_PACKER_BELOW = 1024 * 1024  # a packer that packed more goes (PackerPool.pack): the pool stays small


class PackerPool:
    """Reusable MessagePack packers. ``msgpack.packb`` makes a new packer per call, and each allocates (and the
    kernel maps) a 256 KB buffer, several times what packing a message costs; one shared packer is no better, as
    a ``default`` hook runs Python code mid-pack, letting another thread (or a nested pack) into the same buffer.
    A pack takes a packer from the pool, so nested packs and other threads get others (list pop and append are
    atomic)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._free: list[msgpack.Packer] = []

    def pack(self, value: Any) -> bytes:
        try:
            packer = self._free.pop()
        except IndexError:
            packer = msgpack.Packer(**self._options)
        data = packer.pack(value)  # a failed pack drops its packer (it may hold part of the value)
        if len(data) <= KEEP_PACKER_BELOW:
            self._free.append(packer)
        # else dropped: a packer keeps its buffer at the largest size it packed, and one 100 MB message would
        # otherwise hold 100 MB for as long as the process runs
        return data


# What packing raises for a value it cannot keep (an unknown type, a lone surrogate, an int past 64 bits)
PACK_ERRORS = (TypeError, ValueError, OverflowError)
# What an unregistered subclass of a type MessagePack carries is stored as (an IntEnum member as its int, say).
_PLAIN_BASES = (int, float, str, bytes, bytearray, list, dict)


def _default(value: Any) -> Any:
    tag = _registered_by_type.get(type(value))
    if tag is not None:
        return msgpack.ExtType(_EXT_PICKLED_TYPE, _packer.pack([tag, _registered[tag][1](value)]))
    if type(value) is tuple:
        return list(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return msgpack.ExtType(_EXT_DATETIME, ((value - _EPOCH) // _US).to_bytes(8, "big", signed=True))
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    if isinstance(value, timedelta):
        return msgpack.ExtType(_EXT_TIMEDELTA, (value // _US).to_bytes(8, "big", signed=True))
    for base in _PLAIN_BASES:
        if isinstance(value, base):
            return base(value)
    raise TypeError(f"cannot store a value of type {type(value).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_DATETIME:
        return _EPOCH + timedelta(microseconds=int.from_bytes(data, "big", signed=True))
    if code == _EXT_UUID:
        return uuid.UUID(bytes=data)
    if code == _EXT_TIMEDELTA:
        return timedelta(microseconds=int.from_bytes(data, "big", signed=True))
    if code == _EXT_PICKLED_TYPE:
        tag, plain = msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False)
        return _registered[tag][2](plain)
    return msgpack.ExtType(code, data)


# Strict types: a subclass of int, str, list, ... (an AMQP uint, symbol or array in application properties) goes
# to ``_default`` instead of being packed as its base type, so a registered type comes back as itself.
_packer = PackerPool(default=_default, use_bin_type=True, strict_types=True)


_free_packers = _packer._free
_DATA = BodyType.DATA
_new_packer = partial(msgpack.Packer, **_packer._options)


def pack_message(m: Message) -> bytes:
    """A message's stored bytes. Every send packs one, so ``_packer.pack`` is written out here (one Python call
    fewer per message, the same pool: a packer taken, and given back unless it packed a large message)."""
    ttl = None if m.time_to_live is None else m.time_to_live // _US
    try:
        packer = _free_packers.pop()
    except IndexError:
        packer = _new_packer()
    data = packer.pack(
        [  # a list: MessagePack's strict types take a tuple as an unknown type
            m.body,
            0 if m.body_type is _DATA else int(m.body_type),  # (``int()`` of an IntEnum member is a call)
            m.message_id,
            m.session_id,
            m.partition_key,
            m.correlation_id,
            m.subject,
            m.content_type,
            m.to,
            m.reply_to,
            m.reply_to_session_id,
            ttl,
            m.scheduled_enqueue_time,
            m.application_properties,
            m.annotations,
            m.enqueued_sequence_number,
            m.forward_hops,
            m.enqueued_time_ms,
            m.expires_at_ms,
        ]
    )
    if len(data) <= KEEP_PACKER_BELOW:
        _free_packers.append(packer)
    return data


def pack_dead_letter(m: Message) -> bytes:
    return _packer.pack([m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source])


def unpack_dead_letter(m: Message, data: bytes | None) -> None:
    if data is not None:
        m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source = msgpack.unpackb(data)


# What unpacking starts from: a message with every field at its default, copied (a straight-line field copy costs
# a third of what ``Message(...)``, its dataclass __init__ and __post_init__, do), then given the stored fields.
# Deliveries of a backlog unpack every message they read from the store, so this is on their path.
_BLANK = Message()
_BODY_TYPES = {int(t): t for t in BodyType}


def due_ms(msg: Message) -> int:
    """When a scheduled message comes due (ms since the epoch), as the ``_due`` index of the stores keeps it."""
    assert msg.scheduled_enqueue_time is not None
    return int(msg.scheduled_enqueue_time.timestamp() * 1000)


def unpack_message(data: bytes) -> Message:
    (
        body,
        body_type,
        message_id,
        session_id,
        partition_key,
        correlation_id,
        subject,
        content_type,
        to,
        reply_to,
        reply_to_session_id,
        ttl,
        scheduled,
        app_props,
        annotations,
        enqueued_seq,
        hops,
        enqueued_ms,
        expires_ms,
    ) = msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False, use_list=True)
    m = _copy_message(_BLANK)
    m.body = body if type(body) is bytes else Message(body).body  # bytes as Message() keeps them
    m.body_type = _BODY_TYPES[body_type]
    m.message_id = message_id
    m.session_id = session_id
    m.partition_key = partition_key
    m.correlation_id = correlation_id
    m.subject = subject
    m.content_type = content_type
    m.to = to
    m.reply_to = reply_to
    m.reply_to_session_id = reply_to_session_id
    if ttl is not None:
        m.time_to_live = timedelta(microseconds=ttl)
    m.scheduled_enqueue_time = scheduled
    m.application_properties = app_props
    m.annotations = annotations
    m.enqueued_sequence_number = enqueued_seq
    m.forward_hops = hops
    m.enqueued_time_ms = enqueued_ms
    m.expires_at_ms = expires_ms
    return m
