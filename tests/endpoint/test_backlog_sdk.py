"""Deferred, scheduled, dead-lettered and expiring messages that live on disk, and the messages of session-enabled
queues (next-available sessions found on disk, FIFO per session across the window, session peek, a restart with a
session backlog, deferred and scheduled messages in sessions), driven by the official SDK over real sockets: a
broker whose read-ahead window is 2 messages and whose memory budget is 0 (``SHARDBUS_READ_AHEAD=2``,
``SHARDBUS_MEMORY_MB=0``), so that nearly every message of these tests is read back from the store. With
``SHARDBUS_TEST_WORKERS`` the worker processes inherit the two settings from the environment."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient as AsyncClient
from azure.servicebus.exceptions import MessageNotFoundError, OperationTimeoutError

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


def _session_sends(order: list[str], n: int) -> list[ServiceBusMessage]:
    """``n`` messages of each session, interleaved, the sessions' first messages in ``order``."""
    return [ServiceBusMessage(f"{sid}{i}", session_id=sid) for i in range(n) for sid in order]


def _drain_session(receiver, n: int, batch: int = 3) -> list[str]:
    got: list = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=min(batch, n - len(got)), max_wait_time=1)
    for m in got:
        receiver.complete_message(m)
    return [str(m) for m in got]


def test_sessions_on_disk_next_available_named_peek_and_fifo(client, queue, ns):
    q = queue(requires_session=True)  # one partition: its window of 2 holds almost nothing of the 30
    with client.get_queue_sender(q) as sender:
        sender.send_messages(_session_sends(["c", "a", "b"], 10))
    assert ns.get_runtime_properties(q).active_message_count == 30
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
        assert r.session.session_id == "c"  # the session whose oldest message is the oldest
        peeked = r.peek_messages(4)
        assert [str(m) for m in peeked] == ["c0", "c1", "c2", "c3"]
        assert _drain_session(r, 10) == [f"c{i}" for i in range(10)]  # batches of 3 across the window
        r.session.set_state(b"done")
    with client.get_queue_receiver(q, session_id="b", max_wait_time=3) as r:  # named: read by session
        assert [str(m) for m in r.peek_messages(2, sequence_number=0)] == ["b0", "b1"]
        assert _drain_session(r, 10, batch=7) == [f"b{i}" for i in range(10)]
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
        assert r.session.session_id == "a"
        assert _drain_session(r, 10) == [f"a{i}" for i in range(10)]
    with client.get_queue_receiver(q, session_id="c", max_wait_time=3) as r:
        assert r.session.get_state() == b"done"
    with pytest.raises(OperationTimeoutError):
        with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1) as r:
            r.receive_messages(max_wait_time=1)
    assert ns.get_runtime_properties(q).active_message_count == 0


def test_session_backlog_survives_a_restart(broker, tmp_path):
    from shardbus.server import Broker

    data = tmp_path / "data"
    with Broker(data_dir=data, port=0, workers=WORKERS) as b:
        b.namespace.create_queue("sq", requires_session=True, enable_partitioning=True)
        with ServiceBusClient.from_connection_string(b.connection_string, retry_total=0) as c:
            with c.get_queue_sender("sq") as sender:  # one session per batch: a batch goes to one partition
                for sid in "xyz":
                    sender.send_messages(_session_sends([sid], 8))
            with c.get_queue_receiver("sq", session_id="y", max_wait_time=3) as r:
                assert _drain_session(r, 3) == ["y0", "y1", "y2"]
    with Broker(data_dir=data, port=0, workers=WORKERS) as b:
        assert b.namespace.get_runtime_properties("sq").active_message_count == 21
        with ServiceBusClient.from_connection_string(b.connection_string, retry_total=0) as c:
            seen = {}
            for _ in range(3):
                with c.get_queue_receiver("sq", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
                    sid = r.session.session_id
                    seen[sid] = _drain_session(r, 8 if sid != "y" else 5, batch=4)
            assert seen == {
                "x": [f"x{i}" for i in range(8)],
                "y": [f"y{i}" for i in range(3, 8)],
                "z": [f"z{i}" for i in range(8)],
            }
        assert b.namespace.get_runtime_properties("sq").active_message_count == 0


def test_deferred_and_scheduled_messages_in_sessions_on_disk(client, queue, ns):
    q = queue(requires_session=True)
    due = datetime.now(UTC) + timedelta(seconds=3)
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s") for i in range(6)])
        sender.schedule_messages([ServiceBusMessage("later", session_id="s")], due)
        sender.send_messages([ServiceBusMessage(f"o{i}", session_id="other") for i in range(4)])
    with client.get_queue_receiver(q, session_id="s", max_wait_time=3) as r:
        got = r.receive_messages(max_message_count=3, max_wait_time=2)
        assert [str(m) for m in got] == ["m0", "m1", "m2"]
        for m in got:
            r.defer_message(m)
        time.sleep(0.5)  # the defers are stored: on disk only now
        peeked = r.peek_messages(10, sequence_number=got[0].sequence_number)  # 0: the SDK peeks on from its last
        assert [str(m) for m in peeked] == ["m0", "m1", "m2", "m3", "m4", "m5", "later"]
        back = r.receive_deferred_messages([got[2].sequence_number, got[0].sequence_number])
        assert sorted(str(m) for m in back) == ["m0", "m2"]
        for m in back:
            r.complete_message(m)
        rest = _drain_session(r, 4, batch=2)
        assert rest[:3] == ["m3", "m4", "m5"] and rest[3] == "later"  # "later" once due
        (m1,) = r.receive_deferred_messages([got[1].sequence_number])
        r.complete_message(m1)
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
        assert r.session.session_id == "other"
        assert _drain_session(r, 4) == [f"o{i}" for i in range(4)]
    props = ns.get_runtime_properties(q)
    assert (props.active_message_count, props.scheduled_message_count) == (0, 0)


async def test_async_sessions_on_disk_next_available_and_fifo(conn_str, queue, ns):
    q = queue(requires_session=True)
    async with AsyncClient.from_connection_string(conn_str, retry_total=0) as client:
        async with client.get_queue_sender(q) as sender:
            await sender.send_messages(_session_sends(["q", "p"], 9))
        for expected in ("q", "p"):
            async with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
                assert r.session.session_id == expected
                assert [str(m) for m in await r.peek_messages(3)] == [f"{expected}{i}" for i in range(3)]
                got: list = []
                while len(got) < 9:
                    batch = await r.receive_messages(max_message_count=4, max_wait_time=2)
                    assert batch
                    got += batch
                assert [str(m) for m in got] == [f"{expected}{i}" for i in range(9)]
                await r.abandon_message(got[-1])  # back into its session, read again from memory or disk
                for m in got[:-1]:
                    await r.complete_message(m)
                (again,) = await r.receive_messages(max_message_count=5, max_wait_time=2)
                assert str(again) == f"{expected}8" and again.delivery_count == 1
                await r.complete_message(again)
    assert ns.get_runtime_properties(q).active_message_count == 0
