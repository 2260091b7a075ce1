"""SQLite messaging store: one database file per partition, WAL journal, ``synchronous=FULL``.

FULL makes every commit fsync the WAL, so a batch is on disk when ``apply`` returns (an acknowledged send
survives power loss, not just a process crash). The cost is one fsync per batch; the group committer puts many
operations in each batch. ``apply(sync=False)`` commits with ``synchronous=NORMAL`` instead: no fsync, so the
commit survives a crash of the process but maybe not of the machine. The WAL is written in order and every
later FULL commit (and every checkpoint) syncs the whole file, so an unsynced commit becomes durable with the
next synced one and never jumps ahead of it.

Checkpoints (copying the WAL back into the database file) run in the background, on a connection of their own,
every ``CHECKPOINT_BYTES`` or so of writes. SQLite's own automatic checkpoint runs inside the commit that crosses
its threshold (8 MB): every ~70 batches of 100 1 KB sends, one commit took 10 ms longer, a quarter of a batch
commit's mean time. A passive checkpoint on another connection runs beside the writer without blocking it, and the
WAL starts again from its beginning at the first commit after a complete one. The automatic checkpoint stays as
the safety net should the background ones fall behind.

A full disk: a write that runs out of space fails with SQLITE_FULL (SQLite maps the file system's ENOSPC to it),
and the transaction is rolled back whole (a WAL commit is the commit frame; frames written before the failure
are ignored and overwritten by the next transaction), so the database holds exactly what it held before. That
is raised as ``StoreFull``: the partition treats it as transient and writes again once space returns. Any other
failure (an I/O error, a failed fsync whose commit may or may not be durable) stays a ``StoreError``.

Each slot (a queue, or one subscription of a topic partition) is its own table whose rowid is the
partition-relative sequence number, so rows need no second index.
"""

from __future__ import annotations

