"""The message store adapters (SQLite and PostgreSQL) against one set of tests: every op of store/base.py, reload
after reopening, atomic batches, errors, and a real partition broker over each; plus PostgreSQL's own parts
(partition schemas, lost connections, leases).

PostgreSQL comes from ``SHARDBUS_TEST_POSTGRES_DSN`` (scripts/test.sh starts a throwaway cluster and sets it) or,
when that is unset, from a throwaway cluster started here (tests/pg_server.py). Without a reachable server the
PostgreSQL cases skip, except under CI (``CI`` set), where they fail: CI must really run them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from pg_server import ServerUnavailable
from pg_server import start as start_pg
from pg_server import stop as stop_pg
from shardbus.model.errors import MessageNotFound
from shardbus.model.message import Message, MessageState, SubQueue
from shardbus.partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from shardbus.store import sqlite as sqlite_store
from shardbus.store.base import MessageStore, Row, Snapshot, StoreError, Update
from shardbus.store.postgres import (
    PostgresLeases,
    PostgresStore,
    drop_partition_schema,
    partition_schema,
    postgres_store_factory,
)
from shardbus.store.sqlite import SqliteStore

DSN_ENV = "SHARDBUS_TEST_POSTGRES_DSN"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI is set, so the PostgreSQL store tests must run)", pytrace=False)
    pytest.skip(reason)


def _check_reachable(dsn: str) -> str | None:
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.Error as exc:
        return str(exc).strip()
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        error = _check_reachable(dsn)
        if error:
            _unavailable(f"PostgreSQL at ${DSN_ENV} is unreachable: {error}")
        yield dsn
        return
    # Not under /tmp/pytest-of-*: those directories are private to this user and the server may run as postgres.
    directory = tempfile.mkdtemp(prefix="shardbus-pg-")
    try:
        dsn = start_pg(directory)
    except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
        stop_pg(directory)
        _unavailable(f"no PostgreSQL: ${DSN_ENV} is unset and no throwaway cluster could start ({exc})")
    try:
        error = _check_reachable(dsn)
        if error:
            _unavailable(f"the throwaway PostgreSQL cluster is unreachable: {error}")
        yield dsn
    finally:
        stop_pg(directory)


@dataclass
class Kit:
    """One adapter under test: ``factory`` opens (again) the same store; ``unreachable`` one that cannot open."""

    backend: str
    factory: Callable[[], MessageStore]
    unreachable: Callable[[], MessageStore]
    dsn: str | None = None
    schema: str | None = None
    opened: list[MessageStore] = field(default_factory=list)

    def open(self) -> MessageStore:
        store = self.factory()
        self.opened.append(store)
        return store


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture(params=["sqlite", "postgres"])
def kit(request: pytest.FixtureRequest, tmp_path) -> Iterator[Kit]:
    if request.param == "sqlite":
        path = tmp_path / "p03.db"
        k = Kit("sqlite", lambda: SqliteStore(path), lambda: SqliteStore(tmp_path))  # a directory: cannot open
    else:
        dsn = request.getfixturevalue("pg_dsn")
        namespace = f"test-{uuid.uuid4().hex}"  # a fresh schema per test, through the factory the server uses
        schema = partition_schema(7, "Orders/Tests", 3, namespace=namespace)
        dead = f"host=127.0.0.1 port={_closed_port()} user=postgres dbname=postgres connect_timeout=5"
        k = Kit(
            "postgres",
            postgres_store_factory(dsn, namespace=namespace)(7, "Orders/Tests", 3),
            lambda: PostgresStore(dead, schema),
            dsn=dsn,
            schema=schema,
        )
    yield k
    for store in k.opened:
        store.close()
    if k.dsn is not None and k.schema is not None:
        drop_partition_schema(k.dsn, k.schema)


@pytest.fixture
def store(kit: Kit) -> MessageStore:
    return kit.open()


def _row(seq: int, data: bytes | None = None, **changes) -> Row:
    row = Row(seq, int(SubQueue.MAIN), 0, 0, None, data if data is not None else f"data-{seq}".encode())
    return row._replace(**changes)


def _reload(kit: Kit, store: MessageStore) -> Snapshot:
    store.close()
    return kit.open().load()


# --- every op, and reload after reopening ----------------------------------------------------------------------
def test_new_store_is_empty(store: MessageStore) -> None:
    assert store.load() == Snapshot()


def test_put_rows_come_back_in_sequence_order_after_reopen(kit: Kit, store: MessageStore) -> None:
    rows0 = [_row(3), _row(1, dead_letter=b"\x00dl", queue=int(SubQueue.DEAD_LETTER), state=1, delivery_count=4)]
    rows5 = [_row(2, b"")]
    store.apply([("create_slot", 0), ("create_slot", 5), ("put", 0, rows0), ("put", 5, rows5)])
    snap = _reload(kit, store)
    assert snap.rows == {0: [rows0[1], rows0[0]], 5: rows5}
    assert all(isinstance(r.data, bytes) for r in snap.rows[0])


def test_put_replaces_a_row_and_the_last_of_repeats_wins(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(1), _row(2)])])
    store.apply([("put", 0, [_row(1, b"new", state=2), _row(2, b"first"), _row(2, b"second")])])
    assert _reload(kit, store).rows[0] == [_row(1, b"new", state=2), _row(2, b"second")]


def test_delete(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(s) for s in range(1, 6)])])
    store.apply([("delete", 0, [2])])
    store.apply([("delete", 0, [4, 5, 99]), ("delete", 0, [])])  # a missing sequence number is no error
    assert [r.seq for r in _reload(kit, store).rows[0]] == [1, 3]


def test_unsynced_batches_keep_their_order_among_synced_ones(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(s) for s in range(1, 6)])])
    store.apply([("delete", 0, [1, 2])], sync=False)  # a settlement's commit: no fsync
    store.apply([("put", 0, [_row(6)])])
    store.apply([("delete", 0, [6])], sync=False)
    assert [r.seq for r in _reload(kit, store).rows[0]] == [3, 4, 5]


def test_sqlite_syncs_exactly_the_batches_asked_to(tmp_path) -> None:
    """The setting changes only when it must, between transactions; a synced commit is otherwise BEGIN, its
    statements and COMMIT."""
    store = SqliteStore(tmp_path / "p.db")
    setting = lambda: store._db.execute("PRAGMA synchronous").fetchone()[0]  # noqa: E731  (2 FULL, 1 NORMAL)
    store.apply([("create_slot", 0)])
    assert setting() == 2
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.apply([("delete", 0, [1]), ("counts", 0, 0, 0, 0)], sync=False)
    assert statements[0] == "PRAGMA synchronous=NORMAL"
    store.apply([("delete", 0, [2]), ("counts", 0, 0, 0, 0)], sync=False)
    store.apply([("put", 0, [_row(1)]), ("meta", "next_seq", 2), ("counts", 0, 0, 1, 10)])
    store.apply([("put", 0, [_row(2)]), ("meta", "next_seq", 3), ("counts", 0, 0, 2, 20)])
    store._db.set_trace_callback(None)
    assert [s for s in statements if s.startswith("PRAGMA")] == ["PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"]
    assert setting() == 2
    store.close()


def test_sqlite_small_writes_are_one_statement_each(tmp_path) -> None:
    """A send's rows, its meta and its counts are one statement each (each statement lets go of the GIL), and
    a batch of settlements' counts is one; what they write reads back the same."""
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0), ("create_slot", 1), ("create_slot", 2)])
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.apply(
        [("put", s, [_row(q) for q in range(1, 6)]) for s in (0, 1, 2)]
        + [("meta", "next_seq", 6), ("meta", "other", 1)]
        + [("counts", s, q, 5 + s, 50 * q) for s in (0, 1, 2) for q in (0, 1)]
    )
    store._db.set_trace_callback(None)
    assert len(statements) == 2 + 3 + 1 + 1, statements  # BEGIN, a put per table, meta, counts, COMMIT
    snap = SqliteStore(tmp_path / "p.db").load()
    assert snap.meta == {"next_seq": 6, "other": 1}
    assert snap.counts == {(s, q): (5 + s, 50 * q) for s in (0, 1, 2) for q in (0, 1)}
    assert [[r.seq for r in snap.rows[s]] for s in (0, 1, 2)] == [[1, 2, 3, 4, 5]] * 3
    store.close()


