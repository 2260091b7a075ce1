"""store/sqlite.py: a background checkpoint waits out the disk's bad moments (a synced commit of ``SLOW_COMMIT``
or more, any store's, marks the disk slow for ``CHECKPOINT_HOLD``), ``CHECKPOINT_DEFER`` at most, and never while
its store closes; unsynced commits mark nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardbus.store import sqlite as sqlite_store
from shardbus.store.sqlite import SqliteStore


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_BYTES", 1)  # every commit starts a checkpoint
    monkeypatch.setattr(sqlite_store, "_disk_slow_until", 0.0)
    s = SqliteStore(tmp_path / "p00.db")
    yield s
    s.close()


def _checkpoint(store: SqliteStore):
    store.apply([("meta", "k", 1)], sync=False)
    assert store._checkpoint is not None
    return store._checkpoint


def test_a_slow_synced_commit_marks_the_disk_slow_and_an_unsynced_one_does_not(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "SLOW_COMMIT", 0.0)  # every commit counts as slow
    store.apply([("meta", "a", 1)], sync=False)
    assert sqlite_store._disk_slow_until == 0.0
    before = time.monotonic()
    store.apply([("meta", "a", 2)], sync=True)
    assert sqlite_store._disk_slow_until >= before + sqlite_store.CHECKPOINT_HOLD


def test_a_checkpoint_waits_until_the_bad_moment_has_passed(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "_disk_slow_until", time.monotonic() + 0.4)
    checkpoint = _checkpoint(store)
    time.sleep(0.2)
    assert not checkpoint.done()  # still waiting for the disk
    checkpoint.result(timeout=5)


def test_a_checkpoint_waits_no_longer_than_its_bound(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_DEFER", 0.3)
    monkeypatch.setattr(sqlite_store, "_disk_slow_until", time.monotonic() + 3600)  # a disk slow for ever
    started = time.monotonic()
    _checkpoint(store).result(timeout=5)
    assert 0.25 <= time.monotonic() - started < 3


def test_closing_does_not_wait_for_a_deferred_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_BYTES", 1)
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_DEFER", 3600.0)
    monkeypatch.setattr(sqlite_store, "_disk_slow_until", time.monotonic() + 3600)
    store = SqliteStore(tmp_path / "p00.db")
    checkpoint = _checkpoint(store)
    time.sleep(0.05)
    started = time.monotonic()
    store.close()
    assert checkpoint.done() and time.monotonic() - started < 3
    assert not (tmp_path / "p00.db-wal").exists()  # the last connection closed emptied the WAL, as always
