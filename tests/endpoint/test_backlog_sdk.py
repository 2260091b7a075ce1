"""Deferred, scheduled, dead-lettered and expiring messages that live on disk, driven by the official SDK over real
sockets: a broker whose read-ahead window is 2 messages and whose memory budget is 0 (``SHARDBUS_READ_AHEAD=2``,
``SHARDBUS_MEMORY_MB=0``), so that nearly every message of these tests is read back from the store. With
``SHARDBUS_TEST_WORKERS`` the worker processes inherit the two settings from the environment."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageNotFoundError

from shardbus.partition import broker as partition_broker

WORKERS = int(os.environ.get("SHARDBUS_TEST_WORKERS", "0"))  # as tests/conftest.py reads it
KEY = "one-partition"  # every message of a test in one partition, so its window of 2 is soon full


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """This module's broker: a tiny window and no budget (in this process, and in worker processes)."""
    from shardbus.server import Broker

    saved = {k: os.environ.get(k) for k in ("SHARDBUS_READ_AHEAD", "SHARDBUS_MEMORY_MB")}
    os.environ.update(SHARDBUS_READ_AHEAD="2", SHARDBUS_MEMORY_MB="0")
    window = partition_broker.READ_AHEAD, partition_broker.MEMORY_BUDGET
    partition_broker.READ_AHEAD, partition_broker.MEMORY_BUDGET = 2, 0
    b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0, workers=WORKERS).start()
    try:
        yield b
    finally:
        b.stop()
        partition_broker.READ_AHEAD, partition_broker.MEMORY_BUDGET = window
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def client(broker):
    with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as c:
        yield c


def _receive(receiver, n: int, wait: float = 10) -> list:
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=n - len(got), max_wait_time=1)
    return got


def _messages(prefix: str, n: int, **options) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(f"{prefix}{i}", partition_key=KEY, **options) for i in range(n)]


def test_deferred_messages_on_disk_are_received_by_sequence_number_and_peeked(client, queue, ns):
    q = queue(enable_partitioning=True)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(_messages("d", 8))
    with client.get_queue_receiver(q) as receiver:
        got = _receive(receiver, 8)
        assert [str(m) for m in got] == [f"d{i}" for i in range(8)]
        for m in got:
            receiver.defer_message(m)
        seqs = [m.sequence_number for m in got]
        time.sleep(0.5)  # the defers are stored: the messages are on disk only now
        assert receiver.receive_messages(max_wait_time=0.5) == []
        peeked = receiver.peek_messages(20, sequence_number=seqs[0])
        assert [str(m) for m in peeked] == [f"d{i}" for i in range(8)]
        assert all(m.state.value == 1 for m in peeked)  # ServiceBusMessageState.DEFERRED
        assert ns.get_runtime_properties(q).active_message_count == 8
        back = receiver.receive_deferred_messages([seqs[6], seqs[1], seqs[3]])
        assert sorted(str(m) for m in back) == ["d1", "d3", "d6"]
        for m in back:
            receiver.complete_message(m)
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([seqs[3]])
        rest = receiver.receive_deferred_messages([s for i, s in enumerate(seqs) if i not in (1, 3, 6)])
        assert sorted(str(m) for m in rest) == ["d0", "d2", "d4", "d5", "d7"]
        receiver.abandon_message(rest[0])  # back to DEFERRED, and to disk
        for m in rest[1:]:
            receiver.complete_message(m)
        (again,) = receiver.receive_deferred_messages([rest[0].sequence_number])
        assert str(again) == str(rest[0]) and again.delivery_count == 2
        receiver.complete_message(again)
    assert ns.get_runtime_properties(q).active_message_count == 0


def test_scheduled_messages_on_disk_come_due_in_order_and_cancel(client, queue, ns):
    q = queue(enable_partitioning=True)
    now = datetime.now(UTC)
    offsets = [9, 6, 11, 7, 10, 8, 60]  # seconds; the last is cancelled before it comes due
    with client.get_queue_sender(q) as sender:
        seqs = []
        for i, offset in enumerate(offsets):  # one by one: the soonest stay resident, the rest go to disk
            (seq,) = sender.schedule_messages(_messages(f"s{i}-", 1), now + timedelta(seconds=offset))
            seqs.append(seq)
        assert ns.get_runtime_properties(q).scheduled_message_count == 7
        sender.cancel_scheduled_messages(seqs[6])  # due last: on disk only
        sender.cancel_scheduled_messages(seqs[2])
    assert ns.get_runtime_properties(q).scheduled_message_count == 5
    with client.get_queue_receiver(q) as receiver:
        peeked = receiver.peek_messages(20, sequence_number=seqs[0])
        assert [str(m) for m in peeked] == [f"s{i}-0" for i in (0, 1, 3, 4, 5)]
        assert all(m.state.value == 2 for m in peeked)  # ServiceBusMessageState.SCHEDULED
        got = []
        for m in _receive(receiver, 5, wait=30):
            got.append(str(m))
            receiver.complete_message(m)
        # each arrives once its time has come; those due at the same receive come in sequence order
        assert sorted(got) == sorted(f"s{i}-0" for i in (0, 1, 3, 4, 5))
        assert got.index("s1-0") < got.index("s0-0") < got.index("s4-0")
    props = ns.get_runtime_properties(q)
    assert (props.scheduled_message_count, props.active_message_count) == (0, 0)


def test_dead_lettered_messages_beyond_the_window_are_received_in_order(client, queue, ns):
    q = queue(enable_partitioning=True)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(_messages("x", 9))
    with client.get_queue_receiver(q) as receiver:
        for m in _receive(receiver, 9):
            receiver.dead_letter_message(m, reason="bad", error_description="very")
    assert ns.get_runtime_properties(q).dead_letter_message_count == 9
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        peeked = dlq.peek_messages(20)
        assert [str(m) for m in peeked] == [f"x{i}" for i in range(9)]
        got = _receive(dlq, 9)
        assert [str(m) for m in got] == [f"x{i}" for i in range(9)]
        assert all(m.dead_letter_reason == "bad" for m in got)
        for m in got:
            dlq.complete_message(m)
    assert ns.get_runtime_properties(q).dead_letter_message_count == 0


def test_expired_messages_on_disk_are_dead_lettered_without_a_receive(client, queue, ns):
    q = queue(enable_partitioning=True, dead_lettering_on_message_expiration=True)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(_messages("t", 8, time_to_live=timedelta(seconds=2)))
        sender.send_messages(_messages("keep", 1))
    deadline = time.monotonic() + 20  # nobody receives: the upkeep expires them through the expiry index
    while ns.get_runtime_properties(q).dead_letter_message_count < 8 and time.monotonic() < deadline:
        time.sleep(0.25)
    props = ns.get_runtime_properties(q)
    assert (props.active_message_count, props.dead_letter_message_count) == (1, 8)
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        got = _receive(dlq, 8)
        assert [str(m) for m in got] == [f"t{i}" for i in range(8)]
        assert {m.dead_letter_reason for m in got} == {"TTLExpiredException"}
        for m in got:
            dlq.complete_message(m)
    with client.get_queue_receiver(q) as receiver:
        (m,) = _receive(receiver, 1)
        assert str(m) == "keep0"
        receiver.complete_message(m)
