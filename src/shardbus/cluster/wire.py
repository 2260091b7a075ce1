"""What crosses the wire between front ends and partition brokers in other processes or hosts.

The transport is a plain byte stream (TCP) between two processes we own, one connection per front end and worker.
It opens with an HMAC challenge: the worker sends ``MAGIC`` and a random nonce, the front end answers ``MAGIC`` and
HMAC-SHA256(cluster key, nonce), and the worker accepts (``ACCEPTED``) or closes (``handshake`` below); the key
itself never travels. After that each side writes frames back to back, each one MessagePack array that names the
call and carries its arguments (or answers one), after its length (``LENGTH`` bytes, big-endian): the reader
(``stream.py``) knows where a frame ends before it reads it, so it unpacks each one where it lies in its receive
buffer (``unpack_frame``) instead of copying every read into a streaming unpacker first. A side writes every
frame that waits in one ``writelines`` per loop turn. There is no AMQP engine on this path: per request and reply
the cost is the frame's packing and unpacking and the futures, and per loop turn one write and one read.

MessagePack because the values are our own Python objects (messages with every broker field, settlements,
settings) that the store already packs this way (``store/records.py``): one encoder for disk and wire, and no
type mapping of broker fields to keep in step with the model. Messages, by the hundred in the hot calls, travel as
*compact records* (below): plain arrays the C packer writes without calling back into Python, a batch of them in
one extension value (a reply's, in the frame itself), the body in each once; an enqueue's as *send records*, only
the fields a partition keeps as sent, and a lock reply's messages that the front end sent and holds *named*, by
the fields the partition set (both since SBW6).

Frames (in order on each connection):

    request  [id, partition key, now, operation, args]     front end -> worker; answered by a reply unless the
                                                            operation is one way (``ONE_WAY``: ``hurry``)
    reply    [id, ok, value | [error class, text], health]  worker -> front end
    messages [id, true, [record, ...], health, 2]           worker -> front end: a reply that is a list of
                                                            messages (a lock's, a peek's), as compact records
    locked   [id, true, [record | named, ...], health, 3,   worker -> front end: a lock reply whose messages the
              lock]                                         front end sent and holds go *named*, by the broker's
                                                            fields alone (``Held``, below), those its lock set
                                                            alike once in ``lock`` (``_LOCK``)
    applied  [id, true, nil, health, 1]                     worker -> front end: a settlement is applied, its
                                                            write lingers (a ``written`` frame follows)
    written  [-1, [id, ...], nil | [error class, text]]     worker -> front end: those applied settlements'
                                                            writes are durable (or failed), one frame per turn
    event    [0, partition key, slot]                       worker -> front end: the slot gained messages

``now`` is the caller's clock (workers started with ``clock="caller"`` run on it, so tests can move time);
``health`` is None while the partition is healthy, else the reason it is not.

Memory: a stream's receive buffer holds at most one partial frame besides what one read brought
(``MAX_FRAME_BYTES``), and one grown for a big frame goes back to its size after it (``KEEP_READER_BELOW``).
Each end of a connection holds what its front end sent and may yet lock (``Held``): the messages of the enqueue
frames of at most ``HELD_BYTES`` (16 MB) and ``HELD_MESSAGES`` since both last dropped it all, the front end the
message objects it sent (handed over to the partition, as a local one stores them; what it would otherwise have got
back in its lock replies), the worker the message objects its partitions store anyway (kept past their settlement
only until the next drop).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import struct
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from ..model import errors as domain_errors
from ..model.entities import RuntimeProperties
from ..model.errors import InternalError, ShardbusError
from ..model.message import BodyType, Message, MessageState, SubQueue
from ..model.routing import SET_UUID_INT, SET_UUID_SAFE
from ..partition.values import PartitionConfig, Settle, SlotSettings, SlotStats
from ..store import records

_EXT_MESSAGE = 20  # a message as every field's value (peers before the compact record; still read)
_EXT_RECORD = 21  # a registered dataclass: (tag, field values...)
_EXT_ENUM = 22  # (tag, value) of the model's IntEnums, which would otherwise arrive as plain ints
_EXT_MESSAGES = 23  # a list of messages: one array of compact records (see ``Messages``)
_EXT_ITEMS = 24  # an enqueue's items, their messages as compact records (see ``Items``)
_EXT_TOKENS = 25  # lock tokens: their 16 bytes each, back to back (see ``Tokens``), read back as their ints
_EXT_ONE = 26  # one message elsewhere in a value: its compact record

_MESSAGE_FIELDS = Message.__slots__
_ENUMS: dict[int, type] = {1: SubQueue, 2: MessageState, 3: BodyType}
_ENUM_TAGS = {cls: tag for tag, cls in _ENUMS.items()}
# The enum members' ext values are made once (an enum elsewhere than in a message: a sub-queue argument).
_ENUM_EXTS = {
    cls: {member: msgpack.ExtType(_EXT_ENUM, bytes([tag, int(member)])) for member in cls}
    for tag, cls in _ENUMS.items()
}
_ENUM_MEMBERS = {bytes([tag, int(member)]): member for tag, cls in _ENUMS.items() for member in cls}
_namespace: dict[str, Any] = {}
# the older record (tag 20): every field, set by one generated tuple assignment
exec("def _fill_message(m, values):\n    " + ", ".join(f"m.{f}" for f in _MESSAGE_FIELDS) + ", = values\n", _namespace)
_fill_message = _namespace["_fill_message"]


# --- compact message records ------------------------------------------------------------------------------------
# The hot calls carry messages by the hundred: a send's ``enqueue`` (front end -> worker), a receive's
# ``lock_messages`` reply (worker -> front end). Each message travels as a *compact record*: a MessagePack array of
# its fields in slot order (those mostly at their defaults in one last element: ``_RARE``), every value a plain
# MessagePack one (enums as their ints, a lock token as its 16 bytes), so the C packer writes it without calling
# back into Python; the body is in it once (``wire_sections``, the front end's encoding kept for deliveries, holds
# what precedes a data body, never the body). A list of them
# is, in the hot calls, part of the frame itself (an enqueue's ``ItemsArg``, a reply's ``reply_frame``), read back
# by who knows what it is (the worker: the operation; the front end: the frame), else (``Items``, ``Messages``)
# one extension value: one Python call packs or unpacks the whole batch, through
# straight-line code generated below (as ``dataclasses`` generates code). Values of other types inside a record
# (application properties, a scheduled time) still go through ``_default``.
_F = _MESSAGE_FIELDS
# The fields a message mostly leaves at their defaults (None; ``forward_hops`` 0), sent or locked: a record carries
# them as one last element, None while all are at their defaults (nearly always), else an array of their values.
# Every array element costs the packer and the unpacker about as much as a 1 KB body's copy does, so the 16 of
# them dropped are half of a record's packing and reading (bench/hop_codec.py; SBW5).
_RARE = (
    "session_id",
    "partition_key",
    "correlation_id",
    "subject",
    "content_type",
    "to",
    "reply_to",
    "reply_to_session_id",
    "time_to_live",
    "scheduled_enqueue_time",
    "annotations",
    "dead_letter_reason",
    "dead_letter_error_description",
    "dead_letter_source",
    "forward_hops",
    "transfer_id",
)
_RARE_DEFAULTS = {f: (0 if f == "forward_hops" else None) for f in _RARE}
assert all(f in _F for f in _RARE)
_COMMON = tuple(f for f in _F if f not in _RARE)
_expressions = {f: f"m.{f}" for f in _F}
# an IntEnum member as its plain int: ``+ 0`` is int's own addition, in C; ``int(member)`` a call that costs as
# much again as the rest of the field's trip (an int given in its place comes out the same)
_expressions["body_type"] = "m.body_type + 0"
_expressions["state"] = "m.state + 0"
_expressions["lock_token"] = "None if m.lock_token is None else m.lock_token.int.to_bytes(16, 'big')"
# at its default: ``is None``; ``forward_hops == 0`` (an int; anything else, None included, travels as it is)
_at_default = " and ".join(f"m.{f} == 0" if _RARE_DEFAULTS[f] == 0 else f"m.{f} is None" for f in _RARE)
_BODY_TYPES = {int(b): b for b in BodyType}
_STATES = {int(s): s for s in MessageState}
# A lock token's UUID is built in line (``routing.uuid_of_int``'s two slot stores, without its call): a lock
# reply builds one per message, through the slots' own setters (model/routing.py). A complete's tokens are read as
# their ints only (``Tokens``).
_new_uuid = uuid.UUID.__new__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_set_int = SET_UUID_INT
_set_safe = SET_UUID_SAFE
_namespace.update(
    _new=Message.__new__,
    Message=Message,
    _BT=_BODY_TYPES,
    _ST=_STATES,
    _new_uuid=_new_uuid,
    _UUID=uuid.UUID,
    _set_int=_set_int,
    _set_safe=_set_safe,
    _SAFE=_SAFE_UNKNOWN,
    _from_bytes=int.from_bytes,
    _copies_of=lambda flat: _copies_of(flat),  # defined below
)
_none_defaults = " = ".join(f"m.{f}" for f in _RARE if _RARE_DEFAULTS[f] is None)
# a record's decoding reads these three into locals first (each is stored once, converted)
_targets = {f: f"m.{f}" for f in _F} | {"body_type": "_bt", "state": "_st", "lock_token": "token"}


def _encoding(indent: str) -> str:
    """Lines that set ``rare`` and ``record`` (message ``m``'s compact record)."""
    return (
        f"{indent}rare = None if {_at_default} else [{', '.join(_expressions[f] for f in _RARE)}]\n"
        f"{indent}record = [{', '.join(_expressions[f] for f in _COMMON)}, rare]\n"
    )


# The generated lines that make message ``m``'s lock token from its 16 bytes ``token`` (a UUID made without
# ``UUID.__init__``), and the same for a token that may be None: shared by every decoding below.
_TOKEN = ["u = m.lock_token = _new_uuid(_UUID)", "_set_int(u, _from_bytes(token, 'big'))", "_set_safe(u, _SAFE)"]
_TOKEN_OR_NONE = ["if token is None:", "    m.lock_token = None", "else:", *(f"    {line}" for line in _TOKEN)]


def _decoding(indent: str) -> str:
    """Lines that make message ``m`` from compact record ``v``."""
    lines = [
        "m = _new(Message)",
        ", ".join(_targets[f] for f in _COMMON) + ", rare = v",
        "if rare is None:",
        f"    {_none_defaults} = None",
        "    m.forward_hops = 0",
        "else:",
        "    " + ", ".join(f"m.{f}" for f in _RARE) + ", = rare",
        "m.body_type = _BT[_bt]",
        "m.state = _ST[_st]",
        *_TOKEN_OR_NONE,
    ]
    return "".join(f"{indent}{line}\n" for line in lines)


# One message's record and back, and the hot batches with the same code in their loops: a Python call per
# message fewer (an enqueue's items both ways, a lock reply's messages both ways).
exec(
    "def _record(m):\n" + _encoding("    ") + "    return record\n"
    "def _from_record(v):\n" + _decoding("    ") + "    return m\n"
    "def _item_arrays(items):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    for key, copies in items:\n"
    "        if len(copies) == 1:\n"
    "            slot, m = copies[0]\n" + _encoding("            ") + "            append([key, slot, record])\n"
    "        else:\n"
    "            append([key, [x for slot, m in copies for x in (slot, _record(m))]])\n"
    "    return out\n"
    "def items_of(arrays):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    for item in arrays:\n"
    "        if len(item) == 3:\n"
    "            v = item[2]\n" + _decoding("            ") + "            append((item[0], [(item[1], m)]))\n"
    "        else:\n"
    "            append((item[0], _copies_of(item[1])))\n"
    "    return out\n"
    "def records_of(messages):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    for m in messages:\n" + _encoding("        ") + "        append(record)\n"
    "    return out\n"
    "def messages_of(records):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    for v in records:\n" + _decoding("        ") + "        append(m)\n"
    "    return out\n",
    _namespace,
)
_record = _namespace["_record"]
_from_record = _namespace["_from_record"]


# --- lock replies that name what the front end sent (since SBW6) ------------------------------------------------
# A front end that sent a message and then locks it (a queue's sends and receives through one front end: "both")
# got its body and every field it had set back in the lock reply. Now both ends of a connection keep the messages
# of its successful enqueues that the front end may yet lock (*held*: the front end the message objects it sent,
# the worker the message objects it stored, by partition key and sequence number), and the worker's
# lock reply names such a message by its broker fields alone (``_BROKER``: what the partition set at enqueue and at
# the lock) instead of its whole record: no body and no user field crosses back, and neither side packs or reads
# them again. The two ends change what they hold at the same points of the one ordered stream, so they hold the
# same: an enqueue's messages are added when its reply is sent (worker) and read (front end), if every item is one
# copy (a queue's send; a topic's copies differ by subscription); every message of a ``locked`` reply is taken out
# by its sequence number; and once the enqueue frames added since the last drop pass ``HELD_BYTES`` (or their
# messages ``HELD_MESSAGES``), both drop everything at once (counted per frame, not per message: the two ends
# count the same frames' lengths, at no cost per message). So the worker names only what the front end holds, and
# anything else (dropped, sent through another connection, a dead-letter queue's) comes back in full, its body
# from the worker. A worker names a message only if the one it locked *is* the object it stored: the partition
# never changes a locked message in place but replaces it with a copy (``PartitionBroker.lock_messages_as``), so
# a message the worker names is the one the front end holds, with the broker's fields in the named record.
# Of those fields, the ones one lock gives every message alike (``_LOCK``: the lock's end, the state, the partition)
# travel once per reply, not once per message (since SBW7), and the enqueued sequence number, which an enqueue sets
# to the sequence number, not at all: a named record is the five that differ (``_NAMED``), and a held message whose
# ``_LOCK`` fields differ from the reply's or whose enqueued sequence number is another (neither seen from one
# ``lock_messages``, but not assumed) goes as its full record instead. Four elements a message fewer for the
# packer and the unpacker, and four assignments fewer for the front end (bench/hop_micro.py --callgrind).
# The front end locks the very message it sent (``_named_locking``: the broker's fields set on it, nine stores),
# not a copy of it made from its send record (thirty stores, its dictionaries copied): a sent message is handed
# over to its partition (``Entity.submit_many``'s ``owned``, or the entity's copy), which in one process stores
# that same object and lends it to the receiver it locks it for (``PartitionBroker.lock_messages_as``, ``LEND``),
# and a named one is taken out of what is held as it is locked, so it is locked once and nobody else has it.
# Nothing is changed on the object but the fields a partition sets at enqueue and at a lock (every one of them,
# so it ends as a local partition's lock gives it). Half the front end's instructions for a named message
# (bench/hop_micro.py --callgrind).
HELD_MESSAGES = 65536  # per connection; part of the protocol (both ends must drop at the same point)
HELD_BYTES = 16 * 1024 * 1024  # enqueue frames' bytes per connection between drops; part of the protocol too
_BROKER = (
    "sequence_number",
    "enqueued_time_ms",
    "expires_at_ms",
    "delivery_count",
    "lock_token",
    "locked_until_ms",
    "state",
    "partition_id",
    "enqueued_sequence_number",
)
assert all(f in _COMMON for f in _BROKER)
_LOCK = ("locked_until_ms", "state", "partition_id")  # alike for a lock's messages: once per reply
_NAMED = tuple(f for f in _BROKER if f not in _LOCK and f != "enqueued_sequence_number")  # a named record, in order
assert _NAMED[0] == "sequence_number" and len(_NAMED) != len(_COMMON) + 1  # told apart from a full record by length


# An enqueue's message travels as a *send record* (since SBW6): the fields its sender sets, in ``_SEND`` order, and
# one last element, None while every other field a partition keeps as sent (``_RARE``, ``_KEPT``) is at its
# default, else an array of their values. The fields a partition sets at every enqueue (``_SET``: sequence number,
# times, state, partition, delivery count: ``PartitionBroker._stage_enqueue`` and ``_new_entry`` overwrite each
# one) do not travel: the worker gives them their defaults. Six elements a message instead of fifteen. Since SBW8
# they are elements of the item's own array, after its dedup id and slot (``[dedup id, slot, body, ..., extra]``,
# eight elements): one array a message fewer for the front end to make and the packer to write, and for the
# worker's unpacker to make and free (bench/hop_micro.py --callgrind).
_SEND = ("body", "message_id", "application_properties", "body_type", "wire_sections")
_KEPT = ("lock_token", "locked_until_ms", "enqueued_sequence_number")
_SET = ("sequence_number", "enqueued_time_ms", "expires_at_ms", "partition_id", "delivery_count", "state")
assert set(_SEND) | set(_KEPT) | set(_SET) | set(_RARE) == set(_F) and len(_SEND + _KEPT + _SET + _RARE) == len(_F)
# What a worker gives the fields of a send record that do not travel, in order: ``_SET`` (the partition sets them
# at enqueue), and also ``_RARE`` and ``_KEPT`` when its last element is None. Stored from one tuple unpacked: two
# bytecodes a field (the message, the store) instead of three (a copy of None first).
_SET_DEFAULTS = (None, None, None, None, 0, MessageState.ACTIVE)
assert _SET == ("sequence_number", "enqueued_time_ms", "expires_at_ms", "partition_id", "delivery_count", "state")
_namespace["_SET_DEFAULTS"] = _SET_DEFAULTS
_namespace["_SENT_DEFAULTS"] = _SET_DEFAULTS + tuple(_RARE_DEFAULTS[f] for f in _RARE) + (None,) * len(_KEPT)
_kept_at_default = " and ".join(f"m.{f} is None" for f in _KEPT)


def _send_encoding(indent: str, head: str = "") -> str:
    """Lines that set ``record``: message ``m``'s send record, after ``head``'s elements (``"key, slot, "``)."""
    extra = ", ".join(_expressions[f] for f in _RARE + _KEPT)
    return (
        f"{indent}extra = None if {_at_default} and {_kept_at_default} else [{extra}]\n"
        f"{indent}record = [{head}{', '.join(_expressions[f] for f in _SEND)}, extra]\n"
    )


def _send_decoding(indent: str, head: str, source: str) -> str:
    """Lines that make message ``m`` from the send record in array ``source`` after ``head``'s elements (``"key,
    slot, "``: the item's)."""
    kept = {"lock_token": "token"}
    set_fields = ", ".join(f"m.{f}" for f in _SET)
    lines = [
        "m = _new(Message)",
        head + ", ".join(_targets[f] for f in _SEND) + f", extra = {source}",
        "m.body_type = _BT[_bt]",
        "if extra is None:",
        f"    {set_fields}, {', '.join(f'm.{f}' for f in _RARE + _KEPT)}, = _SENT_DEFAULTS",
        "else:",
        f"    {set_fields}, = _SET_DEFAULTS",
        "    " + ", ".join([f"m.{f}" for f in _RARE] + [kept.get(f, f"m.{f}") for f in _KEPT]) + ", = extra",
        *(f"    {line}" for line in _TOKEN_OR_NONE),
    ]
    return "".join(f"{indent}{line}\n" for line in lines)


def _named_locking(indent: str) -> str:
    """Lines that lock held message ``m`` (the very one the front end sent) as named record ``v`` says: the
    broker's fields from ``v`` and the reply's ``_LOCK`` fields (locals ``until``, ``state``, ``partition_id``),
    every field a partition sets at enqueue and at a lock (``_SET``, ``_KEPT``); the sender's are as it sent
    them, which is what the partition kept."""
    lines = [
        ", ".join(_targets[f] for f in _NAMED) + ", = v",
        "m.locked_until_ms = until",
        "m.state = state",
        "m.partition_id = partition_id",
        "m.enqueued_sequence_number = m.sequence_number",
        *_TOKEN,
    ]
    assert set(_NAMED) | set(_LOCK) | {"enqueued_sequence_number"} == set(_SET) | set(_KEPT)
    return "".join(f"{indent}{line}\n" for line in lines)


exec(
    "def held_item_arrays(items):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    sent = []\n"
    "    keep = sent.append\n"
    "    for key, copies in items:\n"
    "        if len(copies) == 1:\n"
    "            slot, m = copies[0]\n" + _send_encoding("            ", "key, slot, ") + "            append(record)\n"
    "            keep(m)\n"
    "        else:\n"
    "            sent = None\n"
    "            append([key, [x for slot, m in copies for x in (slot, _record(m))]])\n"
    "    return out, sent\n"
    "def held_items_of(arrays):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    messages = []\n"
    "    keep = messages.append\n"
    "    for item in arrays:\n"
    f"        if len(item) == {len(_SEND) + 3}:\n"
    + _send_decoding("            ", "key, slot, ", "item")
    + "            append((key, [(slot, m)]))\n"
    "            keep(m)\n"
    "        else:\n"
    "            messages = None\n"
    "            append((item[0], _copies_of(item[1])))\n"
    "    return out, messages\n"
    "def named_records_of(messages, held):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    pop = held.pop\n"
    "    lock = None\n"
    "    for m in messages:\n"
    "        if pop(m.sequence_number, None) is m:\n"
    "            if lock is None:\n"
    "                until, state, partition_id = m.locked_until_ms, m.state, m.partition_id\n"
    "                lock = [until, state + 0, partition_id]\n"
    "            if (\n"
    "                m.locked_until_ms == until and m.state is state and m.partition_id == partition_id\n"
    "                and m.enqueued_sequence_number == m.sequence_number\n"
    "            ):\n"
    f"                append([{', '.join(_expressions[f] for f in _NAMED)}])\n"
    "                continue\n" + _encoding("        ") + "        append(record)\n"
    "    return lock, out\n"
    "def locked_of(lock, records, held):\n"
    "    out = []\n"
    "    append = out.append\n"
    "    pop = held.pop\n"
    "    if lock is not None:\n"
    "        until, state, partition_id = lock\n"
    "        state = _ST[state]\n"
    "    for v in records:\n"
    f"        if len(v) == {len(_NAMED)}:\n"
    "            m = pop(v[0])\n" + _named_locking("            ") + "            append(m)\n"
    "            continue\n"
    f"        pop(v[{_COMMON.index('sequence_number')}], None)\n" + _decoding("        ") + "        append(m)\n"
    "    return out\n",
    _namespace,
)
# An enqueue's items as their arrays (``ItemsArg``'s, an item of one copy as its dedup id, slot and its message's
# send record in one array), and their
# messages to hold (None if an item has several copies): the front end's ``enqueue`` sends the arrays as they are.
held_item_arrays: Callable[[list[Any]], tuple[list[list[Any]], list[Message] | None]] = _namespace["held_item_arrays"]
# The items of ``held_item_arrays``' arrays, and the messages made to hold (None if an item has several copies): the
# worker's enqueue.
held_items_of: Callable[[list[list[Any]]], tuple[list[Any], list[Message] | None]] = _namespace["held_items_of"]
# A ``locked`` reply's lock fields and records (worker): the ``_LOCK`` fields of the first message ``held``
# (sequence number -> the message stored) holds (None if none is), and each message named (``_NAMED``'s fields) if
# ``held`` holds this very object and its ``_LOCK`` fields are those, else its compact record; every one taken out
# of ``held``.
named_records_of: Callable[[list[Message], dict[int, Message]], tuple[list[Any] | None, list[list[Any]]]] = _namespace[
    "named_records_of"
]
# A ``locked`` reply read back (front end): a named record's message the one held for it (sequence number ->
# the message sent), locked as the record and the reply's lock fields say, any other record read as it is; every
# one taken out of ``held``.
locked_of: Callable[[list[Any] | None, list[list[Any]], dict[int, Message]], list[Message]] = _namespace["locked_of"]


class Held:
    """What one end of a connection holds of the messages its front end sent (see above): by partition key and
    sequence number, the messages the front end sent or those the worker stored. Changed only on the
    connection's loop thread, in the stream's order.

    Memory: the messages of the enqueue frames of at most ``HELD_BYTES`` (and ``HELD_MESSAGES``) since the last
    drop, their bodies as they were sent; the worker's entries are messages its partitions store anyway, unless
    settled since, the front end's the messages it handed over to them (each about 250 bytes besides its body and
    properties)."""

    __slots__ = ("by_key", "count", "size")

    def __init__(self) -> None:
        self.by_key: dict[str, dict[int, Any]] = {}
        self.count = 0  # messages added since the last drop
        self.size = 0  # bytes of the enqueue frames that added them

    def add(self, key: str, sequence_numbers: list[int | None], held: list[Any], frame_bytes: int) -> None:
        """An enqueue stored as ``sequence_numbers`` say (None: a duplicate dropped, held under None, never named):
        ``held`` (its messages, one per item) by them. ``frame_bytes``: its frame's length."""
        count, size = self.count + len(held), self.size + frame_bytes
        if count > HELD_MESSAGES or size > HELD_BYTES:  # both ends drop everything at this same point
            self.by_key.clear()
            count, size = len(held), frame_bytes
            if count > HELD_MESSAGES or size > HELD_BYTES:  # one frame past the bounds: not held at all
                self.count = self.size = 0
                return
        self.count, self.size = count, size
        entries = self.by_key.get(key)
        if entries is None:
            entries = self.by_key[key] = {}
        entries.update(zip(sequence_numbers, held, strict=True))

    def of(self, key: str) -> dict[int, Any] | None:
        """What is held of a partition, if anything (``named_records_of`` and ``locked_of`` take from it)."""
        return self.by_key.get(key)

    def clear(self) -> None:
        self.by_key.clear()
        self.count = self.size = 0


class Messages(list):  # type: ignore[type-arg]
    """A list of messages that travels as one array of compact records in one extension value (a reply's go in
    a ``messages`` frame instead: ``reply_frame``)."""


class Items(list):  # type: ignore[type-arg]
    """An ``enqueue``'s (or ``transact``'s) items, ``[(dedup id, [(slot, message), ...]), ...]``, their messages
    as compact records: ``[[dedup id, [slot, record, slot, record, ...]], ...]`` in one extension value, an item
    of one copy as ``[dedup id, slot, record]``."""


class ItemsArg(list):  # type: ignore[type-arg]
    """An ``enqueue``'s (or ``transact``'s) items as a request's argument: ``Items``' arrays in the frame itself,
    not in an extension value (the packer writes them in place, and the worker reads them once); the worker,
    knowing the operation, reads them back (``items_of``; ``worker.ITEMS_ARGUMENT``)."""


class Tokens(list):  # type: ignore[type-arg]
    """Lock tokens (UUIDs) as one bytes value: 16 bytes each, in order (a ``complete``). Read back as their ints
    (``uuid.UUID.int``, ``_unpack_tokens``): the worker's ``complete`` looks its locks up by them
    (``PartitionBroker.complete_keys``), and never needs the UUIDs."""


class TokenKeys(list):  # type: ignore[type-arg]
    """Lock tokens given as their ints (``RemotePartition.complete_keys``), travelling as ``Tokens`` do: the same
    16 bytes each, without a UUID made and read per token at the front end."""


# The batching hints of the partition interface (``compact`` in partition/handle.py): encoding -> its wrapper.
COMPACT: dict[str, type] = {"items": ItemsArg, "tokens": Tokens}


# An item of one copy (a send to a queue: nearly all of them) is one array, ``[dedup id, slot, record]``: no
# flattening loop, and one array fewer per message to pack and to read back. Both generated above.
_item_arrays: Callable[[list[tuple[Any, list[tuple[int, Message]]]]], list[list[Any]]] = _namespace["_item_arrays"]
# Items read back from their arrays (an ``ItemsArg`` request argument, an ``Items`` value).
items_of: Callable[[list[list[Any]]], list[tuple[Any, list[tuple[int, Message]]]]] = _namespace["items_of"]


def _copies_of(flat: list[Any]) -> list[tuple[int, Message]]:
    """An item's copies from ``[slot, record, slot, record, ...]`` (a message sent to several slots: a topic's)."""
    message = _namespace["_from_record"]  # the pure one: ``PURE``'s functions stay pure (the compiled has its own)
    return [(flat[i], message(flat[i + 1])) for i in range(0, len(flat), 2)]


def _unpack_tokens(data: bytes) -> list[int]:
    """A ``Tokens`` value's tokens, each as its ``int``: a UUID built per token (``uuid_of_int``'s two slot stores)
    cost the worker three times as much per completed message (bench/hop_micro.py --callgrind)."""
    # every token's two 64-bit halves in one call: a slice and an ``int.from_bytes`` per token cost a fifth more
    words = iter(struct.unpack(f">{len(data) >> 3}Q", data))
    return [high << 64 | low for high, low in zip(words, words, strict=True)]


def wrap_reply(value: Any) -> Any:
    """A call's result as it best travels: a list of messages as ``Messages``."""
    if type(value) is list and value and type(value[0]) is Message:
        return Messages(value)
    return value


# Requests the worker answers nothing to (since SBW5): ``hurry`` only asks a lingering write to go now, and whoever
# waits for that write hears of it in the ``written`` frame.
ONE_WAY = frozenset({"hurry"})

# The fifth element of a reply frame of five or six: what it is (a plain reply has four).
APPLIED = 1
MESSAGES = 2
LOCKED = 3  # a lock reply of named and compact records (since SBW6): [id, true, [record, ...], health, 3, lock]


class Locked:
    """A worker's lock reply whose records name what the front end holds (``named_records_of``: the lock's
    ``_LOCK`` fields and the records): a ``locked`` frame, which the front end reads against what it holds of the
    partition (``locked_of``)."""

    __slots__ = ("lock", "records")

    def __init__(self, named: tuple[list[Any] | None, list[list[Any]]]) -> None:
        self.lock, self.records = named


class Records:
    """A reply's messages already made compact records (``record_of``): a worker's lock reply, its records made
    under the partition's lock from the live messages, not from copies (``worker.WorkerConnection._lock_messages``).
    It goes as a ``messages`` frame, as a list of messages does."""

    __slots__ = ("records",)

    def __init__(self, records: list[list[Any]]) -> None:
        self.records = records


# A message's compact record (see above): a snapshot of its fields, to be packed before the message changes.
record_of: Callable[[Message], list[Any]] = _record
# Messages' compact records (generated above): a worker's lock reply, from the locked messages lent (read at once,
# never changed in place: ``PartitionBroker.lock_messages_as``).
records_of: Callable[[list[Message]], list[list[Any]]] = _namespace["records_of"]


def reply_frame(request_id: int, ok: bool, value: Any, health: str | None) -> bytes:
    """A reply's frame. A list of messages (a lock reply: the hot one) goes as a ``messages`` frame, its records
    in the frame itself rather than in one extension value: the packer writes them in place, and the reader reads
    them once, where a nested value was packed apart and copied in whole, then copied out and read again."""
    if value.__class__ is Records:
        return _pack([request_id, ok, value.records, health, MESSAGES])
    if value.__class__ is Locked:
        return _pack([request_id, ok, value.records, health, LOCKED, value.lock])
    if type(value) is list and value and type(value[0]) is Message:
        return _pack([request_id, ok, records_of(value), health, MESSAGES])
    return _pack([request_id, ok, value, health])


# A ``messages`` frame's value, read back (generated above).
messages_of: Callable[[list[list[Any]]], list[Message]] = _namespace["messages_of"]


def _token_bytes(tokens: list[uuid.UUID]) -> bytes:
    """A ``Tokens`` value's bytes: each token's 16, in order."""
    return b"".join([t.int.to_bytes(16, "big") for t in tokens])


def _key_bytes(keys: list[int]) -> bytes:
    """A ``TokenKeys`` value's bytes: each token's 16, in order."""
    return b"".join([k.to_bytes(16, "big") for k in keys])


# --- the compiled codec -----------------------------------------------------------------------------------------
# The functions above that run per message in the hot calls, compiled (``_hopcodec.pyx``, Cython: each ``Message``
# slot read and written at its offset, the records' lists built in C; docs/performance.md): the same values from
# the same arguments, so the same bytes on the wire. It also packs the frames (``_pack`` below: plain values
# itself, any other through msgpack's packer, to the same bytes). The pure-Python code above stays, and runs when
# the extension was not built (an optional one: a failed compile still installs shardbus), fails to import (it
# refuses a ``Message`` or a record layout other than the one it was written for), or ``SHARDBUS_PURE_HOP=1`` asks
# for it.
PURE: dict[str, Callable[..., Any]] = {
    "held_item_arrays": held_item_arrays,
    "held_items_of": held_items_of,
    "named_records_of": named_records_of,
    "records_of": records_of,
    "locked_of": locked_of,
    "messages_of": messages_of,
    "_record": _record,
    "_from_record": _from_record,
    "_unpack_tokens": _unpack_tokens,
    "token_bytes": _token_bytes,
    "key_bytes": _key_bytes,
}
COMPILED = None  # the compiled module in use, if any
if os.environ.get("SHARDBUS_PURE_HOP", "") in ("", "0"):
    try:
        from . import _hopcodec as COMPILED  # type: ignore[no-redef]
    except ImportError:
        pass
if COMPILED is not None and COMPILED.check_layout(
    _COMMON, _RARE, _SEND, _KEPT, _SET, _NAMED, _LOCK, _namespace["_SENT_DEFAULTS"], _SET_DEFAULTS, dict(PURE)
):
    held_item_arrays = COMPILED.held_item_arrays
    held_items_of = COMPILED.held_items_of
    named_records_of = COMPILED.named_records_of
    records_of = COMPILED.records_of
    locked_of = COMPILED.locked_of
    messages_of = COMPILED.messages_of
    _record = record_of = COMPILED.record
    _from_record = COMPILED.from_record
    _unpack_tokens = COMPILED.unpack_tokens
    _token_bytes = COMPILED.token_bytes
    _key_bytes = COMPILED.key_bytes
else:
    COMPILED = None


# Dataclasses that travel as their field values; the tag is part of the protocol, never reuse one.
_RECORDS: dict[int, type] = {1: Settle, 2: SlotSettings, 3: PartitionConfig, 4: SlotStats, 5: RuntimeProperties}
_RECORD_TAGS = {cls: tag for tag, cls in _RECORDS.items()}
_RECORD_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _RECORDS.values()}

