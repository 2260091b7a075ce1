"""The pytest plugin used the way a user's test suite uses it: no conftest, only the fixtures the package ships.

``shardbus_connection_string`` gives each test an empty namespace on an in-process broker that the session starts
once; ``shardbus_namespace`` creates entities directly; ``shardbus_ca_path`` lets the admin client trust the broker.
The official SDK is all the tests talk to otherwise.
"""

from __future__ import annotations

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.management import ServiceBusAdministrationClient, SqlRuleFilter


def admin_client(conn_str: str, ca_path: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(conn_str, connection_verify=ca_path)


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_starts_from_an_empty_namespace(shardbus_connection_string, shardbus_ca_path, run):
    """Both runs create the same queue and topic and leave messages behind: the second run would fail with
    ResourceExistsError, or count two messages, if the reset between tests did not delete them."""
    with admin_client(shardbus_connection_string, shardbus_ca_path) as admin:
        assert list(admin.list_queues()) == []
        assert list(admin.list_topics()) == []
        admin.create_queue("orders", enable_partitioning=True)
        admin.create_topic("events")
        admin.create_subscription("events", "alerts")
        admin.create_rule("events", "alerts", "high", filter=SqlRuleFilter("severity > 3"))

        with ServiceBusClient.from_connection_string(shardbus_connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage(f"order of run {run}", partition_key="customer-7"))
            with client.get_topic_sender("events") as sender:
                sender.send_messages(ServiceBusMessage("disk full", application_properties={"severity": 5}))

        assert admin.get_queue_runtime_properties("orders").active_message_count == 1
        assert admin.get_subscription_runtime_properties("events", "alerts").active_message_count == 1


def test_entities_made_with_the_namespace_fixture_are_reachable_with_the_sdk(
    shardbus_namespace, shardbus_connection_string
):
    shardbus_namespace.create_queue("work", max_delivery_count=2)
    with ServiceBusClient.from_connection_string(shardbus_connection_string) as client:
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"job {i}") for i in range(3)])
        with client.get_queue_receiver("work", max_wait_time=2) as receiver:
            received = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            for message in received:
                receiver.complete_message(message)
    assert sorted(str(m) for m in received) == ["job 0", "job 1", "job 2"]
    assert shardbus_namespace.get_runtime_properties("work").active_message_count == 0


def test_a_queue_left_by_an_earlier_test_is_gone(shardbus_connection_string, shardbus_ca_path):
    with admin_client(shardbus_connection_string, shardbus_ca_path) as admin, pytest.raises(ResourceNotFoundError):
        admin.get_queue("work")


def test_the_reset_repairs_partitions_a_test_broke(shardbus_namespace):
    """Fault injection in one test (a stopped partition makes deletes impossible) does not leak into the next."""
    shardbus_namespace.create_queue("fragile", enable_partitioning=True)
    shardbus_namespace.faults.stop_partition("fragile", 5)
    shardbus_namespace.faults.block_store("fragile", 6)
    assert shardbus_namespace.availability("fragile") == "Limited"


def test_after_fault_injection_the_namespace_is_clean_and_healthy(shardbus_namespace):
    assert shardbus_namespace.list_queues() == []
    shardbus_namespace.create_queue("fragile", enable_partitioning=True)  # partition 6's store is not blocked
    assert shardbus_namespace.availability("fragile") == "Available"


async def test_the_async_client_works_too(shardbus_namespace, shardbus_connection_string):
    shardbus_namespace.create_queue("async-orders")
    async with AsyncServiceBusClient.from_connection_string(shardbus_connection_string) as client:
        async with client.get_queue_sender("async-orders") as sender:
            await sender.send_messages(ServiceBusMessage("hello"))
        async with client.get_queue_receiver("async-orders", max_wait_time=2) as receiver:
            messages = await receiver.receive_messages(max_wait_time=2)
            await receiver.complete_message(messages[0])
    assert [str(m) for m in messages] == ["hello"]
