"""The official azure-servicebus SDK (async client, ``azure.servicebus.aio``) against shardbus over real sockets.

The same behaviours as ``test_sdk_sync.py``, plus what only an async application does: several handlers busy
at once on one event loop. Every handler opens its own connection; the SDK handles one frame per 50 ms poll while
opening (about 0.5 s per handler) and its close waits for a keep-alive coroutine that sleeps in 1 s steps (about
0.5 s), none of it the broker's doing. So the tests open and close their handlers together (``opened``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
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

from shardbus import Message
from shardbus.model.routing import decode_sequence_number, partition_for_key

PARTITIONED = pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
SCHEDULED = 2  # ServiceBusMessageState.SCHEDULED


@pytest.fixture
async def client(conn_str):
    async with ServiceBusClient.from_connection_string(conn_str) as c:
        yield c


@pytest.fixture
async def client_no_retry(conn_str):
    async with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as c:
        yield c


async def receive_all(receiver, n: int, wait: float = 5) -> list:
    got: list = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got.extend(await receiver.receive_messages(max_message_count=n - len(got), max_wait_time=1))
    return got


async def wait_for_count(ns, path: str, attr: str, expected: int, wait: float = 5) -> int:
    """Runtime counts of settlements the SDK does not wait for (receive-and-delete) catch up shortly."""
    deadline = time.monotonic() + wait
    while (value := getattr(ns.get_runtime_properties(path), attr)) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return value


@contextlib.asynccontextmanager
async def opened(*handlers):
    """Open several senders/receivers at once and close them at once: each has its own connection, and the
    SDK takes about half a second to open and to close one, so doing it concurrently halves a test's time."""
    results = await asyncio.gather(*(h.__aenter__() for h in handlers), return_exceptions=True)
    try:
        for r in results:
            if isinstance(r, BaseException):
                raise r
        yield handlers
    finally:
        await asyncio.gather(*(h.close() for h in handlers), return_exceptions=True)


# --- sending and receiving ---------------------------------------------------------------------------------
@PARTITIONED
async def test_send_single_list_and_batch_then_peek_lock_complete(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("one"))
        await sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(5)])
        batch = await sender.create_message_batch()
        for i in range(20):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        await sender.send_messages(batch)
        assert ns.get_runtime_properties(q).active_message_count == 26
        msgs = await receive_all(receiver, 26)
        assert sorted(str(m) for m in msgs) == sorted(
            ["one"] + [f"list-{i}" for i in range(5)] + [f"batch-{i}" for i in range(20)]
        )
        assert len({m.sequence_number for m in msgs}) == 26
        if partitioned:  # a list or a batch is stored atomically in one partition
            by_body = {str(m): decode_sequence_number(m.sequence_number)[0] for m in msgs}
            assert len({by_body[f"list-{i}"] for i in range(5)}) == 1
            assert len({by_body[f"batch-{i}"] for i in range(20)}) == 1
        for m in msgs:
            assert m.lock_token and m.locked_until_utc > datetime.now(UTC)
        await asyncio.gather(*(receiver.complete_message(m) for m in msgs))
    assert ns.get_runtime_properties(q).total_message_count == 0


@PARTITIONED
async def test_receive_and_delete(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    async with opened(
        client.get_queue_sender(q),
        client.get_queue_receiver(q, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE),
    ) as (sender, receiver):
        await sender.send_messages([ServiceBusMessage(f"{i}") for i in range(10)])
        msgs = await receive_all(receiver, 10)
        assert sorted(str(m) for m in msgs) == sorted(str(i) for i in range(10))
        assert all(m.lock_token is None for m in msgs)
        with pytest.raises(ValueError):
            await receiver.complete_message(msgs[0])
    assert await wait_for_count(ns, q, "total_message_count", 0) == 0


async def test_properties_round_trip(client, queue):
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
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(sent)
        (m,) = await receive_all(receiver, 1)
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
        await receiver.complete_message(m)


async def test_abandon_counts_a_delivery(client, queue):
    q = queue()
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("x"))
        (m,) = await receive_all(receiver, 1)
        await receiver.abandon_message(m)
        (m,) = await receive_all(receiver, 1)
        assert m.delivery_count == 1
        await receiver.complete_message(m)
        with pytest.raises(MessageAlreadySettled):
            await receiver.complete_message(m)