# Opens both sides of the handshake: a peer that speaks something else is told apart at once. Its digit is the
# frames' version: 2 added the applied and written frames, which a version-1 front end cannot read; 3 the
# messages frame and an enqueue's items in the request itself; 4 each frame's length before it; 5 a compact record's
# fields mostly at their defaults in one last element (``_RARE``), and ``hurry`` one way (``ONE_WAY``); 6 the
# locked frame, whose records name the messages the front end holds (``Held``), and an enqueue's send records; 7 the
# locked frame's fields alike for a lock's messages once per frame (``_LOCK``), its named records five elements; 8 an
# enqueue's send record in its item's array (``_SEND``).
MAGIC = b"SBW8"
LENGTH = 4  # bytes of a frame's length, which precedes it (big-endian)
NONCE_BYTES = 32
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES  # worker -> front end
ANSWER_BYTES = len(MAGIC) + hashlib.sha256().digest_size  # front end -> worker
ACCEPTED = b"\x01"  # worker -> front end: the answer was right, frames follow
REFUSED = b"\x00"  # worker -> front end: the answer was wrong (then it closes)
# The largest frame a reader buffers: an enqueue's batch (a send of up to 100 MB, as the premium tier allows, and
# its records) with room to spare; a bigger one is a broken peer.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# A stream's receive buffer grows to the largest frame it receives: once past a bigger frame than this it goes back
# to its usual size (``stream.py``), so one 100 MB message does not hold 100 MB for as long as the connection lasts.
KEEP_READER_BELOW = records.KEEP_PACKER_BELOW


