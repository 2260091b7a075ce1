"""Which partition a message belongs to, and the numbers that name partitions.

The partition-key rule is the seeds' (Microsoft's "Partitioned queues and topics"): SessionId if set; else
PartitionKey; else MessageId when the entity requires duplicate detection; else no key (round-robin). One
addition of ours: a copy made by auto-forwarding with none of those is keyed by its transfer id, so that a copy
forwarded again after a crash (entity/forwarding.py) lands in the partition that has the first one and is dropped
there, not stored twice in two partitions. A key
maps to a partition through a stable hash, so the same key lands in the same partition in every process and
after every restart (Python's ``hash`` is salted per process and would not).

Client-visible sequence numbers carry the partition id in their top 16 bits, as the service's do; lock tokens
carry it in their low 16 bits. Either one therefore names the partition that owns the message. A lock token also
carries the message's partition-relative sequence number in its next 48 bits (64 random bits above): a front end
that loses a worker between a settlement's echo and its durable write knows which messages it settled from the
tokens alone (``cluster/remote.py``, in-doubt settlements), and a re-lock of the same message still gets another
token.
"""

from __future__ import annotations

import os
import struct
import threading
import types
import uuid
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from .errors import InvalidOperation
from .message import Message

PARTITION_BITS = 16
PARTITION_SHIFT = 64 - PARTITION_BITS
LOCAL_SEQUENCE_MASK = (1 << PARTITION_SHIFT) - 1


def partition_key_of(message: Message, requires_duplicate_detection: bool) -> str | None:
    """The key that pins ``message`` to one partition, or None when it may go anywhere."""
    session_id = message.session_id
    partition_key = message.partition_key
    if session_id is not None:
        if partition_key is not None and partition_key != session_id:
            raise InvalidOperation(
                f"PartitionKey '{partition_key}' and SessionId '{session_id}' must be identical when both "
                "are set: the session id is the partition key of a session message."
            )
        return session_id
    if partition_key is not None:
        return partition_key
    if requires_duplicate_detection and message.message_id is not None:
        return str(message.message_id)
    return message.transfer_id  # None but for a forwarded copy (see the module's header)


def batch_partition_key(
    messages: Iterable[Message], requires_duplicate_detection: bool, partitioned: bool
) -> str | None:
    """The one key a batch is routed by. A batch is stored atomically, so it must fit in one partition."""
    keys = set()
    dedup = requires_duplicate_detection
    for m in messages:  # ``partition_key_of`` called only for a message that has a key: a batch has many
        if (
            m.session_id is None
            and m.partition_key is None
            and (not dedup or m.message_id is None)
            and m.transfer_id is None
        ):
            keys.add(None)
        else:
            keys.add(partition_key_of(m, requires_duplicate_detection))
    if len(keys) > 1 and partitioned:
        raise InvalidOperation(
            "Batching brokered messages with distinct SessionId, PartitionKey, or MessageId is not supported "
            "for an entity with partitioning enabled: a batch is stored in one partition."
        )
    return next(iter(keys)) if len(keys) == 1 else None


def partition_for_key(key: str, partition_count: int) -> int:
    """Stable key → partition mapping (CRC-32 of the UTF-8 key)."""
    if partition_count == 1:
        return 0
    return zlib.crc32(key.encode("utf-8")) % partition_count


def encode_sequence_number(partition_id: int, local_sequence: int) -> int:
    return (partition_id << PARTITION_SHIFT) | local_sequence


def decode_sequence_number(sequence_number: int) -> tuple[int, int]:
    """Split a client-visible sequence number into (partition id, partition-relative sequence)."""
    return sequence_number >> PARTITION_SHIFT, sequence_number & LOCAL_SEQUENCE_MASK


_new_uuid = uuid.UUID.__new__
_set = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def _slot_setter(name: str) -> Callable[[uuid.UUID, Any], None]:
    """The store into a UUID's slot ``name`` through the slot's own descriptor: ``object.__setattr__(u, name, v)``
    looks the name up in the type's dictionaries on every call (cluster/wire.py uses these too)."""
    slot = uuid.UUID.__dict__.get(name)
    if isinstance(slot, types.MemberDescriptorType):
        return slot.__set__
    return lambda u, value: _set(u, name, value)  # a UUID without slots (another Python): the general store


# Every lock token is built with these two stores (a delivery's, a settlement's): ``uuid_of_int``'s fields
SET_UUID_INT = _slot_setter("int")
SET_UUID_SAFE = _slot_setter("is_safe")
# A lock token's delivery tag is its UUID in .NET byte order (``UUID.bytes_le``): the first three fields
# little-endian, the last 8 bytes as they are. Unpacked with one of these and packed with the other, the 16 bytes
# change order in C, in half the time of four slices and three concatenations (each delivery and each settlement
# converts one): ``TAG_ORDER.pack(*UUID_ORDER.unpack(big_endian_bytes))`` is the tag, and the other way round.
TAG_ORDER = struct.Struct("<IHH8s")
UUID_ORDER = struct.Struct(">IHH8s")
_tag_unpack = TAG_ORDER.unpack
_uuid_pack = UUID_ORDER.pack


