"""A session-enabled slot's backlog on disk (issue 25): with a read-ahead window of 2 and no memory budget, the
partition broker keeps only a window of each session in memory and a bounded table of sessions, reads the rest by
session from the store's session index, and still hands sessions out oldest head first, FIFO per session, across
restarts, on both stores."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from test_store_adapters import Kit, kit, pg_dsn  # noqa: F401  (fixtures)

from shardbus.model.message import Message, SubQueue
from shardbus.partition import broker as broker_module
from shardbus.partition import window as window_module
from shardbus.partition.broker import PartitionBroker, PartitionConfig, SlotSettings

LOCAL = 0xFFFFFFFFFF


def _broker(kit: Kit) -> PartitionBroker:  # noqa: F811
    settings = SlotSettings(path="orders", requires_session=True, max_delivery_count=5)
    config = PartitionConfig(path="orders", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, kit.factory, time.time)
    broker.read_ahead = 2
    broker.memory_budget = 0  # nothing beyond the window
    broker.configure_slot(0, settings)
    broker.start()
    broker.create_slot(0, settings).result(30)
    return broker


def _send(broker: PartitionBroker, messages: list[tuple[str, str]], **fields) -> list[int]:
    items = [(None, [(0, Message(body.encode(), session_id=sid, **fields))]) for sid, body in messages]
    return [s & LOCAL for s in broker.enqueue(items).result(30)]


def _resident(broker: PartitionBroker) -> int:
    return len(broker._queues[(0, SubQueue.MAIN)].entries)


def _drain(broker: PartitionBroker, session_id: str | None) -> tuple[str, list[bytes]] | None:
    accepted = broker.accept_session(0, session_id)
    if accepted is None:
        return None
    sid, token, _ = accepted
    got: list[bytes] = []
    while batch := broker.lock_session_messages(0, sid, token, 3):
        got += [m.body for m in batch]
        assert _resident(broker) <= 2 + 3 + 3  # window, locked, one refill of the session
        broker.complete(0, [m.lock_token for m in batch]).result(30)
    broker.release_session(0, sid, token)
    return sid, got


def test_sessions_on_disk_come_out_oldest_head_first_and_in_order(kit: Kit) -> None:  # noqa: F811
    broker = _broker(kit)
    try:
        sends = [("c", "c0"), ("a", "a0"), ("b", "b0")]
        sends += [(s, f"{s}{i}") for i in range(1, 8) for s in "abc"]
        _send(broker, sends)
        assert _resident(broker) <= 2
        assert broker.runtime(0).active_message_count == 24
        sid, got = _drain(broker, None)
        assert sid == "c" and got == [f"c{i}".encode() for i in range(8)]
        broker.stop()
        broker.start()
        assert _resident(broker) == 0 and broker._queues[(0, SubQueue.MAIN)].sessions == {}
        assert broker.runtime(0).active_message_count == 16
        assert sorted(broker.list_sessions(0)) == ["a", "b"]
        peeked = broker.peek(0, SubQueue.MAIN, 0, 5, session_id="b")
        assert [m.body for m in peeked] == [b"b0", b"b1", b"b2", b"b3", b"b4"]
        assert [m.body for m in broker.peek(0, SubQueue.MAIN, 0, 3)] == [b"a0", b"b0", b"a1"]
        assert _drain(broker, "b") == ("b", [f"b{i}".encode() for i in range(8)])
        assert _drain(broker, None) == ("a", [f"a{i}".encode() for i in range(8)])
        assert _drain(broker, None) is None
        assert broker.runtime(0).active_message_count == 0
    finally:
        broker.stop()


def test_fifo_per_session_across_the_window_with_abandon_and_restart(kit: Kit) -> None:  # noqa: F811
    broker = _broker(kit)
    try:
        _send(broker, [("s", f"m{i}") for i in range(10)])
        sid, token, _ = broker.accept_session(0, None)
        first = broker.lock_session_messages(0, sid, token, 3)
        assert [m.body for m in first] == [b"m0", b"m1", b"m2"]
        broker.abandon(0, first[0].lock_token).result(30)
        broker.complete(0, [first[1].lock_token]).result(30)
        _send(broker, [("s", "m10")])  # joins the disk part behind the rest
        broker.release_session(0, sid, token)
        broker.stop()
        broker.start()
        sid, got = _drain(broker, None)
        assert got == [b"m0", b"m2", *(f"m{i}".encode() for i in range(3, 11))]
    finally:
        broker.stop()


def test_more_sessions_than_the_table_holds(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(window_module, "SESSION_TABLE", 3)
    monkeypatch.setattr(broker_module, "SESSION_TABLE", 3)
    broker = _broker(kit)
    try:
        _send(broker, [(f"s{i:02}", f"x{i}") for i in range(12)] + [(f"s{i:02}", f"y{i}") for i in range(12)])
        q = broker._queues[(0, SubQueue.MAIN)]
        assert len(q.sessions) <= 3
        order = []
        held = []
        for _ in range(12):  # every session, oldest head first, while the earlier ones stay locked
            sid, token, _ = broker.accept_session(0, None)
            order.append(sid)
            held.append((sid, token))
            assert len(q.sessions) <= 3 + len(held)
        assert order == [f"s{i:02}" for i in range(12)]
        assert broker.accept_session(0, None) is None
        for sid, token in held:
            got = broker.lock_session_messages(0, sid, token, 5)
            assert [m.body for m in got] == [f"x{int(sid[1:])}".encode(), f"y{int(sid[1:])}".encode()]
            broker.complete(0, [m.lock_token for m in got]).result(30)
            broker.release_session(0, sid, token)
        assert broker.accept_session(0, None) is None and len(q.sessions) == 0
    finally:
        broker.stop()


def test_deferred_and_scheduled_messages_of_a_session_on_disk(kit: Kit) -> None:  # noqa: F811
    broker = _broker(kit)
    try:
        _send(broker, [("s", f"m{i}") for i in range(5)])
        soon = datetime.now(UTC) + timedelta(seconds=1)
        (scheduled,) = _send(broker, [("s", "later")], scheduled_enqueue_time=soon)
        sid, token, _ = broker.accept_session(0, "s")
        got = broker.lock_session_messages(0, sid, token, 2)
        broker.defer(0, got[0].lock_token).result(30)
        broker.complete(0, [got[1].lock_token]).result(30)
        deferred = got[0].sequence_number
        broker.release_session(0, sid, token)
        broker.stop()
        broker.start()
        assert _resident(broker) == 0
        peeked = broker.peek(0, SubQueue.MAIN, 0, 10, session_id="s")
        assert [m.body for m in peeked] == [b"m0", b"m2", b"m3", b"m4", b"later"]
        sid, token, _ = broker.accept_session(0, "s")
        (again,), _ = broker.receive_deferred(0, SubQueue.MAIN, [deferred & LOCAL], True, (sid, token))
        assert again.body == b"m0"
        broker.complete(0, [again.lock_token]).result(30)
        time.sleep(1.2)
        broker.tick()
        got = []
        while batch := broker.lock_session_messages(0, sid, token, 10):
            got += batch
            broker.complete(0, [m.lock_token for m in batch]).result(30)
        assert [m.body for m in got] == [b"m2", b"m3", b"m4", b"later"]
        assert got[-1].sequence_number & LOCAL == scheduled
        assert broker.runtime(0).active_message_count == 0
    finally:
        broker.stop()


def test_session_lock_expiry_and_ttl_on_disk(kit: Kit) -> None:  # noqa: F811
    broker = _broker(kit)
    try:
        _send(broker, [("s", "short")], time_to_live=timedelta(milliseconds=300))
        _send(broker, [("s", f"m{i}") for i in range(4)])
        time.sleep(0.5)
        broker.tick()  # the expiry index: the expired one goes although it is on disk
        assert broker.runtime(0).active_message_count == 4
        sid, token, _ = broker.accept_session(0, None)
        got = broker.lock_session_messages(0, sid, token, 3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        q, session = broker._held_session(0, sid, token, int(time.time() * 1000))
        session.locked_until = 0  # the session lock expires
        for entry in [broker._locks[m.lock_token.int] for m in got]:
            entry.msg.locked_until_ms = 0
        q.session_locks = [(0, sid, token)]
        assert broker.accept_session(0, None)[0] == "s"  # back, counting a delivery
        (first,) = broker.peek(0, SubQueue.MAIN, 0, 1, session_id="s")
        assert first.body == b"m0" and first.delivery_count == 1
    finally:
        broker.stop()


def test_a_file_written_before_the_session_index_gets_it_once(tmp_path) -> None:
    """An older SQLite file (no ``session`` column, no ``_ses`` index) opens: its session-enabled slots' rows get
    their sessions (read from their records) at the first start, and their backlog is read by session."""
    import sqlite3

    from shardbus.store.sqlite import SESSIONS_KEPT, SqliteStore

    path = tmp_path / "p01.db"
    settings = SlotSettings(path="orders", requires_session=True, max_delivery_count=5)
    config = PartitionConfig(path="orders", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, lambda: SqliteStore(path), time.time)
    broker.read_ahead, broker.memory_budget = 2, 0
    broker.configure_slot(0, settings)
    broker.start()
    broker.create_slot(0, settings).result(30)
    _send(broker, [("b", "b0"), ("a", "a0"), ("b", "b1"), ("a", "a1"), ("b", "b2")])
    broker.stop()
    db = sqlite3.connect(path)  # as an earlier version wrote it
    db.executescript(
        f"DROP INDEX m0_ses; ALTER TABLE m0 DROP COLUMN session; DELETE FROM meta WHERE key = '{SESSIONS_KEPT}';"
    )
    db.close()
    broker.start()
    try:
        assert _drain(broker, None) == ("b", [b"b0", b"b1", b"b2"])
        assert _drain(broker, "a") == ("a", [b"a0", b"a1"])
    finally:
        broker.stop()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = ?", (SESSIONS_KEPT,)).fetchone() == (1,)
    db.close()


def test_a_released_session_gives_what_it_read_back_to_disk(kit: Kit) -> None:  # noqa: F811
    broker = _broker(kit)
    try:
        _send(broker, [(s, f"{s}{i}") for s in "abcd" for i in range(6)])
        for sid in "abcd":  # each receiver reads a batch of its session, takes one, and goes
            _, token, _ = broker.accept_session(0, sid)
            (m,) = broker.lock_session_messages(0, sid, token, 1)
            broker.complete(0, [m.lock_token]).result(30)
            broker.release_session(0, sid, token)
        _send(broker, [("e", "e0")]).pop()  # a write after the releases: what they parked leaves memory
        time.sleep(0.2)
        assert _resident(broker) <= 2 + 1
        for sid in "abcd":
            assert _drain(broker, sid) == (sid, [f"{sid}{i}".encode() for i in range(1, 6)])
    finally:
        broker.stop()


def test_a_postgres_schema_written_before_the_session_index_gets_it_once(kit: Kit) -> None:  # noqa: F811
    if kit.backend != "postgres":
        pytest.skip("the SQLite file's migration has its own test")
    import psycopg

    from shardbus.store.postgres import SESSIONS_KEPT

    broker = _broker(kit)
    _send(broker, [("b", "b0"), ("a", "a0"), ("b", "b1"), ("a", "a1"), ("b", "b2")])
    broker.stop()
    with psycopg.connect(kit.dsn, autocommit=True) as conn:  # as an earlier version wrote it
        conn.execute(f'DROP INDEX "{kit.schema}".m0_ses')
        conn.execute(f'ALTER TABLE "{kit.schema}".m0 DROP COLUMN session')
        conn.execute(f'DELETE FROM "{kit.schema}".meta WHERE key = %s', (SESSIONS_KEPT,))
    broker.start()
    try:
        assert _drain(broker, None) == ("b", [b"b0", b"b1", b"b2"])
        assert _drain(broker, "a") == ("a", [b"a0", b"a1"])
    finally:
        broker.stop()


def test_only_session_enabled_slots_have_the_session_index(tmp_path) -> None:
    """Sends without sessions pay nothing for the index: their tables do not have it."""
    import sqlite3

    from shardbus.store.sqlite import SqliteStore

    path = tmp_path / "p01.db"
    config = PartitionConfig(path="t", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, lambda: SqliteStore(path), time.time)
    plain, sessions = SlotSettings(path="t/plain"), SlotSettings(path="t/sessions", requires_session=True)
    broker.start()
    try:
        broker.create_slot(1, plain).result(30)
        broker.create_slot(2, sessions).result(30)
        broker.enqueue([(None, [(1, Message(b"x")), (2, Message(b"y", session_id="s"))])]).result(30)
    finally:
        broker.stop()
    db = sqlite3.connect(path)
    indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "m2_ses" in indexes and "m1_ses" not in indexes
    assert db.execute("SELECT session FROM m2").fetchall() == [("s",)]
    db.close()