@PARTITIONED
async def test_dead_letter_and_dead_letter_queue(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    async with opened(
        client.get_queue_sender(q),
        client.get_queue_receiver(q),
        client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    ) as (sender, receiver, dlq):
        await sender.send_messages(ServiceBusMessage("poison", partition_key="k" if partitioned else None))
        (m,) = await receive_all(receiver, 1)
        await receiver.dead_letter_message(m, reason="Invalid", error_description="no customer")
        props = ns.get_runtime_properties(q)
        assert (props.active_message_count, props.dead_letter_message_count) == (0, 1)
        (d,) = await receive_all(dlq, 1)
        assert str(d) == "poison"
        assert d.dead_letter_reason == "Invalid"
        assert d.dead_letter_error_description == "no customer"
        assert d.sequence_number == m.sequence_number
        await dlq.complete_message(d)
    assert ns.get_runtime_properties(q).total_message_count == 0


async def test_max_delivery_count_moves_to_dead_letter(client, queue, ns):
    q = queue(max_delivery_count=2)
    async with opened(
        client.get_queue_sender(q),
        client.get_queue_receiver(q),
        client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    ) as (sender, receiver, dlq):
        await sender.send_messages(ServiceBusMessage("x"))
        for _ in range(2):
            (m,) = await receive_all(receiver, 1)
            await receiver.abandon_message(m)
        assert ns.get_runtime_properties(q).dead_letter_message_count == 1
        (d,) = await receive_all(dlq, 1)
        assert d.dead_letter_reason == "MaxDeliveryCountExceeded"
        await dlq.complete_message(d)


@PARTITIONED
async def test_defer_and_receive_deferred(client_no_retry, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    async with opened(client_no_retry.get_queue_sender(q), client_no_retry.get_queue_receiver(q)) as (
        sender,
        receiver,
    ):
        await sender.send_messages([ServiceBusMessage("later"), ServiceBusMessage("later too")])
        msgs = await receive_all(receiver, 2)
        seqs = [m.sequence_number for m in msgs]
        for m in msgs:
            await receiver.defer_message(m)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        assert ns.get_runtime_properties(q).total_message_count == 2
        deferred = await receiver.receive_deferred_messages(seqs)
        assert sorted(str(d) for d in deferred) == ["later", "later too"]
        assert all(d.lock_token for d in deferred)
        first, second = deferred
        before = first.locked_until_utc
        assert await receiver.renew_message_lock(first) >= before
        await receiver.complete_message(first)  # deferred messages settle through $management
        await receiver.dead_letter_message(second, reason="gave up")
        with pytest.raises(MessageNotFoundError):
            await receiver.receive_deferred_messages([first.sequence_number])
    props = ns.get_runtime_properties(q)
    assert (props.active_message_count, props.dead_letter_message_count) == (0, 1)


async def test_receive_deferred_unknown_is_message_not_found(client_no_retry, queue):
    q = queue()
    async with client_no_retry.get_queue_receiver(q) as receiver:
        with pytest.raises(MessageNotFoundError):
            await receiver.receive_deferred_messages([12345])


async def test_renew_lock(client, queue):
    q = queue(lock_duration=timedelta(seconds=10))
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("x"))
        (m,) = await receive_all(receiver, 1)
        before = m.locked_until_utc
        assert before - datetime.now(UTC) <= timedelta(seconds=10)
        # No sleep: the first management call attaches the $management links, which alone takes far more
        # than the millisecond resolution of locked-until.
        after = await receiver.renew_message_lock(m)
        assert after > before
        assert after == m.locked_until_utc
        assert timedelta(seconds=9) < after - datetime.now(UTC) <= timedelta(seconds=10)
        await receiver.complete_message(m)


async def test_lock_expiry_gives_the_message_back(client, queue):
    """The one lock-expiry test (5 s is the shortest lock): the SDK refuses to settle locally, the broker
    offers the message again and counts the delivery."""
    q = queue(lock_duration=timedelta(seconds=5))
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("x"))
        (m,) = await receive_all(receiver, 1)
        await asyncio.sleep(max(0.0, (m.locked_until_utc - datetime.now(UTC)).total_seconds()) + 0.3)
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(m)
        (again,) = await receive_all(receiver, 1)
        assert again.sequence_number == m.sequence_number
        assert again.delivery_count == 1
        await receiver.complete_message(again)