def _default(value: Any) -> Any:
    cls = type(value)
    if cls is Messages:
        return msgpack.ExtType(_EXT_MESSAGES, _pack(records_of(value)))
    if cls is ItemsArg:
        return _item_arrays(value)  # packed in place by this same packer
    if cls is Items:
        return msgpack.ExtType(_EXT_ITEMS, _pack(_item_arrays(value)))
    if cls is TokenKeys:
        return msgpack.ExtType(_EXT_TOKENS, _key_bytes(value))
    if cls is Tokens:
        return msgpack.ExtType(_EXT_TOKENS, _token_bytes(value))
    if cls is Message or isinstance(value, Message):
        return msgpack.ExtType(_EXT_ONE, _pack(_record(value)))
    exts = _ENUM_EXTS.get(cls)
    if exts is not None:
        return exts[value]
    if cls is tuple:
        return list(value)
    tag = _RECORD_TAGS.get(cls)
    if tag is not None:
        return msgpack.ExtType(_EXT_RECORD, _pack([tag, *(getattr(value, f) for f in _RECORD_FIELDS[cls])]))
    return records._default(value)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_MESSAGES:
        message = _from_record
        return [message(v) for v in _unpack(data)]
    if code == _EXT_ITEMS:
        return items_of(_unpack(data))
    if code == _EXT_TOKENS:
        return _unpack_tokens(data)
    if code == _EXT_ONE:
        return _from_record(_unpack(data))
    if code == _EXT_MESSAGE:
        m = Message.__new__(Message)
        _fill_message(m, _unpack(data))
        return m
    if code == _EXT_ENUM:
        return _ENUM_MEMBERS[data]
    if code == _EXT_RECORD:
        tag, *values = _unpack(data)
        cls = _RECORDS[tag]
        return cls(**dict(zip(_RECORD_FIELDS[cls], values, strict=True)))
    return records._ext_hook(code, data)


