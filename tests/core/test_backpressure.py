"""A producer faster than the store meets ServerBusy, with the partition's unwritten bytes bounded, and sends are
taken again once the store has caught up; everything acknowledged is stored. The store is made slow by wrapping
its ``apply`` (an in-process partition broker)."""

from __future__ import annotations

import threading
import time

import pytest

from shardbus import Message
from shardbus.model.errors import ServerBusy

pytestmark = pytest.mark.embedded_only


def slow_store(partition, seconds: float) -> threading.Event:
    """Every store write of ``partition`` takes ``seconds`` longer until the returned event is set."""
    store = partition._committer.store
    apply, fast = store.apply, threading.Event()

    def slow(ops, sync=True):
        if not fast.is_set():
            time.sleep(seconds)
        return apply(ops, sync)

    store.apply = slow
    return fast


def test_fast_producer_meets_server_busy_and_memory_stays_bounded(ns):
    ns.create_queue("q")
    partition = ns._queue("q").partitions[0]
    partition.max_unwritten_bytes = 64 * 1024
    fast = slow_store(partition, 0.2)
    body = b"x" * 1024
    accepted, refused, highest = [], 0, 0
    for i in range(2000):  # never waits for a write: as fast as the front end can hand sends over
        future = ns.submit_send("q", Message(body=body, message_id=str(i)))
        if future.done() and isinstance(future.exception(), ServerBusy):  # refused at once, nothing staged
            refused += 1
            assert "wait for its store" in str(future.exception())
            continue
        accepted.append(future)
        highest = max(highest, partition._unwritten)
    assert refused > 0
    assert highest <= partition.max_unwritten_bytes + 2 * 1024  # the bound plus the one send it let in
    fast.set()
    for future in accepted:
        future.result(10)
    assert partition._unwritten == 0
    ns.send("q", Message(body=b"after"))  # taken again once the store caught up
    assert ns.get_runtime_properties("q").active_message_count == len(accepted) + 1


def test_one_message_larger_than_the_bound_is_taken_when_nothing_waits(ns):
    ns.create_queue("big")
    partition = ns._queue("big").partitions[0]
    partition.max_unwritten_bytes = 1024
    ns.send("big", Message(body=b"y" * 100_000))
    assert ns.get_runtime_properties("big").active_message_count == 1
