"""SQLite messaging store: one database file per partition, WAL journal, ``synchronous=FULL``.

FULL makes every commit fsync the WAL, so a batch is on disk when ``apply`` returns (an acknowledged send
survives power loss, not just a process crash). The cost is one fsync per batch; the group committer puts many
operations in each batch. ``apply(sync=False)`` commits with ``synchronous=NORMAL`` instead: no fsync, so the
commit survives a crash of the process but maybe not of the machine. The WAL is written in order and every
later FULL commit (and every checkpoint) syncs the whole file, so an unsynced commit becomes durable with the
next synced one and never jumps ahead of it.

Checkpoints (copying the WAL back into the database file) run in the background, on a connection of their own,
every ``CHECKPOINT_BYTES`` or so of writes. SQLite's own automatic checkpoint runs inside the commit that crosses
its threshold: every ~70 batches of 100 1 KB sends, one commit took 10 ms longer, a quarter of a batch commit's
mean time. A passive checkpoint on another connection runs beside the writer without blocking it, and the WAL
starts again from its beginning at the first commit after a complete one. The automatic checkpoint stays as the
safety net should the background ones fall behind, at ``AUTOCHECKPOINT_PAGES`` (four background intervals), so
that it never runs inside a commit while they keep up; ``journal_size_limit`` cuts a WAL file that a burst grew
back to ``WAL_LIMIT`` when it starts again, so the disk a store holds stays bounded too.

A checkpoint does not block this store's commits, but it shares the disk with every store's: it writes the pages
and fsyncs the database file, and on ext4 that fsync and a commit's fsync of a WAL wait for the same journal. In two
short soaks (bench/soak.py --trace, 64 stores) synced commits that overlapped another store's checkpoint took
5.2 ms at the median and 18 ms at p90 against 2.4 and 11 ms for the others, about 2% of all commits, so enough to
move a p99. So checkpoints are rarer and larger (4 MB of writes, not 2 MB: the WAL of a queue rewrites the same
hot pages, the tail of its tables and the counts, so a checkpoint copies far fewer pages than the WAL holds) and
one at a time in the process (``CHECKPOINTS`` has one thread): at most one checkpoint's fsync at any moment.

Nor does a checkpoint start while the disk is in a bad moment. Its megabytes and its fsync slow the disk for every
other writer while it runs (in a traced soak the disk probe's syncs beside a checkpoint were 3 ms or more 44% of
the time, against 5.6% without one: bench/soak_disk.py), and one begun within 200 ms of the disk stalling took
2.66 ms at p50 and 80 ms at p99, against 1.48 and 10 ms for the others. So a synced commit that took
``SLOW_COMMIT`` or more (of any store: they share the disk) marks the disk slow for ``CHECKPOINT_HOLD``, and a
checkpoint due meanwhile waits until that has passed, ``CHECKPOINT_DEFER`` at most: the sends committed in the
stall then wait for the disk alone. A checkpoint is never urgent (the automatic one is the safety net); the WAL
grows by the writes of those seconds at most, and a store being closed does not wait.

A full disk: a write that runs out of space fails with SQLITE_FULL (SQLite maps the file system's ENOSPC to it),
and the transaction is rolled back whole (a WAL commit is the commit frame; frames written before the failure
are ignored and overwritten by the next transaction), so the database holds exactly what it held before. That
is raised as ``StoreFull``: the partition treats it as transient and writes again once space returns. Any other
failure (an I/O error, a failed fsync whose commit may or may not be durable) stays a ``StoreError``.

Each slot (a queue, or one subscription of a topic partition) is its own table whose rowid is the
partition-relative sequence number: a sub-queue's ACTIVE messages are read in sequence order by a range of the
rowid (``scan``). Three partial indexes cover the rows that are not a main queue's ACTIVE ones, so they cost
nothing for those (nearly every) rows: ``m<slot>_held`` (state != 0: scheduled and deferred rows in sequence order,
for a peek), ``m<slot>_due`` (scheduled rows by the time they come due, the ``due`` column: ``scan_due`` reads the
soonest, ``load`` only counts them), ``m<slot>_exp`` (a main queue's rows with a time to live by their expiry time,
the ``expires`` column: the upkeep expires them through it, ``scan_expiring``)
and ``m<slot>_dl`` (queue != 0: the dead-letter sub-queues, scanned by (queue, seq)); the tables of
session-enabled slots have a fourth, ``m<slot>_ses`` (session, seq) on the rows with a session (the ``session``
column, written by a ``sessions`` op with their put): a session's messages in sequence order (``scan_session``).
The kept counts are in ``counts``, and so is the next sequence number (``NEXT_SEQ_SLOT``). A file written before
these existed gets them when opened (indexes built and counts computed once; its next sequence number stays in the
meta table until the first send writes it anew).

Reads (``load``, ``scan``) use a connection of their own: in WAL mode it sees the last commit, never the
writer's open transaction.

A commit's statements are few because each lets go of the GIL several times (the ``sqlite3`` module wraps every
call into SQLite that may take time), and each time the commit's thread may wait for the event loop to give it
back: see ``apply`` and ``_put``, and bench/sqlite_handoffs.py, which counts them. Held in memory besides the
connections: the statement texts of the few shapes of insert (``_chunks``, per slot table, in bounded caches).
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .. import stalltrace
from .base import Op, Row, Snapshot, StoreError, StoreFull, op_handlers
from .pools import CHECKPOINTS
from .records import due_ms, unpack_message

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS slots (slot INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS dedup (message_id TEXT PRIMARY KEY, seen INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_state (
    slot INTEGER NOT NULL, session TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (slot, session)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counts (
    slot INTEGER NOT NULL, queue INTEGER NOT NULL, n INTEGER NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (slot, queue)
) WITHOUT ROWID;
"""
SCHEDULED = 2  # MessageState.SCHEDULED: the rows the ``_due`` index holds
COUNTS_KEPT = "counts_kept"  # meta key: the counts table is kept by the broker (set when created or migrated)
# meta key: the session-enabled slots' rows carry their session id in the ``session`` column (set when created, or
# once ``load`` filled the column of a file written before it existed)
SESSIONS_KEPT = "sessions_kept"
# The partition's next sequence number (the meta key ``NEXT_SEQ``, which every send's batch sets) is kept as a row of
# the counts table, (``NEXT_SEQ_SLOT``, 0) with n = the number, not in the meta table: a send's commit then writes it
# and its counts in one statement and one page (a statement and a WAL frame less: 50,000 instructions of a commit of
# 100 new 1 KB rows, 3.5%). Slots are never negative. A file written before holds the number in its meta table,
# which ``load`` still reads: the larger of the two is the number (so a file from before numbers on, never back).
NEXT_SEQ = "next_seq"
NEXT_SEQ_SLOT = -1
_FILL_PAGE = 4096  # rows per read while filling the session column of an older file

