"""A worker answers ``lock_messages`` with records made from the locked messages themselves, under the partition's
lock (``PartitionBroker.lock_messages_as``, ``worker.WorkerConnection._lock_messages``), not from copies: what the
front end gets through a real socket is what a local broker's ``lock_messages`` gives, and settles the same way."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from shardbus.cluster import wire
from shardbus.cluster.remote import ClusterClient, RemotePartition
from shardbus.cluster.worker import Worker
from shardbus.model.message import Message, MessageState
from shardbus.partition.broker import PartitionBroker
from shardbus.partition.handle import PartitionSpec
from shardbus.partition.values import PartitionConfig, SlotSettings
from shardbus.runtime import new_event_loop
from shardbus.store.sqlite import SqliteStore

KEY = "ns/entities/1/p00.db"
CONFIG = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)


def _messages() -> list[Message]:
    return [
        Message(b"a" * 10, message_id="a", application_properties={"n": 1, "s": "x"}, subject="first"),
        Message(b"b" * 2000, message_id="b", annotations={"x-opt-custom": "v"}, correlation_id="c"),
        Message(b"", message_id="c", session_id=None, content_type="text/plain"),
    ]


def _seen(m: Message) -> tuple:
    return (m.message_id, m.body, m.application_properties, m.annotations, m.subject, m.delivery_count, m.state)


def test_a_brokers_records_of_locked_messages_are_its_copies_fields(tmp_path: Path) -> None:
    broker = PartitionBroker(CONFIG, lambda: SqliteStore(tmp_path / "p.db"), time.time)
    broker.configure_slot(0, SlotSettings("q"))
    broker.start()
    try:
        broker.create_slot(0, SlotSettings("q")).result(5)
        broker.enqueue([(None, [(0, m)]) for m in _messages()]).result(5)
        records = broker.lock_messages_as(0, 0, 2, wire.record_of)
        locked = wire.messages_of(wire.unpack_frame(wire.pack_frame(records)))
        assert [m.message_id for m in locked] == ["a", "b"]
        assert all(m.lock_token is not None and m.delivery_count == 1 for m in locked)
        assert locked[0].application_properties == {"n": 1, "s": "x"} and locked[0].state is MessageState.ACTIVE
        # the rest, as lock_messages gives it: a copy
        (rest,) = broker.lock_messages(0, 0, 10)
        assert rest.message_id == "c" and type(rest) is Message
        broker.complete(0, [m.lock_token for m in locked] + [rest.lock_token]).result(5)
        assert broker.lock_messages(0, 0, 10) == []
    finally:
        broker.stop()


def test_messages_locked_through_a_worker_are_what_a_local_broker_gives(tmp_path: Path) -> None:
    local = PartitionBroker(CONFIG, lambda: SqliteStore(tmp_path / "local.db"), time.time)
    worker = Worker(tmp_path / "worker", "k")
    loop = new_event_loop()
    ready = threading.Event()
    port: list[int] = []
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(worker.serve("127.0.0.1", 0, lambda b: (port.append(b), ready.set()))),
        daemon=True,
    )
    thread.start()
    assert ready.wait(10)
    client = ClusterClient("k", time.time, tick_interval=1.0)
    try:
        link = client.link("0", ("127.0.0.1", port[0]))
        assert client.wait_connected(10)
        remote = RemotePartition(link, KEY, PartitionSpec(1, CONFIG, tmp_path / KEY, time.time, lambda: None))
        got = {}
        for name, p in (("local", local), ("remote", remote)):
            p.configure_slot(0, SlotSettings("q"))
            p.start()
            p.create_slot(0, SlotSettings("q")).result(5)
            p.enqueue([(None, [(0, m)]) for m in _messages()]).result(5)
            first = p.submit_lock_messages(0, 0, 2).result(5)
            second = p.submit_lock_messages(0, 0, 10).result(5)
            got[name] = [_seen(m) for m in first + second]
            # changing what was handed out changes nothing in the partition
            first[0].application_properties["n"] = 99
            p.abandon(0, first[0].lock_token).result(5)
            (again,) = p.submit_lock_messages(0, 0, 10).result(5)
            assert again.application_properties == {"n": 1, "s": "x"} and again.delivery_count == 2
            p.complete(0, [again.lock_token, first[1].lock_token, second[0].lock_token]).result(5)
            assert p.submit_lock_messages(0, 0, 10).result(5) == []
        assert got["remote"] == got["local"]
        remote.close()
    finally:
        local.stop()
        client.close()
        worker.call_soon(worker._stop_event.set)
        thread.join(10)
