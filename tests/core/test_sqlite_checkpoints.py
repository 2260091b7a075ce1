"""SQLite checkpoints stay out of commits: the store's own automatic checkpoint is only a distant safety net, the
background ones keep the WAL small, and the durability setting is what it was (store/sqlite.py)."""

from __future__ import annotations

import os

from shardbus.store import sqlite as sqlite_store
from shardbus.store.base import Row
from shardbus.store.sqlite import SqliteStore


def _row(seq: int, data: bytes) -> Row:
    return Row(seq, 0, 0, 0, None, data)


def test_connection_settings(tmp_path) -> None:
    store = SqliteStore(tmp_path / "p.db")
    db = store._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: every synced commit fsyncs the WAL
    assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sqlite_store.AUTOCHECKPOINT_PAGES
    assert sqlite_store.AUTOCHECKPOINT_PAGES * sqlite_store.PAGE_SIZE >= 4 * sqlite_store.CHECKPOINT_BYTES
    assert db.execute("PRAGMA journal_size_limit").fetchone()[0] == sqlite_store.WAL_LIMIT
    # freed space is not zeroed (Debian's SQLite zeroes it by default): it costs every insert and delete
    assert db.execute("PRAGMA secure_delete").fetchone()[0] == 0
    store.close()


def test_deleted_rows_stay_gone_and_their_space_is_reused(tmp_path) -> None:
    """Without secure_delete, freed cells keep their old bytes until reused: rows deleted (one by one and as a
    range) never come back, after a reopen either, and the space they held is written over by later rows."""
    path = tmp_path / "p.db"
    store = SqliteStore(path)
    store.apply([("create_slot", 0)])
    old, new = b"o" * 1000, b"n" * 1000
    store.apply([("put", 0, [_row(seq, old) for seq in range(300)])])
    store.apply([("delete", 0, [*range(0, 100), 150, 152, 154])])
    store.apply([("delete_range", 0, 0, 200, 300)])
    kept = [seq for seq in range(100, 200) if seq not in (150, 152, 154)]
    assert [row[0] for row in store.scan(0, 0, 0, 1 << 40, 1000)] == kept
    store.close()
    store = SqliteStore(path)
    assert [row[0] for row in store.scan(0, 0, 0, 1 << 40, 1000)] == kept
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store.apply([("put", 0, [_row(seq, new) for seq in range(300, 500)])])
    assert [row[0] for row in store.scan(0, 0, 0, 1 << 40, 1000)] == [*kept, *range(300, 500)]
    assert all(row[5] == new for row in store.scan(0, 0, 300, 1 << 40, 1000))
    # 200 rows of 1 KB in the room 200 deleted ones left (the free list): the file hardly grows
    assert store._db.execute("PRAGMA page_count").fetchone()[0] <= pages + 4
    store.close()


def test_wal_starts_again_after_each_background_checkpoint(tmp_path) -> None:
    """Three checkpoint intervals of writes by a writer slower than the checkpoints (it waits while one runs, as
    a broker well under its capacity does), a reader between batches: every background checkpoint leaves nothing
    to copy, so the WAL starts again from its beginning and its file never grows past about one interval, far
    below where SQLite's own checkpoint would run inside a commit."""
    path = tmp_path / "p.db"
    store = SqliteStore(path)
    store.apply([("create_slot", 0)])
    data = os.urandom(1000)
    per_batch = 100
    batches = 3 * sqlite_store.CHECKPOINT_BYTES // (per_batch * len(data))
    wal = tmp_path / "p.db-wal"
    checkpoints = set()
    for b in range(batches):
        store.apply([("put", 0, [_row(b * per_batch + i, data) for i in range(per_batch)])])
        assert len(store.scan(0, 0, b * per_batch, 1 << 40, 5)) == 5
        checkpoint = store._checkpoint
        if checkpoint is not None:
            checkpoints.add(id(checkpoint))
            checkpoint.result(timeout=30)
    assert len(checkpoints) >= 2
    assert wal.stat().st_size < 2 * sqlite_store.CHECKPOINT_BYTES
    assert wal.stat().st_size < sqlite_store.AUTOCHECKPOINT_PAGES * sqlite_store.PAGE_SIZE // 2
    store.close()
    assert not wal.exists()