def uuid_of_int(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be in range, without the constructor's argument checks
    (every delivery's lock token is built here or in ``uuid_of_bytes_le``). The fields set are exactly the ones
    ``UUID.__init__`` sets, so the result compares, hashes and prints as the constructor's would."""
    u = _new_uuid(uuid.UUID)
    SET_UUID_INT(u, value)
    SET_UUID_SAFE(u, _SAFE_UNKNOWN)
    return u


def uuid_of_bytes_le(data: bytes) -> uuid.UUID:
    """``uuid.UUID(bytes_le=data)`` for 16 bytes (a delivery tag), see ``uuid_of_int`` (inlined: every
    settlement's token comes here)."""
    u = _new_uuid(uuid.UUID)
    SET_UUID_INT(u, int.from_bytes(_uuid_pack(*_tag_unpack(data)), "big"))
    SET_UUID_SAFE(u, _SAFE_UNKNOWN)
    return u


# Lock tokens' randomness is drawn from the OS in blocks of this many tokens' worth: ``os.urandom`` releases the
# GIL around its system call, and on a busy broker each release hands the GIL to a store thread waiting for it,
# stalling the event loop in the middle of a delivery chunk (py-spy showed a GIL hand-off per chunk). One draw per
# block makes that one hand-off per 1,024 tokens. 8 KiB per process, refilled in place.
_TOKEN_BYTES = 8  # the random part: the rest of the 16 bytes is the partition id and the local sequence number
_TOKEN_SHIFT = PARTITION_BITS + PARTITION_SHIFT  # the random bits' place, above partition and local sequence
_POOL_TOKENS = 1024
_pool = b""
_pool_at = 0
_pool_lock = threading.Lock()  # tokens are made on the event loop, but a duplicate would settle another's lock


def _random_bytes(size: int) -> bytes:
    """``size`` bytes of the OS's randomness, from the pool (refilled from ``os.urandom`` when short)."""
    global _pool, _pool_at
    with _pool_lock:
        at = _pool_at
        end = at + size
        if end > len(_pool):
            if size > _TOKEN_BYTES * _POOL_TOKENS:
                return os.urandom(size)
            _pool = os.urandom(_TOKEN_BYTES * _POOL_TOKENS)
            at, end = 0, size
        _pool_at = end
        return _pool[at:end]


def _forget_pool() -> None:
    """A forked child draws its own randomness (a pool shared with the parent would repeat its tokens)."""
    global _pool, _pool_at, _pool_lock
    _pool, _pool_at, _pool_lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def new_lock_token(partition_id: int, local_seq: int = 0) -> uuid.UUID:
    """A fresh lock token whose low 16 bits name the partition holding the lock and whose next 48 the message's
    local sequence number (0 for a session lock, which holds no one message)."""
    random_part = int.from_bytes(_random_bytes(_TOKEN_BYTES), "big")
    return uuid_of_int((random_part << _TOKEN_SHIFT) | (local_seq << PARTITION_BITS) | partition_id)


def lock_token_bases(partition_id: int, count: int) -> list[int]:
    """``count`` lock tokens' random and partition bits (as ints) from one read of the random pool: OR in a
    message's ``local_seq << PARTITION_BITS`` to make its token (``uuid_of_int``), as ``new_lock_token`` does."""
    if count <= 0:
        return []
    # each 8 bytes as a big-endian int, all in one C call (not a slice and an int.from_bytes per token)
    randoms = struct.unpack(f">{count}Q", _random_bytes(_TOKEN_BYTES * count))
    shift = _TOKEN_SHIFT
    return [(r << shift) | partition_id for r in randoms]


def new_lock_tokens(partition_id: int, count: int) -> list[uuid.UUID]:
    """``count`` fresh lock tokens of local sequence number 0 (``lock_token_bases``, as UUIDs)."""
    return [uuid_of_int(base) for base in lock_token_bases(partition_id, count)]


def partition_of_lock_token(token: uuid.UUID) -> int:
    return token.int & 0xFFFF


def local_seq_of_lock_token(token: uuid.UUID) -> int:
    """The partition-relative sequence number of the message a lock token was made for."""
    return local_seq_of_lock_key(token.int)


def local_seq_of_lock_key(key: int) -> int:
    """``local_seq_of_lock_token`` of a token given as its ``int``."""
    return (key >> PARTITION_BITS) & LOCAL_SEQUENCE_MASK
