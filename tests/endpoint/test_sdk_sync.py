"""The official azure-servicebus SDK (sync client) against shardbus over real sockets."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

from shardbus.model.routing import decode_sequence_number, partition_for_key

PARTITIONED = pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])


@pytest.fixture
def client(conn_str):
    with ServiceBusClient.from_connection_string(conn_str) as c:
        yield c


@pytest.fixture
def client_no_retry(conn_str):
    with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as c:
        yield c


def receive_all(receiver, n: int, wait: float = 5) -> list:
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got.extend(receiver.receive_messages(max_message_count=n - len(got), max_wait_time=1))
    return got


# --- sending and receiving ---------------------------------------------------------------------------------
@PARTITIONED
def test_send_single_list_and_batch_then_peek_lock_complete(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("one"))
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(5)])
        batch = sender.create_message_batch()
        for i in range(20):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        sender.send_messages(batch)
    assert ns.get_runtime_properties(q).active_message_count == 26
    with client.get_queue_receiver(q) as receiver:
        msgs = receive_all(receiver, 26)
        assert sorted(str(m) for m in msgs) == sorted(
            ["one"] + [f"list-{i}" for i in range(5)] + [f"batch-{i}" for i in range(20)]
        )
        for m in msgs:
            assert m.lock_token and m.locked_until_utc > datetime.now(UTC)
            receiver.complete_message(m)
    assert ns.get_runtime_properties(q).total_message_count == 0


@PARTITIONED
def test_receive_and_delete(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(f"{i}") for i in range(10)])
    with client.get_queue_receiver(q, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        msgs = receive_all(receiver, 10)
        assert len(msgs) == 10
        with pytest.raises(ValueError):
            receiver.complete_message(msgs[0])
    deadline = time.monotonic() + 5
    while ns.get_runtime_properties(q).total_message_count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ns.get_runtime_properties(q).total_message_count == 0


def test_properties_round_trip(client, queue):
    q = queue(enable_partitioning=True)
    sent = ServiceBusMessage(
        "body",
        message_id="mid-1",
        correlation_id="cid",
        subject="subj",
        content_type="application/json",
        to="dest",
        reply_to="rq",
        partition_key="pk",
        time_to_live=timedelta(minutes=5),
        application_properties={"s": "x", "i": 7, "f": 1.5, "b": True, "big": 2**40 // 2**20},
    )
    with client.get_queue_sender(q) as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        assert str(m) == "body"
        assert (m.message_id, m.correlation_id, m.subject, m.content_type, m.to, m.reply_to, m.partition_key) == (
            "mid-1",
            "cid",
            "subj",
            "application/json",
            "dest",
            "rq",
            "pk",
        )
        assert m.time_to_live == timedelta(minutes=5)
        assert m.application_properties == {b"s": b"x", b"i": 7, b"f": 1.5, b"b": True, b"big": 2**20}
        assert m.delivery_count == 0  # the SDK counts earlier failed deliveries
        pid, local = decode_sequence_number(m.sequence_number)
        assert (pid, local) == (partition_for_key("pk", 16), 1)
        assert abs((m.enqueued_time_utc - datetime.now(UTC)).total_seconds()) < 30
        assert m.expires_at_utc == m.enqueued_time_utc + timedelta(minutes=5)
        receiver.complete_message(m)


def test_abandon_counts_a_delivery(client, queue):
    q = queue()
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        receiver.abandon_message(m)
        (m,) = receive_all(receiver, 1)
        assert m.delivery_count == 1
        receiver.complete_message(m)
        with pytest.raises(MessageAlreadySettled):
            receiver.complete_message(m)


@PARTITIONED
def test_dead_letter_and_dead_letter_queue(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        receiver.dead_letter_message(m, reason="Invalid", error_description="no customer")
    assert ns.get_runtime_properties(q).dead_letter_message_count == 1
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_all(dlq, 1)
        assert str(d) == "poison"
        assert d.dead_letter_reason == "Invalid"
        assert d.dead_letter_error_description == "no customer"
        dlq.complete_message(d)


def test_max_delivery_count_moves_to_dead_letter(client, queue, ns):
    q = queue(max_delivery_count=2)
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        for _ in range(2):
            (m,) = receive_all(receiver, 1)
            receiver.abandon_message(m)
    with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (d,) = receive_all(dlq, 1)
        assert d.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(d)


@PARTITIONED
def test_defer_and_receive_deferred(client_no_retry, queue, partitioned):
    q = queue(enable_partitioning=partitioned)
    with client_no_retry.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("later"))
    with client_no_retry.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        seq = m.sequence_number
        receiver.defer_message(m)
        assert receiver.receive_messages(max_wait_time=0.5) == []
        (d,) = receiver.receive_deferred_messages([seq])
        assert str(d) == "later" and d.lock_token
        receiver.renew_message_lock(d)
        receiver.complete_message(d)  # deferred messages settle through $management
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([seq])


def test_receive_deferred_unknown_is_message_not_found(client_no_retry, queue):
    q = queue()
    with client_no_retry.get_queue_receiver(q) as receiver, pytest.raises(MessageNotFoundError):
        receiver.receive_deferred_messages([12345])


def test_renew_lock(client, queue):
    q = queue(lock_duration=timedelta(seconds=10))
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        before = m.locked_until_utc
        time.sleep(1.1)
        after = receiver.renew_message_lock(m)
        assert after > before
        receiver.complete_message(m)


def test_lock_expiry_gives_the_message_back(client, queue):
    q = queue(lock_duration=timedelta(seconds=5))
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        (m,) = receive_all(receiver, 1)
        time.sleep(5.5)
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(m)
        (again,) = receive_all(receiver, 1)
        assert again.delivery_count == 1
        receiver.complete_message(again)


@PARTITIONED
def test_schedule_and_cancel(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    when = datetime.now(UTC) + timedelta(seconds=2)
    with client.get_queue_sender(q) as sender:
        seqs = sender.schedule_messages([ServiceBusMessage("a"), ServiceBusMessage("b")], when)
        assert len(seqs) == 2
        sender.cancel_scheduled_messages(seqs[1])
        msg = ServiceBusMessage("c", scheduled_enqueue_time_utc=when)
        sender.send_messages(msg)
    assert ns.get_runtime_properties(q).scheduled_message_count == 2
    with client.get_queue_receiver(q) as receiver:
        peeked = receiver.peek_messages(5)
        assert peeked and all(p.state.value == 2 for p in peeked)  # ServiceBusMessageState.SCHEDULED
        msgs = receive_all(receiver, 2, wait=8)
        assert sorted(str(m) for m in msgs) == ["a", "c"]
        for m in msgs:
            assert m.scheduled_enqueue_time_utc is not None
            receiver.complete_message(m)


def test_peek_pages_through_a_partitioned_queue(client, queue):
    q = queue(enable_partitioning=True)
    with client.get_queue_sender(q) as sender:
        for key in ("a", "b", "c"):
            sender.send_messages([ServiceBusMessage(f"{key}{i}", partition_key=key) for i in range(3)])
    seen = []
    with client.get_queue_receiver(q) as receiver:
        first = receiver.peek_messages(10)
        assert len(first) == 3  # the oldest of one partition: fewer than asked
        seen.extend(first)
        while page := receiver.peek_messages(10, sequence_number=seen[-1].sequence_number + 1):
            seen.extend(page)
    assert sorted(str(m) for m in seen) == sorted(f"{k}{i}" for k in "abc" for i in range(3))


@PARTITIONED
def test_topic_subscriptions(client, topic, ns, partitioned):
    t = topic(subscriptions=("s1", "s2"), enable_partitioning=partitioned)
    with client.get_topic_sender(t) as sender:
        sender.send_messages([ServiceBusMessage(f"{i}") for i in range(4)])
    for sub in ("s1", "s2"):
        with client.get_subscription_receiver(t, sub) as receiver:
            msgs = receive_all(receiver, 4)
            assert sorted(str(m) for m in msgs) == ["0", "1", "2", "3"]
            for m in msgs[:-1]:
                receiver.complete_message(m)
            receiver.dead_letter_message(msgs[-1], reason="r")
        with client.get_subscription_receiver(t, sub, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (d,) = receive_all(dlq, 1)
            assert d.dead_letter_reason == "r"
            dlq.complete_message(d)


def test_messages_arriving_while_waiting(client, queue, ns):
    import threading

    from shardbus import Message

    q = queue(enable_partitioning=True)
    threading.Timer(0.5, lambda: ns.send(q, Message(b"late"))).start()
    with client.get_queue_receiver(q) as receiver:
        msgs = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert [str(m) for m in msgs] == ["late"]
        receiver.complete_message(msgs[0])


def test_released_messages_come_back_without_a_delivery(client, queue, ns):
    q = queue(enable_partitioning=True)
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(f"{i}") for i in range(3)])
    with client.get_queue_receiver(q) as receiver:
        (m,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        receiver.complete_message(m)
    # Closing released anything prefetched or cached; nothing counted a delivery.
    with client.get_queue_receiver(q) as receiver:
        rest = receive_all(receiver, 2)
        assert len(rest) == 2 and all(m.delivery_count == 0 for m in rest)
        for m in rest:
            receiver.complete_message(m)


def test_prefetch(client, queue):
    q = queue(enable_partitioning=True)
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(f"{i}") for i in range(50)])
    with client.get_queue_receiver(q, prefetch_count=20) as receiver:
        msgs = receive_all(receiver, 50)
        assert len({m.sequence_number for m in msgs}) == 50
        for m in msgs:
            receiver.complete_message(m)


# --- errors ---------------------------------------------------------------------------------------------------
def test_unknown_entity(client_no_retry):
    with pytest.raises(MessagingEntityNotFoundError), client_no_retry.get_queue_sender("missing") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with pytest.raises(MessagingEntityNotFoundError), client_no_retry.get_queue_receiver("missing") as receiver:
        receiver.receive_messages(max_wait_time=1)


def test_message_too_large(client_no_retry, queue, ns):
    q = queue()
    with client_no_retry.get_queue_sender(q) as sender:
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (300 * 1024)))
        sender.send_messages(ServiceBusMessage("fine"))  # the link still works
    assert ns.get_runtime_properties(q).active_message_count == 1


def test_wrong_key_is_an_authentication_error(broker, queue):
    q = queue()
    bad = broker.connection_string.replace("SAS_KEY_VALUE", "wrong")
    with (
        ServiceBusClient.from_connection_string(bad, retry_total=0) as c,
        pytest.raises(ServiceBusAuthenticationError),
        c.get_queue_sender(q) as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))


def test_partition_key_must_equal_session_id(client_no_retry, queue):
    q = queue(enable_partitioning=True)
    with client_no_retry.get_queue_sender(q) as sender:
        msg = ServiceBusMessage("x", partition_key="a")
        msg._raw_amqp_message.properties.group_id = b"b"  # the SDK refuses this locally; send it raw
        with pytest.raises(ServiceBusError, match="identical"):
            sender.send_messages(msg)


def test_disabled_entity(client_no_retry, queue, ns):
    q = queue()
    ns.update_queue(q, status="SendDisabled")
    with client_no_retry.get_queue_sender(q) as sender, pytest.raises(MessagingEntityDisabledError):
        sender.send_messages(ServiceBusMessage("x"))


def test_keyed_send_to_unavailable_partition_is_server_busy(client_no_retry, queue, ns):
    q = queue(enable_partitioning=True)
    ns.faults.stop_partition(q, partition_for_key("pinned", 16))
    try:
        with client_no_retry.get_queue_sender(q) as sender:
            with pytest.raises(ServiceBusServerBusyError):
                sender.send_messages(ServiceBusMessage("x", partition_key="pinned"))
            for _ in range(20):
                sender.send_messages(ServiceBusMessage("free"))  # keyless sends fail over
    finally:
        ns.faults.restore_partition(q, partition_for_key("pinned", 16))
    assert ns.get_runtime_properties(q).active_message_count == 20


@pytest.mark.embedded_only  # shrinks an in-process partition's size share
def test_quota_exceeded(client_no_retry, queue, ns):
    q = queue()
    ns._queue(q).partitions[0].config.max_size_bytes = 10_000
    with client_no_retry.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage(b"x" * 8000))
        with pytest.raises(ServiceBusQuotaExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * 8000))


def test_lock_token_of_another_entity_is_lock_lost(client_no_retry, queue):
    a, b = queue(), queue()
    with client_no_retry.get_queue_sender(a) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client_no_retry.get_queue_receiver(a) as ra, client_no_retry.get_queue_receiver(b) as rb:
        (m,) = receive_all(ra, 1)
        m._receiver = rb  # settle through the wrong entity's link
        with pytest.raises((MessageLockLostError, ServiceBusError)):
            rb.renew_message_lock(m)
        ra.complete_message(m)


def test_unique_ids(client, queue):
    q = queue(requires_duplicate_detection=True, enable_partitioning=True)
    mid = str(uuid.uuid4())
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("a", message_id=mid))
        sender.send_messages(ServiceBusMessage("b", message_id=mid))  # a duplicate: accepted and dropped
    with client.get_queue_receiver(q) as receiver:
        msgs = receive_all(receiver, 2, wait=2)
        assert [str(m) for m in msgs] == ["a"]
        receiver.complete_message(msgs[0])