# strict types: int and str subclasses (AMQP types in annotations, the model's enums) keep their type
_msgpack_pack = records.PackerPool(default=_default, use_bin_type=True, strict_types=True).pack
_pack = _msgpack_pack
if COMPILED is not None:  # plain values written by the compiled codec, any other by msgpack's packer: same bytes
    COMPILED.set_pack_fallback(_msgpack_pack, records.KEEP_PACKER_BELOW)
    _pack = COMPILED.pack


def _unpack(data: bytes) -> Any:
    # lists stay lists (tuples are not kept apart): callers that need tuples convert
    return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False, raw=False)


def pack_frame(frame: list[Any]) -> bytes:
    """One frame's bytes, as they go on the stream after their length (``unpack_frame`` reads them back)."""
    return _pack(frame)


def unpack_frame(data: bytes | memoryview) -> list[Any]:
    """One frame read back from its bytes (where they lie: a slice of the stream's receive buffer)."""
    return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False, raw=False)  # type: ignore[no-any-return]


def reader() -> msgpack.Unpacker:
    """Frames packed back to back without their lengths, read as a stream (tools and tests: ``feed`` it the bytes,
    iterate it for the frames complete so far)."""
    return msgpack.Unpacker(
        ext_hook=_ext_hook, strict_map_key=False, raw=False, max_buffer_size=MAX_FRAME_BYTES, use_list=True
    )


