"""Message and batch sizes are enforced where they are advertised: the sender link's attach says the entity's largest
message (``max-message-size``) and batch (``com.microsoft:max-message-batch-size``); a delivery past either is
refused with ``amqp:link:message-size-exceeded`` (the SDK's ``MessageSizeExceededError``) as soon as it passes,
nothing of it is stored, and the link and connection go on. Standard: 256 KB for both. Premium: the entity's
``MaxMessageSizeInKilobytes`` (1,024 by default, 1,024-102,400, through the admin client and Config.json), batches
1 MB."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError
from azure.servicebus.management import ServiceBusAdministrationClient

from shardbus.amqp.message import BATCH_MESSAGE_FORMAT, AmqpMessage, build_batch
from shardbus.amqp.performatives import Accepted, Rejected
from shardbus.amqp.transport import AmqpClient
from shardbus.config import ConfigError, load_config
from shardbus.server import Broker

KB = 1024
MB = 1024 * KB
BATCH_PROPERTY = "com.microsoft:max-message-batch-size"


@pytest.fixture(scope="module")
def premium(tmp_path_factory):
    b = Broker(data_dir=tmp_path_factory.mktemp("premium"), port=0, tier="premium").start()
    yield b
    b.stop()


async def _sender(port: int, address: str) -> tuple[AmqpClient, Any]:
    client = await AmqpClient.connect(
        "127.0.0.1", port, sasl_mechanism="PLAIN", username="RootManageSharedAccessKey", password="SAS_KEY_VALUE"
    )
    session = await client.session()
    return client, await session.sender(address)


def _advertised(sender: Any) -> tuple[int, int]:
    attach = sender.link.remote_attach
    properties = {str(k): v for k, v in (attach.properties or {}).items()}
    return attach.max_message_size, properties[BATCH_PROPERTY]


def _batch(count: int, size: int) -> bytes:
    return build_batch([AmqpMessage.with_data(b"x" * size).encode() for _ in range(count)])


def _refused(outcome: Any) -> bool:
    return isinstance(outcome, Rejected) and outcome.error.condition == "amqp:link:message-size-exceeded"


def test_standard_advertises_256_kb_and_refuses_larger_batches_on_the_same_link(broker, queue, ns):
    q = queue()

    async def run() -> None:
        client, sender = await _sender(broker.server.port, q)
        try:
            assert _advertised(sender) == (256 * KB, 256 * KB)
            # The probes: 10 x 40 KB and 100 x 40 KB batches (400 KB and 4 MB), then one of 4 MB in one go.
            for payload in (_batch(10, 40 * KB), _batch(100, 40 * KB)):
                assert _refused(await sender.send(payload, message_format=BATCH_MESSAGE_FORMAT))
            assert _refused(await sender.send(AmqpMessage.with_data(b"y" * (4 * MB)).encode()))
            # the link and the connection go on
            assert isinstance(await sender.send(_batch(5, 40 * KB), message_format=BATCH_MESSAGE_FORMAT), Accepted)
            assert isinstance(await sender.send(AmqpMessage.with_data(b"fine").encode()), Accepted)
            assert sender.link.attached
        finally:
            await client.close()

    asyncio.run(run())
    assert ns.get_runtime_properties(q).active_message_count == 6  # the 5 of the small batch and "fine"


def test_the_sdk_raises_message_size_exceeded_for_a_batch_past_its_own_check(broker, queue, ns):
    q = queue()
    with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client:
        with client.get_queue_sender(q) as sender:
            sender._open()
            assert sender._max_message_size_on_link == 256 * KB and sender._max_batch_size_on_link == 256 * KB
            sender._max_batch_size_on_link = 8 * MB  # bypass the SDK's own check, as a careless client would
            with pytest.raises(MessageSizeExceededError, match="exceeds the limit"):
                sender.send_messages([ServiceBusMessage(b"z" * (40 * KB)) for _ in range(10)])
            sender.send_messages(ServiceBusMessage("after"))  # same link, same connection
    assert ns.get_runtime_properties(q).active_message_count == 1


def test_premium_entity_limits_through_the_admin_client(premium):
    admin = ServiceBusAdministrationClient.from_connection_string(
        premium.connection_string, connection_verify=str(premium.ca_path), retry_total=0
    )
    with admin:
        assert admin.create_queue("plain").max_message_size_in_kilobytes == 1024
        assert admin.create_queue("large", max_message_size_in_kilobytes=2048).max_message_size_in_kilobytes == 2048
        topic = admin.create_topic("t", max_message_size_in_kilobytes=102400)
        assert topic.max_message_size_in_kilobytes == 102400
        for bad in (1023, 102401):
            with pytest.raises(HttpResponseError) as caught:
                admin.create_queue(f"bad{bad}", max_message_size_in_kilobytes=bad)
            assert caught.value.status_code == 400
        props = admin.get_queue("large")
        props.max_message_size_in_kilobytes = 4096
        admin.update_queue(props)
        assert admin.get_queue("large").max_message_size_in_kilobytes == 4096

    async def advertised(address: str) -> tuple[int, int]:
        client, sender = await _sender(premium.server.port, address)
        try:
            return _advertised(sender)
        finally:
            await client.close()

    assert asyncio.run(advertised("plain")) == (1 * MB, 1 * MB)
    assert asyncio.run(advertised("large")) == (4 * MB, 1 * MB)  # a premium batch stays at 1 MB
    assert asyncio.run(advertised("t")) == (100 * MB, 1 * MB)

    body = bytes(range(256)) * (6 * KB)  # 1.5 MB: over the default, within 4096 KB
    with ServiceBusClient.from_connection_string(premium.connection_string, retry_total=0) as client:
        with client.get_queue_sender("plain") as sender:
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(body))
            sender.send_messages(ServiceBusMessage("small"))
        with client.get_queue_sender("large") as sender:
            sender.send_messages(ServiceBusMessage(body))
        with client.get_queue_receiver("large") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=10)
            assert b"".join(m.body) == body
            receiver.complete_message(m)
    assert premium.namespace.get_runtime_properties("plain").active_message_count == 1


def test_standard_entities_keep_256_kb(broker):
    admin = ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=str(broker.ca_path), retry_total=0
    )
    with admin:
        assert admin.create_queue("std-limit").max_message_size_in_kilobytes == 256
        with pytest.raises(HttpResponseError) as caught:
            admin.create_queue("std-large", max_message_size_in_kilobytes=1024)
        assert caught.value.status_code == 400


def test_config_json_sets_the_premium_message_size_and_checks_it():
    def config(sku: str, kb: Any) -> dict[str, Any]:
        queue = {"Name": "q", "Properties": {"MaxMessageSizeInKilobytes": kb}}
        namespace = {"Name": "ns", "Sku": sku, "Queues": [queue]}
        return {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "Console"}}}

    [ns] = load_config(config("Premium", 51200))
    assert ns.queues[0].description.max_message_size_in_kilobytes == 51200
    for sku, kb in (("Premium", 512), ("Premium", 204800), ("Standard", 1024), ("Premium", "big")):
        with pytest.raises(ConfigError, match=r"Queues\[0\]\.Properties\.MaxMessageSizeInKilobytes"):
            load_config(config(sku, kb))
