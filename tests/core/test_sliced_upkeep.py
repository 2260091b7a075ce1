"""The partition's upkeep tick in slices (issue #28, point 6): it holds the partition lock for a bounded amount of
work at a time and reads the expiry index outside it, and still does exactly what one long tick did: every due
lock ends, every due scheduled message activates, every expired message goes, in one ``tick()``; a send made
visible while the scan is paused keeps its expiry; and rows read before a write was stored are read again."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from shardbus.model.message import Message, SubQueue
from shardbus.partition import broker as broker_module
from shardbus.partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from shardbus.partition.memory import READ_BATCH
from shardbus.store.sqlite import SqliteStore

MAIN, DLQ = int(SubQueue.MAIN), int(SubQueue.DEAD_LETTER)
LOCAL = 0xFFFFFFFFFF


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingLock:
    """The partition's lock, counting how often it is taken (each ``with`` is one hold)."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self.holds = 0

    def __enter__(self):
        self.lock.acquire()
        self.holds += 1
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()

    def acquire(self, *a, **kw):
        self.holds += 1
        return self.lock.acquire(*a, **kw)

    def release(self) -> None:
        self.lock.release()

    def _is_owned(self) -> bool:
        return self.lock._is_owned()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make(tmp_path, clock):
    opened: list[PartitionBroker] = []

    def factory(**settings) -> PartitionBroker:
        config = PartitionConfig(path="q", partition_id=1, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
        broker = PartitionBroker(config, lambda: SqliteStore(tmp_path / "p01.db"), clock)
        slot = SlotSettings(path="q", max_delivery_count=10, **settings)
        broker.configure_slot(0, slot)
        broker.start()
        broker.create_slot(0, slot).result(30)
        opened.append(broker)
        return broker

    yield factory
    for b in opened:
        b.stop()


def send(broker: PartitionBroker, n: int, **fields) -> list[int]:
    items = [(None, [(0, Message(f"m{i}".encode(), **fields))]) for i in range(n)]
    return [s & LOCAL for s in broker.enqueue(items).result(30)]


def count(broker: PartitionBroker, queue: int) -> int:
    q = broker._queues.get((0, queue))
    return 0 if q is None else q.count


def test_due_locks_beyond_a_slice_all_end_in_one_tick_with_the_lock_let_go_between(make, clock) -> None:
    broker = make(lock_duration_ms=10_000)
    n = 3 * broker_module.TICK_SLICE + 5
    send(broker, n)
    assert len(broker.lock_messages(0, MAIN, n)) == n
    clock.now += 11
    lock = broker._lock = CountingLock(broker._lock)
    broker.tick()
    assert lock.holds >= n // broker_module.TICK_SLICE + 1  # one hold per slice at least
    again = broker.lock_messages(0, MAIN, n)
    assert len(again) == n and {m.delivery_count for m in again} == {2}


def test_due_scheduled_messages_beyond_a_slice_all_activate_in_one_tick(make, clock) -> None:
    broker = make()
    n = 2 * broker_module.TICK_SLICE + 7
    due = datetime.fromtimestamp(clock.now + 30, UTC)
    items = [(None, [(0, Message(f"s{i}".encode(), scheduled_enqueue_time=due))]) for i in range(n)]
    broker.enqueue(items).result(30)
    assert broker.lock_messages(0, MAIN, n) == []
    clock.now += 31
    broker.tick()
    q = broker._queues[(0, MAIN)]
    assert len(q.ready) == n and q.scheduled_count == 0


def test_expiry_beyond_a_batch_all_goes_in_one_tick_read_outside_the_lock(make, clock) -> None:
    broker = make(dead_letter_on_expiration=True)
    n = 2 * READ_BATCH + 3
    send(broker, n, time_to_live=timedelta(seconds=1))
    clock.now += 2
    unlocked_reads = []
    store = broker._store
    scan = store.scan_expiring

    def watched(*args):
        unlocked_reads.append(not broker._lock._is_owned())
        return scan(*args)

    store.scan_expiring = watched
    broker.tick()
    assert count(broker, MAIN) == 0 and count(broker, DLQ) == n
    assert len(unlocked_reads) >= 3 and any(unlocked_reads)


def test_a_send_made_visible_while_the_scan_is_paused_keeps_its_expiry(make, clock) -> None:
    broker = make(dead_letter_on_expiration=True)
    send(broker, READ_BATCH + 2, time_to_live=timedelta(seconds=1))
    clock.now += 2
    store = broker._store
    scan = store.scan_expiring
    sent: list[int] = []

    def send_after_the_last_read(*args):
        rows = scan(*args)
        if len(rows) < READ_BATCH and not sent and not broker._lock._is_owned():
            # made visible after the scan's last read: the scan cannot meet its row, only its next_expiry
            done = threading.Thread(target=lambda: sent.extend(send(broker, 1, time_to_live=timedelta(seconds=5))))
            done.start()
            done.join(30)
        return rows

    store.scan_expiring = send_after_the_last_read
    broker.tick()
    assert sent and count(broker, DLQ) == READ_BATCH + 2
    store.scan_expiring = scan
    clock.now += 6
    broker.tick()
    assert count(broker, MAIN) == 0 and count(broker, DLQ) == READ_BATCH + 3


def test_rows_read_before_a_write_was_stored_are_read_again(make, clock) -> None:
    """A deferred message on disk, past its time, is received (and deleted) between the scan's read and its apply:
    the stale row must not bring it back into the dead-letter queue."""
    broker = make(dead_letter_on_expiration=True)
    (seq,) = send(broker, 1, time_to_live=timedelta(seconds=1))
    (msg,) = broker.lock_messages(0, MAIN, 1)
    broker.defer(0, msg.lock_token).result(30)
    broker._committer.wait_idle(30)
    clock.now += 2
    store = broker._store
    scan = store.scan_expiring
    taken: list = []

    def receive_after_reading(*args):
        rows = scan(*args)
        if rows and not taken and not broker._lock._is_owned():
            got, future = broker.receive_deferred(0, MAIN, [seq], lock=False)
            future.result(30)
            taken.extend(got)
        return rows

    store.scan_expiring = receive_after_reading
    broker.tick()
    assert [m.body for m in taken] == [b"m0"]
    assert count(broker, MAIN) == 0 and count(broker, DLQ) == 0