_COLUMNS = "seq, queue, state, delivery_count, dead_letter, data"

log = logging.getLogger(__name__)

PAGE_SIZE = 8192
CHECKPOINT_BYTES = 4 << 20  # about this much written to the WAL starts a background checkpoint
AUTOCHECKPOINT_PAGES = 4 * CHECKPOINT_BYTES // PAGE_SIZE  # SQLite's own checkpoint: only if those fall far behind
CHECKPOINT_ROUNDS = 8  # a background checkpoint goes again at most this often for what was committed beside it
WAL_LIMIT = 4 * CHECKPOINT_BYTES  # journal_size_limit: a WAL file is cut back to this when it starts again
SLOW_COMMIT = 0.02  # a synced commit this slow (s): the disk is in a bad moment (a quiet one's p99 is ~3 ms)
CHECKPOINT_HOLD = 0.25  # a checkpoint waits until no synced commit was slow for this long (s)...
CHECKPOINT_DEFER = 2.0  # ...but no longer than this (s)
_disk_slow_until = 0.0  # monotonic time until which checkpoints wait (set by slow synced commits, any store's)
_COMMIT_BYTES = 2 * PAGE_SIZE  # what a commit writes besides new rows' data (touched pages, the meta row), roughly

_RANGE_MIN = 3  # a run of more than this many consecutive sequence numbers is deleted as one range


def _slow_disk(now: float) -> None:
    """A synced commit ending at ``now`` was slow: checkpoints wait ``CHECKPOINT_HOLD`` from here."""
    global _disk_slow_until
    _disk_slow_until = max(_disk_slow_until, now + CHECKPOINT_HOLD)  # (a race loses a few ms of hold at most)


def _table(slot: int) -> str:
    return f"m{int(slot)}"


def _indexes(slot: int) -> list[str]:
    t = _table(slot)
    return [
        f"CREATE INDEX IF NOT EXISTS {t}_held ON {t}(seq) WHERE state != 0",
        f"CREATE INDEX IF NOT EXISTS {t}_dl ON {t}(queue, seq) WHERE queue != 0",
        f"CREATE INDEX IF NOT EXISTS {t}_due ON {t}(due, seq) WHERE state = {SCHEDULED}",
        f"CREATE INDEX IF NOT EXISTS {t}_exp ON {t}(expires, seq) WHERE expires IS NOT NULL AND queue = 0",
    ]


def _session_index(slot: int) -> str:
    """The ``_ses`` index, on the tables of session-enabled slots only (created with their first session rows, or
    by ``load``): a sessionless table's inserts do not even test its condition."""
    t = _table(slot)
    return f"CREATE INDEX IF NOT EXISTS {t}_ses ON {t}(session, seq) WHERE session IS NOT NULL"