import logging
import sqlite3
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .base import Op, Row, Snapshot, StoreError, StoreFull, op_handlers
from .pools import CHECKPOINTS

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS slots (slot INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS dedup (message_id TEXT PRIMARY KEY, seen INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_state (
    slot INTEGER NOT NULL, session TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (slot, session)
) WITHOUT ROWID;
"""

_COLUMNS = "seq, queue, state, delivery_count, dead_letter, data"

log = logging.getLogger(__name__)

PAGE_SIZE = 8192
CHECKPOINT_BYTES = 2 << 20  # about this much written to the WAL starts a background checkpoint
_COMMIT_BYTES = 2 * PAGE_SIZE  # what a commit writes besides new rows' data (touched pages, the meta row), roughly

_RANGE_MIN = 3  # a run of more than this many consecutive sequence numbers is deleted as one range


def _table(slot: int) -> str:
    return f"m{int(slot)}"


_PUT_CHUNK = 256  # rows per insert statement at most (5 parameters each; SQLite allows 32,766)
# A new message's row has no dead-letter fields yet: NULL is in the statement, not a parameter (see ``_put``).
_PUT_VALUES = [",".join(["(?,?,?,?,NULL,?)"] * (1 << k)) for k in range(_PUT_CHUNK.bit_length())]


def _put_sql(table: str, k: int) -> str:
    """The insert of ``2**k`` rows without dead-letter fields into ``table``."""
    return f"INSERT OR REPLACE INTO {table} VALUES {_PUT_VALUES[k]}"


def _merge_deletes(ops: list[Op]) -> list[Op]:
    """Adjacent deletes of one slot as one (a group commit of many settlements brings many): deletes commute
    with each other, and merging only neighbours keeps every other operation in its place."""
    out: list[Op] = []
    merged: list[int] | None = None  # the sequence numbers of the last delete in ``out``, once it is ours
    for op in ops:
        if op[0] == "delete" and out and out[-1][0] == "delete" and out[-1][1] == op[1]:
            if merged is None:
                merged = list(out[-1][2])  # never extend a caller's list
                out[-1] = ("delete", op[1], merged)
            merged.extend(op[2])
        else:
            out.append(op)
            merged = None
    return out


class SqliteStore:
    """A ``MessageStore`` in one SQLite file. Not thread-safe: its partition's committer serialises use."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # Only a new file takes it (an existing one keeps its page size): 1 KB messages cost less to insert
            # and delete with 8 KB pages than with the default 4 KB (fewer page splits and WAL frames).
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._synced = True  # the connection's synchronous setting is FULL (else NORMAL)
            self._written = 0  # bytes written to the WAL since the last checkpoint started, roughly
            self._checkpoint: Future | None = None  # the last background checkpoint (in flight until done)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        self._ops = op_handlers(self)

    # --- reading -------------------------------------------------------------------------------------------
    def load(self) -> Snapshot:
        try:
            snap = Snapshot()
            db = self._db
            snap.meta = dict(db.execute("SELECT key, value FROM meta"))
            snap.dedup = dict(db.execute("SELECT message_id, seen FROM dedup"))
            for slot, session, state in db.execute("SELECT slot, session, state FROM session_state"):
                snap.session_states[(slot, session)] = state
            for (slot,) in db.execute("SELECT slot FROM slots").fetchall():
                cursor = db.execute(f"SELECT {_COLUMNS} FROM {_table(slot)} ORDER BY seq")
                snap.rows[slot] = [Row(*r) for r in cursor]
            return snap
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    # --- writing -------------------------------------------------------------------------------------------
    def apply(self, ops: list[Op], sync: bool = True) -> None:
        db = self._db
        try:
            if sync != self._synced:  # a connection setting, changed only between transactions
                db.execute("PRAGMA synchronous=FULL" if sync else "PRAGMA synchronous=NORMAL")
                self._synced = sync
            db.execute("BEGIN")
            try:
                dispatch = self._ops
                for op in _merge_deletes(ops):
                    dispatch[op[0]](*op[1:])
                db.execute("COMMIT")
                self._written += _COMMIT_BYTES
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                raise StoreFull(f"store {self.path} is full: {exc}") from exc
            raise StoreError(f"store {self.path} failed: {exc}") from exc
        if self._written >= CHECKPOINT_BYTES and (self._checkpoint is None or self._checkpoint.done()):
            self._written = 0
            self._checkpoint = CHECKPOINTS.get().submit(self._run_checkpoint)

    def _run_checkpoint(self) -> None:
        """A passive checkpoint on a connection of its own (its thread's), closed after: never the last one
        open, so closing it neither checkpoints again nor removes the WAL."""
        try:
            db = sqlite3.connect(self.path, isolation_level=None)
            try:
                db.execute("PRAGMA synchronous=FULL")  # sync the WAL before copying it, the database after
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                db.close()
        except sqlite3.Error as exc:  # the next one (or SQLite's automatic one) copies what this one did not
            log.warning("background checkpoint of %s failed: %s", self.path, exc)

    def _put(self, slot: int, rows: list[Row]) -> None:
        table = _table(slot)
        if any(row.dead_letter is not None for row in rows):
            self._db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?,?,?,?,?,?)", rows)
            return
        # Every new message comes here, so this path binds as little as it can:
        # - many rows per statement, not ``executemany``: the sqlite3 module lets go of the GIL around every step,
        #   and while the event loop is busy each take-back waits for it. Chunk sizes are powers of two, so a
        #   table has few statements;
        # - the sqlite3 module binds exact ints and bytearrays directly, but looks every other value up in its
        #   adapter registry (and raises and clears an AttributeError on the way): None is left out of the
        #   parameters and the packed message goes in as a bytearray, a copy that costs less than that lookup.
        execute = self._db.execute
        i, n = 0, len(rows)
        written = 0
        while i < n:
            k = min(n - i, _PUT_CHUNK).bit_length() - 1
            values: list[Any] = []
            for seq, queue, state, delivery_count, _, data in rows[i : i + (1 << k)]:
                values += (seq, queue, state, delivery_count, bytearray(data))
                written += len(data)
            execute(_put_sql(table, k), values)
            i += 1 << k
        self._written += written

    def _delete(self, slot: int, seqs: list[int]) -> None:
        table = _table(slot)
        if not seqs:
            return
        if len(seqs) == 1:
            self._db.execute(f"DELETE FROM {table} WHERE seq=?", (seqs[0],))
            return
        # Consumers complete in order, so the sequence numbers mostly come in runs: one range delete per run
        # costs less than a statement per row.
        singles: list[tuple[int]] = []
        ordered = sorted(seqs)
        start = prev = ordered[0]
        for seq in [*ordered[1:], None]:
            if seq is not None and seq <= prev + 1:
                prev = seq
                continue
            if prev - start >= _RANGE_MIN:
                self._db.execute(f"DELETE FROM {table} WHERE seq BETWEEN ? AND ?", (start, prev))
            else:
                singles.extend((s,) for s in range(start, prev + 1))
            if seq is not None:
                start = prev = seq
        if singles:
            self._db.executemany(f"DELETE FROM {table} WHERE seq=?", singles)

    def _update(self, slot: int, updates: list[Any]) -> None:
        self._db.executemany(
            f"UPDATE {_table(slot)} SET queue=?, state=?, delivery_count=?, dead_letter=? WHERE seq=?",
            [(u.queue, u.state, u.delivery_count, u.dead_letter, u.seq) for u in updates],
        )

    def _create_slot(self, slot: int) -> None:
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {_table(slot)} (seq INTEGER PRIMARY KEY, queue INTEGER NOT NULL, "
            "state INTEGER NOT NULL, delivery_count INTEGER NOT NULL, dead_letter BLOB, data BLOB NOT NULL)"
        )
        self._db.execute("INSERT OR IGNORE INTO slots VALUES (?)", (slot,))

    def _drop_slot(self, slot: int) -> None:
        self._db.execute(f"DROP TABLE IF EXISTS {_table(slot)}")
        self._db.execute("DELETE FROM slots WHERE slot=?", (slot,))
        self._db.execute("DELETE FROM session_state WHERE slot=?", (slot,))

    def _meta(self, key: str, value: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _dedup(self, entries: list[tuple[str, int]]) -> None:
        self._db.executemany("INSERT OR REPLACE INTO dedup VALUES (?, ?)", entries)

    def _dedup_prune(self, before_ms: int) -> None:
        self._db.execute("DELETE FROM dedup WHERE seen < ?", (before_ms,))

    def _dedup_delete(self, message_ids: list[str]) -> None:
        self._db.executemany("DELETE FROM dedup WHERE message_id=?", [(m,) for m in message_ids])

    def _session_state(self, slot: int, session: str, state: bytes | None) -> None:
        if state is None:
            self._db.execute("DELETE FROM session_state WHERE slot=? AND session=?", (slot, session))
        else:
            self._db.execute("INSERT OR REPLACE INTO session_state VALUES (?, ?, ?)", (slot, session, state))

    def close(self) -> None:
        checkpoint = self._checkpoint
        if checkpoint is not None:  # so that the writer's connection is the last: closing it empties the WAL
            checkpoint.result()
        try:
            self._db.close()
        except sqlite3.Error:
            pass
