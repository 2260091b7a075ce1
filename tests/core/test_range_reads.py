"""Sequence-range reads (ours, behind the Spark connector): range_offsets, browse_range and complete_below.

Partition-relative sequence numbers throughout: a partition's first message is 1, and ``Message.sequence_number``
is the client-visible number that encodes the partition too (``decode_sequence_number``).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

import shardbus
from shardbus import Message
from shardbus.model.routing import decode_sequence_number, partition_for_key
from support.faults import Faults


@pytest.fixture
def cns(open_ns, clock):
    return open_ns(clock=clock)


def local(messages) -> list[int]:
    return [decode_sequence_number(m.sequence_number)[1] for m in messages]


def bodies(messages) -> list[bytes]:
    return [m.body for m in messages]


def send_n(ns, path: str, n: int, start: int = 0, **fields) -> None:
    ns.send(path, [Message(f"m{i}".encode(), **fields) for i in range(start, start + n)])


def eventually(check, timeout: float = 3.0):
    """Poll ``check`` until it returns something truthy (the maintenance thread runs every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


# --- browse_range ---------------------------------------------------------------------------------------------
def test_browse_range_is_ordered_bounded_and_limited(ns):
    ns.create_queue("q")
    send_n(ns, "q", 10)
    assert local(ns.browse_range("q", 0, 1, 100, 100)) == list(range(1, 11))
    assert bodies(ns.browse_range("q", 0, 1, 100, 3)) == [b"m0", b"m1", b"m2"]  # oldest first, at most 3
    assert local(ns.browse_range("q", 0, 4, 7, 100)) == [4, 5, 6]  # [start, end): 7 is not included
    assert local(ns.browse_range("q", 0, 9, 100, 100)) == [9, 10]
    assert ns.browse_range("q", 0, 11, 100, 100) == []  # past the end
    assert ns.browse_range("q", 0, 5, 5, 100) == []  # empty range
    assert ns.browse_range("q", 0, 7, 3, 100) == []  # inverted range
    assert ns.browse_range("q", 0, 1, 100, 0) == []  # nothing asked
    # non-destructive, and no lock is handed out: everything is still there to receive
    (m,) = ns.browse_range("q", 0, 1, 2, 1)
    assert m.lock_token is None
    assert ns.get_runtime_properties("q").active_message_count == 10
    with ns.receiver("q") as r:
        assert len(r.receive(10, max_wait=0)) == 10


def test_browse_range_reads_one_partition_of_a_partitioned_queue(ns):
    ns.create_queue("q", enable_partitioning=True)
    keys = ["k0", "k1", "k2"]
    for i in range(9):
        ns.send("q", Message(f"{i}".encode(), partition_key=keys[i % 3]))
    for key in keys:
        p = partition_for_key(key, 16)
        got = ns.browse_range("q", p, 1, 100, 100)
        assert {decode_sequence_number(m.sequence_number)[0] for m in got} == {p}
        assert local(got) == [1, 2, 3]
        assert {m.partition_key for m in got} == {key}
    with pytest.raises(shardbus.ShardbusError):
        ns.browse_range("q", 16, 1, 100, 100)  # no such partition


def test_locked_messages_are_still_browsed(ns):
    ns.create_queue("q")
    send_n(ns, "q", 3)
    with ns.receiver("q") as r:
        assert len(r.receive(2, max_wait=0)) == 2
        assert local(ns.browse_range("q", 0, 1, 100, 100)) == [1, 2, 3]


def test_scheduled_messages_are_not_readable_until_due(cns, clock):
    cns.create_queue("q")
    (scheduled,) = cns.schedule_messages("q", Message(b"later"), datetime.fromtimestamp(clock() + 60, UTC))
    send_n(cns, "q", 2)
    s = decode_sequence_number(scheduled)[1]
    assert s == 1
    assert bodies(cns.browse_range("q", 0, 1, 100, 100)) == [b"m0", b"m1"]
    ((first, end, mark, count),) = cns.range_offsets("q")
    assert (first, end, mark, count) == (2, 4, 1, 2)  # the scheduled message is neither first nor counted
    clock.advance(61)
    got = eventually(lambda: len(cns.browse_range("q", 0, 1, 100, 100)) == 3 and cns.browse_range("q", 0, 1, 100, 100))
    assert got and bodies(got) == [b"later", b"m0", b"m1"]
    assert cns.range_offsets("q") == [(1, 4, 1, 3)]


# --- range_offsets --------------------------------------------------------------------------------------------
def test_range_offsets_first_end_mark_and_count(ns):
    ns.create_queue("q", enable_partitioning=True)
    offsets = ns.range_offsets("q")
    assert len(offsets) == 16 and set(offsets) == {(1, 1, 1, 0)}  # empty: first == end, never completed
    p = partition_for_key("k", 16)
    send_n(ns, "q", 5, partition_key="k")
    offsets = ns.range_offsets("q")
    assert offsets[p] == (1, 6, 1, 5)
    assert all(o == (1, 1, 1, 0) for i, o in enumerate(offsets) if i != p)
    # count_from: readable messages at or above a partition's number (others count from 0: all of them)
    assert ns.range_offsets("q", {p: 4})[p] == (1, 6, 1, 2)
    assert ns.range_offsets("q", {p: 6})[p] == (1, 6, 1, 0)
    assert ns.range_offsets("q", {(p + 1) % 16: 3})[p] == (1, 6, 1, 5)
    # receiving and completing a message leaves a hole: first moves, end does not
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=0)
        r.complete(m)
    assert ns.range_offsets("q")[p] == (2, 6, 1, 4)
    ns.complete_below("q", {p: 4})
    assert ns.range_offsets("q")[p] == (4, 6, 4, 2)
    ns.complete_below("q", {p: 6})
    assert ns.range_offsets("q")[p] == (6, 6, 6, 0)  # all gone: first == end


