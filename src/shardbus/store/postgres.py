"""PostgreSQL messaging store: one schema per partition, the same tables and semantics as the SQLite store.

Each partition's store is a schema (``partition_schema`` names it) holding ``meta``, ``slots``, ``dedup``,
``session_state``, ``counts`` and one table per slot (``m<slot>``, keyed by the partition-relative sequence number,
with the SQLite store's partial indexes and ``due`` column: see store/sqlite.py), so dropping a slot or a whole
entity is a ``DROP`` rather than a large ``DELETE``. Reads while the partition runs (``scan``) use a connection of
their own.
``apply`` runs its whole batch in one transaction sent in pipeline mode (every statement goes out before any
reply is awaited), so a batch costs about one round trip plus the commit, whatever its size; bulk operations are
single statements over arrays, sent in binary (``%b``) because text-format bytea arrays cost more to escape than
the rest of the write.
``synchronous_commit`` is forced on for the session, so a batch is flushed to the server's WAL when ``apply``
returns; ``apply(sync=False)`` turns it off for that transaction alone (the server flushes it within its
``wal_writer_delay``, in commit order).

Errors: every driver error (including a lost connection) is raised as ``StoreError``; a broken connection is
dropped and the next call connects again. A connection lost during COMMIT leaves the batch's outcome unknown,
which is why the broker treats any store error as "partition unavailable" and reloads from the store on restart.

Also here: ``PostgresLeases``, a small lease table (in the ``shardbus`` schema) for partition takeover, timed by
the database's clock so that the brokers' clocks need not agree. A store opened with ``lease=(key, owner)`` is
fenced by it: every batch first checks, inside its own transaction, that ``owner`` still holds an unexpired lease
on ``key`` (taking a share lock on the lease row, so a takeover waits for the batch's commit), and fails with
StoreError otherwise. A broker whose lease was lost therefore cannot write, even if it has not noticed yet.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Collection
from typing import Any

from ..extras import MissingExtra

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError as exc:
    raise MissingExtra("PostgreSQL (its store, --metadata)", "postgres", "psycopg") from exc

from .base import Op, Row, Snapshot, StoreError, StoreFull, Update, op_handlers
from .records import due_ms, unpack_message

COUNTS_KEPT = "counts_kept"  # meta key, as in the SQLite store
SCHEDULED = 2  # MessageState.SCHEDULED: the rows the ``_due`` index holds
DUE_KEPT = "due_kept"  # meta key: every slot table has the ``due`` column and index (set when created or migrated)
SESSIONS_KEPT = "sessions_kept"  # meta key: every slot table has the ``session`` column and index, and the
# session-enabled slots' rows have it filled (set when created, or by ``load`` for a schema written before)
_COLUMNS = "seq, queue, state, delivery_count, dead_letter, data"
MAX_IDENTIFIER = 63  # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1), which could merge two names
LEASE_SCHEMA = "shardbus"
_REQUIRE_LEASE = f"{LEASE_SCHEMA}.require_lease"
_LEASE_FENCE_ERROR = "SB001"  # the SQLSTATE require_lease raises
# Serialises CREATE ... IF NOT EXISTS across processes: concurrent creation of the same schema or table can
# fail with a unique violation on the catalog instead of being a no-op.
_DDL_LOCK_KEY = 0x73686172_64627573  # "shardbus"

# Defaults a DSN may override: a dead server or network is noticed in seconds instead of hanging a commit.
_CONNECT_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "application_name": "shardbus",
}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def partition_schema(entity_id: int, name: str, partition_id: int, *, namespace: str | None = None) -> str:
    """The schema of one partition's store: ``sb_e<id>_p<NN>_<name>``, e.g. ``sb_e12_p03_orders``.

    Only lower-case letters, digits and underscores, at most 63 bytes, so it is a plain identifier that needs no
    quoting (the store quotes it anyway). Uniqueness comes from the entity id and partition, which come first so
    shortening the readable name never merges two schemas. Entity ids are unique within one namespace's catalog:
    namespaces sharing a database must pass ``namespace``, which adds a short hash of its name
    (``sb_n<hash>_e12_p03_orders``).
    """
    prefix = "sb_"
    if namespace is not None:
        prefix += "n" + hashlib.sha256(namespace.lower().encode()).hexdigest()[:8] + "_"
    schema = f"{prefix}e{int(entity_id)}_p{int(partition_id):02d}"
    slug = _slug(name)
    if slug:
        schema = f"{schema}_{slug}"
    return schema[:MAX_IDENTIFIER].rstrip("_")


def _connect(dsn: str) -> psycopg.Connection:
    """Connect in autocommit mode (transactions are explicit) with durable commits; raises StoreError."""
    try:
        params = conninfo_to_dict(dsn)
        for key, value in _CONNECT_DEFAULTS.items():
            params.setdefault(key, value)
        conn = psycopg.connect(autocommit=True, **params)
        conn.execute("SET synchronous_commit TO on")
        return conn
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to PostgreSQL: {exc}") from exc


def _create_ddl(conn: psycopg.Connection, statements: list[str]) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
        for statement in statements:
            conn.execute(statement)


# Where an op's key and its list of items are, for the ops whose consecutive repeats can be merged into one
# statement: (index of the slot or None, index of the list).
_MERGEABLE = {"put": (1, 2), "delete": (1, 2), "update": (1, 2), "dedup": (None, 1), "dedup_delete": (None, 1)}
_DEDUP_OPS = frozenset({"dedup", "dedup_prune", "dedup_delete"})


def _plan(ops: list[Op]) -> list[Op]:
    """The same batch in fewer statements (each costs the driver far more than a row does).

    A group-committed batch interleaves many small submissions (put, meta, put, meta, ...). Nothing but ``meta``
    ops touch the meta table, and only the dedup ops touch the dedup table, so those two families may move behind
    the message ops without changing the committed result (the batch is one transaction): meta keeps the last
    value of each key, dedup ops keep their own order. Then consecutive put / delete / update ops of one slot
    (and consecutive dedup or dedup_delete ops) become one op; the adapter's bulk statements let the last of
    repeated items win, as running them one by one would.
    """
    main: list[Op] = []
    dedup: list[Op] = []
    meta: dict[str, int] = {}
    counts: dict[tuple[int, int], tuple[int, int]] = {}
    owned: set[int] = set()  # ids of item lists built here, safe to extend (the caller's lists are not touched)
    for op in ops:
        kind = op[0]
        if kind == "meta":
            meta[op[1]] = op[2]
            continue
        if kind == "counts":
            counts[(op[1], op[2])] = (op[3], op[4])
            continue
        if kind == "drop_slot":  # counts of the slot given before its drop go with it
            counts = {k: v for k, v in counts.items() if k[0] != op[1]}
        target = dedup if kind in _DEDUP_OPS else main
        where = _MERGEABLE.get(kind)
        prev = target[-1] if target else None
        if where is not None and prev is not None and prev[0] == kind:
            key, items = where
            if key is None or prev[key] == op[key]:
                merged = prev[items]
                if id(merged) not in owned:
                    merged = list(merged)
                    owned.add(id(merged))
                    target[-1] = (*prev[:items], merged)
                merged.extend(op[items])
                continue
        target.append(op)
    return [
        *main,
        *dedup,
        *(("meta", key, value) for key, value in meta.items()),
        *(("counts", slot, queue, n, size) for (slot, queue), (n, size) in counts.items()),
    ]


def _db_text(text: str) -> bytes:
    # Message and session ids are arbitrary strings, and PostgreSQL text cannot hold NUL (transfer ids start with
    # one), so they are stored as bytea; surrogatepass round-trips any Python str.
    return text.encode("utf-8", "surrogatepass")


def _py_text(raw: bytes) -> str:
    return bytes(raw).decode("utf-8", "surrogatepass")


class PostgresStore:
    """A ``MessageStore`` in one PostgreSQL schema. Not thread-safe: its partition's committer serialises use."""

    def __init__(self, dsn: str, schema: str, lease: tuple[str, str] | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.lease = lease  # (partition key, owner): every batch requires that lease (see the module docstring)
        self._q = sql.Identifier(schema).as_string()  # quoted once; table names inside are m<int>, always safe
        self._conn: psycopg.Connection | None = None
        self._reader: psycopg.Connection | None = None
        self._indexed: set[int] = set()  # slots whose table has the ``_ses`` index (``_session_index``)
        self._ops = op_handlers(self)
        q = self._q
        try:
            _create_ddl(
                self._connection(),
                [
                    f"CREATE SCHEMA IF NOT EXISTS {q}",
                    f"CREATE TABLE IF NOT EXISTS {q}.meta (key text PRIMARY KEY, value bigint NOT NULL)",
                    f"CREATE TABLE IF NOT EXISTS {q}.slots (slot bigint PRIMARY KEY)",
                    f"CREATE TABLE IF NOT EXISTS {q}.dedup (message_id bytea PRIMARY KEY, seen bigint NOT NULL)",
                    f"CREATE TABLE IF NOT EXISTS {q}.session_state (slot bigint NOT NULL, session bytea NOT NULL, "
                    "state bytea NOT NULL, PRIMARY KEY (slot, session))",
                ],
            )
            self._migrate_sessions()
            self._migrate()
            self._migrate_due()
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"cannot open store {self}: {exc}") from exc

    def _migrate(self) -> None:
        """As SqliteStore._migrate: a schema written before counts were kept gets its indexes and counts once."""
        q = self._q
        conn = self._connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
            exists = conn.execute("SELECT to_regclass(%s)", (f"{q}.counts",)).fetchone()[0] is not None
            if exists and conn.execute(f"SELECT 1 FROM {q}.meta WHERE key = %s", (COUNTS_KEPT,)).fetchone():
                return
            fresh = conn.execute(f"SELECT count(*) FROM {q}.slots").fetchone()[0] == 0
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {q}.counts (slot bigint NOT NULL, queue bigint NOT NULL, "
                "n bigint NOT NULL, bytes bigint NOT NULL, PRIMARY KEY (slot, queue))"
            )
            for (slot,) in conn.execute(f"SELECT slot FROM {q}.slots").fetchall():
                for statement in self._indexes(slot):
                    conn.execute(statement)
                if not fresh:
                    conn.execute(
                        f"INSERT INTO {q}.counts SELECT %s, queue, count(*), coalesce(sum(length(data)), 0) "
                        f"FROM {self._table(slot)} GROUP BY queue ON CONFLICT (slot, queue) DO UPDATE SET "
                        "n = EXCLUDED.n, bytes = EXCLUDED.bytes",
                        (slot,),
                    )
            conn.execute(
                f"INSERT INTO {q}.meta VALUES (%s, 1) ON CONFLICT (key) DO UPDATE SET value = 1", (COUNTS_KEPT,)
            )

    def _migrate_due(self) -> None:
        """A schema written before scheduled messages were indexed by their time gets the ``due`` column and
        index on every slot table (filled once from the scheduled rows' records)."""
        q = self._q
        conn = self._connection()
        with conn.transaction():
            if conn.execute(f"SELECT 1 FROM {q}.meta WHERE key = %s", (DUE_KEPT,)).fetchone():
                return
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
            for (slot,) in conn.execute(f"SELECT slot FROM {q}.slots").fetchall():
                table = self._table(slot)
                conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS due bigint")
                conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS expires bigint")  # as in SqliteStore
                with conn.cursor(binary=True) as cur:
                    scheduled = cur.execute(f"SELECT seq, data FROM {table} WHERE state = {SCHEDULED}").fetchall()
                for seq, data in scheduled:
                    conn.execute(f"UPDATE {table} SET due = %s WHERE seq = %s", (due_ms(unpack_message(data)), seq))
                for statement in self._indexes(slot):
                    conn.execute(statement)
            conn.execute(f"INSERT INTO {q}.meta VALUES (%s, 1) ON CONFLICT (key) DO UPDATE SET value = 1", (DUE_KEPT,))

    def _migrate_sessions(self) -> None:
        """Every slot table gets the ``session`` column and its index (the rows are filled by ``load``); a schema
        without slot tables is marked at once."""
        q = self._q
        conn = self._connection()
        with conn.transaction():
            if conn.execute(f"SELECT 1 FROM {q}.meta WHERE key = %s", (SESSIONS_KEPT,)).fetchone():
                return
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
            slots = [slot for (slot,) in conn.execute(f"SELECT slot FROM {q}.slots").fetchall()]
            for slot in slots:
                conn.execute(f"ALTER TABLE {self._table(slot)} ADD COLUMN IF NOT EXISTS session bytea")
            if not slots:
                conn.execute(
                    f"INSERT INTO {q}.meta VALUES (%s, 1) ON CONFLICT (key) DO UPDATE SET value = 1", (SESSIONS_KEPT,)
                )

    def _fill_sessions(self, sessions: Collection[int]) -> None:
        """As SqliteStore._fill_sessions: the session-enabled slots' rows of a schema written before the column
        existed get their session ids once."""
        q = self._q
        conn = self._connection()
        with conn.transaction():
            if conn.execute(f"SELECT 1 FROM {q}.meta WHERE key = %s", (SESSIONS_KEPT,)).fetchone():
                return
            tables = {slot for (slot,) in conn.execute(f"SELECT slot FROM {q}.slots").fetchall()}
            for slot in set(sessions) & tables:
                table = self._table(slot)
                conn.execute(self._session_index(slot))
                after = 0
                while True:  # a page at a time: the backlog need not fit in memory
                    with conn.cursor(binary=True) as cur:
                        rows = cur.execute(
                            f"SELECT seq, data FROM {table} WHERE seq > %s ORDER BY seq LIMIT 4096", (after,)
                        ).fetchall()
                    if not rows:
                        break
                    pairs = [(seq, unpack_message(bytes(data)).session_id) for seq, data in rows]
                    self._sessions(conn.cursor(), slot, [(seq, sid) for seq, sid in pairs if sid is not None])
                    after = rows[-1][0]
            conn.execute(
                f"INSERT INTO {q}.meta VALUES (%s, 1) ON CONFLICT (key) DO UPDATE SET value = 1", (SESSIONS_KEPT,)
            )

    def _indexes(self, slot: int) -> list[str]:
        name = f"m{int(slot)}"
        return [
            f"CREATE INDEX IF NOT EXISTS {name}_held ON {self._table(slot)} (seq) WHERE state <> 0",
            f"CREATE INDEX IF NOT EXISTS {name}_dl ON {self._table(slot)} (queue, seq) WHERE queue <> 0",
            f"CREATE INDEX IF NOT EXISTS {name}_due ON {self._table(slot)} (due, seq) WHERE state = {SCHEDULED}",
            f"CREATE INDEX IF NOT EXISTS {name}_exp ON {self._table(slot)} (expires, seq) "
            "WHERE expires IS NOT NULL AND queue = 0",
        ]

    def _session_index(self, slot: int) -> str:
        """As SqliteStore's: the ``_ses`` index only on the tables of session-enabled slots."""
        return (
            f"CREATE INDEX IF NOT EXISTS m{int(slot)}_ses ON {self._table(slot)} (session, seq) "
            "WHERE session IS NOT NULL"
        )

    def _reading(self) -> psycopg.Connection:
        conn = self._reader
        if conn is None or conn.closed:
            conn = self._reader = _connect(self.dsn)
        return conn

    def __str__(self) -> str:
        return f"postgres schema {self._q}"

    def _connection(self) -> psycopg.Connection:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = _connect(self.dsn)
        return conn

    def _reset(self) -> None:
        """Forget a connection after an error if it is no longer usable, so the next call connects again."""
        conn = self._conn
        if conn is not None and (conn.broken or conn.closed):
            self._conn = None
            conn.close()

    def _table(self, slot: int) -> str:
        return f"{self._q}.m{int(slot)}"

    # --- reading -------------------------------------------------------------------------------------------
    def load(self, resident: Collection[int] | None = None, sessions: Collection[int] = ()) -> Snapshot:
        q = self._q
        try:
            conn = self._connection()  # at start, before any write: the writer's connection is free
            if sessions:
                self._fill_sessions(sessions)
                tables = {slot for (slot,) in conn.execute(f"SELECT slot FROM {q}.slots").fetchall()}
                for slot in set(sessions) & tables:
                    conn.execute(self._session_index(slot))
                    self._indexed.add(slot)
            snap = Snapshot()
            # One snapshot of the database for all tables, as SQLite's single reader sees.
            with conn.transaction(), conn.cursor(binary=True) as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                snap.meta = dict(cur.execute(f"SELECT key, value FROM {q}.meta").fetchall())
                snap.meta.pop(COUNTS_KEPT, None)
                snap.meta.pop(DUE_KEPT, None)
                snap.meta.pop(SESSIONS_KEPT, None)
                for slot, queue, n, size in cur.execute(f"SELECT slot, queue, n, bytes FROM {q}.counts").fetchall():
                    snap.counts[(slot, queue)] = (n, size)
                snap.dedup = {_py_text(m): seen for m, seen in cur.execute(f"SELECT message_id, seen FROM {q}.dedup")}
                for slot, session, state in cur.execute(f"SELECT slot, session, state FROM {q}.session_state"):
                    snap.session_states[(slot, _py_text(session))] = bytes(state)
                for (slot,) in cur.execute(f"SELECT slot FROM {q}.slots ORDER BY slot").fetchall():
                    if resident is None or slot in resident:
                        cur.execute(f"SELECT {_COLUMNS} FROM {self._table(slot)} ORDER BY seq")
                        snap.rows[slot] = [Row(*r) for r in cur]
                    else:  # counted on the _due index alone
                        cur.execute(f"SELECT count(*) FROM {self._table(slot)} WHERE state = {SCHEDULED}")
                        snap.scheduled[slot] = int(cur.fetchone()[0])
            return snap
        except psycopg.Error as exc:
            self._reset()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    def _reset_reader(self) -> None:
        conn = self._reader
        if conn is not None and (conn.broken or conn.closed):
            self._reader = None
            conn.close()

    @staticmethod
    def _queue_terms(queue: int) -> str:
        dead = "queue <> 0 AND " if queue else ""
        return f"{dead}queue = %s AND seq >= %s AND seq < %s AND state = 0"

    def scan(self, slot: int, queue: int, first: int, end: int, limit: int, max_bytes: int | None = None) -> list[Row]:
        return self._scan_rows(
            f"FROM {self._table(slot)} WHERE {self._queue_terms(queue)} ORDER BY seq",
            (queue, first, end),
            limit,
            max_bytes,
        )

    def _scan_rows(
        self, tail: str, params: tuple[Any, ...], limit: int, max_bytes: int | None, key: str = ""
    ) -> list[Any]:
        """Up to ``limit`` rows ``SELECT``ed with ``tail`` (their FROM, WHERE and ORDER BY), as ``Row``s or, with
        ``key``, ``Row``'s columns followed by that column. With ``max_bytes``, no more rows than it takes for their
        data to reach it: the rows' sizes are read first (a TOASTed value's size is in its pointer, so this reads
        no data), and the rows then with the limit that leaves (the reads of ``scan``, ``scan_session``,
        ``scan_due``)."""
        try:
            with self._reading().cursor(binary=True) as cur:
                if max_bytes is not None:
                    cur.execute(f"SELECT octet_length(data) {tail} LIMIT %s", (*params, limit))
                    size = count = 0
                    for (n,) in cur:
                        count += 1
                        size += n
                        if size >= max_bytes:
                            break
                    limit = min(limit, max(count, 1))
                cur.execute(f"SELECT {_COLUMNS}{', ' + key if key else ''} {tail} LIMIT %s", (*params, limit))
                if key:
                    return [
                        (seq, qu, st, dc, None if dl is None else bytes(dl), bytes(d), k)
                        for seq, qu, st, dc, dl, d, k in cur
                    ]
                return [
                    Row(seq, qu, st, dc, None if dl is None else bytes(dl), bytes(d)) for seq, qu, st, dc, dl, d in cur
                ]
        except psycopg.Error as exc:
            self._reset_reader()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    def _rows(self, query: str, params: tuple[Any, ...]) -> list[Row]:
        try:
            with self._reading().cursor(binary=True) as cur:
                cur.execute(query, params)
                return [
                    Row(seq, qu, st, dc, None if dl is None else bytes(dl), bytes(d)) for seq, qu, st, dc, dl, d in cur
                ]
        except psycopg.Error as exc:
            self._reset_reader()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    def get(self, slot: int, seqs: list[int]) -> list[Row]:
        return self._rows(
            f"SELECT {_COLUMNS} FROM {self._table(slot)} WHERE seq = ANY(%s) ORDER BY seq", ([int(s) for s in seqs],)
        )

    def scan_held(self, slot: int, queue: int, state: int, first: int, end: int, limit: int) -> list[Row]:
        return self._rows(
            f"SELECT {_COLUMNS} FROM {self._table(slot)} WHERE state <> 0 AND state = %s AND queue = %s "
            "AND seq >= %s AND seq < %s ORDER BY seq LIMIT %s",
            (state, queue, first, end, limit),
        )

    def scan_due(
        self, slot: int, after: tuple[int, int], limit: int, max_bytes: int | None = None
    ) -> list[tuple[Any, ...]]:
        return self._scan_by(slot, "due", f"state = {SCHEDULED}", after, limit, max_bytes)

    def scan_expiring(self, slot: int, after: tuple[int, int], limit: int) -> list[tuple[Any, ...]]:
        return self._scan_by(slot, "expires", "expires IS NOT NULL AND queue = 0", after, limit)

    def _scan_by(
        self, slot: int, key: str, where: str, after: tuple[int, int], limit: int, max_bytes: int | None = None
    ) -> list[tuple[Any, ...]]:
        """Rows matching ``where`` after ``after`` in (``key``, seq) order, each with its ``key`` value last (the
        scans along the due and expiry indexes)."""
        return self._scan_rows(
            f"FROM {self._table(slot)} WHERE {where} AND ({key}, seq) > (%s, %s) ORDER BY {key}, seq",
            after,
            limit,
            max_bytes,
            key,
        )

    def scan_session(
        self, slot: int, session: str, state: int, first: int, end: int, limit: int, max_bytes: int | None = None
    ) -> list[Row]:
        return self._scan_rows(
            f"FROM {self._table(slot)} WHERE session = %s AND seq >= %s AND seq < %s "
            "AND queue = 0 AND state = %s ORDER BY session, seq",
            (_db_text(session), first, end, state),
            limit,
            max_bytes,
        )

    def scan_heads(self, slot: int, first: int, end: int, limit: int) -> list[tuple[int, str]]:
        try:
            with self._reading().cursor(binary=True) as cur:
                cur.execute(
                    f"SELECT seq, session FROM {self._table(slot)} WHERE queue = 0 AND seq >= %s AND seq < %s "
                    "AND state = 0 AND session IS NOT NULL ORDER BY seq LIMIT %s",
                    (first, end, limit),
                )
                return [(int(seq), _py_text(session)) for seq, session in cur]
        except psycopg.Error as exc:
            self._reset_reader()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    def session_ids(self, slot: int) -> list[str]:
        try:
            with self._reading().cursor(binary=True) as cur:
                cur.execute(f"SELECT DISTINCT session FROM {self._table(slot)} WHERE session IS NOT NULL AND queue = 0")
                return [_py_text(session) for (session,) in cur]
        except psycopg.Error as exc:
            self._reset_reader()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    def scan_sizes(self, slot: int, queue: int, first: int, end: int) -> list[tuple[int, int]]:
        try:
            with self._reading().cursor() as cur:
                cur.execute(
                    f"SELECT seq, length(data) FROM {self._table(slot)} WHERE {self._queue_terms(queue)} ORDER BY seq",
                    (queue, first, end),
                )
                return [(int(seq), int(size)) for seq, size in cur]
        except psycopg.Error as exc:
            self._reset_reader()
            raise StoreError(f"cannot read store {self}: {exc}") from exc

    # --- writing -------------------------------------------------------------------------------------------
    def apply(self, ops: list[Op], sync: bool = True) -> None:
        try:
            conn = self._connection()
            dispatch = self._ops
            # The transaction block commits on exit (or rolls back on any exception); the pipeline sends every
            # statement without waiting and collects the replies at COMMIT. An error in one statement makes the
            # server skip the rest and the whole block raise.
            with conn.pipeline(), conn.transaction(), conn.cursor() as cur:
                if not sync:
                    cur.execute("SET LOCAL synchronous_commit TO off")
                if self.lease is not None:
                    cur.execute(f"SELECT {_REQUIRE_LEASE}(%s, %s)", self.lease)
                for op in _plan(ops):
                    dispatch[op[0]](cur, *op[1:])
        except psycopg.errors.DiskFull as exc:  # "could not extend file": the transaction rolled back whole
            self._reset()
            raise StoreFull(f"store {self} is full: {exc}") from exc
        except psycopg.Error as exc:
            self._reset()
            raise StoreError(f"store {self} failed: {exc}") from exc

    def _put(self, cur: psycopg.Cursor, slot: int, rows: list[Row]) -> None:
        if not rows:
            return
        # INSERT OR REPLACE: the last row given for a sequence number wins (ON CONFLICT may not meet a key twice
        # in one statement, so repeats within the list are folded here).
        by_seq = {row[0]: row for row in rows}
        if len(by_seq) != len(rows):
            rows = list(by_seq.values())
        cur.execute(
            f"INSERT INTO {self._table(slot)} (seq, queue, state, delivery_count, dead_letter, data, expires) "
            "SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bytea[], %b::bytea[], "
            "%b::bigint[]) ON CONFLICT (seq) DO UPDATE SET queue = EXCLUDED.queue, state = EXCLUDED.state, "
            "delivery_count = EXCLUDED.delivery_count, dead_letter = EXCLUDED.dead_letter, data = EXCLUDED.data, "
            "expires = EXCLUDED.expires",
            [list(column) for column in zip(*rows, strict=True)],
        )

    def _sessions(self, cur: psycopg.Cursor, slot: int, pairs: list[tuple[int, str]]) -> None:
        if slot not in self._indexed:  # a session-enabled slot created since the start
            cur.execute(self._session_index(slot))
            self._indexed.add(slot)
        if pairs:
            cur.execute(
                f"UPDATE {self._table(slot)} AS t SET session = u.session "
                "FROM unnest(%b::bigint[], %b::bytea[]) AS u(seq, session) WHERE t.seq = u.seq",
                ([seq for seq, _ in pairs], [_db_text(sid) for _, sid in pairs]),
            )

    def _delete(self, cur: psycopg.Cursor, slot: int, seqs: list[int]) -> None:
        if seqs:
            cur.execute(f"DELETE FROM {self._table(slot)} WHERE seq = ANY(%b::bigint[])", (list(seqs),))

    def _update(self, cur: psycopg.Cursor, slot: int, updates: list[Update]) -> None:
        if not updates:
            return
        # Applied in order like SQLite's executemany: for a repeated sequence number the last update wins.
        by_seq = {u[0]: u for u in updates}
        seqs, queues, states, counts, dead_letters = (list(c) for c in zip(*by_seq.values(), strict=True))
        cur.execute(
            f"UPDATE {self._table(slot)} AS t SET queue = u.queue, state = u.state, "
            "delivery_count = u.delivery_count, dead_letter = u.dead_letter "
            "FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bytea[]) "
            "AS u(seq, queue, state, delivery_count, dead_letter) WHERE t.seq = u.seq",
            (seqs, queues, states, counts, dead_letters),
        )

    def _create_slot(self, cur: psycopg.Cursor, slot: int) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {self._table(slot)} (seq bigint PRIMARY KEY, queue bigint NOT NULL, "
            "state bigint NOT NULL, delivery_count bigint NOT NULL, dead_letter bytea, data bytea NOT NULL, "
            "due bigint, expires bigint, session bytea)"
        )
        for statement in self._indexes(slot):
            cur.execute(statement)
        cur.execute(f"INSERT INTO {self._q}.slots VALUES (%s) ON CONFLICT DO NOTHING", (slot,))

    def _due(self, cur: psycopg.Cursor, slot: int, dues: list[tuple[int, int]]) -> None:
        if dues:
            seqs, times = (list(c) for c in zip(*dues, strict=True))
            cur.execute(
                f"UPDATE {self._table(slot)} AS t SET due = u.due FROM unnest(%b::bigint[], %b::bigint[]) "
                "AS u(seq, due) WHERE t.seq = u.seq",
                (seqs, times),
            )

    def _expires(self, cur: psycopg.Cursor, slot: int, times: list[tuple[int, int]]) -> None:
        if times:
            seqs, ms = (list(c) for c in zip(*times, strict=True))
            cur.execute(
                f"UPDATE {self._table(slot)} AS t SET expires = u.expires FROM unnest(%b::bigint[], %b::bigint[]) "
                "AS u(seq, expires) WHERE t.seq = u.seq",
                (seqs, ms),
            )

    def _drop_slot(self, cur: psycopg.Cursor, slot: int) -> None:
        self._indexed.discard(slot)
        cur.execute(f"DROP TABLE IF EXISTS {self._table(slot)}")
        cur.execute(f"DELETE FROM {self._q}.slots WHERE slot = %s", (slot,))
        cur.execute(f"DELETE FROM {self._q}.session_state WHERE slot = %s", (slot,))
        cur.execute(f"DELETE FROM {self._q}.counts WHERE slot = %s", (slot,))

    def _counts(self, cur: psycopg.Cursor, slot: int, queue: int, n: int, size: int) -> None:
        cur.execute(
            f"INSERT INTO {self._q}.counts VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (slot, queue) DO UPDATE SET n = EXCLUDED.n, bytes = EXCLUDED.bytes",
            (slot, queue, n, size),
        )

    def _delete_range(self, cur: psycopg.Cursor, slot: int, queue: int, first: int, end: int) -> None:
        cur.execute(f"DELETE FROM {self._table(slot)} WHERE {self._queue_terms(queue)}", (queue, first, end))

    def _meta(self, cur: psycopg.Cursor, key: str, value: int) -> None:
        cur.execute(
            f"INSERT INTO {self._q}.meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            (key, value),
        )

    def _dedup(self, cur: psycopg.Cursor, entries: list[tuple[str, int]]) -> None:
        if not entries:
            return
        latest = dict(entries)  # last wins for a repeated id, as INSERT OR REPLACE in order
        cur.execute(
            f"INSERT INTO {self._q}.dedup SELECT * FROM unnest(%b::bytea[], %b::bigint[]) "
            "ON CONFLICT (message_id) DO UPDATE SET seen = EXCLUDED.seen",
            ([_db_text(m) for m in latest], list(latest.values())),
        )

    def _dedup_prune(self, cur: psycopg.Cursor, before_ms: int) -> None:
        cur.execute(f"DELETE FROM {self._q}.dedup WHERE seen < %s", (before_ms,))

    def _dedup_delete(self, cur: psycopg.Cursor, message_ids: list[str]) -> None:
        if message_ids:
            cur.execute(
                f"DELETE FROM {self._q}.dedup WHERE message_id = ANY(%b::bytea[])",
                ([_db_text(m) for m in message_ids],),
            )

    def _session_state(self, cur: psycopg.Cursor, slot: int, session: str, state: bytes | None) -> None:
        if state is None:
            cur.execute(
                f"DELETE FROM {self._q}.session_state WHERE slot = %s AND session = %s", (slot, _db_text(session))
            )
        else:
            cur.execute(
                f"INSERT INTO {self._q}.session_state VALUES (%s, %s, %s) "
                "ON CONFLICT (slot, session) DO UPDATE SET state = EXCLUDED.state",
                (slot, _db_text(session), state),
            )

    def close(self) -> None:
        for conn in (self._reader, self._conn):
            if conn is not None:
                try:
                    conn.close()
                except psycopg.Error:
                    pass
        self._conn = self._reader = None


