"""The ``MessageStore`` protocol: what a partition broker needs from durable storage.

A store is owned by exactly one partition broker. It keeps rows for one or more *slots*: slot 0 is a queue's
messages; a topic partition has one slot per subscription (the subscription id), so a message fanned out to
several subscriptions is stored in one transaction. The broker keeps a bounded working set in memory and reads
the rest from the store when it needs it: ``load`` at start (with ``resident`` slots: only what the broker keeps
in memory, see partition/broker.py), ``scan`` for the next messages of a sub-queue in sequence order, then
``apply`` batches of operations, each batch one transaction that is durable when ``apply`` returns.

Counts (messages and bytes per slot and sub-queue) are kept by the broker and stored with ``counts`` operations
in the same transactions as the changes they count, so a start reads them instead of counting. A store written
before counts were kept has them computed once, when it is first opened.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol


class Row(NamedTuple):
    """One stored message (a slot's row). Only what changes after enqueue has a column of its own;
    everything fixed at enqueue (properties, body, enqueue and expiry times) is packed in ``data``."""

    seq: int
    queue: int  # SubQueue
    state: int  # MessageState
    delivery_count: int
    dead_letter: bytes | None  # packed (reason, description, source) once dead-lettered
    data: bytes  # see records.py
    expires: int | None = None  # when it expires (ms), for the expiry index; written by ``put`` (rows read: None)


class Update(NamedTuple):
    """New values for a stored message's mutable columns."""

    seq: int
    queue: int
    state: int
    delivery_count: int
    dead_letter: bytes | None


# Operations a batch may hold. Each is a tuple whose first item names it; adapters dispatch on that name.
#   ("put", slot, [Row, ...])                 insert (or replace) rows (plain tuples in ``Row``'s order too)
#   ("delete", slot, [seq, ...])              remove rows
#   ("update", slot, [Update, ...])           change mutable columns
#   ("create_slot", slot) / ("drop_slot", slot)
#   ("meta", key, value)                      small persistent counters (next sequence number)
#   ("dedup", [(message_id, seen_ms), ...])   duplicate-detection history
#   ("dedup_prune", before_ms)
#   ("dedup_delete", [message_id, ...])
#   ("session_state", slot, session_id, bytes | None)
#   ("counts", slot, sub_queue, messages, bytes)  the sub-queue's kept counts (the last of a batch wins)
#   ("delete_range", slot, sub_queue, first, end)  remove the ACTIVE rows of a sub-queue with first <= seq < end
#   ("due", slot, [(seq, due_ms), ...])       when SCHEDULED rows (put in the same batch) come due: their index
#   ("expires", slot, [(seq, ms), ...])       when rows expire: their index (``put`` writes a new row's own)
#   ("sessions", slot, [(seq, session id), ...])  the session of rows (put in the same batch) of a session-enabled
#                                             slot: their ``_ses`` index, by (session, seq)
Op = tuple[Any, ...]
OP_NAMES = (
    "put",
    "delete",
    "update",
    "create_slot",
    "drop_slot",
    "meta",
    "dedup",
    "dedup_prune",
    "dedup_delete",
    "session_state",
    "counts",
    "delete_range",
    "due",
    "expires",
    "sessions",
)


def op_handlers(adapter: object) -> dict[str, Callable[..., None]]:
    """An adapter's dispatch table: each operation name to its ``_<name>`` method."""
    return {name: getattr(adapter, f"_{name}") for name in OP_NAMES}


@dataclass(slots=True)
class Snapshot:
    """Everything a store holds, read once when its partition broker starts."""

    rows: dict[int, list[Row]] = field(default_factory=dict)
    meta: dict[str, int] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)
    session_states: dict[tuple[int, str], bytes] = field(default_factory=dict)
    counts: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (slot, sub-queue) -> (n, bytes)
    scheduled: dict[int, int] = field(default_factory=dict)  # slot -> SCHEDULED rows (of slots not loaded whole)