def test_sqlite_a_send_is_begin_its_rows_one_counts_statement_and_commit(tmp_path) -> None:
    """A send's batch (its rows, the next sequence number, its counts) writes the number with the counts, in one
    statement (the counts table's row (NEXT_SEQ_SLOT, 0)), and a group of 100 rows is two inserts (96 + 4)."""
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.apply([("put", 0, [_row(s) for s in range(1, 101)]), ("meta", "next_seq", 101), ("counts", 0, 0, 100, 9)])
    store._db.set_trace_callback(None)
    assert len(statements) == 1 + 2 + 1 + 1, statements  # BEGIN, 96 rows, 4 rows, counts and next_seq, COMMIT
    assert not [s for s in statements if "meta" in s]
    snap = store.load()
    assert snap.meta == {"next_seq": 101} and snap.counts == {(0, 0): (100, 9)}  # not a slot's counts
    assert [r.seq for r in snap.rows[0]] == list(range(1, 101))
    store.close()


def test_sqlite_next_seq_of_a_file_written_before_is_read_from_its_meta_table(tmp_path) -> None:
    """A file written before the next sequence number moved to the counts table holds it in its meta table: it is
    read from there until a batch writes a new one (the larger of the two counts, so it never goes back)."""
    import sqlite3

    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    store.close()
    db = sqlite3.connect(tmp_path / "p.db")
    db.execute("INSERT INTO meta VALUES ('next_seq', 7)")  # as main's code wrote it
    db.commit()
    db.close()
    store = SqliteStore(tmp_path / "p.db")
    assert store.load().meta == {"next_seq": 7}
    store.apply([("put", 0, [_row(7)]), ("meta", "next_seq", 8), ("counts", 0, 0, 1, 10)])
    assert store.load().meta == {"next_seq": 8}
    store.close()
    store = SqliteStore(tmp_path / "p.db")
    snap = store.load()
    assert snap.meta == {"next_seq": 8} and snap.counts == {(0, 0): (1, 10)}
    store.close()


def test_sqlite_chunks_are_never_more_statements_than_powers_of_two() -> None:
    """The halfway sizes (48, 96, 192) only ever save statements: a group of 100 rows is 96 + 4."""

    def powers_of_two(n: int) -> list[int]:  # the split before them
        out = []
        while n > sqlite_store._EXACT_ROWS:
            out.append(1 << (min(n, sqlite_store._PUT_CHUNK).bit_length() - 1))
            n -= out[-1]
        return out + [n] * bool(n)

    for n in range(1, 2000):
        chunks = sqlite_store._chunks(n)
        assert sum(chunks) == n and max(chunks) <= sqlite_store._PUT_CHUNK
        assert len(chunks) <= len(powers_of_two(n)), n
    assert sqlite_store._chunks(100) == (96, 4) and sqlite_store._chunks(76) == (64, 12)


def test_sqlite_puts_of_every_size_read_back(tmp_path) -> None:
    """Exact statements up to _EXACT_ROWS rows, chunks of _CHUNK_SIZES and an exact rest above: every row lands."""
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    seq = 1
    for n in (1, 2, 5, 15, 16, 17, 31, 100, 257, 600):
        store.apply([("put", 0, [_row(seq + i) for i in range(n)])])
        seq += n
    store.apply([("put", 0, [_row(s) for s in range(1, 40)])])  # replaces, not new (the ``_put_sql`` path)
    assert [r.seq for r in store.load().rows[0]] == list(range(1, seq))
    store.close()


def test_sqlite_checkpoints_in_the_background(tmp_path) -> None:
    """Past CHECKPOINT_BYTES of writes a checkpoint copies the WAL into the database file, long before SQLite's
    own (8 MB) would inside a commit; writes go on meanwhile, and closing leaves no WAL and every row."""
    path = tmp_path / "p.db"
    store = SqliteStore(path)
    store.apply([("create_slot", 0)])
    data = os.urandom(1000)
    per_batch = 100
    batches = sqlite_store.CHECKPOINT_BYTES // (per_batch * len(data)) + 2
    seq = 0
    for _ in range(batches):
        store.apply([("put", 0, [_row(seq + i, data) for i in range(per_batch)])])
        seq += per_batch
    started = store._checkpoint
    assert started is not None or path.stat().st_size > sqlite_store.CHECKPOINT_BYTES // 2  # running, or done
    store.apply([("put", 0, [_row(seq + i, data) for i in range(per_batch)])])  # beside the checkpoint
    seq += per_batch
    if started is not None:
        started.result(timeout=30)
    assert path.stat().st_size > sqlite_store.CHECKPOINT_BYTES // 2  # the WAL's pages are in the database file
    store.close()
    assert not (tmp_path / "p.db-wal").exists()
    reopened = SqliteStore(path)
    assert [r.seq for r in reopened.load().rows[0]] == list(range(seq))
    reopened.close()