def _queue_terms(queue: int) -> str:
    """The WHERE terms that pick one sub-queue's ACTIVE rows (``queue != 0`` literally, so SQLite may use the
    partial index ``_dl``); parameters: queue, first, end."""
    dead = "queue != 0 AND " if queue else ""
    return f"{dead}queue = ? AND seq >= ? AND seq < ? AND state = 0"


LARGE_BLOB = 1 << 20  # a row with more data than this is written through incremental blob I/O (``_put_large``)
_BLOB_CHUNK = 1 << 20  # bytes per blob write


def _add_due(db: sqlite3.Connection, slot: int) -> None:
    """A slot table written before scheduled messages were indexed by their time gets the column (filled once
    from its scheduled rows' records)."""
    table = _table(slot)
    db.execute(f"ALTER TABLE {table} ADD COLUMN due INTEGER")
    scheduled = db.execute(f"SELECT seq, data FROM {table} WHERE state = {SCHEDULED}").fetchall()
    db.executemany(f"UPDATE {table} SET due=? WHERE seq=?", [(due_ms(unpack_message(d)), s) for s, d in scheduled])


_PUT_CHUNK = 256  # rows per insert statement at most (5 parameters each; SQLite allows 32,766)
# Rows per statement: any count up to _EXACT_ROWS in one statement (a send brings 1-5 messages, a batch of
# settlements a few counts rows), larger ones in chunks of ``_CHUNK_SIZES`` (the largest that fits, again) and an
# exact rest. So a connection prepares at most _EXACT_ROWS + 7 shapes of each insert (its statement cache holds
# 128), and a small write is one statement. The sizes are the powers of two and the halfway steps between them
# (48, 96, 192): a group of 100 sends (a window of 100, bench/scale.py) is 96 + 4, two statements, not 64 + 32 + 4.
# A statement costs about 30,000 instructions whatever its rows (the sqlite3 module's call, the insert's cursors on
# the table and its four indexes, the statement's reset): 2% of a commit of 100 1 KB rows, and five GIL hand-offs.
_EXACT_ROWS = 16
_CHUNK_SIZES = (256, 192, 128, 96, 64, 48, 32, 16)  # largest first, none above _PUT_CHUNK, the last <= _EXACT_ROWS


@functools.lru_cache(maxsize=1024)
def _chunks(n: int) -> tuple[int, ...]:
    """How ``n`` rows are split into insert statements (see ``_EXACT_ROWS``)."""
    out = []
    while n > _EXACT_ROWS:
        size = next(size for size in _CHUNK_SIZES if size <= n)
        out.append(size)
        n -= size
    if n:
        out.append(n)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _row_marks(width: int, rows: int) -> str:
    """``(?,?,..),(?,?,..)``: ``rows`` rows of ``width`` parameters each."""
    return ",".join(["(" + ",".join("?" * width) + ")"] * rows)


@functools.lru_cache(maxsize=64)
def _marks(n: int) -> str:
    """``?,?,..``: ``n`` parameters (an IN list)."""
    return ",".join("?" * n)


# A new message's row has no dead-letter fields yet: NULL is in the statement, not a parameter (see ``_put``).
# An expiry time is a parameter, or NULL in the statement for rows without one (the usual case).
@functools.lru_cache(maxsize=1024)  # by table: a few shapes each
def _put_sql(table: str, rows: int, timed: bool) -> str:
    """The insert of ``rows`` rows without dead-letter fields (with expiry times if ``timed``) into ``table``."""
    values = ",".join([f"(?,?,?,?,NULL,?,{'?' if timed else 'NULL'})"] * rows)
    return f"INSERT OR REPLACE INTO {table}({_COLUMNS}, expires) VALUES {values}"


# New messages as a send stores them (consecutive sequence numbers, main queue, ACTIVE, never delivered): only
# the first sequence number (?1, the others are ?1+i), each row's data and, if timed, its expiry time are bound;
# the rest are constants in the statement. Binding a parameter costs the sqlite3 module far more than SQLite's
# evaluating ?1+i (bench/amqp_instructions.py's produce replay: 1,650 instructions less per 1 KB message, -1.4%,
# than binding five per row).
@functools.lru_cache(maxsize=1024)
def _new_sql(table: str, rows: int, timed: bool) -> str:
    """The insert of ``rows`` new rows into ``table``: parameters are the first sequence number, the rows' data,
    then (if ``timed``) their expiry times."""
    values = ",".join(f"(?1+{i},0,0,0,NULL,?{i + 2},{f'?{rows + i + 2}' if timed else 'NULL'})" for i in range(rows))
    return f"INSERT OR REPLACE INTO {table}({_COLUMNS}, expires) VALUES {values}"