def drop_partition_schema(dsn: str, schema: str) -> None:
    """Remove a partition's store (its schema and every table in it), for entity deletion. Missing is fine."""
    conn = _connect(dsn)
    try:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    except psycopg.Error as exc:
        raise StoreError(f"cannot drop postgres schema {schema!r}: {exc}") from exc
    finally:
        conn.close()


def postgres_store_factory(
    dsn: str, *, namespace: str | None = None
) -> Callable[[int, str, int], Callable[[], PostgresStore]]:
    """Store factories for a namespace's partitions, shaped like ``Namespace._store_factory``:
    ``postgres_store_factory(dsn)(entity_id, entity_name, partition_id)`` is a zero-argument callable that opens
    that partition's ``PostgresStore`` (raising StoreError when it cannot)."""

    def for_partition(entity_id: int, name: str, partition_id: int) -> Callable[[], PostgresStore]:
        schema = partition_schema(entity_id, name, partition_id, namespace=namespace)

        def factory() -> PostgresStore:
            return PostgresStore(dsn, schema)

        return factory

    return for_partition


class SharedConnection:
    """One connection for several threads (calls take turns behind a lock), opened on first use and replaced after
    it breaks; driver errors are raised as StoreError saying what failed."""

    def __init__(self, dsn: str, what: str) -> None:
        self.dsn = dsn
        self.what = what
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None

    def run(self, action: Callable[[psycopg.Connection], Any]) -> Any:
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = _connect(self.dsn)
            try:
                return action(conn)
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    self._conn = None
                    conn.close()
                raise StoreError(f"{self.what} failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class PostgresLeases:
    """Time-limited ownership of partitions, one row per partition key in ``shardbus.leases``.

    Expiry is judged by the database's ``now()``, never the caller's clock. Thread-safe (one connection behind
    a lock); errors are raised as StoreError and a broken connection is replaced on the next call.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._db = SharedConnection(dsn, "lease table")
        schema = sql.Identifier(LEASE_SCHEMA).as_string()
        self._table = f"{schema}.leases"
        ddl = [
            f"CREATE SCHEMA IF NOT EXISTS {schema}",
            f"CREATE TABLE IF NOT EXISTS {self._table} (partition_key text PRIMARY KEY, owner text NOT NULL, "
            "expires_at timestamptz NOT NULL)",
            # the fence of a leased store (PostgresStore(lease=...)): FOR SHARE makes a takeover wait for the batch
            f"CREATE OR REPLACE FUNCTION {_REQUIRE_LEASE}(k text, o text) RETURNS void LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM 1 FROM {self._table} WHERE partition_key = k AND owner = o AND expires_at > now() "
            "FOR SHARE; IF NOT FOUND THEN RAISE EXCEPTION 'the lease on partition % is not held by %', k, o "
            f"USING ERRCODE = '{_LEASE_FENCE_ERROR}'; END IF; END $$",
        ]
        try:
            self._run(lambda conn: _create_ddl(conn, ddl))
        except StoreError:
            self.close()
            raise

    def _run(self, action: Callable[[psycopg.Connection], Any]) -> Any:
        return self._db.run(action)

    def acquire(self, partition_key: str, owner: str, ttl_s: float) -> bool:
        """Take or renew the lease for ``ttl_s`` seconds: succeeds when it is free, expired or already ours."""
        query = (
            f"INSERT INTO {self._table} AS l VALUES (%s, %s, now() + make_interval(secs => %s)) "
            "ON CONFLICT (partition_key) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at "
            "WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now() RETURNING owner"
        )
        row = self._run(lambda conn: conn.execute(query, (partition_key, owner, float(ttl_s))).fetchone())
        return row is not None

    def renew(self, owner: str, partition_keys: list[str], ttl_s: float) -> set[str]:
        """Extend ``owner``'s unexpired leases on these partitions by ``ttl_s`` from now, in one statement; returns
        the keys renewed. A lease that expired is not renewed even if nobody took it: its holder must stop (the
        store fence already refuses its writes) and acquire it again."""
        if not partition_keys:
            return set()
        query = (
            f"UPDATE {self._table} SET expires_at = now() + make_interval(secs => %s) "
            "WHERE owner = %s AND partition_key = ANY(%s) AND expires_at > now() RETURNING partition_key"
        )
        rows = self._run(lambda conn: conn.execute(query, (float(ttl_s), owner, list(partition_keys))).fetchall())
        return {row[0] for row in rows}

    def holders(self) -> dict[str, str]:
        """Every unexpired lease: partition key -> holder."""
        query = f"SELECT partition_key, owner FROM {self._table} WHERE expires_at > now()"
        rows = self._run(lambda conn: conn.execute(query).fetchall())
        return dict(rows)

    def release(self, partition_key: str, owner: str) -> None:
        """Give the lease up (only if ``owner`` holds it; someone else's lease is left alone)."""
        query = f"DELETE FROM {self._table} WHERE partition_key = %s AND owner = %s"
        self._run(lambda conn: conn.execute(query, (partition_key, owner)))

    def holder(self, partition_key: str) -> str | None:
        """Who holds an unexpired lease on the partition, if anyone."""
        query = f"SELECT owner FROM {self._table} WHERE partition_key = %s AND expires_at > now()"
        row = self._run(lambda conn: conn.execute(query, (partition_key,)).fetchone())
        return None if row is None else row[0]

    def close(self) -> None:
        self._db.close()