@PARTITIONED
async def test_schedule_and_cancel(client, queue, ns, partitioned):
    q = queue(enable_partitioning=partitioned)
    far = datetime.now(UTC) + timedelta(hours=1)
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        seqs = await sender.schedule_messages([ServiceBusMessage("a"), ServiceBusMessage("b")], far)
        assert len(set(seqs)) == 2
        await sender.cancel_scheduled_messages(seqs[1])
        assert ns.get_runtime_properties(q).scheduled_message_count == 1
        (peeked,) = await receiver.peek_messages(5)
        assert (str(peeked), peeked.sequence_number, peeked.state.value) == ("a", seqs[0], SCHEDULED)
        assert abs((peeked.scheduled_enqueue_time_utc - far).total_seconds()) < 0.002
        await sender.cancel_scheduled_messages(seqs[0])
        assert ns.get_runtime_properties(q).total_message_count == 0

        soon = datetime.now(UTC) + timedelta(seconds=1)
        await sender.schedule_messages(ServiceBusMessage("c"), soon)
        await sender.send_messages(ServiceBusMessage("d", scheduled_enqueue_time_utc=soon))
        props = ns.get_runtime_properties(q)
        if datetime.now(UTC) < soon:  # (on a very slow machine the time may already have come)
            assert (props.scheduled_message_count, props.active_message_count) == (2, 0)
        msgs = await receive_all(receiver, 2, wait=6)
        assert datetime.now(UTC) >= soon - timedelta(milliseconds=50)
        assert sorted(str(m) for m in msgs) == ["c", "d"]
        for m in msgs:
            assert abs((m.scheduled_enqueue_time_utc - soon).total_seconds()) < 0.002
            await receiver.complete_message(m)
    assert ns.get_runtime_properties(q).total_message_count == 0


async def test_peek_pages_through_a_partitioned_queue(client, queue, ns):
    q = queue(enable_partitioning=True)
    seen = []
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        for key in ("a", "b", "c"):
            await sender.send_messages([ServiceBusMessage(f"{key}{i}", partition_key=key) for i in range(3)])
        first = await receiver.peek_messages(10)
        assert len(first) == 3  # the oldest of one partition: fewer than asked
        seen.extend(first)
        while page := await receiver.peek_messages(10, sequence_number=seen[-1].sequence_number + 1):
            seen.extend(page)
        assert all(m.lock_token is None for m in seen)
    assert sorted(str(m) for m in seen) == sorted(f"{k}{i}" for k in "abc" for i in range(3))
    assert ns.get_runtime_properties(q).active_message_count == 9  # peeking takes nothing


@PARTITIONED
async def test_topic_subscriptions(client, topic, ns, partitioned):
    t = topic(subscriptions=("s1", "s2"), enable_partitioning=partitioned)

    async def drain(receiver, dlq) -> None:
        msgs = await receive_all(receiver, 4)
        assert sorted(str(m) for m in msgs) == ["0", "1", "2", "3"]
        for m in msgs[:-1]:
            await receiver.complete_message(m)
        await receiver.dead_letter_message(msgs[-1], reason="r")
        (d,) = await receive_all(dlq, 1)
        assert d.dead_letter_reason == "r"
        await dlq.complete_message(d)

    async with opened(
        client.get_topic_sender(t),
        client.get_subscription_receiver(t, "s1"),
        client.get_subscription_receiver(t, "s1", sub_queue=ServiceBusSubQueue.DEAD_LETTER),
        client.get_subscription_receiver(t, "s2"),
        client.get_subscription_receiver(t, "s2", sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    ) as (sender, r1, dlq1, r2, dlq2):
        await sender.send_messages([ServiceBusMessage(f"{i}") for i in range(4)])
        await asyncio.gather(drain(r1, dlq1), drain(r2, dlq2))  # both subscriptions at once
    for sub in ("s1", "s2"):
        assert ns.get_runtime_properties(f"{t}/Subscriptions/{sub}").total_message_count == 0


async def test_messages_arriving_while_waiting(client, queue):
    q = queue(enable_partitioning=True)
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):

        async def send_later() -> float:
            await asyncio.sleep(0.3)
            await sender.send_messages(ServiceBusMessage("late"))
            return time.monotonic()

        started = time.monotonic()
        msgs, sent_at = await asyncio.gather(
            receiver.receive_messages(max_message_count=1, max_wait_time=5), send_later()
        )
        assert [str(m) for m in msgs] == ["late"]
        assert time.monotonic() - started < 4  # woken by the message, not by the end of the wait
        assert time.monotonic() - sent_at < 1.5
        await receiver.complete_message(msgs[0])


