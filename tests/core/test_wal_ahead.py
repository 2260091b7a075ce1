"""The WAL file is kept ahead of its frames with written zeros (store/sqlite.py, ``_keep_wal_ahead``), so that
synced commits overwrite blocks the file has instead of appending: what it may hold on disk stays bounded, and
nothing committed is lost to the zeros, after a clean close or a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from shardbus.store import sqlite as sqlite_store
from shardbus.store.base import Row
from shardbus.store.sqlite import SqliteStore


def _row(seq: int, data: bytes) -> Row:
    return Row(seq, 0, 0, 0, None, data)


def _used(store: SqliteStore) -> int:
    return 32 + store._wal_frames() * sqlite_store.WAL_FRAME


def test_the_wal_file_stays_ahead_of_its_frames_and_bounded(tmp_path) -> None:
    """Synced commits alone (a store that only takes sends): once the WAL has reached two megabytes by itself,
    the file grows only by extensions, never by a commit appending to it, and never past its frames' use plus
    two megabytes."""
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    wal = tmp_path / "p.db-wal"
    data = os.urandom(1000)
    sizes = set()
    for b in range(500):  # 5 MB of rows and more of pages: several extensions
        store.apply([("put", 0, [_row(b * 10 + i, data) for i in range(10)])])
        size = wal.stat().st_size
        used = _used(store)
        assert used <= size <= max(used, min(sqlite_store.WAL_LIMIT, used + 2 * sqlite_store.WAL_HEADROOM))
        if store._wal_size:
            assert size == store._wal_size  # every commit since the first extension overwrote in place
            sizes.add(size)
    assert len(sizes) >= 2  # it grew a megabyte or more at a time, not at every commit
    store.close()
    assert not wal.exists()  # the last connection's close still checkpoints and removes it


def test_extensions_wait_for_a_commit_nobody_waits_for(tmp_path, monkeypatch) -> None:
    """Sends (synced) and settlements (unsynced) in turn: every extension lands on a settlement's commit, and
    no commit appends once the first one is done."""
    extended_in = []
    extend = sqlite_store.extend_wal
    syncs = [True]

    def spy(path, size):
        extended_in.append(syncs[-1])
        return extend(path, size)

    monkeypatch.setattr(sqlite_store, "extend_wal", spy)
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    wal = tmp_path / "p.db-wal"
    data = os.urandom(1000)
    for b in range(300):
        syncs.append(True)
        store.apply([("put", 0, [_row(b * 10 + i, data) for i in range(10)])])
        syncs.append(False)
        store.apply([("delete", 0, [b * 10])], sync=False)
        if store._wal_size:
            assert wal.stat().st_size == store._wal_size
    assert len(extended_in) >= 2
    assert not any(extended_in)
    store.close()


def test_a_store_that_wrote_little_keeps_its_wal_as_it_was(tmp_path) -> None:
    """Most stores are idle partitions: a WAL that never reached ``WAL_HEADROOM`` is never extended."""
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    for b in range(20):
        store.apply([("put", 0, [_row(b, os.urandom(1000))])])
    size = (tmp_path / "p.db-wal").stat().st_size
    assert size == _used(store) < sqlite_store.WAL_HEADROOM
    store.close()


def test_commits_after_a_checkpoint_overwrite_the_file_in_place(tmp_path) -> None:
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    wal = tmp_path / "p.db-wal"
    data = os.urandom(1000)
    for b in range(100):
        store.apply([("put", 0, [_row(b * 10 + i, data) for i in range(10)])])
    busy, frames, copied = store._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert (busy, copied) == (0, frames)
    size = wal.stat().st_size
    for b in range(100, 150):  # the WAL starts again from its beginning, inside the file it has
        store.apply([("put", 0, [_row(b * 10 + i, data) for i in range(10)])])
        assert wal.stat().st_size == size
    assert _used(store) < size // 2
    assert len(store.load().rows[0]) == 1500
    store.close()


def test_nothing_committed_is_lost_to_the_zeros_after_a_crash(tmp_path) -> None:
    """A process that commits past several extensions and dies without closing (os._exit: the WAL keeps its
    frames and the zeros after them); the next open recovers every committed row from the WAL."""
    script = textwrap.dedent(
        f"""
        import os
        from shardbus.store.base import Row
        from shardbus.store.sqlite import SqliteStore
        store = SqliteStore({str(tmp_path / "p.db")!r})
        store.apply([("create_slot", 0)])
        data = bytes(range(256)) * 4
        for b in range(250):
            store.apply([("put", 0, [Row(b * 10 + i, 0, 0, 0, None, data) for i in range(10)])])
        assert store._wal_size > 2 * {sqlite_store.WAL_HEADROOM}, store._wal_size
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    wal = tmp_path / "p.db-wal"
    assert wal.stat().st_size > 2 * sqlite_store.WAL_HEADROOM
    store = SqliteStore(tmp_path / "p.db")
    rows = store.load().rows[0]
    assert [r.seq for r in rows] == list(range(2500))
    assert all(r.data == bytes(range(256)) * 4 for r in rows)
    store.apply([("put", 0, [_row(2500, b"x")])])  # and it writes on after them
    store.close()
    store = SqliteStore(tmp_path / "p.db")
    assert len(store.load().rows[0]) == 2501
    store.close()


def test_a_failed_extension_leaves_commits_as_they_were(tmp_path, monkeypatch) -> None:
    """A WAL that cannot be extended (a full disk): commits append as without it, and no extension is tried
    again for ``WAL_RETRY`` seconds."""
    calls = []

    def fail(path, size):
        calls.append(size)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sqlite_store, "extend_wal", fail)
    store = SqliteStore(tmp_path / "p.db")
    store.apply([("create_slot", 0)])
    for b in range(300):
        store.apply([("put", 0, [_row(b * 10 + i, os.urandom(1000)) for i in range(10)])])
    assert len(calls) == 1
    assert len(store.load().rows[0]) == 3000
    store.close()