# --- the handshake -------------------------------------------------------------------------------------------
def challenge() -> tuple[bytes, bytes]:
    """The worker's opening bytes and the nonce in them."""
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce, nonce


def answer(key: str, opening: bytes) -> bytes:
    """The front end's answer to a worker's opening bytes (ValueError if they are not a shardbus worker's)."""
    if len(opening) != CHALLENGE_BYTES or not opening.startswith(MAGIC):
        if opening.startswith(MAGIC[:3]):
            theirs = opening[:4].decode(errors="replace")
            what = f"a shardbus worker of another version ({theirs}; this front end speaks {MAGIC.decode()})"
        elif opening.startswith(b"AMQP"):
            what = "an AMQP peer (an older shardbus worker?)"
        else:
            what = "not a shardbus worker"
        raise ValueError(f"the peer is {what}")
    return MAGIC + _mac(key, opening[len(MAGIC) :])


def accepts(key: str, nonce: bytes, reply: bytes) -> bool:
    """Whether a front end's answer proves it holds the cluster key (compared in constant time)."""
    return reply.startswith(MAGIC) and hmac.compare_digest(reply[len(MAGIC) :], _mac(key, nonce))


def _mac(key: str, nonce: bytes) -> bytes:
    return hmac.new(key.encode(), b"shardbus cluster " + nonce, hashlib.sha256).digest()


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