def test_update_changes_only_mutable_columns(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(1), _row(2, dead_letter=b"x")])])
    store.apply(
        [
            ("update", 0, [Update(1, int(SubQueue.DEAD_LETTER), 1, 3, b"why"), Update(99, 0, 0, 0, None)]),
            ("update", 0, [Update(2, 0, 2, 1, None)]),
            ("update", 0, [Update(2, 0, 3, 2, None)]),  # applied in order: the last one wins
        ]
    )
    assert _reload(kit, store).rows[0] == [
        Row(1, int(SubQueue.DEAD_LETTER), 1, 3, b"why", b"data-1"),
        Row(2, 0, 3, 2, None, b"data-2"),
    ]


def test_create_slot_twice_keeps_its_rows(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 1), ("put", 1, [_row(1)])])
    store.apply([("create_slot", 1)])
    assert _reload(kit, store).rows == {1: [_row(1)]}


def test_drop_slot_removes_rows_and_session_states(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 1), ("create_slot", 2), ("put", 1, [_row(1)]), ("put", 2, [_row(2)])])
    store.apply([("session_state", 1, "s", b"one"), ("session_state", 2, "s", b"two")])
    store.apply([("drop_slot", 1), ("drop_slot", 77)])  # dropping a missing slot is no error
    snap = store.load()
    assert snap.rows == {2: [_row(2)]}
    assert snap.session_states == {(2, "s"): b"two"}
    with pytest.raises(StoreError):
        store.apply([("put", 1, [_row(3)])])  # its table is gone
    store.apply([("create_slot", 1)])
    assert _reload(kit, store).rows == {1: [], 2: [_row(2)]}


def test_meta_keeps_the_last_value(kit: Kit, store: MessageStore) -> None:
    store.apply([("meta", "next_seq", 5), ("meta", "mark:0:0", 3), ("meta", "next_seq", 9)])
    store.apply([("meta", "big", 2**62)])
    assert _reload(kit, store).meta == {"next_seq": 9, "mark:0:0": 3, "big": 2**62}


def test_dedup_history_prune_and_delete(kit: Kit, store: MessageStore) -> None:
    transfer = "\x00transfer:abc"  # forwarded messages' ids start with NUL
    store.apply([("dedup", [("a", 100), ("b", 200), (transfer, 300), ("ü-ñ", 400)]), ("dedup", [("a", 150)])])
    assert store.load().dedup == {"a": 150, "b": 200, transfer: 300, "ü-ñ": 400}
    store.apply([("dedup_prune", 200)])  # strictly older than 200 goes
    assert store.load().dedup == {"b": 200, transfer: 300, "ü-ñ": 400}
    store.apply([("dedup_delete", [transfer, "missing"]), ("dedup_delete", [])])
    store.apply([("dedup", [("c", 1), ("c", 2)]), ("dedup", [])])
    assert _reload(kit, store).dedup == {"b": 200, "ü-ñ": 400, "c": 2}


def test_session_state_set_replace_and_clear(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("create_slot", 4)])
    store.apply([("session_state", 0, "a", b"1"), ("session_state", 0, "b\x00é", b""), ("session_state", 4, "a", b"x")])
    store.apply([("session_state", 0, "a", b"2"), ("session_state", 0, "gone", None)])  # clearing nothing is fine
    assert store.load().session_states == {(0, "a"): b"2", (0, "b\x00é"): b"", (4, "a"): b"x"}
    store.apply([("session_state", 0, "a", None)])
    assert _reload(kit, store).session_states == {(0, "b\x00é"): b"", (4, "a"): b"x"}


def test_interleaved_batch_has_the_effect_of_its_ops_in_order(kit: Kit, store: MessageStore) -> None:
    # What a group commit produces: many submissions' ops back to back, touching the same rows.
    store.apply(
        [
            ("create_slot", 0),
            ("put", 0, [_row(1)]),
            ("meta", "next_seq", 2),
            ("dedup", [("m1", 10)]),
            ("put", 0, [_row(2)]),
            ("meta", "next_seq", 3),
            ("delete", 0, [1]),
            ("put", 0, [_row(1, b"again")]),
            ("update", 0, [Update(2, 0, 4, 1, None)]),
            ("dedup_prune", 11),
            ("dedup", [("m2", 12)]),
            ("session_state", 0, "s", b"x"),
            ("drop_slot", 0),
            ("create_slot", 0),
            ("put", 0, [_row(3)]),
            ("session_state", 0, "t", b"y"),
            ("meta", "next_seq", 4),
        ]
    )
    snap = _reload(kit, store)
    assert snap == Snapshot(
        rows={0: [_row(3)]}, meta={"next_seq": 4}, dedup={"m2": 12}, session_states={(0, "t"): b"y"}
    )


def test_empty_batch_and_empty_lists(store: MessageStore) -> None:
    store.apply([])
    store.apply([("create_slot", 0), ("put", 0, []), ("update", 0, []), ("delete", 0, [])])
    assert store.load().rows == {0: []}


# --- transactions, errors, size ------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", [True, False])
def test_a_batch_that_starts_with_a_new_slot_is_atomic_too(kit: Kit, store: MessageStore, sync: bool) -> None:
    """A failure later in a batch takes the slot it created back with the rest; synced or not."""
    store.apply([("create_slot", 0)])
    with pytest.raises(StoreError):
        store.apply([("create_slot", 9), ("put", 9, [_row(1)]), ("put", 8, [_row(2)])], sync=sync)  # no slot 8
    store.apply([("put", 0, [_row(1)])])
    snap = _reload(kit, store)
    assert 9 not in snap.rows and [r.seq for r in snap.rows[0]] == [1]


def test_a_failing_op_leaves_nothing_of_its_batch(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(1)]), ("meta", "next_seq", 2)])
    before = store.load()
    with pytest.raises(StoreError):
        store.apply(
            [
                ("put", 0, [_row(2)]),
                ("delete", 0, [1]),
                ("meta", "next_seq", 3),
                ("dedup", [("d", 1)]),
                ("session_state", 0, "s", b"x"),
                ("create_slot", 9),
                ("put", 8, [_row(3)]),  # no such slot
            ]
        )
    assert store.load() == before
    store.apply([("put", 0, [_row(2)])])  # the store is still usable
    assert [r.seq for r in _reload(kit, store).rows[0]] == [1, 2]


def test_a_store_that_cannot_open_raises_store_error(kit: Kit) -> None:
    with pytest.raises(StoreError):
        kit.unreachable()