class MessageStore(Protocol):
    def load(self, resident: Collection[int] | None = None, sessions: Collection[int] = ()) -> Snapshot:
        """What the store holds. ``sessions``: the session-enabled slots, whose rows a store written before the
        ``session`` column existed gets filled in once (their ``_ses`` index). ``resident=None``: every row.
        Otherwise every row of the ``resident`` slots and,
        of the other slots no rows, only how many are SCHEDULED (``scheduled``, counted on their index): ACTIVE
        rows are read with ``scan`` when a delivery needs them, SCHEDULED ones with ``scan_due`` in the order they
        come due, DEFERRED ones with ``get`` (by sequence number); ``scan_held`` reads either for a peek."""
        ...

    def scan(self, slot: int, queue: int, first: int, end: int, limit: int, max_bytes: int | None = None) -> list[Row]:
        """Up to ``limit`` ACTIVE rows of one sub-queue with ``first <= seq < end``, in sequence order (by index:
        the cost follows what is returned and skipped, not the table's size). With ``max_bytes``, no more rows
        than it takes for their data to reach it (the last one may pass it), so one read holds at most that plus
        one message, whatever the messages' sizes. Rows may be plain tuples in ``Row``'s order."""
        ...

    def get(self, slot: int, seqs: list[int]) -> list[Row]:
        """The rows of one slot with these sequence numbers (any state and sub-queue; missing ones are left out),
        in sequence order, by key."""
        ...

    def scan_held(self, slot: int, queue: int, state: int, first: int, end: int, limit: int) -> list[Row]:
        """Up to ``limit`` rows of one sub-queue in ``state`` (not ACTIVE: by the ``_held`` index) with
        ``first <= seq < end``, in sequence order."""
        ...

    def scan_due(
        self, slot: int, after: tuple[int, int], limit: int, max_bytes: int | None = None
    ) -> list[tuple[Any, ...]]:
        """Up to ``limit`` SCHEDULED rows of a slot with (due, seq) above ``after``, in that order (by the ``_due``
        index): each is ``Row``'s columns followed by its due time (ms). ``max_bytes`` bounds them as ``scan``'s."""
        ...

    def scan_expiring(self, slot: int, after: tuple[int, int], limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` rows of a slot's main queue (any state) with (expires, seq) above ``after``, in that order
        (by the ``_exp`` index; rows stored without an expiry time are not in it): ``Row``'s columns followed by the
        expiry time (ms)."""
        ...

    def scan_session(
        self, slot: int, session: str, state: int, first: int, end: int, limit: int, max_bytes: int | None = None
    ) -> list[Row]:
        """Up to ``limit`` rows in ``state`` (ACTIVE for a session's window; DEFERRED or SCHEDULED for a peek) of
        one session of a slot's main queue with ``first <= seq < end``, in sequence order (by the ``_ses`` index,
        on (session, seq) of the rows that have a session). ``max_bytes`` bounds them as ``scan``'s."""
        ...

    def scan_heads(self, slot: int, first: int, end: int, limit: int) -> list[tuple[int, str]]:
        """(seq, session id) of up to ``limit`` ACTIVE rows with a session of a slot's main queue with
        ``first <= seq < end``, in sequence order: the sessions in the order of their oldest messages."""
        ...

    def session_ids(self, slot: int) -> list[str]:
        """The sessions that have messages (any state) in a slot's main queue (by the ``_ses`` index)."""
        ...

    def scan_sizes(self, slot: int, queue: int, first: int, end: int) -> list[tuple[int, int]]:
        """(seq, stored size) of the ACTIVE rows of one sub-queue with ``first <= seq < end``."""
        ...

    def apply(self, ops: list[Op], sync: bool = True) -> None:
        """Run ``ops`` in one transaction; return only when it is durable. Raise StoreError on failure.

        ``sync=False`` relaxes "durable" to "survives a crash of this process": the machine's crash may take
        the transaction back, and the next synced one (or the store's close) makes it durable too. Transactions
        are never reordered or torn, so what survives is always a prefix of what was applied."""
        ...

    def close(self) -> None: ...


class StoreError(Exception):
    """The store could not read or write; its partition becomes unavailable."""


class StoreFull(StoreError):
    """A write failed for want of space (SQLite's SQLITE_FULL, PostgreSQL's disk_full) and nothing of it was
    stored: the transaction rolled back whole, so the store holds exactly what it held before. Transient: the
    same write succeeds once space returns (the partition refuses sends meanwhile, store/committer.py)."""
