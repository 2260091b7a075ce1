"""The bound on a receive cache: messages a front end locked for one receiver but nobody asked for go back to
their partitions after ``CACHE_HOLD`` seconds (without counting a delivery), long before their lock would expire,
so another receiver gets them. Through the official SDK over real sockets (and the core API on the same broker)."""

from __future__ import annotations

import time

from azure.servicebus import ServiceBusClient, ServiceBusMessage

import shardbus
from shardbus.cluster.supervisor import LocalCluster
from shardbus.entity.receiver import CACHE_HOLD

LOCK = 60  # seconds: the default lock duration, far longer than the cache bound


def _send_one_per_partition(client: ServiceBusClient, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        for i in range(count):  # one at a time: keyless sends go round-robin, one partition each
            sender.send_messages(ServiceBusMessage(f"{i}", message_id=str(i)))


def test_cached_messages_nobody_asked_for_go_to_another_receiver_long_before_their_lock_expires(
    conn_str, queue, receive_until
):
    q = queue(enable_partitioning=True)
    with (
        ServiceBusClient.from_connection_string(conn_str) as first,
        ServiceBusClient.from_connection_string(conn_str) as second,
    ):
        _send_one_per_partition(first, q, 3)
        with first.get_queue_receiver(q) as holder, second.get_queue_receiver(q) as other:
            # One message for the holder; the front end asked every partition, so the two others wait in the
            # holder's receive cache, locked, for a receive call that never comes.
            (held,) = holder.receive_messages(max_message_count=1, max_wait_time=5)
            started = time.monotonic()
            rest = receive_until(other, 2, limit=CACHE_HOLD + 20)
            took = time.monotonic() - started
            assert sorted(str(m) for m in [*rest, held]) == ["0", "1", "2"]
            assert took < LOCK / 2  # released by the cache bound, not by lock expiry
            # Released, not abandoned: the other receiver's delivery is still the first one.
            assert all(m.delivery_count == 0 for m in rest)
            for m in rest:
                other.complete_message(m)
            # The message the holder was given keeps its lock: it is still the holder's to settle.
            holder.complete_message(held)
        with first.get_queue_receiver(q) as check:
            assert check.receive_messages(max_message_count=3, max_wait_time=1) == []


def test_a_receiver_that_asks_again_within_the_bound_gets_its_cached_messages(ns):
    """Core API on the same broker: within CACHE_HOLD the cache serves the next receive (no partition asked);
    after it, the cache is empty and its messages are available to anyone, with no delivery counted."""
    name = "cachebound-core"
    ns.create_queue(name, enable_partitioning=True)
    for i in range(4):
        ns.send(name, _core_message(i))
    r = ns.receiver(name)
    try:
        assert len(r.receive(1, max_wait=5)) == 1
        deadline = time.monotonic() + 5
        while r.cached < 3 and time.monotonic() < deadline:  # remote partitions answer on their own time
            time.sleep(0.01)
        assert r.cached == 3
        deadline = time.monotonic() + CACHE_HOLD + 10
        while r.cached and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.cached == 0  # released: nobody asked within the bound
        other = ns.receiver(name)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += other.receive(3 - len(got), max_wait=1)
        assert len(got) == 3 and all(m.delivery_count == 1 for m in got)  # core counts this delivery: first
        other.complete(*got)
        other.close()
    finally:
        r.close()


def _core_message(i: int) -> shardbus.Message:
    return shardbus.Message(f"{i}", message_id=str(i))


def test_another_front_end_gets_what_one_front_end_cached_within_the_bound(tmp_path):
    """Two front ends (two namespaces over one data directory and one set of workers), the default 60 s lock:
    what the first one cached for a receiver that never asks again reaches the second within seconds."""
    data = tmp_path / "data"
    with LocalCluster(data, 2, "k").start() as cluster:
        first = shardbus.Namespace.open(data, partition_factory=cluster.partition)
        first.create_queue("q", enable_partitioning=True)
        second = shardbus.Namespace.open(data, partition_factory=cluster.partition)
        try:
            for i in range(3):  # one at a time: round-robin puts them on three partitions
                first.send("q", _core_message(i))
            held = first.receiver("q").receive(1, max_wait=5)
            assert len(held) == 1
            r2 = second.receiver("q")
            started = time.monotonic()
            got: list = []
            while len(got) < 2 and time.monotonic() - started < CACHE_HOLD + 20:
                got += r2.receive(2 - len(got), max_wait=1)
            assert sorted(m.message_id for m in [*held, *got]) == ["0", "1", "2"]
            assert time.monotonic() - started < LOCK / 2  # the cache bound, not the lock, let them go
            assert all(m.delivery_count == 1 for m in got)  # released: that first delivery did not count
            r2.complete(*got)
        finally:
            second.close()
            first.close()