def test_large_batches(kit: Kit, store: MessageStore) -> None:
    n = 5000
    rows = [_row(s, os.urandom(64), dead_letter=None if s % 3 else b"dl") for s in range(1, n + 1)]
    store.apply([("create_slot", 0), ("put", 0, rows), ("meta", "next_seq", n + 1)])
    store.apply([("update", 0, [Update(s, 0, 1, 1, None) for s in range(1, n + 1, 2)])])
    store.apply([("delete", 0, list(range(2, n + 1, 2)))])
    store.apply([("dedup", [(f"id-{i}", i) for i in range(n)])])
    store.apply([("dedup_prune", n // 2)])
    snap = _reload(kit, store)
    assert snap.rows[0] == [r._replace(state=1, delivery_count=1, dead_letter=None) for r in rows[::2]]
    assert snap.dedup == {f"id-{i}": i for i in range(n // 2, n)}
    assert snap.meta == {"next_seq": n + 1}


def test_put_of_many_new_rows(kit: Kit, store: MessageStore) -> None:
    """New messages' rows (no dead-letter fields), more than one insert statement takes (SQLite: 256 rows, in
    power-of-two chunks), with a repeated sequence number inside one chunk: the last one wins."""
    n = 777
    rows = [_row(s, os.urandom(100), state=s % 2, delivery_count=s % 3) for s in range(1, n + 1)]
    store.apply([("create_slot", 0), ("put", 0, [*rows[:10], _row(5, b"again"), *rows[10:]])])
    snap = _reload(kit, store)
    assert snap.rows[0] == [*rows[:4], _row(5, b"again"), *rows[5:]]
    assert all(type(r.data) is bytes for r in snap.rows[0])


def test_put_of_a_sends_rows_and_of_rows_that_differ_in_one_field(kit: Kit, store: MessageStore) -> None:
    """Rows as a send stores them (consecutive sequence numbers, main queue, ACTIVE, never delivered; SQLite writes
    what they share as constants and binds only the first sequence number), with and without expiry times, in
    chunks of several sizes; and rows that each differ from those in one field, which SQLite binds in full."""
    plain = [_row(s, os.urandom(50)) for s in range(1, 300)]  # 299: chunks of 256, 32, 8, 2 and 1
    timed = [_row(s, os.urandom(50), expires=10_000 + s) for s in range(300, 377)]
    enums = [_row(s, state=MessageState.ACTIVE, queue=SubQueue.MAIN) for s in range(377, 380)]
    gap = [_row(s) for s in (400, 402, 403)]
    scheduled = [_row(s, state=int(MessageState.SCHEDULED)) for s in range(500, 505)]
    delivered = [_row(s, delivery_count=1) for s in range(600, 603)]
    dead = [_row(s, queue=int(SubQueue.DEAD_LETTER)) for s in range(700, 703)]
    lists = [plain, timed, enums, gap, scheduled, delivered, dead]
    store.apply([("create_slot", 0), *[("put", 0, rows) for rows in lists]])
    store.close()
    reopened = kit.open()
    assert reopened.load().rows[0] == [r._replace(expires=None) for rows in lists for r in rows]
    assert [(r[0], r[-1]) for r in reopened.scan_expiring(0, (0, 0), 1000)] == [(r.seq, r.expires) for r in timed]
    assert [r[0] for r in reopened.scan_held(0, 0, int(MessageState.SCHEDULED), 0, 1000, 10)] == list(range(500, 505))
    assert [r[0] for r in reopened.scan(0, int(SubQueue.DEAD_LETTER), 0, 1000, 10)] == list(range(700, 703))


def test_many_small_submissions_in_one_batch(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("create_slot", 1)])
    ops = []
    for s in range(1, 1001):
        ops += [("put", s % 2, [_row(s)]), ("meta", "next_seq", s + 1), ("dedup", [(f"m{s}", s)])]
    store.apply(ops)
    snap = _reload(kit, store)
    assert [r.seq for r in snap.rows[1]] == list(range(1, 1001, 2))
    assert [r.seq for r in snap.rows[0]] == list(range(2, 1001, 2))
    assert snap.meta == {"next_seq": 1001} and len(snap.dedup) == 1000


# --- a real partition broker over each store -------------------------------------------------------------------
def test_partition_broker_keeps_messages_across_restarts(kit: Kit) -> None:
    settings = SlotSettings(path="orders")
    config = PartitionConfig(
        path="orders",
        partition_id=3,
        max_size_bytes=1 << 30,
        max_message_size_bytes=1 << 20,
        requires_duplicate_detection=True,
    )
    broker = PartitionBroker(config, kit.factory, time.time)

    def restart() -> None:
        broker.stop()
        broker.start()
        broker.configure_slot(0, settings)  # slot settings live in the catalog, not the store

    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        items = [(f"id-{i}", [(0, Message(f"m{i}".encode(), session_id=None))]) for i in range(3)]
        first = broker.enqueue(items).result(30)
        restart()
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 10)] == [b"m0", b"m1", b"m2"]
        assert broker.enqueue([("id-1", [(0, Message(b"dup"))])]).result(30) == [None]  # dedup survived
        locked = broker.lock_messages(0, SubQueue.MAIN, 10)
        assert [m.sequence_number for m in locked] == first
        broker.complete(0, [m.lock_token for m in locked]).result(30)
        restart()
        assert broker.peek(0, SubQueue.MAIN, 0, 10) == []
        assert broker.lock_messages(0, SubQueue.MAIN, 10) == []
        later = broker.enqueue([(None, [(0, Message(b"m3"))])]).result(30)
        assert later[0] > first[-1]  # numbering goes on after the restarts
    finally:
        broker.stop()


# --- PostgreSQL only -------------------------------------------------------------------------------------------
def test_partition_schema_names_are_safe_distinct_identifiers() -> None:
    names = [
        partition_schema(1, "orders", 0),
        partition_schema(1, "orders", 1),
        partition_schema(2, "orders", 0),
        partition_schema(12, 'We"ird; DROP SCHEMA public--/Sub', 15),
        partition_schema(3, "ü" * 200, 2),
        partition_schema(4, "", 0),
        partition_schema(1, "orders", 0, namespace="premiumns"),
        partition_schema(1, "x" * 300, 0, namespace="other"),
    ]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name.encode()) <= 63
        assert name[0].isalpha() and all(c.isascii() and (c.isalnum() or c == "_") for c in name), name
        assert name == name.lower()
    assert partition_schema(12, "Orders/Sub-1", 3) == "sb_e12_p03_orders_sub_1"
    assert partition_schema(12, "ORDERS", 3) == partition_schema(12, "orders", 3)  # names are case-insensitive


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    schema = f'Odd "schema" {uuid.uuid4().hex[:8]}'  # needs quoting everywhere it is used
    yield schema
    drop_partition_schema(pg_dsn, schema)


def test_postgres_quotes_any_schema_name_and_drops_it(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresStore(pg_dsn, pg_schema)
    store.apply([("create_slot", 0), ("put", 0, [_row(1)])])
    store.close()
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (pg_schema,)).fetchone()
        assert found == (1,)
    drop_partition_schema(pg_dsn, pg_schema)
    drop_partition_schema(pg_dsn, pg_schema)  # already gone: fine
    store = PostgresStore(pg_dsn, pg_schema)
    assert store.load() == Snapshot()
    store.close()


def _kill_backend(dsn: str, store: PostgresStore) -> None:
    assert store._conn is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))


