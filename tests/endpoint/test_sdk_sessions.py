"""Sessions through the official SDK (sync and async), on partitioned and non-partitioned entities."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncClient
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from shardbus.server import Broker

PARTITIONED = pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])


@pytest.fixture
def client(conn_str):
    with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as c:
        yield c


def send(client, entity: str, messages, topic: bool = False) -> None:
    getter = client.get_topic_sender if topic else client.get_queue_sender
    with getter(entity) as sender:
        sender.send_messages(messages)


@PARTITIONED
def test_session_messages_in_order_with_interleaving_sessions(client, queue, partitioned):
    q = queue(requires_session=True, enable_partitioning=partitioned)
    with client.get_queue_sender(q) as sender:
        for i in range(0, 1000, 100):
            sender.send_messages([ServiceBusMessage(f"{j}", session_id="main") for j in range(i, i + 100)])
            sender.send_messages([ServiceBusMessage(f"x{j}", session_id=f"other-{i}") for j in range(3)])
    got: list[str] = []
    with client.get_queue_receiver(q, session_id="main", prefetch_count=50) as receiver:
        while len(got) < 1000:
            batch = receiver.receive_messages(max_message_count=100, max_wait_time=2)
            assert batch, f"stalled after {len(got)}"
            for m in batch:
                got.append(str(m))
                receiver.complete_message(m)
    assert got == [str(i) for i in range(1000)]


@PARTITIONED
def test_next_available_and_competing_receivers(client, queue, partitioned):
    q = queue(requires_session=True, enable_partitioning=partitioned)
    send(client, q, [ServiceBusMessage("a", session_id="a")])
    send(client, q, [ServiceBusMessage("b", session_id="b")])
    with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as first:
        with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as second:
            assert {first.session.session_id, second.session.session_id} == {"a", "b"}
            for r in (first, second):
                (m,) = r.receive_messages(max_wait_time=2)
                assert str(m) == r.session.session_id
                r.complete_message(m)
            with pytest.raises(SessionCannotBeLockedError):
                with client.get_queue_receiver(q, session_id="a") as third:
                    third.receive_messages(max_wait_time=1)


def test_no_free_session_times_out(client, queue):
    q = queue(requires_session=True, enable_partitioning=True)
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1) as r:
            r.receive_messages(max_wait_time=1)
    assert time.monotonic() - start < 10


@PARTITIONED
def test_session_state_renew_peek_and_deferred(client, queue, partitioned):
    q = queue(requires_session=True, enable_partitioning=partitioned)
    send(client, q, [ServiceBusMessage(f"{i}", session_id="s") for i in range(3)])
    with client.get_queue_receiver(q, session_id="s") as receiver:
        session = receiver.session
        assert session.get_state() is None
        session.set_state("checkpoint")
        assert session.get_state() == b"checkpoint"
        before = session.locked_until_utc
        time.sleep(0.2)
        assert session.renew_lock() > before
        assert [str(m) for m in receiver.peek_messages(5)] == ["0", "1", "2"]
        msgs = receiver.receive_messages(max_message_count=3, max_wait_time=2)
        receiver.defer_message(msgs[0])
        for m in msgs[1:]:
            receiver.complete_message(m)
        (d,) = receiver.receive_deferred_messages([msgs[0].sequence_number])
        assert str(d) == "0"
        receiver.complete_message(d)
        session.set_state(None)
        assert session.get_state() is None


def test_list_sessions(client, queue, topic, ns):
    q = queue(requires_session=True, enable_partitioning=True)
    send(client, q, [ServiceBusMessage("1", session_id="a")])
    send(client, q, [ServiceBusMessage("2", session_id="b")])
    with client.get_queue_receiver(q, session_id="c") as r:
        r.session.set_state(b"state only")
    assert sorted(client.list_queue_sessions(q)) == ["a", "b", "c"]
    t = topic(subscriptions=())
    ns.create_subscription(t, "s", requires_session=True)
    send(client, t, [ServiceBusMessage("x", session_id="z")], topic=True)
    assert list(client.list_subscription_sessions(t, "s")) == ["z"]
    with client.get_subscription_receiver(t, "s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
        assert r.session.session_id == "z"
        (m,) = r.receive_messages(max_wait_time=2)
        r.complete_message(m)


def test_session_lock_expiry_is_session_lock_lost(client, queue):
    q = queue(requires_session=True, lock_duration=timedelta(seconds=5))
    send(client, q, [ServiceBusMessage("x", session_id="s")])
    with client.get_queue_receiver(q, session_id="s") as r:
        (m,) = r.receive_messages(max_wait_time=2)
        time.sleep(5.5)
        with pytest.raises(SessionLockLostError):
            r.complete_message(m)
    with client.get_queue_receiver(q, session_id="s") as r:
        (again,) = r.receive_messages(max_wait_time=2)
        assert again.delivery_count == 1
        r.complete_message(again)


def test_plain_receiver_on_session_queue_is_refused(client, queue):
    q = queue(requires_session=True)
    with pytest.raises(ServiceBusError):
        with client.get_queue_receiver(q) as r:
            r.receive_messages(max_wait_time=1)


def test_session_state_survives_a_broker_restart(tmp_path):
    data = tmp_path / "data"
    with Broker(data_dir=data, port=0) as b:
        b.namespace.create_queue("sq", requires_session=True, enable_partitioning=True)
        with ServiceBusClient.from_connection_string(b.connection_string) as c:
            with c.get_queue_receiver("sq", session_id="s") as r:
                r.session.set_state(b"kept")
    with Broker(data_dir=data, port=0) as b:
        with ServiceBusClient.from_connection_string(b.connection_string) as c:
            with c.get_queue_receiver("sq", session_id="s") as r:
                assert r.session.get_state() == b"kept"


@PARTITIONED
async def test_async_sessions(conn_str, queue, partitioned):
    q = queue(requires_session=True, enable_partitioning=partitioned)
    async with AsyncClient.from_connection_string(conn_str, retry_total=0) as client:
        async with client.get_queue_sender(q) as sender:
            await sender.send_messages([ServiceBusMessage(f"{i}", session_id="s") for i in range(5)])
        async with client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3) as r:
            assert r.session.session_id == "s"
            assert r.session.locked_until_utc > datetime.now(UTC)
            msgs = await r.receive_messages(max_message_count=5, max_wait_time=2)
            assert [str(m) for m in msgs] == ["0", "1", "2", "3", "4"]
            await r.session.set_state(b"async")
            assert await r.session.get_state() == b"async"
            await r.session.renew_lock()
            for m in msgs:
                await r.complete_message(m)


@PARTITIONED
async def test_async_competing_receivers_order_and_deferral(conn_str, queue, partitioned):
    q = queue(requires_session=True, enable_partitioning=partitioned)
    async with AsyncClient.from_connection_string(conn_str, retry_total=0) as client:
        async with client.get_queue_sender(q) as sender:
            for sid in ("a", "b"):
                await sender.send_messages([ServiceBusMessage(f"{sid}{i}", session_id=sid) for i in range(50)])
        first = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3)
        second = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3)
        async with first, second:
            assert {first.session.session_id, second.session.session_id} == {"a", "b"}
            with pytest.raises(SessionCannotBeLockedError):
                async with client.get_queue_receiver(q, session_id="a") as third:
                    await third.receive_messages(max_wait_time=1)
            for r in (first, second):
                got = []
                while len(got) < 50:
                    batch = await r.receive_messages(max_message_count=50, max_wait_time=2)
                    assert batch
                    got.extend(batch)
                sid = r.session.session_id
                assert [str(m) for m in got] == [f"{sid}{i}" for i in range(50)]
                await r.defer_message(got[0])
                for m in got[1:]:
                    await r.complete_message(m)
                (d,) = await r.receive_deferred_messages([got[0].sequence_number])
                await r.complete_message(d)
                assert await r.peek_messages(5) == []


async def test_async_session_lock_expiry(conn_str, queue):
    q = queue(requires_session=True, lock_duration=timedelta(seconds=5), enable_partitioning=True)
    async with AsyncClient.from_connection_string(conn_str, retry_total=0) as client:
        async with client.get_queue_sender(q) as sender:
            await sender.send_messages(ServiceBusMessage("x", session_id="s"))
        async with client.get_queue_receiver(q, session_id="s") as r:
            (m,) = await r.receive_messages(max_wait_time=2)
            await asyncio.sleep(5.5)
            with pytest.raises(SessionLockLostError):
                await r.complete_message(m)
        async with client.get_queue_receiver(q, session_id="s") as r:
            (again,) = await r.receive_messages(max_wait_time=2)
            assert again.delivery_count == 1
            await r.complete_message(again)
