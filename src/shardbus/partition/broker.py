"""One partition broker: the message state machine of one partition, over its own messaging store.

Theory of operation
-------------------
A partition owns *slots* (slot 0: a queue's messages; a topic partition: one slot per subscription), and each
slot has three *sub-queues*: main, dead-letter and transfer-dead-letter. Every message lives in exactly one
sub-queue of one slot, in one of these states:

    SCHEDULED ──(time comes)──────────────▶ ACTIVE ◀───────────────────────────┐
    ACTIVE    ──lock──▶ LOCKED ──complete──▶ (gone)                           │
                        LOCKED ──abandon / release / lock expires─────────────┘ (abandon and expiry count a
                        LOCKED ──defer──▶ DEFERRED ──receive by sequence number──▶ LOCKED    delivery; release
                        LOCKED ──dead-letter / too many deliveries──▶ ACTIVE in the dead-letter sub-queue)
    ACTIVE    ──TTL passes──▶ dead-letter sub-queue (if the entity says so) or (gone)
    SCHEDULED ──cancel──▶ (gone)

A lock on a DEFERRED message returns it to DEFERRED, not ACTIVE, when released. Every transition is a method of
``PartitionBroker`` below and nothing else changes a message's state. A locked message is never changed in place:
it may be lent to the front end that delivers it (``lock_messages_as``, ``LEND``: read there, not copied), so a
lock's end or renewal changes a copy that takes its place in the entry (``_drop_lock``), and a removal only forgets
its lock (``_forget_lock``).

This module is the one place where message states change: every transition above (and the session lock's, which
locks and frees messages) is a method here. ``PartitionBroker`` is split by concern into parts that own no state
(mixins; the state is this object's, all of it set up in ``__init__`` below), each in its own module:
  - partition/lifecycle.py (``Lifecycle``): start, stop, close, delete, health, store failures, recovery;
  - partition/window.py (``StoreWindow``): disk-only messages into memory and out again (read-ahead, refills,
    disk scans for peeks and range reads, evictions) and the resident bytes; it moves no message to a new state;
  - partition/queries.py (``Queries``): peek, the range reads (browse_range, range_offsets), counts and stats;
  - partition/sessions.py (``SessionQueries``): session lookups (lock holder, state, list);
  - partition/memory.py: the in-memory records (``Entry``, ``SessionQueue``, ``MessageQueue``, ``RESIDENT``) and
    the names these modules share.

Sessions: in a session-enabled slot every session (all messages with one SessionId, which the partition key rule
pins to one partition) has its own ready heap, so its messages come out strictly in sequence order. A receiver
first takes the *session lock* (a named session, or the next free one with messages: the one whose oldest message
is the oldest, as Service Bus hands them out); it then locks that
session's messages, whose locks last exactly as long as the session lock. Renewing the session renews them;
when the session lock expires every message it held ends its lock as an expiry does (counting a delivery), and
the holder's next call fails with SessionLockLost. Session state (bytes) is stored with the partition.

Durability: the store holds every message; memory holds a bounded working set of them (below), and every change
is made in memory first and queued as a store write behind earlier ones. A send becomes visible to receivers only
after its batch is committed (``GroupCommitter`` on_commit), so nothing is delivered that was not first stored.
Locks are memory only: after a restart every locked message is available again. Delivery counts are written when
a lock ends in abandon, defer or dead-letter; a crash may forget increments of locks that simply expired.

Backpressure: sends staged but not yet written are counted in bytes; past ``MAX_UNWRITTEN_BYTES`` the next send
is refused with ``ServerBusy`` until the store catches up, so memory stays bounded under a producer faster than
the disk (settlements are not counted: each frees what it settles).

Memory and the store (what is resident, and why it is bounded): each sub-queue (``MessageQueue``) keeps
  - its counts (messages, bytes; scheduled ones), stored by a ``counts`` op in the same transaction as each change
    that moves them, so a start reads them instead of counting and runtime properties never read messages (the
    scheduled count is counted at start on the store's due index, which holds nothing else);
  - its resident messages (``entries``): the *read-ahead window* of ACTIVE messages (sends keep at most
    ``READ_AHEAD`` ready, ``SHARDBUS_READ_AHEAD``, and more while the process's brokers together hold less than
    ``MEMORY_BUDGET`` bytes of messages, ``SHARDBUS_MEMORY_MB``; a read brings ``READ_BATCH``), the locked ones
    (bounded by receivers' credit and lock durations), the soonest-due SCHEDULED ones (below), and DEFERRED ones
    only while locked or until the write that deferred them is stored;
  - ``disk_from``: ACTIVE messages numbered at or above it may be on disk only (None: all are resident). A send
    that finds the window full stays on disk (``disk_from`` is set to it); when the ready heap runs out below
    ``disk_from`` the next ``READ_BATCH`` ACTIVE rows are read in one indexed scan (``_refill``) and ``disk_from``
    moves past them. So a queue's oldest ACTIVE message is always resident or at ``disk_from``: FIFO holds, and
    a message above ``disk_from`` that became resident another way (a scheduled one come due, a dead-lettered one
    in the DLQ) is only delivered after the disk before it is read. A dead-letter queue works the same way: a
    move beyond its window (and the budget) starts its disk part above every message it ever held (``top``), and
    a moved message at or above ``disk_from`` leaves memory once the move is stored (``_evict``, ``_evicted``).
    In a session-enabled main queue ``disk_from`` is only a lower bound (the least of its sessions'), where the
    queue-wide scans (peek, expiry, range reads) start; its sessions are read as the next bullet says;
  - ``sessions`` (a session-enabled main queue): a bounded table of ``SessionQueue``s, each with the session's
    resident ready messages (a heap) and its own ``disk_from``: the session's ACTIVE messages at or above it may be
    on disk only. Sends keep a session's messages resident while the queue holds fewer than ``READ_AHEAD``
    messages (or the budget has room) and nothing of that session waits on disk before them; a session's heap
    that runs out below its ``disk_from`` reads the next ``READ_BATCH`` of that session by the store's session
    index (``_refill_session``), so FIFO per session holds across disk and memory. The table holds the locked
    sessions, those with resident messages, and while it has fewer than ``SESSION_TABLE`` entries the others it
    learns of (sends to a new session, sessions found on disk), with no message resident; a session left with
    nothing (no messages, no lock, no state change) leaves it. ``sess_from``: every session with an ACTIVE
    message numbered below it is in the table (None: every session with messages is); the rest are found by an
    indexed scan of the (seq, session) of ACTIVE rows from ``sess_from`` (``_discover_sessions``), which meets
    them in the order of their oldest messages, so "next available" (``_next_session``) takes the known free
    session with the oldest head and looks on disk only while none begins below ``sess_from``. A start knows no
    session (``sess_from`` = 1): a million sessions with one message each are a million rows, not objects;
  - ``gone``: resident messages at or above ``disk_from`` that left the sub-queue while their row may still be in
    the store (the delete or move is queued): scans skip them. Dropped as ``disk_from`` passes them. A
    session-enabled main queue has none: its messages that leave go in ``_leaving`` (below) instead, since its
    sessions' disk parts have no common start for such a set to be pruned by;
  - ``scheduled`` and ``sched_disk``: the resident SCHEDULED messages by (enqueue time, seq), every one of them
    before ``sched_disk``; those at or after it may be on disk only (None: all resident). A send due after
    ``sched_disk`` stays on disk; when more than ``2 x READ_AHEAD`` are resident (and the budget is used) the
    latest go (``_trim_scheduled``) and ``sched_disk`` moves down to them. When the resident ones run out and
    ``sched_disk`` is due, the next ``READ_BATCH`` are read from the store's due index (``_refill_scheduled``), as
    long as the ready messages are within the window (the rest wait on disk, still counted SCHEDULED); coming
    due writes the row's ACTIVE state, which takes it out of the due index. Cancel reads a disk-only one by key;
  - ``next_expiry``: no message of a main queue expires before it. The upkeep (``tick``) then reads the store's
    expiry index from its start and expires what is past its time (``_expire_rows``: dropped, or dead-lettered),
    resident or on disk, in any state but locked, ``READ_BATCH`` at a time; ``_disk_only`` tells a disk-only row
    from one whose message left with its row's change still queued. The head check stays: a message past its
    time is never delivered.
DEFERRED messages on disk are read by key (``receive_deferred``: ``_read_deferred``) and by the store's held
index for a peek or a range read. ``_leaving`` holds the deferred and scheduled messages (and every message of a
session-enabled main queue) that left while their row's change is queued (so no read by key or by index brings
them back), emptied as those writes are stored.
Peek, browse_range, range_offsets, complete_below and revocations merge the resident messages with an indexed
scan of the disk-only ones (a page costs what it returns). Scans only read rows numbered below
``_visible_next``, so a committed send is never read before ``make_visible`` has run for it.
What stays in memory per sub-queue is thus bounded by the windows, the budget, the locks and the writes in flight;
per partition, by its sub-queues. A session whose lock ends while its queue holds more than the window (and the
budget is used) gives its resident ready messages back to disk (``_park_session``), so the sessions received
from do not add up. Session states (bytes each, loaded at start as before) still follow the sessions that set
one.

Health: a store error (a failed read included) or a stop makes the partition unavailable; every call then raises
``PartitionUnavailable``. ``start`` (again) reloads the resident set and the counts from the store.

A full store is not such an error (``StoreFull``: the write ran out of space and nothing of it was stored). The
partition stays healthy and consistent: a send whose write found the store full is refused with
``PartitionFull`` (ServerBusy on the wire; a keyless send tries the next partition) and its in-memory traces
(size, duplicate-detection ids, batch record) are undone, since nothing of it was stored; further sends are
refused at once for ``FULL_RETRY`` seconds, then one goes to the store again as the probe. Everything else
(settlements, session state, slot changes) is already applied in memory and waits in the committer, in order,
until space returns (store/committer.py), so receives and settlements go on meanwhile, and should the broker
crash first, they are undone as any unsynced settlement is: at-least-once. Only if too much waits does the
committer give up: the partition becomes unavailable, and its upkeep ``tick`` reloads it from its store every
``FULL_RETRY`` seconds until that succeeds (what waited is lost from memory, never from the store: the messages
it would have settled are delivered again).

Sends whose outcome is unknown (in-doubt batches): a write that fails may still have reached the disk (a commit
whose fsync failed; a worker killed after committing, before its reply left). The sender was told it failed,
and a keyless batch has already been stored on another partition, so such a batch must not come back. Two
records make that possible: a failed ``enqueue`` leaves its sequence-number range here, and the next ``start``
deletes whatever of it the store holds before the partition is healthy again; and an ``enqueue`` that carries a
``batch_id`` (a front end's request to a worker, whose process may die with this memory) stores a *batch
record* with its messages (a duplicate-detection entry named ``BATCH_ID_PREFIX``, so no store format changes),
which the front end names in ``revoke_batches`` once it can reach the partition again.

Threading: one lock guards the state; store writes run on the committer's thread. Methods never wait for a write
except the ``*_sync`` conveniences; reads of disk-only messages (a read-ahead scan, a peek past the window) run
under the lock, on the caller's thread, one indexed query per ``READ_BATCH`` messages. The upkeep (``tick``) holds
the lock in slices, and reads the expiry index outside it: rows read while no write was stored are as good as
rows read under the lock (what memory changed since is in ``gone``/``_leaving`` or resident, as for any read),
others are read again under it (``_ExpiryScan``).
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any

from ..model.errors import (
    ArgumentError,
    InvalidOperation,
    MessageLockLost,
    MessageNotFound,
    MessageSizeExceeded,
    PartitionFull,
    QuotaExceeded,
    ServerBusy,
    SessionCannotBeLocked,
    SessionLockLost,
)
from ..model.message import Message, MessageState, SubQueue, _copy_message
from ..model.routing import (
    PARTITION_BITS,
    PARTITION_SHIFT,
    SET_UUID_INT,
    SET_UUID_SAFE,
    encode_sequence_number,
    lock_token_bases,
    new_lock_token,
)
from ..store.base import MessageStore, Op, Row, StoreError, Update
from ..store.committer import GroupCommitter
from ..store.records import PACK_ERRORS, pack_dead_letter, pack_message
from .lifecycle import Lifecycle
from .memory import (
    _ACTIVE,
    _DEFERRED,
    _MAIN,
    _SCHEDULED,
    BATCH_ID_PREFIX,
    BATCH_ID_RETENTION_MS,
    LARGE_MESSAGE,
    MARK_PREFIX,
    READ_BATCH,
    RESIDENT,
    SESSION_TABLE,
    Entry,
    MessageQueue,
    SessionQueue,
    _ms,
    _scheduled_ms,
)
from .queries import Queries
from .sessions import SessionQueries
from .values import (
    SETTLE_OUTCOMES,
    TRANSFER_ID_PREFIX,
    TRANSFER_ID_RETENTION_MS,
    PartitionConfig,
    Settle,
    SlotSettings,
    SlotStats,
)
from .window import StoreWindow

log = logging.getLogger(__name__)

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_EXPIRED_REASON = "TTLExpiredException"
TTL_EXPIRED_DESCRIPTION = "The message expired and was dead lettered."


def _env_int(name: str, default: int, least: int) -> int:
    """A whole-number setting from the environment; a value that is not one is refused at start, by name."""
    text = os.environ.get(name, "").strip()
    try:
        value = int(text) if text else default
    except ValueError:
        raise SystemExit(f"{name}={text!r} is not a whole number") from None
    return max(least, value)


# Read-ahead: how many ACTIVE messages of one sub-queue sends always keep in memory ahead of its receivers; the
# rest of a backlog stays on disk (but see MEMORY_BUDGET). SHARDBUS_READ_AHEAD sets it (docs/backlog.md).
READ_AHEAD = _env_int("SHARDBUS_READ_AHEAD", 1000, 1)
# A time to live this long (the default, TimeSpan.MaxValue, is 29,000 years) never comes: such messages stay out of
# the expiry index (each entry costs a send 4% more instructions) and expire, if ever, at the head of their queue.
FAR_TTL_MS = 100 * 365 * 86_400_000
EXPIRE_BATCHES = 8  # an upkeep expires at most this many READ_BATCHes per sub-queue (the rest at the next one)
# The upkeep's work per hold of the partition lock: at most this many due items (ended locks, activated
# messages), or one READ_BATCH of expiring rows, then the lock is let go (and the thread yields) before the next
# slice, so a send never waits behind a long tick (issue #28, point 6).
TICK_SLICE = 64
# Beyond its window a queue keeps sent messages in memory while every partition broker of this process together
# holds less than this many bytes of (stored) messages: a backlog that fits is served from memory as before, a
# larger one from the store. SHARDBUS_MEMORY_MB sets it (docs/backlog.md).
MEMORY_BUDGET = _env_int("SHARDBUS_MEMORY_MB", 32, 0) << 20


# How long a settlement's store write may wait for others to share its transaction (seconds). Nobody waits on
# it (the outcome is applied in memory and answered at once), and should it not reach the disk the message is
# delivered again: at-least-once, as with the service. Sends never wait (they are acknowledged once stored).
# A lingering store holds no thread (store/pools.py's ``LINGERS``), so the wait can be long enough for a stream of
# completes spread over 16 partitions to share few transactions: at 20 ms rather than 2, bench/scale.py's receive
# phase cost the broker 26 us per message instead of 40 (a delete-only transaction of ~6 rows costs SQLite and
# its thread about as much as one of ~50).
SETTLE_LINGER = 0.020
# Bytes of sends staged but not yet committed, above which the next send is refused with ServerBusy: a producer
# faster than the store meets backpressure (the SDK retries ServerBusy after a pause) instead of a queue of
# writes that grows without end in memory. One batch beyond it is always taken, so a message larger than the
# bound (premium's 100 MB) still goes in when nothing else waits.
MAX_UNWRITTEN_BYTES = 32 * 1024 * 1024


_UNSET = object()
# ``lock_messages_as``'s ``give`` that lends the locked messages themselves instead of copies (a locked message is
# never changed in place: the front end's receivers and a worker's lock reply read them as they are)
LEND: Callable[[Message], Any] = lambda m: m  # noqa: E731 (compared by identity, never called)
_new_tuple = tuple.__new__
_new_entry_object = object.__new__
_UUID = uuid.UUID
_new_uuid = uuid.UUID.__new__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def _batch_key(batch_id: str, first: int, end: int) -> str:
    return f"{BATCH_ID_PREFIX}{batch_id}:{first}:{end}"


def _finished(value: Any) -> Future:
    done: Future = Future()
    done.set_result(value)
    return done


class _ExpiryScan:
    """Where one sub-queue's expiry scan is (``tick``): the index position, and what it met. While it is paused
    (its next rows read without the lock) the sub-queue's ``next_expiry`` is left None, so that a send made visible
    meanwhile sets it to its own expiry (``make_visible``), which the scan keeps (``lowered``) when it ends:
    otherwise its end would overwrite that with a later time."""

    __slots__ = ("after", "batches", "expired", "held", "lowered", "seen")

    def __init__(self, q: MessageQueue) -> None:
        self.after = (-1, 0)
        self.batches = 0
        self.expired = self.held = False
        self.lowered: int | None = None
        self.seen = 0  # the committer's count of stored writes before the rows were read
        q.next_expiry = None

    def stale(self, committer: GroupCommitter | None) -> bool:
        """Whether a write was stored since the rows were read (they may show a change memory knows is done)."""
        return committer is not None and committer.stored != self.seen

    def resume(self, q: MessageQueue) -> None:
        if q.next_expiry is not None:  # lowered by a send while paused
            self.lowered = q.next_expiry if self.lowered is None else min(self.lowered, q.next_expiry)

    def pause(self, q: MessageQueue) -> None:
        q.next_expiry = None

    def finish(self, q: MessageQueue, at: int | None) -> None:
        lowered = self.lowered
        q.next_expiry = at if lowered is None else lowered if at is None else min(at, lowered)


_NO_TOKEN = uuid.UUID(int=0)  # the token of a settlement applied by sequence number (``settle_by_sequence``)


def _unstorable(exc: Exception) -> ArgumentError:
    """The refusal of a message holding a value the store cannot keep."""
    return ArgumentError(f"The message cannot be stored: {exc}.")


def _too_large(size: int, limit: int) -> MessageSizeExceeded:
    """The refusal of a message whose stored form passes the entity's largest message."""
    return MessageSizeExceeded(
        f"The received message (size {size} bytes) exceeds the limit ({limit} bytes) currently allowed on the link."
    )