def test_postgres_lost_connection_raises_store_error_then_reconnects(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresStore(pg_dsn, pg_schema)
    try:
        store.apply([("create_slot", 0), ("put", 0, [_row(1)])])
        _kill_backend(pg_dsn, store)
        with pytest.raises(StoreError):
            store.apply([("put", 0, [_row(2)])])
        store.apply([("put", 0, [_row(3)])])  # a new connection
        _kill_backend(pg_dsn, store)
        with pytest.raises(StoreError):
            store.load()
        assert [r.seq for r in store.load().rows[0]] == [1, 3]
    finally:
        store.close()


def test_postgres_unreachable_server_raises_store_error() -> None:
    dsn = f"host=127.0.0.1 port={_closed_port()} user=postgres dbname=postgres connect_timeout=5"
    with pytest.raises(StoreError):
        PostgresStore(dsn, "sb_e1_p00_x")
    with pytest.raises(StoreError):
        PostgresLeases(dsn)
    with pytest.raises(StoreError):
        drop_partition_schema(dsn, "sb_e1_p00_x")


@pytest.fixture
def leases(pg_dsn: str) -> Iterator[Callable[[], PostgresLeases]]:
    made: list[PostgresLeases] = []

    def make() -> PostgresLeases:
        lease = PostgresLeases(pg_dsn)
        made.append(lease)
        return lease

    yield make
    for lease in made:
        lease.close()


def test_lease_acquire_renew_release(leases: Callable[[], PostgresLeases]) -> None:
    a, b = leases(), leases()
    key = f"ns/orders/{uuid.uuid4().hex}"
    assert a.holder(key) is None
    assert a.acquire(key, "broker-a", 30)
    assert b.holder(key) == "broker-a"
    assert not b.acquire(key, "broker-b", 30)  # held by someone else
    assert a.acquire(key, "broker-a", 30)  # renewal
    b.release(key, "broker-b")  # not b's: no effect
    assert a.holder(key) == "broker-a"
    a.release(key, "broker-a")
    assert a.holder(key) is None
    assert b.acquire(key, "broker-b", 30)
    assert a.holder(key) == "broker-b"
    assert a.holder(f"{key}-other") is None  # leases are per partition key


def test_lease_expires_by_the_database_clock(leases: Callable[[], PostgresLeases]) -> None:
    a, b = leases(), leases()
    key = f"ns/orders/{uuid.uuid4().hex}"
    assert a.acquire(key, "broker-a", 0.3)
    assert not b.acquire(key, "broker-b", 10)
    time.sleep(0.6)
    assert a.holder(key) is None
    assert b.acquire(key, "broker-b", 10)  # taken over
    assert not a.acquire(key, "broker-a", 10)  # a's renewal comes too late
    assert b.holder(key) == "broker-b"


def test_lease_race_has_one_winner(leases: Callable[[], PostgresLeases]) -> None:
    contenders = [leases() for _ in range(4)]
    key = f"ns/orders/{uuid.uuid4().hex}"
    barrier = threading.Barrier(len(contenders))
    won: list[str] = []

    def contend(i: int) -> None:
        barrier.wait()
        if contenders[i].acquire(key, f"broker-{i}", 30):
            won.append(f"broker-{i}")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(contenders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(won) == 1
    assert contenders[0].holder(key) == won[0]


def test_lease_survives_a_lost_connection(pg_dsn: str, leases: Callable[[], PostgresLeases]) -> None:
    a = leases()
    key = f"ns/orders/{uuid.uuid4().hex}"
    assert a.acquire(key, "broker-a", 30)
    backend = a._db.run(lambda conn: conn.info.backend_pid)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with pytest.raises(StoreError):
        a.acquire(key, "broker-a", 30)
    assert a.acquire(key, "broker-a", 30)  # reconnected; the lease was kept


def test_partition_broker_backlog_beyond_its_read_ahead(kit: Kit) -> None:
    """With a read-ahead window of 3, a backlog of 20 lives on disk: counts, peek, range reads, FIFO deliveries,
    settlements and a restart all see every message, while only the window (and locked or deferred ones) is
    resident."""
    settings = SlotSettings(path="orders", max_delivery_count=5)
    config = PartitionConfig(path="orders", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, time.time)
    broker.read_ahead = 3
    broker.memory_budget = 0  # nothing beyond the window
    broker.configure_slot(0, settings)

    def restart() -> None:
        broker.stop()
        broker.start()

    def resident() -> int:
        return len(broker._queues[(0, SubQueue.MAIN)].entries)

    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        seqs = broker.enqueue([(None, [(0, Message(f"m{i}".encode()))]) for i in range(20)]).result(30)
        local = [s & 0xFFFFFFFFFF for s in seqs]
        assert local == list(range(1, 21)) and resident() == 3
        assert broker.runtime(0).active_message_count == 20
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 50)] == [f"m{i}".encode() for i in range(20)]
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 11, 2)] == [b"m10", b"m11"]
        assert [m.body for m in broker.browse_range(0, SubQueue.MAIN, 5, 15, 4)] == [b"m4", b"m5", b"m6", b"m7"]
        assert broker.range_offsets(0, SubQueue.MAIN, 11) == (1, 21, 1, 10)
        locked = broker.lock_messages(0, SubQueue.MAIN, 5)
        assert [m.body for m in locked] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        broker.abandon(0, locked[1].lock_token).result(30)
        broker.dead_letter(0, locked[2].lock_token, "why", "because").result(30)
        broker.defer(0, locked[3].lock_token).result(30)
        broker.complete(0, [locked[0].lock_token, locked[4].lock_token]).result(30)
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (17, 1)
        restart()
        assert resident() <= 1  # the deferred one; ACTIVE ones stay on disk until a receiver needs them
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (17, 1)
        assert broker.size_bytes() == props.size_in_bytes
        assert [m.body for m in broker.peek(0, SubQueue.DEAD_LETTER, 0, 5)] == [b"m2"]
        got = broker.lock_messages(0, SubQueue.MAIN, 4)
        assert [m.body for m in got] == [b"m1", b"m5", b"m6", b"m7"]
        assert got[0].delivery_count == 2  # the abandon counted
        (deferred,), _ = broker.receive_deferred(0, SubQueue.MAIN, [4], lock=False)
        assert deferred.body == b"m3"
        broker.complete(0, [m.lock_token for m in got]).result(30)
        rest = []
        while batch := broker.lock_messages(0, SubQueue.MAIN, 5):
            rest += batch
            assert resident() <= 3 + 5  # the window and the locked ones
            broker.complete(0, [m.lock_token for m in batch]).result(30)
        assert [m.body for m in rest] == [f"m{i}".encode() for i in range(8, 20)]
        (dead,) = broker.lock_messages(0, SubQueue.DEAD_LETTER, 5)
        broker.complete(0, [dead.lock_token]).result(30)
        restart()
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count, props.size_in_bytes) == (0, 0, 0)
        assert broker.peek(0, SubQueue.MAIN, 0, 50) == []
    finally:
        broker.stop()


