"""How many rows one read of the store window brings (partition/window.py): a session's read-ahead and the
scheduled messages' one are bounded by the bytes they read, as the queue's read-ahead is, not by the largest
message the entity allows (a queue allowing 100 MB messages read its 1 KB ones one row per query). The stores'
``scan_session`` and ``scan_due`` take the same ``max_bytes`` as ``scan``; a broker over a counting wrapper of a
real store shows how many queries a drain costs. Both stores."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from test_store_adapters import Kit, _row, kit, pg_dsn, store  # noqa: F401  (fixtures)

from shardbus.model.message import Message, SubQueue
from shardbus.partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from shardbus.store.base import MessageStore

LARGE = 100 << 20  # Premium's largest message: READ_BATCH_BYTES // LARGE is 0


def test_scan_session_stops_once_its_rows_hold_max_bytes(store: MessageStore) -> None:  # noqa: F811
    rows = [_row(s, b"x" * 1000) for s in range(1, 11)]
    store.apply([("create_slot", 0), ("put", 0, rows), ("sessions", 0, [(s, "s") for s in range(1, 11)])])
    assert [r[0] for r in store.scan_session(0, "s", 0, 0, 100, 10, 3500)] == [1, 2, 3, 4]
    assert [r[0] for r in store.scan_session(0, "s", 0, 5, 100, 3, 1 << 20)] == [5, 6, 7]
    assert [r[0] for r in store.scan_session(0, "s", 0, 9, 100, 10, 1 << 20)] == [9, 10]
    assert [r[0] for r in store.scan_session(0, "s", 0, 0, 100, 10, 1)] == [1]  # at least one row
    assert [r[0] for r in store.scan_session(0, "s", 0, 0, 100, 10)] == list(range(1, 11))


def test_scan_due_stops_once_its_rows_hold_max_bytes(store: MessageStore) -> None:  # noqa: F811
    rows = [_row(s, b"x" * 1000, state=2) for s in range(1, 11)]
    store.apply([("create_slot", 0), ("put", 0, rows), ("due", 0, [(s, 1000 - s) for s in range(1, 11)])])
    assert [r[0] for r in store.scan_due(0, (0, 0), 10, 3500)] == [10, 9, 8, 7]
    assert [(r[0], r[6]) for r in store.scan_due(0, (993, 7), 2, 1 << 20)] == [(6, 994), (5, 995)]
    assert [r[0] for r in store.scan_due(0, (0, 0), 10, 1)] == [10]
    assert [r[0] for r in store.scan_due(0, (0, 0), 10)] == list(range(10, 0, -1))


class _Counting:
    """A real store whose ``scan_session`` and ``scan_due`` calls are counted (what the broker reads, as it is)."""

    def __init__(self, inner: MessageStore, calls: dict[str, int]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def scan_session(self, *args: Any) -> Any:
        self._calls["scan_session"] += 1
        return self._inner.scan_session(*args)

    def scan_due(self, *args: Any) -> Any:
        self._calls["scan_due"] += 1
        return self._inner.scan_due(*args)


def _broker(kit: Kit, clock: Callable[[], float], calls: dict[str, int], **settings: Any) -> PartitionBroker:  # noqa: F811
    slot = SlotSettings(path="orders", **settings)
    config = PartitionConfig(path="orders", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=LARGE)
    broker = PartitionBroker(config, lambda: _Counting(kit.factory(), calls), clock)
    broker.read_ahead = 64
    broker.memory_budget = 0  # nothing beyond the window
    broker.configure_slot(0, slot)
    broker.start()
    broker.create_slot(0, slot).result(30)
    return broker


def test_a_sessions_backlog_on_disk_is_read_many_rows_to_a_query(kit: Kit, clock) -> None:  # noqa: F811
    calls = {"scan_session": 0, "scan_due": 0}
    broker = _broker(kit, clock, calls, requires_session=True)
    try:
        broker.enqueue([(None, [(0, Message(b"x" * 1000, session_id="s"))]) for _ in range(200)]).result(30)
        broker.stop()
        broker.start()  # nothing resident
        sid, token, _ = broker.accept_session(0, "s")
        calls["scan_session"] = 0
        got = 0
        while batch := broker.lock_session_messages(0, sid, token, 50):
            got += len(batch)
            broker.complete(0, [m.lock_token for m in batch]).result(30)
        assert got == 200
        assert calls["scan_session"] <= 200 // 64 + 2  # one row per query made it 200
    finally:
        broker.stop()


def test_scheduled_messages_on_disk_are_read_many_rows_to_a_query(kit: Kit, clock) -> None:  # noqa: F811
    calls = {"scan_session": 0, "scan_due": 0}
    broker = _broker(kit, clock, calls)
    try:
        due = datetime.fromtimestamp(clock() + 60, UTC)
        messages = [Message(b"x" * 1000, scheduled_enqueue_time=due) for _ in range(200)]
        broker.enqueue([(None, [(0, m)]) for m in messages]).result(30)
        broker.stop()
        broker.start()  # nothing resident
        assert broker.runtime(0).scheduled_message_count == 200
        clock.advance(61)
        calls["scan_due"] = 0
        got = 0
        while batch := broker.lock_messages(0, SubQueue.MAIN, 50):
            got += len(batch)
            broker.complete(0, [m.lock_token for m in batch]).result(30)
            broker.tick()
        assert got == 200
        assert calls["scan_due"] <= 200 // 64 + 2
    finally:
        broker.stop()