def _merge_deletes(ops: list[Op]) -> list[Op]:
    """Adjacent deletes of one slot as one (a group commit of many settlements brings many): deletes commute
    with each other, and merging only neighbours keeps every other operation in its place. The meta and counts
    ops (each settlement brings its sub-queue's counts) go to the end, as they are written there anyway, so they
    do not keep deletes apart; counts given before their slot's drop go with it."""
    out: list[Op] = []
    last: dict[tuple[Any, Any], Op] = {}  # by (meta key, None) or (slot, queue): only the last value is applied
    merged: list[int] | None = None  # the sequence numbers of the last delete in ``out``, once it is ours
    for op in ops:
        kind = op[0]
        if kind == "counts":  # the commonest two first: a group of settlements is deletes and counts
            last[op[1], op[2]] = op
        elif kind == "delete" and out and out[-1][0] == "delete" and out[-1][1] == op[1]:
            if merged is None:
                merged = list(out[-1][2])  # never extend a caller's list
                out[-1] = ("delete", op[1], merged)
            merged.extend(op[2])
        elif kind == "meta":
            last[op[1], None] = op
        else:
            if kind == "drop_slot":
                last = {k: o for k, o in last.items() if o[0] != "counts" or o[1] != op[1]}
            out.append(op)
            merged = None
    out += last.values()
    return out