def test_complete_below_removes_a_backlog_on_disk(kit: Kit) -> None:
    settings = SlotSettings(path="stream")
    config = PartitionConfig(path="stream", partition_id=0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, time.time)
    broker.read_ahead = 2
    broker.memory_budget = 0
    broker.configure_slot(0, settings)
    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        broker.enqueue([(None, [(0, Message(f"m{i}".encode()))]) for i in range(10)]).result(30)
        broker.complete_below(0, SubQueue.MAIN, 8).result(30)
        assert broker.runtime(0).active_message_count == 3
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 50)] == [b"m7", b"m8", b"m9"]
        broker.stop()
        broker.start()
        assert broker.runtime(0).active_message_count == 3
        assert [m.body for m in broker.lock_messages(0, SubQueue.MAIN, 5)] == [b"m7", b"m8", b"m9"]
    finally:
        broker.stop()


def test_sqlite_file_of_the_earlier_schema_opens_with_its_counts(tmp_path) -> None:
    """A store written before counts were kept (no counts table, no indexes) gets both when opened."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        CREATE TABLE slots (slot INTEGER PRIMARY KEY);
        CREATE TABLE dedup (message_id TEXT PRIMARY KEY, seen INTEGER NOT NULL) WITHOUT ROWID;
        CREATE TABLE session_state (
            slot INTEGER NOT NULL, session TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (slot, session)
        ) WITHOUT ROWID;
        CREATE TABLE m0 (seq INTEGER PRIMARY KEY, queue INTEGER NOT NULL, state INTEGER NOT NULL,
            delivery_count INTEGER NOT NULL, dead_letter BLOB, data BLOB NOT NULL);
        INSERT INTO slots VALUES (0);
        INSERT INTO meta VALUES ('next_seq', 5);
        INSERT INTO m0 VALUES (1, 0, 0, 0, NULL, x'0102'), (2, 0, 1, 1, NULL, x'010203'),
                              (3, 1, 0, 2, x'00', x'01'), (4, 0, 0, 0, NULL, x'0102030405');
        """
    )
    db.commit()
    db.close()
    store = SqliteStore(path)
    try:
        snap = store.load(resident=())
        assert snap.counts == {(0, 0): (3, 10), (0, 1): (1, 1)}
        assert snap.meta == {"next_seq": 5}
        assert 0 not in snap.rows and snap.scheduled == {0: 0}  # no rows: the deferred one is read by key
        assert [r[0] for r in store.get(0, [2, 3, 9])] == [2, 3]
        assert [r[0] for r in store.scan_held(0, 0, 1, 0, 10, 10)] == [2]
        assert [r[0] for r in store.scan(0, 0, 0, 10, 10)] == [1, 4]
        assert [r[0] for r in store.scan(0, 1, 0, 10, 10)] == [3]
        assert [r.seq for r in store.load().rows[0]] == [1, 2, 3, 4]
    finally:
        store.close()
    reopened = SqliteStore(path)  # migrated once: opening again changes nothing
    try:
        assert reopened.load(resident=()).counts == {(0, 0): (3, 10), (0, 1): (1, 1)}
    finally:
        reopened.close()


def test_counts_keep_the_last_value_and_go_with_their_slot(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 1), ("create_slot", 2), ("counts", 1, 0, 5, 50), ("counts", 2, 1, 1, 9)])
    store.apply(
        [
            ("delete", 1, [1]),
            ("counts", 1, 0, 4, 40),
            ("delete", 1, [2]),
            ("counts", 1, 0, 3, 30),
            ("counts", 2, 1, 7, 70),
            ("drop_slot", 2),
        ]
    )
    assert _reload(kit, store).counts == {(1, 0): (3, 30)}