async def test_async_iteration_ends_after_max_wait_time(client, queue):
    q = queue(enable_partitioning=True)
    got = []
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q, max_wait_time=1)) as (
        sender,
        receiver,
    ):
        await sender.send_messages([ServiceBusMessage(f"{i}") for i in range(3)])
        await asyncio.gather(*(sender.send_messages(ServiceBusMessage(f"{i}")) for i in range(3, 6)))
        async for m in receiver:
            got.append(str(m))
            await receiver.complete_message(m)
    assert sorted(got) == [str(i) for i in range(6)]


async def test_many_senders_at_once(client, queue, ns):
    q = queue(enable_partitioning=True)

    async def send(n: int) -> None:
        async with client.get_queue_sender(q) as sender:
            await asyncio.gather(
                *(sender.send_messages(ServiceBusMessage(f"{n}-{i}", partition_key=f"k{i % 4}")) for i in range(10))
            )

    await asyncio.gather(*(send(n) for n in range(4)))
    props = ns.get_runtime_properties(q)
    assert props.active_message_count == 40
    used = {row["partition"] for row in props.partitions if row["active"]}
    assert used == {partition_for_key(f"k{i}", 16) for i in range(4)}  # keyed: only the keys' partitions


async def test_released_messages_come_back_without_a_delivery(client, queue):
    q = queue(enable_partitioning=True)
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages([ServiceBusMessage(f"{i}") for i in range(3)])
        (m,) = await receiver.receive_messages(max_message_count=1, max_wait_time=2)
        await receiver.complete_message(m)
    # Closing released anything prefetched or cached; nothing counted a delivery.
    async with client.get_queue_receiver(q) as receiver:
        rest = await receive_all(receiver, 2)
        assert len(rest) == 2 and all(m.delivery_count == 0 for m in rest)
        for m in rest:
            await receiver.complete_message(m)


async def test_prefetch(client, queue, ns):
    q = queue(enable_partitioning=True)
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q, prefetch_count=20)) as (
        sender,
        receiver,
    ):
        await sender.send_messages([ServiceBusMessage(f"{i}") for i in range(50)])
        msgs = await receive_all(receiver, 50)
        assert len({m.sequence_number for m in msgs}) == 50
        for m in msgs:
            await receiver.complete_message(m)
    assert ns.get_runtime_properties(q).total_message_count == 0


async def test_duplicate_detection(client, queue, ns):
    q = queue(requires_duplicate_detection=True, enable_partitioning=True)
    mid = str(uuid.uuid4())
    async with opened(client.get_queue_sender(q), client.get_queue_receiver(q)) as (sender, receiver):
        await sender.send_messages(ServiceBusMessage("a", message_id=mid))
        await sender.send_messages(ServiceBusMessage("b", message_id=mid))  # a duplicate: accepted and dropped
        assert ns.get_runtime_properties(q).active_message_count == 1
        (m,) = await receive_all(receiver, 1)
        assert (str(m), m.message_id) == ("a", mid)
        await receiver.complete_message(m)


# --- errors ---------------------------------------------------------------------------------------------------
async def send_one(sender) -> None:
    await sender.send_messages(ServiceBusMessage("x"))


async def receive_some(receiver) -> None:
    await receiver.receive_messages(max_wait_time=1)


async def fails_with(error: type[Exception], handler, action) -> None:
    """``action(handler)`` on a newly opened handler raises ``error`` (opening is part of it)."""
    with pytest.raises(error):
        async with handler:
            await action(handler)


async def opened_do(handler, action) -> None:
    async with handler:
        await action(handler)


async def test_unknown_entity(client_no_retry):
    await asyncio.gather(
        fails_with(MessagingEntityNotFoundError, client_no_retry.get_queue_sender("missing"), send_one),
        fails_with(MessagingEntityNotFoundError, client_no_retry.get_queue_receiver("missing"), receive_some),
        fails_with(MessagingEntityNotFoundError, client_no_retry.get_topic_sender("missing-topic"), send_one),
        fails_with(
            MessagingEntityNotFoundError, client_no_retry.get_subscription_receiver("missing-topic", "s1"), receive_some
        ),
    )


