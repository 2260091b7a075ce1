"""Partition brokers in worker processes: a worker killed under load, its restart, and what clients see meanwhile
(through the official SDK over real sockets, against ``Broker(workers=N)``), plus two front ends sharing workers."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusServerBusyError

import shardbus
from shardbus.cluster.supervisor import LocalCluster
from shardbus.model.routing import partition_for_key
from shardbus.server import Broker

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cluster_broker(tmp_path):
    b = Broker(data_dir=tmp_path / "data", port=0, workers=2).start()
    yield b
    b.stop()


def _key_on(worker: int, cluster: LocalCluster, entity_id: int, partitions: int = 16) -> str:
    """A partition key whose partition lives on ``worker``."""
    for i in range(10_000):
        key = f"k{i}"
        if (entity_id + partition_for_key(key, partitions)) % len(cluster.workers) == worker:
            return key
    raise AssertionError("no key found")


def _wait_until(check, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_worker_limits_only_its_partitions_and_loses_nothing(cluster_broker):
    b = cluster_broker
    ns = b.namespace
    ns.create_queue("orders", enable_partitioning=True)
    entity_id = ns._queue("orders").entity_id
    dead_key = _key_on(0, b.cluster, entity_id)
    live_key = _key_on(1, b.cluster, entity_id)
    acknowledged: set[str] = set()
    keyless_failures = 0
    stop = threading.Event()

    def produce() -> None:
        """Keyless batches on a client of its own (SDK senders are not thread-safe)."""
        nonlocal keyless_failures
        n = 0
        with ServiceBusClient.from_connection_string(b.connection_string, retry_total=0) as own:
            with own.get_queue_sender("orders") as keyless:
                while not stop.is_set():
                    ids = [f"m{n + i}" for i in range(5)]
                    try:
                        keyless.send_messages([ServiceBusMessage(b"x", message_id=i) for i in ids])
                        acknowledged.update(ids)
                    except Exception:
                        keyless_failures += 1
                    n += 5
                    time.sleep(0.01)

    with ServiceBusClient.from_connection_string(b.connection_string, retry_total=0) as client:
        with client.get_queue_sender("orders") as sender:
            producer = threading.Thread(target=produce)
            producer.start()
            time.sleep(0.5)
            b.cluster.kill(0)
            _wait_until(lambda: ns.availability("orders") == "Limited")
            # a key on the dead worker: ServerBusy until it is back; a key on the live one works
            with pytest.raises(ServiceBusServerBusyError):
                sender.send_messages(ServiceBusMessage(b"k", partition_key=dead_key, message_id="dead-key"))
            sender.send_messages(ServiceBusMessage(b"k", partition_key=live_key, message_id="live-key"))
            acknowledged.add("live-key")
            # management acts on every partition, so it waits for the dead ones
            with pytest.raises(shardbus.ServerBusy):
                ns.update_queue("orders", max_delivery_count=5)
            # receives keep flowing from the live partitions meanwhile
            completed: set[str] = set()
            with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
                got = receiver.receive_messages(max_message_count=20, max_wait_time=2)
                assert got
                for m in got:
                    receiver.complete_message(m)
                    completed.add(str(m.message_id))
            # the supervisor restarts the worker; its partitions reload from their stores
            _wait_until(lambda: ns.availability("orders") == "Available")
            time.sleep(0.3)
            stop.set()
            producer.join()
            sender.send_messages(ServiceBusMessage(b"k", partition_key=dead_key, message_id="dead-key-later"))
            acknowledged.add("dead-key-later")

        assert keyless_failures == 0  # keyless sends always found a live partition
        remaining: list[str] = []
        with client.get_queue_receiver("orders", max_wait_time=2) as receiver:
            while batch := receiver.receive_messages(max_message_count=200, max_wait_time=2):
                for m in batch:
                    remaining.append(str(m.message_id))
                    receiver.complete_message(m)
    # nothing acknowledged is missing and nothing completed came back
    assert completed.isdisjoint(remaining)
    assert set(remaining) | completed == acknowledged
    # A batch in flight to the worker when it died may have been stored before the worker went; its failover
    # stored it on another partition too, and the first copy was taken back before the partition came back.
    duplicates = len(remaining) - len(set(remaining))
    assert duplicates == 0


def test_remote_partitions_survive_a_broker_restart(tmp_path):
    data = tmp_path / "data"
    with Broker(data_dir=data, port=0, workers=2) as b:
        b.namespace.create_queue("q", enable_partitioning=True)
        with ServiceBusClient.from_connection_string(b.connection_string) as client:
            with client.get_queue_sender("q") as sender:
                sender.send_messages([ServiceBusMessage(f"{i}", message_id=str(i)) for i in range(50)])
    with Broker(data_dir=data, port=0, workers=3) as b:  # another worker count: partitions move, data stays
        with ServiceBusClient.from_connection_string(b.connection_string) as client:
            with client.get_queue_receiver("q", max_wait_time=2) as receiver:
                ids = []
                while batch := receiver.receive_messages(max_message_count=50, max_wait_time=2):
                    ids += [str(m.message_id) for m in batch]
                    for m in batch:
                        receiver.complete_message(m)
        assert sorted(ids, key=int) == [str(i) for i in range(50)]


def test_a_message_cached_by_one_front_end_is_invisible_to_another_until_its_lock_expires(tmp_path):
    """Two front ends (two namespaces over one data directory and one set of workers): the service's
    low-volume behaviour of receive caches."""
    data = tmp_path / "data"
    with LocalCluster(data, 2, "k").start() as cluster:
        first = shardbus.Namespace.open(data, partition_factory=cluster.partition)
        first.create_queue("q", enable_partitioning=True, lock_duration=timedelta(seconds=5))
        second = shardbus.Namespace.open(data, partition_factory=cluster.partition)
        try:
            for i in range(3):  # one at a time: round-robin puts them on three partitions
                first.send("q", shardbus.Message(f"{i}", message_id=str(i)))
            r1 = first.receiver("q")
            got = r1.receive(1, max_wait=2)
            assert len(got) == 1
            _wait_until(lambda: r1.cached >= 1)  # the others wait in the first front end's cache, locked
            r2 = second.receiver("q")
            seen = [m.message_id for m in r2.receive(3, max_wait=0.5)]
            assert seen == []  # locked by the first front end's cache
            time.sleep(5.5)  # the cached locks expire; the second front end now gets them
            seen = [m.message_id for m in r2.receive(3, max_wait=3)]
            assert set(seen) == {"0", "1", "2"}  # including the one the first receiver held and let expire
        finally:
            second.close()
            first.close()


def test_keyed_send_to_a_down_partition_is_server_busy_and_nothing_is_half_done(tmp_path):
    data = tmp_path / "data"
    with LocalCluster(data, 2, "k", restart=False).start() as cluster:
        ns = shardbus.Namespace.open(data, partition_factory=cluster.partition)
        try:
            ns.create_queue("q", enable_partitioning=True)
            entity_id = ns._queue("q").entity_id
            key = _key_on(1, cluster, entity_id)
            ns.send("q", shardbus.Message(b"before", partition_key=key))
            cluster.kill(1)
            _wait_until(lambda: ns.availability("q") == "Limited")
            with pytest.raises(shardbus.ServerBusy):
                ns.send("q", shardbus.Message(b"during", partition_key=key))
            for _ in range(40):
                ns.send("q", shardbus.Message(uuid.uuid4().hex))  # keyless: other partitions take them
            with pytest.raises(shardbus.ServerBusy):
                ns.update_queue("q", max_delivery_count=4)
        finally:
            ns.close()