def _eventually(check: Callable[[], bool], limit: float = 10.0) -> None:
    """Messages leave memory once their write is stored (a future's callbacks may run just after its waiters)."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "not within the limit"
        time.sleep(0.01)


def test_store_reads_deferred_rows_by_key_and_by_index(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(1), _row(2, state=1), _row(3, state=2), _row(4, state=1)])])
    store.apply([("put", 0, [_row(5, state=1, queue=1)])])
    assert [r[0] for r in store.get(0, [4, 2, 9])] == [2, 4]
    assert [r[0] for r in store.scan_held(0, 0, 1, 0, 10, 10)] == [2, 4]
    assert [r[0] for r in store.scan_held(0, 0, 1, 3, 10, 10)] == [4]
    assert [r[0] for r in store.scan_held(0, 1, 1, 0, 10, 1)] == [5]
    snap = store.load(resident=())
    assert 0 not in snap.rows and snap.scheduled == {0: 1}  # counted, not read


def test_partition_broker_keeps_deferred_and_dead_lettered_messages_on_disk(kit: Kit) -> None:
    """Deferred messages, and dead-lettered ones beyond the dead-letter queue's window, leave memory once their
    change is stored: receive by sequence number reads them by key, peek and range reads show them, a restart
    does not load them."""
    settings = SlotSettings(path="orders", max_delivery_count=5)
    config = PartitionConfig(path="orders", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, time.time)
    broker.read_ahead = 2
    broker.memory_budget = 0
    broker.configure_slot(0, settings)

    def resident(queue: SubQueue = SubQueue.MAIN) -> int:
        return len(broker._queues[(0, queue)].entries)

    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        broker.enqueue([(None, [(0, Message(f"m{i}".encode()))]) for i in range(12)]).result(30)
        locked = broker.lock_messages(0, SubQueue.MAIN, 10)
        assert [m.body for m in locked] == [f"m{i}".encode() for i in range(10)]
        for m in locked[:6]:
            broker.defer(0, m.lock_token).result(30)
        for m in locked[6:]:
            broker.dead_letter(0, m.lock_token, "why", "because").result(30)
        # in memory: nothing of the main queue (its window is read when a receiver asks), the DLQ's window
        _eventually(lambda: resident() == 0 and resident(SubQueue.DEAD_LETTER) == 2)
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (8, 4)
        everything = [f"m{i}".encode() for i in range(12)]
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 50)] == everything[:6] + everything[10:]
        assert [m.state for m in broker.peek(0, SubQueue.MAIN, 0, 2)] == [MessageState.DEFERRED] * 2
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 4, 3)] == [b"m3", b"m4", b"m5"]
        assert [m.body for m in broker.browse_range(0, SubQueue.MAIN, 2, 12, 3)] == [b"m1", b"m2", b"m3"]
        assert broker.range_offsets(0, SubQueue.MAIN, 4) == (1, 13, 1, 5)  # m3, m4, m5, m10, m11
        assert [m.body for m in broker.peek(0, SubQueue.DEAD_LETTER, 0, 50)] == everything[6:10]
        # receive by sequence number reads a disk-only deferred message by key; it goes back to disk when released
        (got,), _ = broker.receive_deferred(0, SubQueue.MAIN, [3], lock=True)
        assert got.body == b"m2" and got.state is MessageState.DEFERRED
        broker.abandon(0, got.lock_token).result(30)  # back to DEFERRED (and to disk once that is stored)
        _eventually(lambda: 3 not in broker._queues[(0, SubQueue.MAIN)].entries)
        (got,), _ = broker.receive_deferred(0, SubQueue.MAIN, [3], lock=True)
        broker.complete(0, [got.lock_token])  # not waited for: its row is still there for a moment
        with pytest.raises(MessageNotFound):
            broker.receive_deferred(0, SubQueue.MAIN, [3], lock=True)
        (gone,), future = broker.receive_deferred(0, SubQueue.MAIN, [4], lock=False)
        assert gone.body == b"m3"
        future.result(30)
        # the dead-letter queue delivers its disk part in order
        dead = broker.lock_messages(0, SubQueue.DEAD_LETTER, 10)
        assert [m.body for m in dead] == everything[6:10]
        broker.complete(0, [m.lock_token for m in dead]).result(30)
        broker.stop()
        broker.start()
        assert resident() == 0
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (6, 0)
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 50)] == [b"m0", b"m1", b"m4", b"m5", b"m10", b"m11"]
        msgs, future = broker.receive_deferred(0, SubQueue.MAIN, [1, 2], lock=False)
        assert [m.body for m in msgs] == [b"m0", b"m1"]
        future.result(30)
        broker.complete_below(0, SubQueue.MAIN, 7).result(30)  # m4 and m5, deferred on disk
        assert broker.runtime(0).active_message_count == 2
        broker.stop()
        broker.start()
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 50)] == [b"m10", b"m11"]
        assert broker.runtime(0).active_message_count == 2
    finally:
        broker.stop()


def test_store_reads_scheduled_rows_by_their_time(kit: Kit, store: MessageStore) -> None:
    store.apply([("create_slot", 0), ("put", 0, [_row(s, state=2) for s in (1, 2, 3, 4)] + [_row(5)])])
    store.apply([("due", 0, [(1, 500), (2, 100), (3, 100), (4, 300)])])
    assert [(r[0], r[6]) for r in store.scan_due(0, (0, 0), 10)] == [(2, 100), (3, 100), (4, 300), (1, 500)]
    assert [r[0] for r in store.scan_due(0, (100, 2), 2)] == [3, 4]
    store.apply([("update", 0, [Update(3, 0, 0, 0, None)]), ("delete", 0, [4])])  # came due; cancelled
    assert [r[0] for r in store.scan_due(0, (0, 0), 10)] == [2, 1]
    assert store.load(resident=()).scheduled == {0: 2}


def test_sqlite_file_without_the_due_column_gets_it_filled_from_its_records(tmp_path) -> None:
    import sqlite3
    from datetime import UTC, datetime

    from shardbus.store.records import pack_message

    msg = Message(b"later")
    msg.scheduled_enqueue_time = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    path = tmp_path / "old.db"
    store = SqliteStore(path)
    store.apply([("create_slot", 0), ("put", 0, [_row(7, pack_message(msg), state=2), _row(8)])])
    store.close()
    db = sqlite3.connect(path)
    db.executescript("DROP INDEX m0_due; ALTER TABLE m0 DROP COLUMN due;")  # as an earlier version wrote it
    db.close()
    store = SqliteStore(path)
    try:
        (row,) = store.scan_due(0, (0, 0), 10)
        assert (row[0], row[6]) == (7, int(msg.scheduled_enqueue_time.timestamp() * 1000))
        assert store.load(resident=()).scheduled == {0: 1}
    finally:
        store.close()


def test_partition_broker_keeps_scheduled_messages_on_disk_by_their_time(kit: Kit, clock) -> None:
    """Only the soonest-due scheduled messages are resident (a window of 2 here); the rest are read from the due
    index as they come due, cancelled by key, counted without being read, and a restart does not load them."""
    from datetime import UTC, datetime

    settings = SlotSettings(path="orders")
    config = PartitionConfig(path="orders", partition_id=2, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, clock)
    broker.read_ahead = 2
    broker.memory_budget = 0
    broker.configure_slot(0, settings)
    start = clock()
    order = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]  # message i comes due after order[i] minutes

    def scheduled(i: int) -> Message:
        msg = Message(f"s{i}".encode())
        msg.scheduled_enqueue_time = datetime.fromtimestamp(start + 60 * order[i], UTC)
        return msg

    def resident() -> int:
        return len(broker._queues[(0, SubQueue.MAIN)].entries)

    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        for i in range(10):  # one send each: the window is trimmed as they come
            broker.enqueue([(None, [(0, scheduled(i))])]).result(30)
        broker.enqueue([(None, [(0, Message(b"now"))])]).result(30)
        assert resident() <= 2 * 2 + 1
        assert broker.runtime(0).scheduled_message_count == 10
        assert broker.scheduled_count() == 10
        peeked = broker.peek(0, SubQueue.MAIN, 0, 50)
        assert [m.body for m in peeked] == [f"s{i}".encode() for i in range(10)] + [b"now"]
        assert [m.state for m in peeked[:10]] == [MessageState.SCHEDULED] * 10
        assert broker.range_offsets(0, SubQueue.MAIN, 0)[3] == 1  # a scheduled message is not readable yet
        # cancel one that is on disk only (s9: due last), and one twice
        s9 = peeked[9].sequence_number & 0xFFFFFFFFFF
        assert s9 not in broker._queues[(0, SubQueue.MAIN)].entries
        broker.cancel_scheduled([s9]).result(30)
        with pytest.raises(MessageNotFound):
            broker.cancel_scheduled([s9])
        assert broker.runtime(0).scheduled_message_count == 9
        broker.stop()
        broker.start()
        assert resident() == 0  # nothing read at start, the counts are right
        props = broker.runtime(0)
        assert (props.scheduled_message_count, props.active_message_count) == (9, 1)
        assert broker.next_due_ms(0, SubQueue.MAIN) is not None
        (now,) = broker.lock_messages(0, SubQueue.MAIN, 5)
        assert now.body == b"now"
        broker.complete(0, [now.lock_token]).result(30)
        got = []
        for minute in range(1, 10):  # each comes due in its turn, read from the due index
            clock.advance(60)
            batch = broker.lock_messages(0, SubQueue.MAIN, 5)
            got += [m.body for m in batch]
            assert resident() <= 2 * 2 + 1
            if batch:
                broker.complete(0, [m.lock_token for m in batch]).result(30)
            if minute == 4:  # a restart midway: the ones that came due stay due
                broker.stop()
                broker.start()
        assert got == [f"s{order.index(m)}".encode() for m in range(1, 10)]
        assert broker.runtime(0).scheduled_message_count == 0
        broker.stop()
        broker.start()
        props = broker.runtime(0)
        assert (props.scheduled_message_count, props.active_message_count, props.size_in_bytes) == (0, 0, 0)
    finally:
        broker.stop()


@pytest.mark.parametrize("dead_letter", [False, True], ids=["dropped", "dead-lettered"])
def test_partition_broker_expires_messages_anywhere_through_the_expiry_index(kit: Kit, clock, dead_letter) -> None:
    """The upkeep expires messages past their time to live wherever they are (on disk beyond the window, deferred
    on disk, resident), in batches through the store's expiry index, with the counts kept right; a locked one is
    left to its lock, and one past its time is never delivered."""
    from datetime import timedelta

    settings = SlotSettings(path="orders", dead_letter_on_expiration=dead_letter)
    config = PartitionConfig(path="orders", partition_id=3, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, clock)
    broker.read_ahead = 2
    broker.memory_budget = 0
    broker.configure_slot(0, settings)

    def message(body: str, ttl_s: int | None) -> Message:
        msg = Message(body.encode())
        msg.time_to_live = None if ttl_s is None else timedelta(seconds=ttl_s)
        return msg

    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        # m0..m2: locked, then m1 deferred (to disk); the rest stays beyond the window, on disk
        ttls = [10, 10, 10, None, 10, 60, 10, None, 10, 10]
        broker.enqueue([(None, [(0, message(f"m{i}", t))]) for i, t in enumerate(ttls)]).result(30)
        locked = broker.lock_messages(0, SubQueue.MAIN, 3)
        broker.defer(0, locked[1].lock_token).result(30)
        _eventually(lambda: 2 not in broker._queues[(0, SubQueue.MAIN)].entries)
        clock.advance(11)
        broker.tick()
        props = broker.runtime(0)
        # gone: m1 (deferred), m4, m6, m8, m9; left: m0 and m2 (locked), m3, m5, m7
        assert props.active_message_count == 5
        assert props.dead_letter_message_count == (5 if dead_letter else 0)
        assert broker._queues[(0, SubQueue.MAIN)].next_expiry is not None  # it looks again for the locked ones
        broker.abandon(0, locked[0].lock_token).result(30)
        broker.abandon(0, locked[2].lock_token).result(30)
        got = broker.lock_messages(0, SubQueue.MAIN, 10)  # the head check: m0 and m2 expire on the way
        assert [m.body for m in got] == [b"m3", b"m5", b"m7"]
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (3, 7 if dead_letter else 0)
        if dead_letter:
            dead = broker.peek(0, SubQueue.DEAD_LETTER, 0, 20)
            assert [m.body for m in dead] == [f"m{i}".encode() for i in (0, 1, 2, 4, 6, 8, 9)]
            assert {m.dead_letter_reason for m in dead} == {"TTLExpiredException"}
        for m in got:
            broker.release(0, m.lock_token)
        broker.stop()
        broker.start()  # the expiry index survives: m5 expires at 60 s, found after a restart
        clock.advance(60)
        broker.tick()
        props = broker.runtime(0)
        assert (props.active_message_count, props.dead_letter_message_count) == (2, 8 if dead_letter else 0)
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 20)] == [b"m3", b"m7"]
        assert broker._queues[(0, SubQueue.MAIN)].next_expiry is None
    finally:
        broker.stop()


def test_store_indexes_rows_by_their_expiry_time(kit: Kit, store: MessageStore) -> None:
    timed = [_row(1, expires=900), _row(2, expires=100), _row(3)]  # mixed: the generic insert
    store.apply([("create_slot", 0), ("put", 0, timed), ("put", 0, [_row(4, expires=500), _row(5, expires=500)])])
    store.apply([("put", 0, [_row(6), _row(7)])])  # none timed: NULL in the statement
    assert [(r[0], r[6]) for r in store.scan_expiring(0, (-1, 0), 10)] == [(2, 100), (4, 500), (5, 500), (1, 900)]
    assert [r[0] for r in store.scan_expiring(0, (500, 4), 2)] == [5, 1]
    store.apply([("update", 0, [Update(4, 1, 0, 1, b"x")]), ("delete", 0, [2])])  # dead-lettered; gone
    assert [r[0] for r in store.scan_expiring(0, (-1, 0), 10)] == [5, 1]


def test_a_time_to_live_that_never_comes_is_not_indexed(kit: Kit) -> None:
    """TimeSpan.MaxValue (the default) is not worth an index entry per send; a finite one is."""
    from datetime import timedelta

    settings = SlotSettings(path="orders", default_ttl_ms=10_675_199 * 86_400_000)
    config = PartitionConfig(path="orders", partition_id=4, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, time.time)
    broker.configure_slot(0, settings)
    broker.start()
    try:
        broker.create_slot(0, settings).result(30)
        short = Message(b"short")
        short.time_to_live = timedelta(minutes=5)
        broker.enqueue([(None, [(0, Message(b"forever"))]), (None, [(0, short)])]).result(30)
        assert [r[0] for r in broker._store.scan_expiring(0, (-1, 0), 10)] == [2]
        assert broker._queues[(0, SubQueue.MAIN)].next_expiry is not None
    finally:
        broker.stop()


def test_scan_stops_once_its_rows_hold_max_bytes(store: MessageStore) -> None:
    """A read-ahead is bounded by the bytes it reads (the last row may pass the bound), not by the largest message
    the entity allows: a queue allowing 100 MB messages still reads its 1 KB ones many to a query."""
    store.apply([("create_slot", 0), ("put", 0, [_row(s, b"x" * 1000) for s in range(1, 11)])])
    assert [r[0] for r in store.scan(0, 0, 0, 100, 10, 3500)] == [1, 2, 3, 4]
    assert [r[0] for r in store.scan(0, 0, 0, 100, 10, 4000)] == [1, 2, 3, 4]
    assert [r[0] for r in store.scan(0, 0, 5, 100, 3, 1 << 20)] == [5, 6, 7]
    assert [r[0] for r in store.scan(0, 0, 9, 100, 10, 1 << 20)] == [9, 10]
    assert [r[0] for r in store.scan(0, 0, 11, 100, 10, 1)] == []
    store.apply([("put", 0, [_row(11, b"y" * 1000)])])  # the store reads on after an unfinished scan
    assert [r[0] for r in store.scan(0, 0, 10, 100, 10)] == [10, 11]