async def test_message_too_large(client_no_retry, queue, ns):
    q = queue()
    async with client_no_retry.get_queue_sender(q) as sender:
        with pytest.raises(MessageSizeExceededError):
            await sender.send_messages(ServiceBusMessage(b"x" * (300 * 1024)))
        await sender.send_messages(ServiceBusMessage("fine"))  # the link still works
    assert ns.get_runtime_properties(q).active_message_count == 1


async def test_wrong_key_is_an_authentication_error(broker, queue):
    q = queue()
    bad = broker.connection_string.replace("SAS_KEY_VALUE", "wrong")
    async with ServiceBusClient.from_connection_string(bad, retry_total=0) as c:
        await asyncio.gather(
            fails_with(ServiceBusAuthenticationError, c.get_queue_sender(q), send_one),
            fails_with(ServiceBusAuthenticationError, c.get_queue_receiver(q), receive_some),
        )
    assert broker.namespace.get_runtime_properties(q).active_message_count == 0


async def test_partition_key_must_equal_session_id(client_no_retry, queue):
    q = queue(enable_partitioning=True)
    async with client_no_retry.get_queue_sender(q) as sender:
        msg = ServiceBusMessage("x", partition_key="a")
        msg._raw_amqp_message.properties.group_id = b"b"  # the SDK refuses this locally; send it raw
        with pytest.raises(ServiceBusError, match="identical"):
            await sender.send_messages(msg)


@pytest.mark.parametrize(
    ("status", "can_send", "can_receive"),
    [("SendDisabled", False, True), ("ReceiveDisabled", True, False), ("Disabled", False, False)],
)
async def test_disabled_entity(client_no_retry, queue, ns, status, can_send, can_receive):
    q = queue()
    ns.send(q, Message(b"before"))
    ns.update_queue(q, status=status)

    async def receive_and_complete(receiver) -> None:
        (m,) = await receive_all(receiver, 1)
        await receiver.complete_message(m)

    sender, receiver = client_no_retry.get_queue_sender(q), client_no_retry.get_queue_receiver(q)
    disabled = MessagingEntityDisabledError
    send = opened_do(sender, send_one) if can_send else fails_with(disabled, sender, send_one)
    receive = opened_do(receiver, receive_and_complete) if can_receive else fails_with(disabled, receiver, receive_some)
    await asyncio.gather(send, receive)
    props = ns.get_runtime_properties(q)
    assert props.active_message_count == 1 + can_send - can_receive


async def test_keyed_send_to_unavailable_partition_is_server_busy(client_no_retry, queue, ns):
    q = queue(enable_partitioning=True)
    down = partition_for_key("pinned", 16)
    ns.faults.stop_partition(q, down)
    try:
        async with client_no_retry.get_queue_sender(q) as sender:
            with pytest.raises(ServiceBusServerBusyError):
                await sender.send_messages(ServiceBusMessage("x", partition_key="pinned"))
            for _ in range(20):
                await sender.send_messages(ServiceBusMessage("free"))  # keyless sends fail over
            await asyncio.gather(*(sender.send_messages(ServiceBusMessage("free")) for _ in range(10)))
    finally:
        ns.faults.restore_partition(q, down)
    props = ns.get_runtime_properties(q)
    assert props.active_message_count == 30
    assert {row["partition"]: row.get("active") for row in props.partitions}[down] == 0


@pytest.mark.embedded_only  # shrinks an in-process partition's size share
async def test_quota_exceeded(client_no_retry, queue, ns):
    q = queue()
    ns._queue(q).partitions[0].config.max_size_bytes = 10_000
    async with client_no_retry.get_queue_sender(q) as sender:
        await sender.send_messages(ServiceBusMessage(b"x" * 8000))
        with pytest.raises(ServiceBusQuotaExceededError):
            await sender.send_messages(ServiceBusMessage(b"x" * 8000))
    assert ns.get_runtime_properties(q).active_message_count == 1


async def test_lock_token_of_another_entity_is_lock_lost(client_no_retry, queue):
    a, b = queue(), queue()
    async with opened(
        client_no_retry.get_queue_sender(a),
        client_no_retry.get_queue_receiver(a),
        client_no_retry.get_queue_receiver(b),
    ) as (sender, ra, rb):
        await sender.send_messages(ServiceBusMessage("x"))
        (m,) = await receive_all(ra, 1)
        m._receiver = rb  # settle through the wrong entity's link
        with pytest.raises((MessageLockLostError, ServiceBusError)):
            await rb.renew_message_lock(m)
        await ra.complete_message(m)