@pytest.mark.embedded_only
def test_end_only_covers_messages_whose_store_write_committed(ns):
    ns.create_queue("q")
    send_n(ns, "q", 2)
    partition = ns._queue("q").partitions[0]
    store = partition._committer.store
    gate, entered = threading.Event(), threading.Event()
    real_apply = store.apply

    def held_apply(ops, sync=True):
        entered.set()
        assert gate.wait(10)
        real_apply(ops, sync)

    store.apply = held_apply
    try:
        pending = ns.submit_send("q", [Message(b"held-1"), Message(b"held-2")])
        assert entered.wait(5)
        assert not pending.done()
        assert ns.range_offsets("q") == [(1, 3, 1, 2)]  # numbered, but not stored yet: not covered by end
        assert bodies(ns.browse_range("q", 0, 1, 100, 100)) == [b"m0", b"m1"]
        gate.set()
        pending.result(5)
    finally:
        gate.set()
        store.apply = real_apply
    assert ns.range_offsets("q") == [(1, 5, 1, 4)]
    assert bodies(ns.browse_range("q", 0, 3, 5, 100)) == [b"held-1", b"held-2"]


def test_an_unavailable_partition_reports_none(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.faults.stop_partition("q", 3)
    offsets = ns.range_offsets("q")
    assert offsets[3] is None and all(o is not None for i, o in enumerate(offsets) if i != 3)
    with pytest.raises(shardbus.ServerBusy):
        ns.browse_range("q", 3, 1, 100, 100)
    ns.faults.restore_partition("q", 3)
    assert ns.range_offsets("q")[3] == (1, 1, 1, 0)


# --- complete_below -------------------------------------------------------------------------------------------
def test_complete_below_removes_readable_messages_below_the_mark_locked_ones_too(ns):
    ns.create_queue("q")
    send_n(ns, "q", 6)
    r = ns.receiver("q")
    locked = r.receive(2, max_wait=0)  # 1 and 2, locked by a receiver
    assert local(locked) == [1, 2]
    ns.complete_below("q", {0: 4})
    assert local(ns.browse_range("q", 0, 1, 100, 100)) == [4, 5, 6]
    assert ns.get_runtime_properties("q").active_message_count == 3
    for m in locked:
        with pytest.raises(shardbus.MessageLockLost):
            r.complete(m)
    (m,) = r.receive(1, max_wait=0)
    assert local([m]) == [4]
    r.close()


def test_complete_below_leaves_scheduled_messages(cns, clock):
    cns.create_queue("q")
    send_n(cns, "q", 1)
    cns.schedule_messages("q", Message(b"later"), datetime.fromtimestamp(clock() + 60, UTC))  # number 2
    send_n(cns, "q", 1, start=1)
    cns.complete_below("q", {0: 4})
    props = cns.get_runtime_properties("q")
    assert (props.active_message_count, props.scheduled_message_count) == (0, 1)
    clock.advance(61)
    got = eventually(lambda: cns.browse_range("q", 0, 1, 100, 100))
    assert bodies(got) == [b"later"] and local(got) == [2]


def test_complete_below_is_idempotent_and_cumulative(ns):
    ns.create_queue("q")
    send_n(ns, "q", 5)
    ns.complete_below("q", {0: 4})
    send_n(ns, "q", 3, start=5)  # 6..8
    ns.complete_below("q", {0: 2})  # a lower mark does nothing
    ns.complete_below("q", {0: 4})  # nor does the same mark
    assert ns.range_offsets("q") == [(4, 9, 4, 5)]
    assert local(ns.browse_range("q", 0, 1, 100, 100)) == [4, 5, 6, 7, 8]
    ns.complete_below("q", {0: 7})
    assert ns.range_offsets("q") == [(7, 9, 7, 2)]


def test_the_mark_survives_a_restart(open_ns):
    ns = open_ns()
    ns.create_queue("q", enable_partitioning=True)
    for key in ("a", "b"):
        send_n(ns, "q", 4, partition_key=key)
    pa, pb = partition_for_key("a", 16), partition_for_key("b", 16)
    assert pa != pb
    ns.complete_below("q", {pa: 3})
    ns.close()

    ns = open_ns()
    offsets = ns.range_offsets("q")
    assert offsets[pa] == (3, 5, 3, 2)
    assert offsets[pb] == (1, 5, 1, 4)
    assert local(ns.browse_range("q", pa, 1, 100, 100)) == [3, 4]
    ns.complete_below("q", {pa: 2})  # still idempotent after the restart
    assert ns.range_offsets("q")[pa] == (3, 5, 3, 2)
    send_n(ns, "q", 1, start=4, partition_key="a")  # numbering goes on where it was
    assert ns.range_offsets("q")[pa] == (3, 6, 3, 3)


# --- topics ---------------------------------------------------------------------------------------------------
def test_each_subscription_has_its_own_mark(ns):
    ns.create_topic("t")
    ns.create_subscription("t", "a")
    ns.create_subscription("t", "b")
    send_n(ns, "t", 4)
    a, b = "t/Subscriptions/a", "t/Subscriptions/b"
    assert ns.range_offsets(a) == ns.range_offsets(b) == [(1, 5, 1, 4)]
    ns.complete_below(a, {0: 3})
    assert ns.range_offsets(a) == [(3, 5, 3, 2)]
    assert ns.range_offsets(b) == [(1, 5, 1, 4)]
    assert bodies(ns.browse_range(a, 0, 1, 100, 100)) == [b"m2", b"m3"]
    assert bodies(ns.browse_range(b, 0, 1, 100, 100)) == [b"m0", b"m1", b"m2", b"m3"]
    ns.complete_below(b, {0: 5})
    assert ns.range_offsets(b) == [(5, 5, 5, 0)]
    assert ns.range_offsets(a) == [(3, 5, 3, 2)]


# --- fault hooks ----------------------------------------------------------------------------------------------
def test_fail_reads_fails_the_next_range_reads_only(ns):
    ns.create_queue("q", enable_partitioning=True)
    p = partition_for_key("k", 16)
    send_n(ns, "q", 3, partition_key="k")
    Faults(ns).fail_reads("q", p, count=2)
    for _ in range(2):
        with pytest.raises(shardbus.PartitionUnavailable):
            ns.browse_range("q", p, 1, 100, 100)
        assert ns.range_offsets("q")[p] == (1, 4, 1, 3)  # offsets still answer: the partition is healthy
    assert local(ns.browse_range("q", p, 1, 100, 100)) == [1, 2, 3]
    assert ns.browse_range("q", (p + 1) % 16, 1, 100, 100) == []  # other partitions were never affected


def test_busy_sends_refuses_the_next_sends_and_stays_healthy(ns):
    ns.create_queue("q")
    Faults(ns).busy_sends("q", 0, count=2)
    for _ in range(2):
        with pytest.raises(shardbus.ServerBusy):
            ns.send("q", Message(b"refused"))
    ns.send("q", Message(b"ok"))
    assert ns.range_offsets("q") == [(1, 2, 1, 1)]  # nothing of the refused sends was numbered or kept
    assert bodies(ns.browse_range("q", 0, 1, 100, 100)) == [b"ok"]


def test_a_scheduled_message_that_came_due_behind_the_reader_is_kept_for_receivers(cns, clock):
    """A reader passed its sequence number before it was due: later marks must not remove it unread."""
    cns.create_queue("q")
    cns.schedule_messages("q", Message(b"later"), datetime.fromtimestamp(clock() + 60, UTC))  # number 1
    send_n(cns, "q", 1)  # number 2
    cns.complete_below("q", {0: 3})
    clock.advance(61)
    send_n(cns, "q", 1, start=1)  # number 4... the reader reads [3, 5) and completes below 5
    cns.complete_below("q", {0: 5})
    with cns.receiver("q") as receiver:
        got = receiver.receive(max_count=10, max_wait=2)
    assert [m.body for m in got] == [b"later"]