class SqliteStore:
    """A ``MessageStore`` in one SQLite file. Not thread-safe: its partition's committer serialises use."""

    LOCAL_WRITES = True  # an unsynced ``apply`` is a write into the page cache: the committer's timer thread may run it

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Not isolation_level="DEFERRED" (the module's own BEGIN and ``commit()`` let go of the GIL once each, an
            # executed BEGIN or COMMIT five times): with it, bench/scale.py's "both" with --workers 1 made 1.38 write
            # system calls per message in the worker against 1.03, and used 1.08x the CPU per message.
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # Only a new file takes it (an existing one keeps its page size): 1 KB messages cost less to insert
            # and delete with 8 KB pages than with the default 4 KB (fewer page splits and WAL frames).
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
            # Debian's and Ubuntu's SQLite are built with SECURE_DELETE, which zeroes what a delete or a page
            # split frees (memset of the freed cells, freed pages written to the WAL as zeros): 1,200 instructions
            # per 1 KB row inserted (bench/amqp_instructions.py). Other builds (python.org's, macOS's) have it off.
            # It is not about durability: a deleted message's bytes stay in free space until it is reused.
            self._db.execute("PRAGMA secure_delete=OFF")
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE name='slots'").fetchone() is None:
                # a new file: its tables and the mark that its counts are kept, in one commit (one fsync)
                self._db.executescript(
                    f"BEGIN; {_SCHEMA} INSERT INTO meta VALUES ('{COUNTS_KEPT}', 1); "
                    f"INSERT INTO meta VALUES ('{SESSIONS_KEPT}', 1); COMMIT;"
                )
            else:
                self._db.executescript(_SCHEMA)  # only what an older file lacks is created
                self._migrate()
            self._synced = True  # the connection's synchronous setting is FULL (else NORMAL)
            self._written = 0  # bytes written to the WAL since the last checkpoint started, roughly
            self._checkpoint: Future | None = None  # the last background checkpoint (in flight until done)
            self._closing = threading.Event()  # set by ``close``: a checkpoint then waits for no bad moment
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        self._ops = op_handlers(self)
        self._reader: sqlite3.Connection | None = None
        self._meta_values: dict[str, int] = {}  # a batch's meta and counts, written once each at its end
        self._count_values: dict[tuple[int, int], tuple[int, int]] = {}
        self._indexed: set[int] = set()  # slots whose table has the ``_ses`` index (see ``_session_index``)

    def _migrate(self) -> None:
        """Bring a file written by an earlier version up to date: the slot tables' indexes, and the kept counts
        (computed once, from the rows). Nothing is written when the file is up to date."""
        db = self._db
        db.execute("BEGIN")
        try:
            slots = [slot for (slot,) in db.execute("SELECT slot FROM slots").fetchall()]
            for slot in slots:
                columns = {column[1] for column in db.execute(f"PRAGMA table_info({_table(slot)})")}
                if "due" not in columns:
                    _add_due(db, slot)
                if "expires" not in columns:  # rows stored before expire at the head of their queue, as they did
                    db.execute(f"ALTER TABLE {_table(slot)} ADD COLUMN expires INTEGER")
                if "session" not in columns:  # filled by ``load`` for the session-enabled slots (SESSIONS_KEPT)
                    db.execute(f"ALTER TABLE {_table(slot)} ADD COLUMN session TEXT")
                for statement in _indexes(slot):
                    db.execute(statement)
            if db.execute("SELECT 1 FROM meta WHERE key=?", (COUNTS_KEPT,)).fetchone() is None:
                for slot in slots:
                    db.executemany(
                        "INSERT OR REPLACE INTO counts VALUES (?, ?, ?, ?)",
                        [
                            (slot, queue, n, size or 0)
                            for queue, n, size in db.execute(
                                f"SELECT queue, count(*), sum(length(data)) FROM {_table(slot)} GROUP BY queue"
                            ).fetchall()
                        ],
                    )
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, 1)", (COUNTS_KEPT,))
            if not slots:  # nothing to fill
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, 1)", (SESSIONS_KEPT,))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _read(self) -> sqlite3.Connection:
        reader = self._reader
        if reader is None:
            reader = self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        return reader

    # --- reading -------------------------------------------------------------------------------------------
    def _fill_sessions(self, sessions: Collection[int]) -> None:
        """A file written before the ``session`` column existed: its session-enabled slots' rows get their session
        ids, once (read from their records), and the file is marked so (SESSIONS_KEPT)."""
        db = self._db
        if db.execute("SELECT 1 FROM meta WHERE key=?", (SESSIONS_KEPT,)).fetchone() is not None:
            return
        db.execute("BEGIN")
        try:
            tables = {slot for (slot,) in db.execute("SELECT slot FROM slots")}
            for slot in set(sessions) & tables:
                db.execute(_session_index(slot))
                after = 0
                while rows := db.execute(  # a page at a time: the backlog need not fit in memory
                    f"SELECT seq, data FROM {_table(slot)} WHERE seq > ? ORDER BY seq LIMIT {_FILL_PAGE}", (after,)
                ).fetchall():
                    filled = [(unpack_message(data).session_id, seq) for seq, data in rows]
                    db.executemany(f"UPDATE {_table(slot)} SET session=? WHERE seq=?", [f for f in filled if f[0]])
                    after = rows[-1][0]
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, 1)", (SESSIONS_KEPT,))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def load(self, resident: Collection[int] | None = None, sessions: Collection[int] = ()) -> Snapshot:
        try:
            if sessions:
                self._fill_sessions(sessions)
                tables = {slot for (slot,) in self._db.execute("SELECT slot FROM slots")}
                for slot in set(sessions) & tables:
                    self._db.execute(_session_index(slot))
                    self._indexed.add(slot)
            snap = Snapshot()
            db = self._read()
            db.execute("BEGIN")  # one snapshot of every table
            try:
                snap.meta = dict(db.execute("SELECT key, value FROM meta"))
                snap.meta.pop(COUNTS_KEPT, None)
                snap.meta.pop(SESSIONS_KEPT, None)
                snap.dedup = dict(db.execute("SELECT message_id, seen FROM dedup"))
                for slot, session, state in db.execute("SELECT slot, session, state FROM session_state"):
                    snap.session_states[(slot, session)] = state
                for slot, queue, n, size in db.execute("SELECT slot, queue, n, bytes FROM counts"):
                    if slot == NEXT_SEQ_SLOT:
                        snap.meta[NEXT_SEQ] = max(n, snap.meta.get(NEXT_SEQ, n))
                    else:
                        snap.counts[(slot, queue)] = (n, size)
                for (slot,) in db.execute("SELECT slot FROM slots").fetchall():
                    if resident is None or slot in resident:
                        cursor = db.execute(f"SELECT {_COLUMNS} FROM {_table(slot)} ORDER BY seq")
                        snap.rows[slot] = [Row(*r) for r in cursor]
                    else:  # counted on the _due index alone
                        (n,) = db.execute(f"SELECT count(*) FROM {_table(slot)} WHERE state = {SCHEDULED}").fetchone()
                        snap.scheduled[slot] = n
            finally:
                db.execute("COMMIT")
            return snap
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def scan(self, slot: int, queue: int, first: int, end: int, limit: int, max_bytes: int | None = None) -> list[Row]:
        return self._scan_rows(
            f"SELECT {_COLUMNS} FROM {_table(slot)} WHERE {_queue_terms(queue)} ORDER BY seq LIMIT ?",
            (queue, first, end, limit),
            max_bytes,
        )

    def _scan_rows(self, query: str, params: tuple[Any, ...], max_bytes: int | None) -> list[Any]:
        """The rows of ``query`` (``Row``'s columns first). With ``max_bytes``, no more rows than it takes for their
        data to reach it: SQLite steps on demand, so the rows past it are never read (the reads of ``scan``,
        ``scan_session``, ``scan_due``)."""
        try:
            cursor = self._read().execute(query, params)
            if max_bytes is None:
                return cursor.fetchall()  # tuples in Row's order: a Row each would cost more than reading it
            rows = []
            size = 0
            for row in cursor:
                rows.append(row)
                size += len(row[5])
                if size >= max_bytes:
                    break
            cursor.close()  # an unfinished statement would keep its read transaction (and hold checkpoints back)
            return rows
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def get(self, slot: int, seqs: list[int]) -> list[Row]:
        try:
            marks = ",".join("?" * len(seqs))
            cursor = self._read().execute(
                f"SELECT {_COLUMNS} FROM {_table(slot)} WHERE seq IN ({marks}) ORDER BY seq", [int(s) for s in seqs]
            )
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def scan_held(self, slot: int, queue: int, state: int, first: int, end: int, limit: int) -> list[Row]:
        try:
            cursor = self._read().execute(
                f"SELECT {_COLUMNS} FROM {_table(slot)} WHERE state != 0 AND state = ? AND queue = ? "
                "AND seq >= ? AND seq < ? ORDER BY seq LIMIT ?",
                (state, queue, first, end, limit),
            )
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def scan_due(
        self, slot: int, after: tuple[int, int], limit: int, max_bytes: int | None = None
    ) -> list[tuple[Any, ...]]:
        return self._scan_rows(
            f"SELECT {_COLUMNS}, due FROM {_table(slot)} WHERE state = {SCHEDULED} AND (due, seq) > (?, ?) "
            "ORDER BY due, seq LIMIT ?",
            (after[0], after[1], limit),
            max_bytes,
        )

    def scan_expiring(self, slot: int, after: tuple[int, int], limit: int) -> list[tuple[Any, ...]]:
        try:
            cursor = self._read().execute(
                f"SELECT {_COLUMNS}, expires FROM {_table(slot)} WHERE expires IS NOT NULL AND queue = 0 "
                "AND (expires, seq) > (?, ?) ORDER BY expires, seq LIMIT ?",
                (after[0], after[1], limit),
            )
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def scan_session(
        self, slot: int, session: str, state: int, first: int, end: int, limit: int, max_bytes: int | None = None
    ) -> list[Row]:
        return self._scan_rows(  # the _ses index: the session's rows in order, the main queue's in ``state`` of them
            f"SELECT {_COLUMNS} FROM {_table(slot)} WHERE session = ? "
            "AND seq >= ? AND seq < ? AND queue = 0 AND state = ? ORDER BY seq LIMIT ?",
            (session, first, end, state, limit),
            max_bytes,
        )

    def scan_heads(self, slot: int, first: int, end: int, limit: int) -> list[tuple[int, str]]:
        try:
            cursor = self._read().execute(
                f"SELECT seq, session FROM {_table(slot)} WHERE queue = 0 AND seq >= ? AND seq < ? AND state = 0 "
                "AND session IS NOT NULL ORDER BY seq LIMIT ?",
                (first, end, limit),
            )
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def session_ids(self, slot: int) -> list[str]:
        try:
            cursor = self._read().execute(
                f"SELECT DISTINCT session FROM {_table(slot)} WHERE session IS NOT NULL AND queue = 0"
            )
            return [s for (s,) in cursor]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    def scan_sizes(self, slot: int, queue: int, first: int, end: int) -> list[tuple[int, int]]:
        try:
            cursor = self._read().execute(
                f"SELECT seq, length(data) FROM {_table(slot)} WHERE {_queue_terms(queue)} ORDER BY seq",
                (queue, first, end),
            )
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc

    # --- writing -------------------------------------------------------------------------------------------
    def apply(self, ops: list[Op], sync: bool = True) -> None:
        db = self._db
        started = time.monotonic() if stalltrace.ON else 0.0
        try:
            # A connection setting, changed only between transactions and only when it changes: a statement (five
            # GIL hand-offs) that a send right after a settlement batch pays. Flipping back after every unsynced
            # batch instead kept it off the sends' path but cost a statement per settlement batch, where they come
            # several to a send (bench/scale.py's "both" with --workers 1: 1.01-1.06x the CPU per message).
            if sync != self._synced:
                db.execute("PRAGMA synchronous=FULL" if sync else "PRAGMA synchronous=NORMAL")
                self._synced = sync
            db.execute("BEGIN")
            try:
                dispatch = self._ops
                for op in _merge_deletes(ops):
                    dispatch[op[0]](*op[1:])
                self._flush_values()
                committing = time.monotonic()
                db.execute("COMMIT")
                if sync and (ended := time.monotonic()) - committing >= SLOW_COMMIT:
                    _slow_disk(ended)
                self._written += _COMMIT_BYTES
                if stalltrace.ON:
                    stalltrace.record("commit", started, time.monotonic() - started, f"{self.path} sync={sync}", True)
            except BaseException:
                self._meta_values.clear()
                self._count_values.clear()
                if db.in_transaction:
                    db.rollback()
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
        open, so closing it neither checkpoints again nor removes the WAL.

        The WAL starts again from its beginning only at a write that finds all of it copied. A checkpoint copies
        what was committed when it began, so one that had commits beside it leaves their frames, and the WAL
        would grow until SQLite's own checkpoint ran inside a commit. So it goes again, for what came meanwhile
        (less each round), until a round finds nothing left (``CHECKPOINT_ROUNDS`` at most)."""
        give_up = time.monotonic() + CHECKPOINT_DEFER
        try:
            db = sqlite3.connect(self.path, isolation_level=None)
            try:
                db.execute("PRAGMA synchronous=FULL")  # sync the WAL before copying it, the database after
                for _ in range(CHECKPOINT_ROUNDS):
                    # out of the disk's bad moments (module docstring), unless the store is closing
                    while (now := time.monotonic()) < min(_disk_slow_until, give_up):
                        if self._closing.wait(min(_disk_slow_until, give_up) - now):
                            break
                    started = time.monotonic()
                    busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if stalltrace.ON:
                        detail = f"{self.path} ({busy}, {frames}, {copied})"
                        stalltrace.record("checkpoint", started, time.monotonic() - started, detail, True)
                    if busy or copied >= frames:
                        break
            finally:
                db.close()
        except sqlite3.Error as exc:  # the next one (or SQLite's automatic one) copies what this one did not
            log.warning("background checkpoint of %s failed: %s", self.path, exc)

    def _put(self, slot: int, rows: list[Row]) -> None:
        if not rows:
            return
        table = _table(slot)
        if len(rows) == 1 and len(rows[0][5]) > LARGE_BLOB:  # a large message comes alone (batches are <= 1 MB)
            self._put_large(table, rows[0])
            return
        # Every new message comes here, so this path binds as little as it can:
        # - many rows per statement, not ``executemany``: the sqlite3 module lets go of the GIL around every step,
        #   and while the event loop is busy each take-back waits for it. A send's rows are one statement, and
        #   a table has few shapes of it (``_chunks``);
        # - the columns are looked at whole (``zip``, ``count``: loops in C, not a Python loop per row), and what
        #   a send's rows share is written as constants (``_new_sql``);
        # - the sqlite3 module binds exact ints and bytearrays directly, but looks every other value up in its
        #   adapter registry (and raises and clears an AttributeError on the way): None is left out of the
        #   parameters and the packed message goes in as a bytearray, a copy that costs less than that lookup.
        n = len(rows)
        seqs, queues, states, delivery_counts, dead_letters, datas, expires = zip(*rows, strict=True)
        timed = expires[0] is not None
        if dead_letters.count(None) != n or expires.count(None) != (0 if timed else n):
            self._db.executemany(f"INSERT OR REPLACE INTO {table}({_COLUMNS}, expires) VALUES (?,?,?,?,?,?,?)", rows)
            return
        many = self._db.executemany  # with one parameter set: it lets go of the GIL once less than ``execute``
        first = seqs[0]
        new = (
            queues.count(0) == n
            and states.count(0) == n
            and delivery_counts.count(0) == n
            and seqs == tuple(range(first, first + n))
        )
        i = 0
        for size in _chunks(n):
            end = i + size
            if new:
                values: list[Any] = [first + i, *map(bytearray, datas[i:end])]
                if timed:
                    values += expires[i:end]
                many(_new_sql(table, size, timed), (values,))
            else:
                values = []
                if timed:
                    for seq, queue, state, delivery_count, _, data, expiry in rows[i:end]:
                        values += (seq, queue, state, delivery_count, bytearray(data), expiry)
                else:
                    for seq, queue, state, delivery_count, _, data, _ in rows[i:end]:
                        values += (seq, queue, state, delivery_count, bytearray(data))
                many(_put_sql(table, size, timed), (values,))
            i = end
        self._written += sum(map(len, datas))

    def _put_large(self, table: str, row: Row) -> None:
        """Write a large message's row through incremental blob I/O: a zeroblob of its size, then its bytes in
        place, a chunk at a time. Bound as a parameter, the record would be copied twice more (a bytearray here,
        and SQLite's own copy of a bound blob) while the page cache and the WAL take it anyway."""
        seq, queue, state, delivery_count, dead_letter, data, expires = row
        n = len(data)
        self._db.execute(
            f"INSERT OR REPLACE INTO {table}({_COLUMNS}, expires) VALUES (?,?,?,?,?,zeroblob(?),?)",
            (seq, queue, state, delivery_count, dead_letter, n, expires),
        )
        view = memoryview(data)
        with self._db.blobopen(table, "data", seq) as blob:  # seq is the rowid (INTEGER PRIMARY KEY)
            for start in range(0, n, _BLOB_CHUNK):
                blob.write(view[start : start + _BLOB_CHUNK])
        self._written += n

    def _delete(self, slot: int, seqs: list[int]) -> None:
        table = _table(slot)
        if not seqs:
            return
        if len(seqs) == 1:
            self._db.executemany(f"DELETE FROM {table} WHERE seq=?", ((seqs[0],),))
            return
        # Consumers complete in order, so the sequence numbers mostly come in runs: one range delete per run
        # costs less than a statement per row. The rest go by ``seq IN (...)``, a statement per ``_chunks`` (not a
        # step per row: each lets go of the GIL).
        many = self._db.executemany
        singles: list[int] = []
        ordered = sorted(seqs)
        start = prev = ordered[0]
        for seq in [*ordered[1:], None]:
            if seq is not None and seq <= prev + 1:
                prev = seq
                continue
            if prev - start >= _RANGE_MIN:
                many(f"DELETE FROM {table} WHERE seq BETWEEN ? AND ?", ((start, prev),))
            else:
                singles.extend(range(start, prev + 1))
            if seq is not None:
                start = prev = seq
        i = 0
        for size in _chunks(len(singles)):
            many(f"DELETE FROM {table} WHERE seq IN ({_marks(size)})", (singles[i : i + size],))
            i += size

    def _update(self, slot: int, updates: list[Any]) -> None:
        self._db.executemany(
            f"UPDATE {_table(slot)} SET queue=?, state=?, delivery_count=?, dead_letter=? WHERE seq=?",
            [(u.queue, u.state, u.delivery_count, u.dead_letter, u.seq) for u in updates],
        )

    def _create_slot(self, slot: int) -> None:
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {_table(slot)} (seq INTEGER PRIMARY KEY, queue INTEGER NOT NULL, "
            "state INTEGER NOT NULL, delivery_count INTEGER NOT NULL, dead_letter BLOB, data BLOB NOT NULL, "
            "due INTEGER, expires INTEGER, session TEXT)"
        )
        for statement in _indexes(slot):
            self._db.execute(statement)
        self._db.execute("INSERT OR IGNORE INTO slots VALUES (?)", (slot,))

    def _drop_slot(self, slot: int) -> None:
        self._indexed.discard(slot)
        self._db.execute(f"DROP TABLE IF EXISTS {_table(slot)}")
        self._db.execute("DELETE FROM slots WHERE slot=?", (slot,))
        self._db.execute("DELETE FROM session_state WHERE slot=?", (slot,))
        self._db.execute("DELETE FROM counts WHERE slot=?", (slot,))

    def _meta(self, key: str, value: int) -> None:
        # only the meta ops touch the meta table: the last value is written (``NEXT_SEQ``'s with the counts)
        if key == NEXT_SEQ:
            self._count_values[(NEXT_SEQ_SLOT, 0)] = (value, 0)
        else:
            self._meta_values[key] = value

    def _counts(self, slot: int, queue: int, n: int, size: int) -> None:
        self._count_values[(slot, queue)] = (n, size)

    def _flush_values(self) -> None:
        # One multi-row statement per table, not a step per row (``executemany`` of many rows): the sqlite3 module
        # lets go of the GIL around every step (a send's commit waits for the event loop to give it back).
        meta = self._meta_values
        if meta:
            self._insert_rows("meta", 2, [v for item in meta.items() for v in item], len(meta))
            meta.clear()
        counts = self._count_values
        if counts:
            values: list[Any] = []
            for (slot, queue), (n, size) in counts.items():
                values += (slot, queue, n, size)
            self._insert_rows("counts", 4, values, len(counts))
            counts.clear()

    def _insert_rows(self, table: str, width: int, values: list[Any], rows: int) -> None:
        """``INSERT OR REPLACE`` of ``rows`` rows of ``width`` columns (``values`` flat, row after row) into
        ``table``, in as few statements as ``_chunks`` allows."""
        many = self._db.executemany  # one parameter set: see ``_put``
        i = 0
        for size in _chunks(rows):
            many(f"INSERT OR REPLACE INTO {table} VALUES {_row_marks(width, size)}", (values[i : i + size * width],))
            i += size * width

    def _delete_range(self, slot: int, queue: int, first: int, end: int) -> None:
        self._db.execute(f"DELETE FROM {_table(slot)} WHERE {_queue_terms(queue)}", (queue, first, end))

    def _due(self, slot: int, dues: list[tuple[int, int]]) -> None:
        self._db.executemany(f"UPDATE {_table(slot)} SET due=? WHERE seq=?", [(due, seq) for seq, due in dues])

    def _sessions(self, slot: int, pairs: list[tuple[int, str]]) -> None:
        if slot not in self._indexed:  # a session-enabled slot created since the start
            self._db.execute(_session_index(slot))
            self._indexed.add(slot)
        self._db.executemany(f"UPDATE {_table(slot)} SET session=? WHERE seq=?", [(sid, seq) for seq, sid in pairs])

    def _expires(self, slot: int, times: list[tuple[int, int]]) -> None:
        self._db.executemany(f"UPDATE {_table(slot)} SET expires=? WHERE seq=?", [(ms, seq) for seq, ms in times])

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
        self._closing.set()
        checkpoint = self._checkpoint
        if checkpoint is not None:  # so that the writer's connection is the last: closing it empties the WAL
            checkpoint.result()
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.close()
            except sqlite3.Error:
                pass
        try:
            self._db.close()
        except sqlite3.Error:
            pass