class PartitionBroker(Lifecycle, StoreWindow, Queries, SessionQueries):
    answers_at_once = True  # see ``PartitionHandle``

    def __init__(
        self,
        config: PartitionConfig,
        store_factory: Callable[[], MessageStore],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.id = config.partition_id
        self._store_factory = store_factory
        self._clock = clock
        self._lock = threading.RLock()
        self._slots: dict[int, SlotSettings] = {}
        self._queues: dict[tuple[int, int], MessageQueue] = {}
        self._locks: dict[int, Entry] = {}  # by lock token's int: hashing a UUID runs Python code
        self._dedup: dict[str, int] = {}
        self._next_seq = 1
        self._visible_next = 1  # every sequence number below it is visible or gone (see make_visible)
        self._marks: dict[tuple[int, int], int] = {}  # (slot, sub-queue) -> complete_below's cumulative mark
        self._size = 0
        self._store: MessageStore | None = None
        self._committer: GroupCommitter | None = None
        self._healthy = False
        self._failure: str | None = None
        self._in_doubt: list[tuple[int, int]] = []  # [first, end) of failed enqueues; kept across restarts
        self._unwritten = 0  # bytes of staged sends whose write has not finished (bounded: MAX_UNWRITTEN_BYTES)
        self.max_unwritten_bytes = MAX_UNWRITTEN_BYTES
        self._recover_at: float | None = None  # unavailable for a full store: reload from it at (monotonic)
        self._epoch = 0  # counts memory resets: a late callback must not undo into a reloaded partition
        self.listeners: list[Callable[[int], None]] = []  # called with the slot that gained messages
        self.read_ahead = READ_AHEAD
        self.settle_linger = SETTLE_LINGER  # a worker's too: it answers once applied (cluster/worker.py)
        self.memory_budget = MEMORY_BUDGET
        self._resident = 0  # this broker's share of RESIDENT
        self._stats: dict[int, SlotStats] = {}

    # ------------------------------------------------------------------------------------------------------
    # store writes (life cycle and health: lifecycle.py; the store window: window.py)
    # ------------------------------------------------------------------------------------------------------

    def _on_store_resumed(self) -> None:
        """(The committer's thread, no write in hand.) Counts a refused write carried are stored now, not left
        to a next change that may not come (``_undo_refused``)."""
        log.warning("partition %s of '%s': its store has space again; taking sends", self.id, self.config.path)
        with self._lock:
            if self._healthy and self._dirty and self._committer is not None:
                self._write([], linger=self.settle_linger)

    def _write(
        self, ops: list[Op], on_commit: Callable[[], Any] | None = None, linger: float = 0.0, refusable: bool = False
    ) -> Future:
        """Queue a write, with the counts of the sub-queues it changed (so they commit together). ``refusable``:
        a send, which a full store refuses whole (see "Health")."""
        assert self._committer is not None
        if self._dirty:
            ops = ops + self._count_ops()
        future = self._committer.submit(ops, on_commit, linger, refusable)
        if self._evict:  # commits run in order: once this one is stored, so is every change they wait for
            evict, self._evict = self._evict, []
            future.add_done_callback(partial(self._evicted, self._epoch, evict))
        return future

    def _count_ops(self) -> list[Op]:
        ops: list[Op] = [("counts", *q.key, q.count, q.bytes) for q in self._dirty]
        self._dirty.clear()
        return ops

    def _remove(self, q: MessageQueue, entry: Entry) -> None:
        """A resident message leaves its sub-queue for good (the caller writes its delete)."""
        seq = entry.seq
        del q.entries[seq]
        self._hold(-entry.size)
        q.count -= 1
        q.bytes -= entry.size
        self._size -= entry.size
        self._dirty.add(q)
        if q.sessions is not None:  # its row may still be read (by session, or from sess_from) until the change
            self._left_held(entry)  # commits: sessions have no ``gone``, their disk parts have no common start
        elif q.disk_from is not None and seq >= q.disk_from:
            q.gone.add(seq)  # its row may still be read until the delete commits
        state = entry.msg.state
        if state is _SCHEDULED:
            q.scheduled_count -= 1
            self._left_held(entry)
        elif state is _DEFERRED:
            self._left_held(entry)

    # ------------------------------------------------------------------------------------------------------
    # slots
    # ------------------------------------------------------------------------------------------------------
    def configure_slot(self, slot: int, settings: SlotSettings) -> None:
        """Tell the partition about a slot it holds (at start, or after an update changed the settings)."""
        with self._lock:
            self._slots[slot] = settings

    def create_slot(self, slot: int, settings: SlotSettings) -> Future:
        with self._lock:
            self._check()
            self._slots[slot] = settings
            return self._write([("create_slot", slot)])

    def drop_slot(self, slot: int) -> Future:
        with self._lock:
            self._check()
            self._slots.pop(slot, None)
            for queue in SubQueue:
                q = self._queues.pop((slot, queue), None)
                if q is not None:
                    self._size -= q.bytes
                    self._dirty.discard(q)  # the drop removes its stored counts
                    self._hold(-sum(entry.size for entry in q.entries.values()))
                    for entry in q.entries.values():
                        if entry.msg.lock_token is not None:
                            self._locks.pop(entry.msg.lock_token.int, None)
            for key in [k for k in self._session_states if k[0] == slot]:
                del self._session_states[key]
            return self._write([("drop_slot", slot)])

    def _queue(self, slot: int, queue: int) -> MessageQueue:
        key = (slot, queue)
        q = self._queues.get(key)
        if q is None:
            settings = self._slots.get(slot)
            session_mode = queue == SubQueue.MAIN and settings is not None and settings.requires_session
            q = self._queues[key] = MessageQueue(key, session_mode)
        return q

    def _push_ready(self, q: MessageQueue, entry: Entry) -> None:
        """Make an ACTIVE, unlocked message receivable (in its session's heap on session entities)."""
        session_id = entry.msg.session_id
        if q.sessions is not None and session_id is not None:
            session = q.sessions.get(session_id)
            if session is None:  # (come due, say) its other messages are on disk from ``sess_from``, if any
                session = q.sessions[session_id] = SessionQueue(session_id, q.sess_from)
            heapq.heappush(session.ready, entry.seq)
        else:
            heapq.heappush(q.ready, entry.seq)

    def _forget_lock(self, q: MessageQueue, entry: Entry) -> None:
        """Forget a message's lock in the lock table (and its session's), leaving the message as it is: for a
        message that leaves its sub-queue with it (complete, a revoked send, complete_below)."""
        msg = entry.msg
        token = msg.lock_token
        if token is not None:
            self._locks.pop(token.int, None)
            if q.sessions is not None and msg.session_id is not None:
                session = q.sessions.get(msg.session_id)
                if session is not None:
                    session.locked.discard(token)

    def _drop_lock(self, q: MessageQueue, entry: Entry) -> Message:
        """End a message's lock (abandon, release, expiry, defer, dead-letter) and return the message to change from
        now on. A locked message may be lent to its receiver (``lock_messages_as``, ``LEND``), which reads it after
        this, so it is never changed: the entry gets a copy, unlocked."""
        msg = entry.msg
        if msg.lock_token is None:
            return msg
        self._forget_lock(q, entry)
        msg = entry.msg = _copy_message(msg)  # shallow: nobody changes a lent message's property maps
        msg.lock_token = None
        msg.locked_until_ms = None
        return msg

    # ------------------------------------------------------------------------------------------------------
    # sending
    # ------------------------------------------------------------------------------------------------------
    def enqueue(self, items: list[tuple[str | None, list[tuple[int, Message]]]], batch_id: str | None = None) -> Future:
        """Store messages; each item is (duplicate-detection id or None, [(slot, the copy that slot gets), ...]).

        All items commit together or not at all. The future's result is the list of client-visible sequence
        numbers, one per item, None for a duplicate that duplicate detection dropped. With ``batch_id`` the
        batch is stored with a batch record, so that ``revoke_batches`` can take it back (see the docstring).
        """
        with self._lock:
            self._check()
            self._refuse_if_full()
            now = _ms(self._clock)
            first = self._next_seq
            size_before = self._size
            ops, on_commit = self._stage_enqueue(items, now, batch_id)
            end = self._next_seq
            if end == first:  # only duplicates: nothing of it is stored, nothing to revoke
                return self._write(ops, on_commit, refusable=True)
            staged = self._size - size_before
            self._unwritten += staged
            dedup_ids = [k for op in ops if op[0] == "dedup" for k, _ in op[1]]
            puts = [op for op in ops if op[0] == "put"]
            if len(puts) == 1:  # one slot (a queue): its bytes are all that was staged
                slots = [(puts[0][1], len(puts[0][2]), staged)]
            else:
                slots = [(op[1], len(op[2]), sum(len(row[5]) for row in op[2])) for op in puts]
            if batch_id is not None:
                self._batches[batch_id] = (first, end, now)
                self._staged[batch_id] = (slots, dedup_ids)
                ops.append(("dedup", [(_batch_key(batch_id, first, end), now)]))
            future = self._write(ops, on_commit, refusable=True)
            refused = partial(self._undo_refused, self._epoch, slots, dedup_ids, now)
        future.add_done_callback(partial(self._written, staged))  # outside the lock: it may run at once
        future.add_done_callback(partial(self._enqueue_done, first, end, batch_id, refused))
        return future

    def _written(self, staged: int, future: Future) -> None:
        """A send's write finished (either way): its bytes no longer wait."""
        with self._lock:
            self._unwritten -= staged

    def _refuse_if_full(self) -> None:
        """Sends are refused at once while a write found the store full a moment ago (see "Health")."""
        assert self._committer is not None
        if self._committer.refusing:
            raise PartitionFull(
                f"Partition {self.id} of '{self.config.path}' cannot store messages now: its store is full. "
                "Receives and settlements go on; retry the send later."
            )

    def _enqueue_done(
        self, first: int, end: int, batch_id: str | None, refused: Callable[[str | None, bool], None], future: Future
    ) -> None:
        """A failed write may have landed all the same: remember its range for the next ``start``. A write
        refused for a full store did not land (nothing of it was stored): undo what staging it changed."""
        if batch_id is None and future.exception() is None:
            return
        with self._lock:
            revoked = False
            if batch_id is not None:
                self._staged.pop(batch_id, None)
                revoked = batch_id in self._revoked_staged
                self._revoked_staged.discard(batch_id)
            if isinstance(future.exception(), PartitionFull):
                refused(batch_id, revoked)
            elif future.exception() is not None:
                self._in_doubt.append((first, end))

    def _undo_refused(
        self,
        epoch: int,
        slots: list[tuple[int, int, int]],
        dedup_ids: list[str],
        now: int,
        batch_id: str | None,
        revoked: bool,
    ) -> None:
        """(Lock held.) Forget a send its full store refused: its counts and size ((slot, messages, bytes) per
        slot; ``revoke_batches`` already took back those of a revoked one), its duplicate-detection ids (so that
        the sender's retry is not dropped as a duplicate) and its batch record. The refused write also carried
        the counts of other changes, which did not land either: every sub-queue's counts are written again with
        the next write, at the latest when the store takes writes again (``_on_store_resumed``) or at ``stop``."""
        if epoch != self._epoch:  # reloaded since: memory is the store's, which never had it
            return
        for slot, count, size in slots:
            q = self._queues.get((slot, _MAIN))
            if q is None:  # the slot was dropped meanwhile, and its counts and size with it
                continue
            q.staged -= count
            q.staged_bytes -= size
            if not revoked:
                q.count -= count
                q.bytes -= size
                self._size -= size
        self._dirty.update(self._queues.values())
        for key in dedup_ids:
            if self._dedup.get(key) == now:
                del self._dedup[key]
        if batch_id is not None:
            self._batches.pop(batch_id, None)

    def revoke_batches(self, batch_ids: list[str]) -> Future:
        """Take back the batches ``enqueue`` stored under these ids, if it did: their messages and the
        duplicate-detection entries they made go, as if never sent (idempotent; unknown ids are ignored). A
        front end calls it for the sends it saw fail in flight, before it uses the partition again. The
        future's result is how many messages went."""
        with self._lock:
            self._check()
            ops: list[Op] = []
            gone = 0
            for batch_id in batch_ids:
                found = self._batches.pop(batch_id, None)
                if found is None:
                    continue
                first, end, _ = found
                dedup_gone = [_batch_key(batch_id, first, end)]
                staged = self._staged.pop(batch_id, None)
                if staged is None:
                    gone += self._revoke_range(first, end, ops)
                else:  # still on its way to the disk: delete behind it, and never make it visible
                    slots, dedup_ids = staged
                    self._revoked_staged.add(batch_id)
                    ops += [("delete", slot, list(range(first, end))) for slot, _, _ in slots]
                    for slot, count, size in slots:
                        q = self._queue(slot, _MAIN)
                        q.count -= count
                        q.bytes -= size
                        self._size -= size
                        self._dirty.add(q)
                    for key in dedup_ids:
                        self._dedup.pop(key, None)
                    dedup_gone += dedup_ids
                    gone += end - first
                ops.append(("dedup_delete", dedup_gone))
            if not ops:
                return _finished(0)
            return self._write(ops, lambda: gone)

    def _revoke_range(self, first: int, end: int, ops: list[Op]) -> int:
        """Remove the stored messages numbered [first, end) from every slot and sub-queue, with the
        duplicate-detection entries and batch record they came with; append the store ops. How many went."""
        gone = 0
        dedup_gone: list[str] = []
        deletes: dict[int, list[int]] = {}
        for q in list(self._queues.values()):
            entries = q.entries
            found = [entries[s] for s in range(first, end) if s in entries]
            found += self._disk_entries(q, first, end, end - first)  # as if resident: the same steps
            if self._on_disk(q):
                for state in (_DEFERRED, _SCHEDULED):
                    found += self._disk_held(q, state, first, end, end - first)
            for entry in found:
                seq = entry.seq
                if seq in entries:
                    self._forget_lock(q, entry)
                else:
                    entries[seq] = entry
                    self._hold(entry.size)
                self._remove(q, entry)
                deletes.setdefault(entry.slot, []).append(seq)
                gone += 1
                msg = entry.msg
                key = msg.transfer_id if msg.transfer_id is not None else msg.message_id
                # only the entry this very send made (another send of the id may have made a later one)
                if key is not None and self._dedup.get(str(key)) == msg.enqueued_time_ms:
                    del self._dedup[str(key)]
                    dedup_gone.append(str(key))
        for batch_id, (b_first, b_end, _) in list(self._batches.items()):
            if b_first == first:
                del self._batches[batch_id]
                dedup_gone.append(_batch_key(batch_id, b_first, b_end))
        ops += [("delete", slot, seqs) for slot, seqs in deletes.items()]
        if dedup_gone:
            ops.append(("dedup_delete", dedup_gone))
        return gone

    def _stage_enqueue(
        self, items: list[tuple[str | None, list[tuple[int, Message]]]], now: int, batch_id: str | None = None
    ) -> tuple[list[Op], Callable[[], list[int | None]]]:
        """Validate and number messages; return the store ops and the callback that makes them visible.
        Raises (leaving nothing behind) when the batch is refused."""
        if self._unwritten >= self.max_unwritten_bytes:
            raise ServerBusy(
                f"Partition {self.id} of '{self.config.path}' is busy: {self._unwritten} bytes of earlier sends "
                "wait for its store; retry later."
            )
        cfg = self.config
        window_start = now - cfg.dedup_window_ms
        dedup_new: list[tuple[str, int]] = []
        rows_by_slot: dict[int, list[Row]] = {}
        visible: dict[int, list[Entry]] = {}  # each slot's new entries, in sequence order
        results: list[int | None] = []
        added_size = 0
        seq = self._next_seq
        ttl_floors: dict[int, int | None] = {}
        check_all_ids = cfg.requires_duplicate_detection
        partition_bits = self.id << PARTITION_SHIFT  # encode_sequence_number, hoisted
        new_entry = self._new_entry
        pid = self.id
        max_size = cfg.max_message_size_bytes
        last_slot: int | None = None  # the slot of the last copy, and its lists and TTL floor (below)
        slot_rows: list[Row] = []
        slot_entries: list[Entry] = []
        floor: int | None = None
        far = True  # the slot's TTL floor never expires a message (``_new_entry``'s index rule): the inline path
        expires_at: int | None = None  # what the inline path gives such a message: now + the floor, or None
        try:
            for dedup_id, copies in items:
                if dedup_id is not None and (check_all_ids or dedup_id.startswith(TRANSFER_ID_PREFIX)):
                    seen = self._dedup.get(dedup_id)
                    if seen is not None and seen >= window_start:
                        results.append(None)  # accepted and dropped, as the service does
                        continue
                    self._dedup[dedup_id] = now
                    dedup_new.append((dedup_id, now))
                sequence_number = partition_bits | seq  # every copy's (``encode_sequence_number``)
                results.append(sequence_number)
                for slot, msg in copies:
                    if slot != last_slot:  # a queue's sends are all slot 0: its lists looked up once
                        floor = ttl_floors.get(slot, _UNSET)
                        if floor is _UNSET:
                            floor = ttl_floors[slot] = self._ttl_floor(slot)
                            rows_by_slot[slot] = []
                            visible[slot] = []
                        slot_rows, slot_entries, last_slot = rows_by_slot[slot], visible[slot], slot
                        far = floor is None or floor >= FAR_TTL_MS
                        expires_at = None if floor is None else now + floor
                    if far and msg.time_to_live is None and msg.scheduled_enqueue_time is None:
                        # ``_new_entry`` written out for the usual message (active now, never expiring): the
                        # same fields, row and entry, one Python call fewer per message
                        msg.sequence_number = sequence_number
                        msg.enqueued_time_ms = now
                        msg.expires_at_ms = expires_at  # in no expiry index
                        msg.state = _ACTIVE
                        msg.partition_id = pid
                        msg.delivery_count = 0
                        if msg.enqueued_sequence_number is None:
                            msg.enqueued_sequence_number = sequence_number
                        try:
                            data = pack_message(msg)
                        except PACK_ERRORS as exc:
                            raise _unstorable(exc) from exc
                        size = len(data)
                        if size > max_size:
                            raise _too_large(size, max_size)
                        # a plain tuple in ``Row``'s order (the stores read rows by position): one tuple made,
                        # not two and a call
                        row = (seq, 0, 0, 0, None, data, None)
                        entry = _new_entry_object(Entry)
                        entry.msg = msg
                        entry.slot = slot
                        entry.seq = seq
                        entry.queue = _MAIN
                        entry.size = size
                    else:
                        entry, row = new_entry(slot, seq, msg, now, floor)
                        size = entry.size
                    added_size += size
                    slot_rows.append(row)
                    slot_entries.append(entry)
                seq += 1
            if self._size + added_size > cfg.max_size_bytes:
                raise QuotaExceeded(
                    f"The maximum entity size has been reached or exceeded for '{cfg.path}' "
                    f"(partition {self.id}). "
                    f"Size of entity in bytes: {self._size}, max entity size in bytes: {cfg.max_size_bytes}."
                )
        except Exception:
            for dedup_id, _ in dedup_new:  # nothing of a refused batch is remembered
                self._dedup.pop(dedup_id, None)
            self._dues.clear()
            self._expiries.clear()
            raise
        self._next_seq = seq
        self._size += added_size
        if len(visible) == 1:  # one slot (a queue): it has all the bytes
            slot_sizes = dict.fromkeys(visible, added_size)
        else:
            slot_sizes = {slot: sum(e.size for e in entries) for slot, entries in visible.items()}
        indexed: list[Op] = []
        for slot, size in slot_sizes.items():  # counted now: the counts commit with the rows
            q = self._queue(slot, _MAIN)
            q.count += len(rows_by_slot[slot])
            q.staged += len(rows_by_slot[slot])
            q.staged_bytes += size
            q.bytes += size
            self._dirty.add(q)
            if q.sessions is not None:  # a session-enabled slot's rows go in its session index
                pairs = [(e.seq, e.msg.session_id) for e in visible[slot] if e.msg.session_id is not None]
                indexed.append(("sessions", slot, pairs))
        ops: list[Op] = [("put", slot, rows) for slot, rows in rows_by_slot.items()]
        if indexed:
            ops += indexed
        if self._dues:
            by_slot: dict[int, list[tuple[int, int]]] = {}
            for slot, s, due in self._dues:
                by_slot.setdefault(slot, []).append((s, due))
            ops += [("due", slot, dues) for slot, dues in by_slot.items()]
            self._dues.clear()
        soonest: dict[int, int] = {}  # slot -> the batch's first expiry: the upkeep looks from then on
        if self._expiries:
            for slot, ms in self._expiries:
                if ms < soonest.get(slot, ms + 1):
                    soonest[slot] = ms
            self._expiries.clear()
        ops.append(("meta", "next_seq", seq))
        if dedup_new:
            ops.append(("dedup", dedup_new))

        committer = self._committer  # the one whose drain runs ``make_visible`` (a reload makes another)
        assert committer is not None

        def make_visible() -> list[int | None]:
            with self._lock:
                for slot, rows in rows_by_slot.items():
                    q = self._queues.get((slot, _MAIN))
                    if q is not None:
                        q.staged -= len(rows)
                        q.staged_bytes -= slot_sizes[slot]
                revoked = batch_id is not None and batch_id in self._revoked_staged
                if self._healthy and not revoked:
                    touched = self._add_visible(visible)
                    for slot, ms in soonest.items():
                        q = self._queue(slot, _MAIN)
                        q.next_expiry = ms if q.next_expiry is None else min(q.next_expiry, ms)
                    # commits run in submission order, so everything numbered below ``seq`` is now visible
                    self._visible_next = max(self._visible_next, seq)
                else:
                    touched = set()
            if touched:
                # receivers are woken once the senders are answered (store/committer.py's ``after_answers``)
                committer.after_answers(partial(self._notify, touched))
            return results

        return ops, make_visible

    def _ttl_floor(self, slot: int) -> int | None:
        """The smaller of the entity's and the slot's default TTL (ms), None when neither limits it."""
        settings = self._slots.get(slot)
        limits = [t for t in (self.config.entity_default_ttl_ms, settings and settings.default_ttl_ms) if t]
        return min(limits) if limits else None

    def _new_entry(self, slot: int, seq: int, msg: Message, now: int, ttl: int | None) -> tuple[Entry, Row]:
        """A stored entry and its row for a new message; ``ttl`` is the slot's TTL floor (``_ttl_floor``)."""
        scheduled = msg.scheduled_enqueue_time
        state = _ACTIVE
        start = now
        if scheduled is not None:
            scheduled_ms = int(scheduled.timestamp() * 1000)
            if scheduled_ms > now:
                state = MessageState.SCHEDULED
                start = scheduled_ms
                self._dues.append((slot, seq, scheduled_ms))  # its row's place in the _due index
        if msg.time_to_live is not None:
            own = int(msg.time_to_live.total_seconds() * 1000)
            ttl = own if ttl is None else min(ttl, own)
        msg.sequence_number = sequence_number = (self.id << PARTITION_SHIFT) | seq
        msg.enqueued_time_ms = now
        # in the expiry index: not for a time to live that never comes (TimeSpan.MaxValue's)
        if ttl is None or ttl >= FAR_TTL_MS:
            msg.expires_at_ms = None if ttl is None else start + ttl
            expires = None
        else:
            msg.expires_at_ms = expires = start + ttl
            self._expiries.append((slot, expires))  # the upkeep's next look
        msg.state = state
        msg.partition_id = self.id
        msg.delivery_count = 0
        if msg.enqueued_sequence_number is None:
            msg.enqueued_sequence_number = sequence_number
        try:
            data = pack_message(msg)
        except PACK_ERRORS as exc:  # a value the store cannot keep: refuse, nothing else
            raise _unstorable(exc) from exc
        if len(data) > self.config.max_message_size_bytes:
            raise _too_large(len(data), self.config.max_message_size_bytes)
        # Plain ints in the row (queue 0 is SubQueue.MAIN): the sqlite3 module runs its adapter lookup (which
        # raises and clears an AttributeError) for every parameter that is not an exact int, str or float. The row
        # is made as a tuple (a NamedTuple's own constructor is a Python function) and int() of an IntEnum
        # member is skipped for the usual state: together 40% of what Row(...) with int(state) cost.
        row = _new_tuple(Row, (seq, 0, 0 if state is _ACTIVE else int(state), 0, None, data, expires))
        entry = _new_entry_object(Entry)  # ``Entry(msg, slot, seq, _MAIN, len(data))`` without its Python __init__
        entry.msg = msg
        entry.slot = slot
        entry.seq = seq
        entry.queue = _MAIN
        entry.size = len(data)
        return entry, row

    def _add_visible(self, visible: dict[int, list[Entry]]) -> set[int]:
        """Put committed new entries (by slot, in sequence order) in their main queues; the slots that got
        receivable messages. A queue's ready messages beyond its read-ahead window stay on disk only."""
        touched = set()
        push = heapq.heappush
        read_ahead = self.read_ahead
        room = self.memory_budget - RESIDENT.bytes  # beyond the windows, while the process's budget lasts
        budget = self.memory_budget
        held = 0
        for slot, entries in visible.items():
            q = self._queue(slot, _MAIN)
            stored, ready, sessions = q.entries, q.ready, q.sessions
            disk_from = q.disk_from  # a local: only this loop changes it (below)
            readied = False
            for entry in entries:
                seq = entry.seq
                if entry.msg.state is _SCHEDULED:
                    q.scheduled_count += 1
                    key = (_scheduled_ms(entry.msg), seq)
                    if q.sched_disk is not None and key >= q.sched_disk:
                        continue  # due after the resident ones: read from the store when its time nears
                    stored[seq] = entry
                    held += entry.size
                    push(q.scheduled, key)
                    if len(q.scheduled) > 2 * read_ahead and RESIDENT.bytes + held >= budget:
                        self._hold(held)
                        held = 0
                        self._trim_scheduled(q)
                elif sessions is None:
                    if disk_from is None:
                        # a large message (Premium's reach 100 MB) stays resident only within the budget; the
                        # budget first, as it usually has room: one comparison, no len()
                        if held < room or (len(ready) < read_ahead and entry.size <= LARGE_MESSAGE):
                            stored[seq] = entry
                            held += entry.size
                            push(ready, seq)  # ``_push_ready`` without sessions
                        else:
                            q.disk_from = disk_from = seq  # the window is full: from here on, read from the store
                    readied = True
                else:
                    self._session_visible(q, entry, held < room)
                    held += entry.size if seq in stored else 0
                    readied = True
            if readied:
                touched.add(slot)
            self._slot_stats(slot).incoming += len(entries)
        self._hold(held)
        return touched

    def _session_visible(self, q: MessageQueue, entry: Entry, room: bool) -> None:
        """A committed ACTIVE send of a session-enabled queue: resident in its session's heap while the queue's
        window (or the budget: ``room``) has space and nothing of the session waits on disk before it; else on
        disk only, read by session (``_refill_session``), or, for a session the table lacks, found from
        ``sess_from`` (``_discover_sessions``)."""
        sessions = q.sessions
        assert sessions is not None
        seq, session_id = entry.seq, entry.msg.session_id
        session = sessions.get(session_id)
        if session is None:
            if q.sess_from is not None or len(sessions) >= SESSION_TABLE:
                if q.sess_from is None:
                    q.sess_from = seq
                self._spill(q, seq)
                return
            session = sessions[session_id] = SessionQueue(session_id)
        if session.disk_from is None and (room or (len(q.entries) < self.read_ahead and entry.size <= LARGE_MESSAGE)):
            q.entries[seq] = entry
            heapq.heappush(session.ready, seq)
        elif session.disk_from is None:
            session.disk_from = seq
            self._spill(q, seq)

    def _notify(self, slots: Iterable[int]) -> None:
        for slot in slots:
            for listener in self.listeners:
                listener(slot)

    def cancel_scheduled(self, local_seqs: list[int]) -> Future:
        """Remove scheduled messages (from every slot that holds a copy)."""
        with self._lock:
            self._check()
            deletes: dict[int, list[int]] = {}
            for seq in local_seqs:
                found = False
                for (slot, queue), q in self._queues.items():
                    entry = q.entries.get(seq)
                    if queue == SubQueue.MAIN and entry is not None and entry.msg.state is MessageState.SCHEDULED:
                        self._remove(q, entry)
                        deletes.setdefault(slot, []).append(seq)
                        found = True
                if not found:
                    found = self._cancel_on_disk(seq, deletes)
                if not found:
                    raise MessageNotFound(
                        f"No scheduled message with sequence number {encode_sequence_number(self.id, seq)} "
                        f"exists in '{self.config.path}'."
                    )
            return self._write([("delete", slot, seqs) for slot, seqs in deletes.items()])

    def _cancel_on_disk(self, seq: int, deletes: dict[int, list[int]]) -> bool:
        """Cancel a scheduled message that is on disk only (read by key in every slot with such messages)."""
        found = False
        for (slot, queue), q in list(self._queues.items()):
            if queue != _MAIN or q.sched_disk is None or (slot, seq) in self._leaving or seq in q.entries:
                continue
            rows = self._stored_rows(slot, [seq])
            if rows and rows[0][1] == _MAIN and rows[0][2] == _SCHEDULED:
                entry = q.entries[seq] = self._entry_of(slot, rows[0], _SCHEDULED)
                self._hold(entry.size)
                self._remove(q, entry)
                deletes.setdefault(slot, []).append(seq)
                found = True
        return found

    # ------------------------------------------------------------------------------------------------------
    # receiving
    # ------------------------------------------------------------------------------------------------------
    def lock_messages(self, slot: int, queue: int, max_count: int) -> list[Message]:
        """Lock up to ``max_count`` of the oldest active messages; return copies carrying their lock tokens."""
        return self.lock_messages_as(slot, queue, max_count, None)

    def lock_messages_as(
        self, slot: int, queue: int, max_count: int, give: Callable[[Message], Any] | None
    ) -> list[Any]:
        """``lock_messages``, each locked message given out as ``give(message)`` (under the lock) instead of as a
        copy: a worker's wire record (cluster/worker.py), packed before its loop runs anything else, so a copy
        would be made only to be read once (a sixth of the hop's instructions per received message).

        ``give`` = ``LEND``: the message itself, lent: a front end that only reads what it delivers (encodes it,
        takes its lock token) gets no copy (127 bytecodes a delivery). The partition never changes a locked
        message in place: whatever ends or renews its lock changes a copy that takes its place (``_drop_lock``),
        and complete only forgets it, so what was lent stays as it was locked, as a copy would."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            q = self._queue(slot, queue)
            settings = self._slots[slot]
            writes: list[Op] = []
            self._process_due(q, settings, now, writes)
            out: list[Message] = []
            ready = q.ready
            if q.disk_from is not None and len(ready) < max_count:
                self._refill(q)
            # Every lock pops at least one entry of the ready heap, so this many tokens are usually enough (more
            # come one at a time); drawing them together costs one read of the random source instead of one each.
            # A token carries its message's sequence number too (model/routing.py): made below, once it is known.
            bases = lock_token_bases(self.id, min(max_count, len(ready)))
            until = now + settings.lock_duration_ms
            locks, lock_heap, push, pop, entries = self._locks, q.lock_heap, heapq.heappush, heapq.heappop, q.entries
            set_int, set_safe = SET_UUID_INT, SET_UUID_SAFE
            while len(out) < max_count:
                if ready and q.disk_from is None:  # ``_next_lockable``'s usual case, inlined (nothing on disk)
                    entry = entries.get(pop(ready))
                    if entry is None:
                        continue  # removed since it became ready
                    msg = entry.msg
                    if msg.lock_token is not None or msg.state is not _ACTIVE:
                        continue
                    if msg.expires_at_ms is not None and msg.expires_at_ms <= now and entry.queue == _MAIN:
                        self._expire(q, entry, settings, writes)
                        continue
                else:
                    found = self._next_lockable(q, ready, settings, now, writes)
                    if found is None:
                        break
                    entry, msg = found, found.msg
                # a list, not a generator: no resumed frame per token (more than drawn come one at a time; the
                # tokens are random, so which end they are taken from does not matter)
                if bases:  # ``uuid_of_int``, inlined: one per delivery
                    token = _new_uuid(_UUID)
                    set_int(token, bases.pop() | (entry.seq << PARTITION_BITS))
                    set_safe(token, _SAFE_UNKNOWN)
                else:
                    token = new_lock_token(self.id, entry.seq)
                msg.lock_token = token
                msg.locked_until_ms = until
                msg.delivery_count += 1
                locks[token.int] = entry
                push(lock_heap, (until, entry.seq, token))
                if give is LEND:
                    out.append(msg)
                    continue
                if give is not None:
                    out.append(give(msg))
                    continue
                copy = _copy_message(msg)  # ``msg.copy()``, inlined
                if copy.application_properties is not None:
                    copy.application_properties = dict(copy.application_properties)
                if copy.annotations is not None:
                    copy.annotations = dict(copy.annotations)
                out.append(copy)
            self._slot_stats(slot).delivered += len(out)
            if writes:
                self._write(writes)
            return out

    def _next_lockable(
        self, q: MessageQueue, ready: list[int], settings: SlotSettings, now: int, writes: list[Op]
    ) -> Entry | None:
        """Pop the oldest message of a ready heap that can be locked; expired ones met on the way expire."""
        entries = q.entries
        while True:
            disk_from = q.disk_from
            if disk_from is not None and (not ready or ready[0] >= disk_from):
                self._refill(q)  # older messages are on disk: read them first
                continue
            if not ready:
                return None
            entry = entries.get(heapq.heappop(ready))
            if entry is None:
                continue  # removed since it became ready
            msg = entry.msg
            if msg.lock_token is not None or msg.state is not _ACTIVE:
                continue
            if msg.expires_at_ms is not None and msg.expires_at_ms <= now and entry.queue == _MAIN:
                self._expire(q, entry, settings, writes)
                continue
            return entry

    def _process_due(
        self, q: MessageQueue, settings: SlotSettings, now: int, writes: list[Op], budget: int = 1 << 62
    ) -> bool:
        """Apply what time has made due: expired locks and session locks end, scheduled messages become active;
        ``budget`` items of it at most (a session's lock counts as its messages; the upkeep's slice, receives
        take all). Whether more may be due."""
        session_locks = q.session_locks
        while session_locks and session_locks[0][0] <= now:
            if budget <= 0:
                return True
            _, session_id, token = heapq.heappop(session_locks)
            session = q.sessions.get(session_id) if q.sessions is not None else None
            if session is None or session.holder != token or session.locked_until > now:
                continue  # released or renewed since
            budget -= 1 + len(session.locked)
            for message_token in list(session.locked):
                entry = self._locks.get(message_token.int)
                if entry is not None:
                    self._slot_stats(entry.slot).lock_expired += 1
                    self._unlock(q, entry, settings, count_delivery=True, writes=writes)
            session.holder = None
            self._park_session(q, session)
        lock_heap = q.lock_heap
        while lock_heap and lock_heap[0][0] <= now:
            if budget <= 0:
                return True
            budget -= 1
            _, seq, token = heapq.heappop(lock_heap)
            entry = self._locks.get(token.int)
            if entry is None or entry.msg.lock_token != token or entry.msg.locked_until_ms > now:
                continue  # settled or renewed since
            self._slot_stats(entry.slot).lock_expired += 1
            self._unlock(q, entry, settings, count_delivery=True, writes=writes)
        scheduled = q.scheduled
        activated: list[Update] = []
        more = False
        while True:
            if budget <= 0:
                more = True  # perhaps: the next slice finds out
                break
            if not scheduled:
                # the next ones are on disk: read them once due, while the ready messages are within the window
                # (the rest stay SCHEDULED on disk, counted so, until receivers make room)
                due = q.sched_disk
                if due is None or due[0] > now:
                    break
                if len(q.ready if q.sessions is None else q.entries) >= self.read_ahead:
                    break
                self._refill_scheduled(q)
                budget -= 1
                continue
            if scheduled[0][0] > now:
                break
            budget -= 1
            _, seq = heapq.heappop(scheduled)
            entry = q.entries.get(seq)
            if entry is not None and entry.msg.state is MessageState.SCHEDULED:
                entry.msg.state = MessageState.ACTIVE
                q.scheduled_count -= 1
                self._push_ready(q, entry)
                activated.append(self._update_of(entry))  # its row leaves the due index, joins the ACTIVE ones
        if activated:
            writes.append(("update", q.key[0], activated))
        return more

    def _unlock(
        self, q: MessageQueue, entry: Entry, settings: SlotSettings, count_delivery: bool, writes: list[Op]
    ) -> None:
        """End a lock without settling: back to ACTIVE (or DEFERRED), or to the dead-letter queue."""
        msg = self._drop_lock(q, entry)
        if not count_delivery:
            msg.delivery_count -= 1
        elif entry.queue == SubQueue.MAIN and msg.delivery_count >= settings.max_delivery_count:
            self._move_to_dead_letter(
                q,
                entry,
                MAX_DELIVERY_REASON,
                f"Message could not be consumed after {settings.max_delivery_count} delivery attempts.",
                writes,
            )
            return
        if msg.state is MessageState.ACTIVE:
            self._push_ready(q, entry)
        elif msg.state is _DEFERRED:
            self._evict.append((q, entry))  # back on disk (its row already says DEFERRED)
        if count_delivery:
            writes.append(("update", entry.slot, [self._update_of(entry)]))

    def _update_of(self, entry: Entry) -> Update:
        m = entry.msg
        dead_letter = pack_dead_letter(m) if entry.queue != SubQueue.MAIN else None
        return Update(entry.seq, int(entry.queue), int(m.state), m.delivery_count, dead_letter)  # ints: see _new_entry

    def _move_to_dead_letter(
        self,
        q: MessageQueue,
        entry: Entry,
        reason: str | None,
        description: str | None,
        writes: list[Op],
        sub_queue: SubQueue = SubQueue.DEAD_LETTER,
    ) -> None:
        msg = self._drop_lock(q, entry)
        self._remove(q, entry)
        msg.state = MessageState.ACTIVE
        msg.dead_letter_reason = reason
        msg.dead_letter_error_description = description
        msg.dead_letter_source = None
        entry.queue = sub_queue
        dlq = self._queue(entry.slot, sub_queue)
        seq = entry.seq
        dlq.entries[seq] = entry
        self._hold(entry.size)
        dlq.count += 1
        dlq.bytes += entry.size
        self._size += entry.size
        self._dirty.add(dlq)
        writes.append(("update", entry.slot, [self._update_of(entry)]))
        # Beyond the window (and the process's budget) a dead-letter queue's messages stay on disk as a queue's
        # sends do. Its disk part may only begin above every message it ever held (``top``), as none of those
        # can have a row that lingers there; one above ``disk_from`` stays resident until its move is stored,
        # not receivable (a read-ahead that meets its row skips it), then leaves memory (``_evicted``).
        if (
            dlq.disk_from is None
            and seq > dlq.top
            and len(dlq.ready) >= self.read_ahead
            and RESIDENT.bytes >= self.memory_budget
        ):
            dlq.disk_from = seq
        if seq > dlq.top:
            dlq.top = seq
        if dlq.disk_from is not None and seq >= dlq.disk_from:
            self._evict.append((dlq, entry))
        else:
            heapq.heappush(dlq.ready, seq)

    def _expire_rows(
        self, q: MessageQueue, settings: SlotSettings, now: int, rows: list[Row], scan: _ExpiryScan, writes: list[Op]
    ) -> bool:
        """(The upkeep, lock held.) Expire what of ``rows`` (the store's expiry index from ``scan.after``, at most
        ``READ_BATCH``) is past its time, wherever it is (resident or on disk, ACTIVE, DEFERRED or come-due
        SCHEDULED); a locked message is left to its lock's end (its receiver has it; the head check expires it when
        it comes back). Sets ``next_expiry`` once the scan ends; whether it goes on (another batch)."""
        slot = q.key[0]
        for row in rows:
            expires, seq = row[6], row[0]
            if expires > now:
                scan.finish(q, min(expires, now + 1000) if scan.held else expires)
                return False
            entry = q.entries.get(seq)
            if entry is None:
                if not self._disk_only(q, row):
                    continue  # it left (its row goes with a queued write) or is not visible yet
                entry = q.entries[seq] = self._entry_of(slot, row, MessageState(row[2]))
                self._hold(entry.size)
            elif entry.msg.lock_token is not None:
                scan.held = True
                continue
            self._expire(q, entry, settings, writes)
            scan.expired = True
        if len(rows) < READ_BATCH:
            scan.finish(q, now + 1000 if scan.held else None)
            return False
        scan.after = (rows[-1][6], rows[-1][0])
        return True

    def _expire(self, q: MessageQueue, entry: Entry, settings: SlotSettings, writes: list[Op]) -> None:
        if settings.dead_letter_on_expiration:
            self._move_to_dead_letter(q, entry, TTL_EXPIRED_REASON, TTL_EXPIRED_DESCRIPTION, writes)
        else:
            self._remove(q, entry)
            writes.append(("delete", entry.slot, [entry.seq]))

    # ------------------------------------------------------------------------------------------------------
    # settling
    # ------------------------------------------------------------------------------------------------------
    def _locked_entry(self, slot: int, key: int, now: int) -> Entry:
        """The entry locked by the lock token whose ``int`` is ``key``, or the error that says why none is."""
        entry = self._locks.get(key)
        if entry is None or entry.slot != slot or entry.msg.locked_until_ms <= now:
            if entry is not None and entry.msg.session_id is not None and self._is_session_slot(slot):
                raise SessionLockLost(
                    f"The session lock of session '{entry.msg.session_id}' was lost: it expired or was released. "
                    "Accept the session again."
                )
            raise MessageLockLost(
                "The lock supplied is invalid. Either the lock expired, or the message has already been removed "
                "from the queue, or was received by a different receiver instance."
            )
        return entry

    def _check_settle(self, slot: int, settle: Settle, now: int) -> Entry:
        """Validate one settlement without changing anything (so a group can be refused as a whole)."""
        entry = self._locked_entry(slot, settle.token.int, now)
        if settle.outcome == "dead_letter" and (
            entry.queue == settle.sub_queue
            or (entry.queue != SubQueue.MAIN and settle.sub_queue == SubQueue.DEAD_LETTER)
        ):
            raise InvalidOperation("A message in a dead-letter queue cannot be dead-lettered again.")
        if settle.outcome not in SETTLE_OUTCOMES:
            raise InvalidOperation(f"Unknown settlement outcome '{settle.outcome}'.")
        return entry

    def _settle_locked(self, slot: int, entry: Entry, settle: Settle, writes: list[Op]) -> None:
        """The settlement transitions: complete (gone), abandon/release (back, counting a delivery or not),
        defer, dead-letter. ``entry`` was validated by ``_check_settle``."""
        q = self._queues[(slot, entry.queue)]
        outcome = settle.outcome
        if outcome == "complete":
            self._forget_lock(q, entry)
            self._remove(q, entry)
            writes.append(("delete", slot, [entry.seq]))
        elif outcome in ("abandon", "release"):
            self._unlock(q, entry, self._slots[slot], outcome == "abandon", writes)
        elif outcome == "defer":
            self._drop_lock(q, entry).state = MessageState.DEFERRED
            writes.append(("update", slot, [self._update_of(entry)]))
            self._evict.append((q, entry))  # on disk only once that update is stored
        else:
            self._move_to_dead_letter(q, entry, settle.reason, settle.description, writes, settle.sub_queue)

    def settle(self, slot: int, settles: list[Settle]) -> Future:
        """Apply settlements of one slot: all valid, or none is applied."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            entries = [self._check_settle(slot, st, now) for st in settles]
            writes: list[Op] = []
            for entry, st in zip(entries, settles, strict=True):
                self._settle_locked(slot, entry, st, writes)
            future = self._write(writes, linger=self.settle_linger)
        if any(st.outcome in ("abandon", "release") for st in settles):
            self._notify((slot,))  # something is receivable again
        return future

    def complete(self, slot: int, tokens: list[uuid.UUID]) -> Future:
        """Settle locked messages as done: they are removed. All tokens must be valid, or none is settled.
        (``settle``'s complete transition without its per-message ``Settle`` and store op: every peek-lock and
        receive-and-delete message ends here.)"""
        with self._lock:
            if not self._healthy:  # ``_check`` and ``_ms``, inlined: the usual case makes no call
                self._check()
            now = int(self._clock() * 1000)
            locks = self._locks
            entries = []
            for t in tokens:  # ``_locked_entry``'s test inlined; it raises the right error for one that fails
                entry = locks.get(t.int)
                if entry is None or entry.slot != slot or entry.msg.locked_until_ms <= now:
                    entry = self._locked_entry(slot, t.int, now)
                entries.append(entry)
            return self._complete_locked(slot, entries)

    def complete_keys(self, slot: int, keys: list[int]) -> Future:
        """``complete`` of the lock tokens whose ``int`` are ``keys``, which is all a lock is found by: a worker
        reads a complete's tokens as these ints (cluster/wire.py's ``Tokens``), not as a UUID each. (Its own loop
        rather than ``complete`` of the keys made from the tokens: that list cost one process's complete a
        Python frame and a pass over its tokens, bench/amqp_instructions.py --path peek-lock 1.015 of its base
        against 1.005 this way.)"""
        with self._lock:
            if not self._healthy:
                self._check()
            now = int(self._clock() * 1000)
            locks = self._locks
            entries = []
            for key in keys:
                entry = locks.get(key)
                if entry is None or entry.slot != slot or entry.msg.locked_until_ms <= now:
                    entry = self._locked_entry(slot, key, now)
                entries.append(entry)
            return self._complete_locked(slot, entries)

    def _complete_locked(self, slot: int, entries: list[Entry]) -> Future:
        """The complete transition of validated locked entries (``complete``, ``complete_keys``; under the lock)."""
        locks = self._locks
        seqs: list[int] = []
        size = 0
        queues = self._queues
        dirty = self._dirty
        queue: Any = None
        q: Any = None
        q_entries: dict[int, Entry] = {}
        plain = False
        run_start = run_size = 0  # where the sub-queue's run began in ``seqs`` and its bytes: counted off once
        for entry in entries:
            if entry.queue is not queue:  # a group is mostly of one sub-queue: looked up once a run
                if q is not None:
                    q.count -= len(seqs) - run_start
                    q.bytes -= run_size
                    size += run_size
                    run_start, run_size = len(seqs), 0
                queue = entry.queue
                q = queues[(slot, queue)]
                dirty.add(q)
                q_entries = q.entries
                plain = q.sessions is None and q.disk_from is None  # the usual sub-queue: no sessions, none on disk
            msg = entry.msg
            seq = entry.seq
            if plain:  # ``_forget_lock`` inlined for a message without a session
                locks.pop(msg.lock_token.int, None)  # (the message itself is left as it is: it may be lent)
            elif q.sessions is None:
                locks.pop(msg.lock_token.int, None)
                if q.disk_from is not None and seq >= q.disk_from:
                    q.gone.add(seq)  # see _remove (a locked message is resident, so never scheduled)
            else:
                self._forget_lock(q, entry)
                self._left_held(entry)  # see _remove
            del q_entries[seq]
            run_size += entry.size
            if msg.state is _DEFERRED:
                self._left_held(entry)
            seqs.append(seq)
        if q is not None:
            q.count -= len(seqs) - run_start
            q.bytes -= run_size
            size += run_size
        self._size -= size
        self._resident -= size  # ``_hold``, inlined
        resident = RESIDENT
        with resident.lock:  # ``RESIDENT.add``, inlined
            resident.bytes -= size
        # ``_write``, inlined: the delete and the counts of the sub-queues changed since the last write
        ops: list[Op] = [("delete", slot, seqs)]
        for q in dirty:
            ops.append(("counts", q.key[0], q.key[1], q.count, q.bytes))
        dirty.clear()
        assert self._committer is not None
        future = self._committer.submit(ops, None, self.settle_linger)
        if self._evict:  # a completed deferred message's key leaves ``_leaving`` once this is stored
            evict, self._evict = self._evict, []
            future.add_done_callback(partial(self._evicted, self._epoch, evict))
        return future

    def abandon(self, slot: int, token: uuid.UUID) -> Future:
        return self.settle(slot, [Settle("abandon", token)])

    def release(self, slot: int, token: uuid.UUID) -> None:
        """Give a message back without counting a delivery (AMQP ``released``, unrequested prefetch)."""
        self.settle(slot, [Settle("release", token)])

    def defer(self, slot: int, token: uuid.UUID) -> Future:
        return self.settle(slot, [Settle("defer", token)])

    def dead_letter(
        self,
        slot: int,
        token: uuid.UUID,
        reason: str | None,
        description: str | None,
        sub_queue: SubQueue = SubQueue.DEAD_LETTER,
    ) -> Future:
        """Move a locked message to the dead-letter queue (or, for forwarding failures, the transfer
        dead-letter queue). From the dead-letter queue only the transfer dead-letter queue is allowed."""
        return self.settle(slot, [Settle("dead_letter", token, reason, description, sub_queue)])

    def transact(
        self, items: list[tuple[str | None, list[tuple[int, Message]]]], settles: list[tuple[int, Settle]]
    ) -> Future:
        """Sends and settlements (per slot) committed together in one store transaction, or not at all.
        The future's result is the sent messages' sequence numbers, as ``enqueue`` gives them."""
        with self._lock:
            self._check()
            if items:  # its settlements could wait for space, its sends cannot
                self._refuse_if_full()
            now = _ms(self._clock)
            entries = [self._check_settle(slot, st, now) for slot, st in settles]
            size_before = self._size
            ops, on_commit = self._stage_enqueue(items, now) if items else ([], list)
            staged = self._size - size_before
            self._unwritten += staged
            writes: list[Op] = []
            for entry, (slot, st) in zip(entries, settles, strict=True):
                self._settle_locked(slot, entry, st, writes)
            future = self._write(writes + ops, on_commit)
        future.add_done_callback(partial(self._written, staged))  # outside the lock: it may run at once
        self._notify({slot for slot, st in settles if st.outcome in ("abandon", "release")})
        return future

    def settle_by_sequence(self, settles: list[tuple[int, str, list[int], str | None, str | None, int]]) -> Future:
        """Apply settlements again by sequence number: (slot, outcome, local seqs, reason, description, sub-queue)
        with outcome complete (gone), defer (DEFERRED) or dead_letter (moved to that sub-queue, with the reason).
        A front end that lost a worker after it echoed these outcomes to clients and before their write was durable
        calls it before the partition is used again (``cluster/remote.py``, in-doubt settlements). Idempotent: a
        message already gone, or already where the outcome puts it, is skipped (the worker may have stored the
        write before it died, or not died at all); a message locked again loses its lock. Written at once, no
        linger. The future's result is how many messages changed."""
        with self._lock:
            self._check()
            writes: list[Op] = []
            changed = 0
            for slot, outcome, seqs, reason, description, sub_queue in settles:
                if slot not in self._slots:
                    continue  # dropped meanwhile: nothing of it is left
                if outcome not in ("complete", "defer", "dead_letter"):
                    continue
                settle = Settle(outcome, _NO_TOKEN, reason, description, SubQueue(sub_queue))
                for _, entry in self._entries_by_seq(slot, seqs):
                    if outcome == "defer" and entry.msg.state is not _ACTIVE:
                        continue  # deferred already (or scheduled: never the message settled)
                    if outcome == "dead_letter" and (
                        entry.queue == sub_queue or (entry.queue != _MAIN and sub_queue == SubQueue.DEAD_LETTER)
                    ):
                        continue  # there already
                    self._settle_locked(slot, entry, settle, writes)  # the same transition as by lock token
                    changed += 1
            if not writes:
                return _finished(0)
            return self._write(writes, lambda: changed)

    def _entries_by_seq(self, slot: int, seqs: list[int]) -> list[tuple[MessageQueue, Entry]]:
        """(Lock held.) The messages of ``slot`` numbered ``seqs`` that are still there, in whichever sub-queue,
        each with its sub-queue; one not resident is read from the store (one read by key) and made resident."""
        found = []
        missing = []
        for seq in seqs:
            for queue in SubQueue:
                q = self._queues.get((slot, queue))
                entry = q.entries.get(seq) if q is not None else None
                if entry is not None:
                    found.append((q, entry))
                    break
            else:
                missing.append(seq)
        if missing:
            held = 0
            for row in self._stored_rows(slot, missing):
                q = self._queue(slot, row[1])
                if row[0] in q.entries or not self._disk_only(q, row):
                    continue  # resident after all, leaving, or not visible
                entry = q.entries[row[0]] = self._entry_of(slot, row, MessageState(row[2]))
                held += entry.size
                found.append((q, entry))
            self._hold(held)
        return found

    def renew_lock(self, slot: int, token: uuid.UUID) -> int:
        """Extend a lock by the lock duration from now; returns the new locked-until time (ms)."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            entry = self._locked_entry(slot, token.int, now)
            if entry.msg.session_id is not None and self._is_session_slot(slot):
                raise InvalidOperation("Messages of a session are locked by the session: renew the session lock.")
            until = now + self._slots[slot].lock_duration_ms
            msg = entry.msg = _copy_message(entry.msg)  # it may be lent (see ``_drop_lock``): changed as a copy
            msg.locked_until_ms = until
            heapq.heappush(self._queues[(slot, entry.queue)].lock_heap, (until, entry.seq, token))
            return until

    def receive_deferred(
        self,
        slot: int,
        queue: int,
        local_seqs: list[int],
        lock: bool,
        session: tuple[str, uuid.UUID] | None = None,
    ) -> tuple[list[Message], Future | None]:
        """Fetch deferred messages by sequence number, locking them (peek-lock) or removing them. On a session
        entity ``session`` (id, session lock token) must hold the messages' session."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            q = self._queue(slot, queue)
            held = None
            if session is not None:
                _, held = self._held_session(slot, session[0], session[1], now)
            elif q.sessions is not None:
                raise InvalidOperation("Deferred messages of a session entity are received through their session.")
            self._read_deferred(q, local_seqs)
            entries = []
            for seq in local_seqs:
                entry = q.entries.get(seq)
                if (
                    entry is None
                    or entry.msg.state is not MessageState.DEFERRED
                    or entry.msg.lock_token is not None
                    or (held is not None and entry.msg.session_id != held.id)
                ):
                    raise MessageNotFound(
                        f"Failed to lock one or more specified messages: the message with sequence number "
                        f"{encode_sequence_number(self.id, seq)} was not found or is not deferred."
                    )
                entries.append(entry)
            out = []
            future = None
            if lock:
                lock_ms = self._slots[slot].lock_duration_ms
                for entry in entries:
                    token = new_lock_token(self.id, entry.seq)
                    entry.msg.lock_token = token
                    entry.msg.delivery_count += 1
                    self._locks[token.int] = entry
                    if held is not None:  # a session's messages are locked by the session lock
                        entry.msg.locked_until_ms = held.locked_until
                        held.locked.add(token)
                    else:
                        entry.msg.locked_until_ms = now + lock_ms
                        heapq.heappush(q.lock_heap, (now + lock_ms, entry.seq, token))
                    out.append(entry.msg.copy())
            else:
                for entry in entries:
                    self._remove(q, entry)
                    out.append(entry.msg.copy())
                future = self._write([("delete", slot, [e.seq for e in entries])])
            self._slot_stats(slot).delivered += len(out)
            return out, future

    # ------------------------------------------------------------------------------------------------------
    # sessions (their lookups: sessions.py)
    # ------------------------------------------------------------------------------------------------------

    def accept_session(self, slot: int, session_id: str | None) -> tuple[str, uuid.UUID, int] | None:
        """Lock a session: the named one, or (``None``) the free session with the oldest ready message.
        Returns (session id, session lock token, locked-until ms), or None when no session is free."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            q = self._session_queue(slot)
            settings = self._slots[slot]
            writes: list[Op] = []
            self._process_due(q, settings, now, writes)
            if writes:
                self._write(writes)
            if session_id is None:
                session = self._next_session(q, now)
                if session is None:
                    return None
            else:
                session = q.sessions.get(session_id)
                if session is None:  # its messages, if any, are on disk from sess_from (see _discover_sessions)
                    session = q.sessions[session_id] = SessionQueue(session_id, q.sess_from)
                elif session.holder is not None and session.locked_until > now:
                    raise SessionCannotBeLocked(
                        f"The requested session '{session_id}' cannot be accepted. It may be locked by another "
                        "receiver."
                    )
            token = new_lock_token(self.id)
            session.holder = token
            session.locked_until = now + settings.lock_duration_ms
            heapq.heappush(q.session_locks, (session.locked_until, session.id, token))
            return session.id, token, session.locked_until

    def _next_session(self, q: MessageQueue, now: int) -> SessionQueue | None:
        """The free session whose oldest ACTIVE message is the oldest (as Service Bus hands them out), or None.
        Sessions the table lacks all begin at or above ``sess_from``, so they are looked for (in head order) only
        while no known one begins below it. A known session's head is its oldest resident ready message or
        (nothing resident) a bound its disk part begins at or above, made exact by reading it. Sessions left
        with nothing (unlocked, no messages, no state change to list) leave the table."""
        sessions = q.sessions
        assert sessions is not None
        entries = q.entries
        while True:
            best = None
            best_head = 0
            for session in list(sessions.values()):
                ready = session.ready
                while ready and (
                    (e := entries.get(ready[0])) is None or e.msg.lock_token is not None or e.msg.state is not _ACTIVE
                ):
                    heapq.heappop(ready)  # settled, locked, deferred or gone since it became ready
                if session.holder is not None and session.locked_until > now:
                    continue
                if not ready and session.disk_from is None:
                    if not session.locked and session.updated_ms == 0:
                        del sessions[session.id]
                    continue
                head = ready[0] if ready else session.disk_from
                if session.disk_from is not None and session.disk_from < head:
                    head = session.disk_from  # older ones may wait on disk
                if best is None or head < best_head:
                    best, best_head = session, head
            if q.sess_from is not None and (best is None or best_head >= q.sess_from):
                before = q.sess_from
                if self._discover_sessions(q) or q.sess_from != before:
                    continue
            if best is None or (best.ready and (best.disk_from is None or best.ready[0] < best.disk_from)):
                return best
            self._refill_session(q, best)  # only a bound is known: read it, then look again

    def _park_session(self, q: MessageQueue, session: SessionQueue) -> None:
        """A session's lock ended. While its queue holds more than its window and the budget is used, the
        session's resident ready messages (what its receiver's reads brought) go back to disk once what changed
        them is stored (``_evicted``), unless the session is locked again by then: resident messages stay
        bounded by the window, not by how many sessions were received from."""
        if session.ready and len(q.entries) > self.read_ahead and RESIDENT.bytes >= self.memory_budget:
            entries = q.entries
            self._evict += [(q, e) for seq in session.ready if (e := entries.get(seq)) is not None]

    def _next_session_lockable(
        self, q: MessageQueue, session: SessionQueue, settings: SlotSettings, now: int, writes: list[Op]
    ) -> Entry | None:
        """Pop a session's oldest message that can be locked (``_next_lockable`` for one session: its disk part
        is read by session first when it holds older messages)."""
        entries, ready = q.entries, session.ready
        while True:
            disk_from = session.disk_from
            if disk_from is not None and (not ready or ready[0] >= disk_from):
                self._refill_session(q, session)
                continue
            if not ready:
                return None
            entry = entries.get(heapq.heappop(ready))
            if entry is None:
                continue
            msg = entry.msg
            if msg.lock_token is not None or msg.state is not _ACTIVE:
                continue
            if msg.expires_at_ms is not None and msg.expires_at_ms <= now:
                self._expire(q, entry, settings, writes)
                continue
            return entry

    def lock_session_messages(self, slot: int, session_id: str, token: uuid.UUID, max_count: int) -> list[Message]:
        """Lock up to ``max_count`` of a held session's messages, in order; their locks end with the session's."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            settings = self._slots[slot]
            q = self._session_queue(slot)
            writes: list[Op] = []
            self._process_due(q, settings, now, writes)
            q, session = self._held_session(slot, session_id, token, now)
            out: list[Message] = []
            while len(out) < max_count and (entry := self._next_session_lockable(q, session, settings, now, writes)):
                msg = entry.msg
                message_token = new_lock_token(self.id, entry.seq)
                msg.lock_token = message_token
                msg.locked_until_ms = session.locked_until
                msg.delivery_count += 1
                self._locks[message_token.int] = entry
                session.locked.add(message_token)
                out.append(msg.copy())
            self._slot_stats(slot).delivered += len(out)
            if writes:
                self._write(writes)
            return out

    def renew_session_lock(self, slot: int, session_id: str, token: uuid.UUID) -> int:
        """Extend a held session lock (and its messages' locks) by the lock duration from now."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            q, session = self._held_session(slot, session_id, token, now)
            session.locked_until = until = now + self._slots[slot].lock_duration_ms
            for message_token in session.locked:
                entry = self._locks.get(message_token.int)
                if entry is not None:
                    entry.msg.locked_until_ms = until
            heapq.heappush(q.session_locks, (until, session_id, token))
            return until

    def release_session(self, slot: int, session_id: str, token: uuid.UUID) -> None:
        """Give a session back (its receiver closed): unsettled messages return without counting a delivery."""
        with self._lock:
            if not self._healthy:
                return
            q = self._queues.get((slot, SubQueue.MAIN))
            session = q.sessions.get(session_id) if q is not None and q.sessions is not None else None
            if session is None or session.holder != token:
                return
            writes: list[Op] = []
            for message_token in list(session.locked):
                entry = self._locks.get(message_token.int)
                if entry is not None:
                    self._unlock(q, entry, self._slots[slot], count_delivery=False, writes=writes)
            session.holder = None
            self._park_session(q, session)
            if writes:
                self._write(writes)
        self._notify((slot,))

    def set_session_state(self, slot: int, session_id: str, token: uuid.UUID, state: bytes | None) -> Future:
        """Store (or with ``None`` clear) a held session's state; it survives restarts."""
        with self._lock:
            self._check()
            now = _ms(self._clock)
            _, session = self._held_session(slot, session_id, token, now)
            if state is None:
                self._session_states.pop((slot, session_id), None)
            else:
                self._session_states[(slot, session_id)] = bytes(state)
            session.updated_ms = now
            return self._write([("session_state", slot, session_id, None if state is None else bytes(state))])

    # ------------------------------------------------------------------------------------------------------
    # range completion and upkeep (browsing and counting: queries.py)
    # ------------------------------------------------------------------------------------------------------

    # ------------------------------------------------------------------------------------------------------
    # sequence-range reads (ours: replayable, non-destructive reads for stream processors such as Spark)
    # ------------------------------------------------------------------------------------------------------

    def complete_below(self, slot: int, queue: int, mark: int) -> Future:
        """Cumulative, idempotent completion: remove every readable message from the previous mark up to
        ``mark`` (locked ones too; the reader using this must be the entity's only consumer) and remember the
        mark durably."""
        with self._lock:
            self._check()
            key = (slot, queue)
            previous = self._marks.get(key, 1)
            if mark <= previous:
                done: Future = Future()
                done.set_result(None)
                return done
            self._marks[key] = mark
            q = self._queues.get(key)
            gone = []
            ops: list[Op] = []
            if q is not None:
                # Only [previous, mark): a message below the previous mark that is still here was scheduled and
                # came due after the reader passed it; the reader never saw it, so receivers keep it.
                for s, entry in list(q.entries.items()):
                    if previous <= s < mark and entry.msg.state is not MessageState.SCHEDULED:
                        self._forget_lock(q, entry)
                        self._remove(q, entry)
                        gone.append(s)
                if self._on_disk(q):  # deferred ones on disk: by the index of held rows
                    held = self._held_rows(q, _DEFERRED, previous, mark, q.count)
                    for row in held:
                        size = len(row[5])
                        q.count -= 1
                        q.bytes -= size
                        self._size -= size
                        self._dirty.add(q)
                        gone.append(row[0])
                        self._leaving.add((slot, row[0]))
                        self._evict.append((None, (slot, row[0])))
                if q.disk_from is not None:  # disk-only ones: counted by index, deleted as one range
                    first, last = max(previous, q.disk_from), min(mark, self._visible_next)
                    on_disk = self._disk_sizes(q, first, last)
                    if on_disk:
                        size = sum(r[1] for r in on_disk)
                        q.count -= len(on_disk)
                        q.bytes -= size
                        self._size -= size
                        self._dirty.add(q)
                    if first < last:
                        ops.append(("delete_range", slot, queue, first, last))
                        if first == q.disk_from:  # nothing ACTIVE is left on disk below ``last``
                            q.disk_from = last
                        else:
                            q.gone.update(r[0] for r in on_disk)
            if gone:
                ops.insert(0, ("delete", slot, gone))
            ops.append(("meta", f"{MARK_PREFIX}{slot}:{queue}", mark))
            return self._write(ops)

    def prune_dedup(self) -> None:
        """Forget message ids older than the duplicate-detection window. The ids are looked over outside the lock
        (a copy taken under it: a window of a busy entity holds many), and one is forgotten only if it was not seen
        again meanwhile."""
        with self._lock:
            if not self._healthy or not (self._dedup or self._batches):
                return
            now = _ms(self._clock)
            ids = list(self._dedup.items())
        cutoff = now - self.config.dedup_window_ms
        transfer_cutoff = now - TRANSFER_ID_RETENTION_MS
        old = [(k, seen) for k, seen in ids if seen < (transfer_cutoff if k.startswith(TRANSFER_ID_PREFIX) else cutoff)]
        del ids
        with self._lock:
            if not self._healthy:
                return
            dedup = self._dedup
            stale = [k for k, seen in old if dedup.get(k) == seen]
            for key in stale:
                del dedup[key]
            batch_cutoff = now - BATCH_ID_RETENTION_MS
            for batch_id, (first, end, since) in list(self._batches.items()):
                if since < batch_cutoff and batch_id not in self._staged:
                    del self._batches[batch_id]
                    stale.append(_batch_key(batch_id, first, end))
            if stale:
                self._write([("dedup_delete", stale)])

    def tick(self) -> None:
        """Periodic upkeep: end expired locks, activate due scheduled messages and expire messages past their time
        to live, waking waiting receivers; write again what waits for a full store, or reload a partition a full
        store made unavailable (see "Health").

        Sliced, so that a send never waits long behind it: the partition lock is held for one sub-queue at a time
        and ``TICK_SLICE`` items of due work (or one ``READ_BATCH`` of expiring rows) at most, and let go (the
        thread yields) between slices; the expiry index is read outside the lock. Every slice applies what is due
        at its own ``now``, under the lock, as one tick did: what it changes is the same, only interleaved with
        other calls."""
        if not self._healthy and self._recover_at is not None and time.monotonic() >= self._recover_at:
            self._recover()
        committer = self._committer
        if committer is not None:
            committer.retry_due()
        if not self._healthy:
            return
        touched: set[int] = set()
        with self._lock:
            keys = list(self._queues)
        try:
            for key in keys:
                if not self._tick_queue(key, touched):
                    return
        finally:
            self._notify(touched)

    def _tick_queue(self, key: tuple[int, int], touched: set[int]) -> bool:
        """One sub-queue's upkeep, in slices (see ``tick``); False once the partition is unavailable."""
        scan: _ExpiryScan | None = None
        rows: list[Row] | None = None
        while True:
            with self._lock:
                q = self._queues.get(key)
                if not self._healthy:
                    return False
                settings = self._slots.get(key[0])
                if q is None or settings is None:
                    return True
                now = _ms(self._clock)
                writes: list[Op] = []
                before = len(q.ready)
                if scan is None:  # the due locks and scheduled messages first
                    more = self._process_due(q, settings, now, writes, TICK_SLICE)
                    if not more and key[1] == _MAIN and q.next_expiry is not None and q.next_expiry <= now:
                        scan = _ExpiryScan(q)  # then the expiry index, from its start (rows read next, unlocked)
                        more = True
                else:
                    if rows is None or scan.stale(self._committer):  # a write landed meanwhile: read again, here
                        rows = self._scan_expiring(key[0], scan.after)
                    scan.resume(q)
                    more = self._expire_rows(q, settings, now, rows, scan, writes)
                    if scan.expired:
                        touched.add(key[0])  # its dead-letter queue gained messages
                    if more and scan.batches >= EXPIRE_BATCHES:
                        scan.finish(q, now)  # more at the next upkeep
                        more = False
                    if more:
                        scan.pause(q)
                if writes:
                    self._write(writes)
                if len(q.ready) > before:
                    touched.add(key[0])
            if not more:
                return True
            time.sleep(0)  # let the threads that waited for the lock (a send's, a receive's) in first
            if scan is not None:
                scan.batches += 1
                scan.seen = self._committer.stored if self._committer is not None else 0
                try:  # outside the lock: checked against the writes stored since before applying it
                    rows = self._store.scan_expiring(key[0], scan.after, READ_BATCH) if self._store else None
                except StoreError:
                    rows = None  # read again under the lock, where a failure means what it always meant

    def _scan_expiring(self, slot: int, after: tuple[int, int]) -> list[Row]:
        assert self._store is not None
        try:
            return self._store.scan_expiring(slot, after, READ_BATCH)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc

    def submit_lock_messages(self, slot: int, queue: int, max_count: int, lend: bool = False) -> Future:
        """``lock_messages`` as an already answered future (``PartitionHandle``: a remote partition answers later);
        ``lend``: the locked messages themselves, to be read and never changed (``lock_messages_as``, ``LEND``)."""
        future: Future = Future()
        try:
            future.set_result(self.lock_messages_as(slot, queue, max_count, LEND if lend else None))
        except Exception as exc:
            future.set_exception(exc)
        return future
