"""What a partition broker keeps in memory, record by record: ``Entry`` (a resident message and its stored size),
``SessionQueue`` (one session's ready heap and its lock), ``MessageQueue`` (one sub-queue's kept counts, resident
messages and indexes, and where its disk-only part begins), and ``RESIDENT``, the stored bytes the brokers of this
process hold together (what ``MEMORY_BUDGET`` is weighed against). With them, the names the broker's parts share:
the read sizes of the store window, the key prefixes of batch records and of complete_below's marks, the clock in
milliseconds, and the enum members per-message code compares with, as module globals.

It keeps nothing itself but the one process-wide ``RESIDENT`` counter; why what the records hold is bounded is in
partition/broker.py, "Memory and the store".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from ..model.message import Message, MessageState, SubQueue

# Batch records (partition/broker.py, "Sends whose outcome is unknown") live in the dedup table as
# "\x00batch:<batch id>:<first seq>:<end seq>". A front end revokes within moments of reaching the partition again
# (a dead worker prunes nothing, and a (re)started partition counts their age from its start), so two minutes of
# running time is plenty and keeps the table small.
BATCH_ID_PREFIX = "\x00batch:"
BATCH_ID_RETENTION_MS = 120_000
MARK_PREFIX = "mark:"  # meta keys of complete_below's marks: "mark:<slot>:<sub-queue>"
# One read brings at most this many: a larger read costs a receiver that waits for it more than it saves (a
# query per 256 messages is already a small share of their delivery).
READ_BATCH = 256
# A read-ahead (a queue's, a session's, the scheduled messages') stops once its rows hold this many bytes (the last
# may pass it), and brings at least one message: bounded by the bytes read, not by the largest message the
# partition accepts (Premium allows 100 MB messages: 256 of them would be 25 GB; dividing by that size made a read
# of their 1 KB messages one row).
READ_BATCH_BYTES = 64 << 20
LARGE_MESSAGE = READ_BATCH_BYTES // 16  # a message above this is kept in a window only within MEMORY_BUDGET
# A session-enabled slot's table of sessions (``MessageQueue.sessions``) takes sessions it did not know (discovered
# on disk, or new ones sent to) while it has fewer than this many; the rest wait on disk, found by the next look
# (``sess_from``). Locked sessions, sessions with resident messages and sessions whose scheduled message came due
# join it whatever its size: receivers, the read-ahead window and the scheduled window bound those.
SESSION_TABLE = 1024


class _Resident:
    """The stored bytes of the messages this process's partition brokers keep in memory (their ``entries``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # brokers change it under their own locks, on different threads
        self.bytes = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.bytes += n


RESIDENT = _Resident()


class Entry:
    """A stored message in memory: the message (with its broker fields) and its stored size."""

    __slots__ = ("msg", "queue", "seq", "size", "slot")

    def __init__(self, msg: Message, slot: int, seq: int, queue: int, size: int) -> None:
        self.msg = msg
        self.slot = slot
        self.seq = seq
        self.queue = queue
        self.size = size


class SessionQueue:
    """One session of a session-enabled queue or subscription: its resident ready messages, where its disk-only
    ones begin, and its lock."""

    __slots__ = ("disk_from", "holder", "id", "locked", "locked_until", "ready", "updated_ms")

    def __init__(self, session_id: str, disk_from: int | None = None) -> None:
        self.id = session_id
        self.ready: list[int] = []  # heap of sequence numbers of this session's resident ACTIVE, unlocked messages
        # its ACTIVE messages numbered at or above it may be on disk only (read by session: ``_refill_session``);
        # None: all of them are resident
        self.disk_from = disk_from
        self.holder: uuid.UUID | None = None  # the session lock token
        self.locked_until = 0
        self.locked: set[uuid.UUID] = set()  # lock tokens of messages locked under this session lock
        self.updated_ms = 0  # when its state last changed


class MessageQueue:
    """One sub-queue of one slot: its kept counts, its resident messages and their indexes, and where its
    disk-only messages begin (see "Memory and the store" in the header)."""

    __slots__ = (
        "bytes",
        "count",
        "disk_from",
        "entries",
        "gone",
        "key",
        "lock_heap",
        "next_expiry",
        "ready",
        "sched_disk",
        "scheduled",
        "scheduled_count",
        "sess_from",
        "session_locks",
        "sessions",
        "staged",
        "staged_bytes",
        "top",
    )

    def __init__(self, key: tuple[int, int], session_mode: bool = False) -> None:
        self.key = key
        self.count = 0  # messages in the sub-queue, resident or not (kept, stored with "counts")
        self.bytes = 0  # and their stored size
        self.scheduled_count = 0  # of them SCHEDULED (resident or not)
        self.staged = 0  # of them sent but not yet visible (their commit is under way)
        self.staged_bytes = 0
        # ACTIVE messages numbered at or above it may be on disk only; None: every message is resident
        self.disk_from: int | None = None
        self.gone: set[int] = set()  # resident messages at or above disk_from that left (their rows may linger)
        self.top = 0  # the highest sequence number ever resident here (a dead-letter queue's disk_from is above it)
        self.next_expiry: int | None = None  # no message of it expires before this (ms); None: none expires
        self.entries: dict[int, Entry] = {}
        self.ready: list[int] = []  # heap of sequence numbers of ACTIVE, unlocked messages (no session)
        self.lock_heap: list[tuple[int, int, uuid.UUID]] = []  # (locked_until, seq, token)
        self.scheduled: list[tuple[int, int]] = []  # (enqueue time, seq) of resident SCHEDULED messages
        # SCHEDULED messages with (enqueue time, seq) at or above it may be on disk only; None: all are resident
        self.sched_disk: tuple[int, int] | None = None
        self.sessions: dict[str, SessionQueue] | None = {} if session_mode else None
        # (session-enabled) every session with an ACTIVE message numbered below it is in ``sessions``; the others
        # are found on disk from it on (``_discover_sessions``); None: every session with messages is there
        self.sess_from: int | None = None
        self.session_locks: list[tuple[int, str, uuid.UUID]] = []  # (locked_until, session id, token)


# Members that per-message code compares with, as module constants: in Python 3.11 reading a member off an
# Enum class costs about ten times a global (EnumType defines __getattr__, which slows every class attribute).
_ACTIVE = MessageState.ACTIVE
_SCHEDULED = MessageState.SCHEDULED
_DEFERRED = MessageState.DEFERRED
_MAIN = SubQueue.MAIN


def _ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)


def _mark_key(key: str) -> tuple[int, int]:
    slot, queue = key[len(MARK_PREFIX) :].split(":")
    return int(slot), int(queue)


def _scheduled_ms(msg: Message) -> int:
    return int(msg.scheduled_enqueue_time.timestamp() * 1000)
