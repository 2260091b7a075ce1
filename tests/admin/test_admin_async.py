"""The official async ``ServiceBusAdministrationClient`` (aiohttp transport) against shardbus over HTTPS.

Every operation once, with the errors the SDK maps to exceptions and partitioning that cannot change; the sync
module goes through the properties in depth.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.aio.management import ServiceBusAdministrationClient
from azure.servicebus.management import CorrelationRuleFilter, SqlRuleAction, SqlRuleFilter, TrueRuleFilter

import shardbus


def _client(broker, conn_str: str | None = None) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        conn_str or broker.connection_string, connection_verify=str(broker.ca_path), retry_total=0
    )


async def test_namespace_and_queues(broker, ns, name):
    q, target = name("q"), name("fwd")
    async with _client(broker) as admin:
        props = await admin.get_namespace_properties()
        assert props.name == ns.name and props.messaging_sku == "Standard"

        await admin.create_queue(target)
        created = await admin.create_queue(
            q,
            enable_partitioning=True,
            requires_duplicate_detection=True,
            duplicate_detection_history_time_window=timedelta(minutes=1),
            lock_duration=timedelta(seconds=50),
            max_delivery_count=6,
            forward_to=target,
        )
        assert created.enable_partitioning is True
        got = await admin.get_queue(q)
        assert got.lock_duration == timedelta(seconds=50) and got.max_delivery_count == 6
        assert got.requires_duplicate_detection is True
        assert got.forward_to.endswith(f"/{target}")

        got.max_delivery_count = 2
        got.forward_to = None
        await admin.update_queue(got)
        again = await admin.get_queue(q)
        assert again.max_delivery_count == 2 and again.forward_to is None
        assert ns.get_queue(q).forward_to is None

        again.enable_partitioning = False
        with pytest.raises(HttpResponseError) as info:
            await admin.update_queue(again)
        assert info.value.status_code == 400
        assert ns.get_queue(q).enable_partitioning is True

        with pytest.raises(ResourceExistsError):
            await admin.create_queue(q)
        with pytest.raises(ResourceNotFoundError):
            await admin.get_queue(name("missing"))
        ghost = await admin.get_queue(q)
        ghost.name = name("missing")
        with pytest.raises(ResourceNotFoundError):
            await admin.update_queue(ghost)
        with pytest.raises(HttpResponseError) as info:
            await admin.create_queue(name("q"), max_delivery_count=0)
        assert info.value.status_code == 400 and "MaxDeliveryCount" in str(info.value)

        ns.send(q, [shardbus.Message(b"a", partition_key="x"), shardbus.Message(b"b", partition_key="x")])
        ns.send(q, shardbus.Message(b"c", partition_key="y"))
        rt = await admin.get_queue_runtime_properties(q)
        assert rt.active_message_count == 3 and rt.total_message_count == 3 and rt.size_in_bytes > 0
        assert q in [p.name async for p in admin.list_queues()]
        assert q in [p.name async for p in admin.list_queues_runtime_properties()]

        await admin.delete_queue(q)
        with pytest.raises(ResourceNotFoundError):
            await admin.delete_queue(q)


async def test_topics_subscriptions_rules(broker, ns, name):
    t = name("t")
    async with _client(broker) as admin:
        await admin.create_topic(t, enable_partitioning=True, max_size_in_megabytes=2048)
        topic = await admin.get_topic(t)
        assert topic.enable_partitioning is True and topic.max_size_in_megabytes == 2048
        await admin.update_topic(topic, user_metadata="async")
        assert (await admin.get_topic(t)).user_metadata == "async"
        with pytest.raises(HttpResponseError) as info:
            await admin.update_topic(await admin.get_topic(t), enable_partitioning=False)
        assert info.value.status_code == 400
        assert t in [x.name async for x in admin.list_topics()]

        await admin.create_subscription(t, "s", max_delivery_count=4, requires_session=False)
        sub = await admin.get_subscription(t, "s")
        assert sub.max_delivery_count == 4
        await admin.update_subscription(t, sub, lock_duration=timedelta(seconds=10))
        assert (await admin.get_subscription(t, "s")).lock_duration == timedelta(seconds=10)
        with pytest.raises(ResourceExistsError):
            await admin.create_subscription(t, "s")
        assert [s.name async for s in admin.list_subscriptions(t)] == ["s"]

        assert isinstance((await admin.get_rule(t, "s", "$Default")).filter, TrueRuleFilter)
        await admin.create_rule(
            t, "s", "r1", filter=SqlRuleFilter("n > @n", {"@n": 3}), action=SqlRuleAction("SET big = true")
        )
        await admin.create_rule(t, "s", "r2", filter=CorrelationRuleFilter(label="L", properties={"p": "v"}))
        r1 = await admin.get_rule(t, "s", "r1")
        assert r1.filter.sql_expression == "n > @n" and dict(r1.filter.parameters) == {"@n": 3}
        assert r1.action.sql_expression == "SET big = true"
        r1.filter = SqlRuleFilter("n > 100")
        await admin.update_rule(t, "s", r1)
        assert (await admin.get_rule(t, "s", "r1")).filter.sql_expression == "n > 100"
        assert sorted([r.name async for r in admin.list_rules(t, "s")]) == ["$Default", "r1", "r2"]
        with pytest.raises(ResourceNotFoundError):
            await admin.get_rule(t, "s", "missing")
        await admin.delete_rule(t, "s", "r2")

        ns.send(t, shardbus.Message(b"m", partition_key="k"))
        srt = await admin.get_subscription_runtime_properties(t, "s")
        assert srt.active_message_count == 1
        trt = await admin.get_topic_runtime_properties(t)
        assert trt.subscription_count == 1
        assert [r.name async for r in admin.list_subscriptions_runtime_properties(t)] == ["s"]
        assert t in [r.name async for r in admin.list_topics_runtime_properties()]

        await admin.delete_subscription(t, "s")
        with pytest.raises(ResourceNotFoundError):
            await admin.get_subscription(t, "s")
        await admin.delete_topic(t)
        with pytest.raises(ResourceNotFoundError):
            await admin.get_topic(t)


async def test_availability_and_auth(broker, ns, name):
    t = name("t")
    async with _client(broker) as admin:
        await admin.create_topic(t, enable_partitioning=True)
        await admin.create_subscription(t, "s")
        ns.faults.stop_partition(t, 0)
        try:
            assert (await admin.get_topic(t)).availability_status == "Limited"
            assert (await admin.get_subscription(t, "s")).availability_status == "Limited"
        finally:
            ns.faults.restore_partition(t, 0)
        assert (await admin.get_topic(t)).availability_status == "Available"
    bad = broker.connection_string.replace(f"SharedAccessKey={broker.key}", "SharedAccessKey=nope")
    async with _client(broker, bad) as admin:
        with pytest.raises(ClientAuthenticationError):
            await admin.get_queue("anything")


async def test_async_data_plane_after_https(broker, conn_str, name):
    q = name("q")
    async with _client(broker) as admin:
        await admin.create_queue(q)
        async with ServiceBusClient.from_connection_string(conn_str) as client:
            async with client.get_queue_sender(q) as sender:
                await sender.send_messages(ServiceBusMessage("hi"))
            assert (await admin.get_queue_runtime_properties(q)).active_message_count == 1
            async with client.get_queue_receiver(q, max_wait_time=5) as receiver:
                got = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await receiver.complete_message(got[0])
        assert str(got[0]) == "hi"
        assert (await admin.get_queue_runtime_properties(q)).total_message_count == 0
