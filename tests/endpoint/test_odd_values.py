"""Values a client may send that Service Bus clients rarely do, over real sockets: an ``x-opt-scheduled-enqueue-time``
the service would not honour, application properties of AMQP types the SDK has no Python type for, and link
addresses and session filters of the wrong type. Each message is accepted, each odd link refused with the right
condition, and the connection goes on; the values come back with their AMQP types, also after a restart (when
deliveries are encoded from the store, not from the bytes the sender sent)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient

from shardbus import Message
from shardbus.amqp import types as t
from shardbus.amqp.message import AmqpMessage, BodyType, Properties, decode_message
from shardbus.amqp.performatives import Accepted
from shardbus.amqp.transport import AmqpClient, AmqpClientError
from shardbus.endpoint.mapping import SCHEDULED_TIME
from shardbus.server import Broker

PARTITIONED = pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])


def _message(i: int, **sections) -> bytes:
    message = AmqpMessage(properties=Properties(message_id=str(i)), body=[b"x"], body_type=BodyType.DATA, **sections)
    return message.encode()


async def _connect(port: int) -> AmqpClient:
    return await AmqpClient.connect(
        "127.0.0.1", port, sasl_mechanism="PLAIN", username="RootManageSharedAccessKey", password="SAS_KEY_VALUE"
    )


async def _send_all(port: int, queue: str, payloads: list[bytes]) -> list:
    client = await _connect(port)
    try:
        sender = await (await client.session()).sender(queue)
        return [await sender.send(p, timeout=10) for p in payloads]
    finally:
        await client.close()


async def _receive_all(port: int, queue: str, count: int) -> list[AmqpMessage]:
    client = await _connect(port)
    try:
        receiver = await (await client.session()).receiver(queue, credit=count)
        return [decode_message((await receiver.receive(timeout=10)).payload) for _ in range(count)]
    finally:
        await client.close()


@PARTITIONED
def test_a_scheduled_time_the_service_would_not_honour_is_ignored(broker, conn_str, queue, partitioned):
    """The service honours only an AMQP timestamp and ignores any other value (azure-sdk-for-js#27396); so does
    shardbus, where such a value used to close the sender's connection with amqp:internal-error."""
    q = queue(enable_partitioning=partitioned)
    in_an_hour = int((datetime.now(UTC) + timedelta(hours=1)).timestamp() * 1000)
    ignored = ["2030-01-01T00:00:00Z", t.Long(in_an_hour), in_an_hour, t.Timestamp(2**62), t.Timestamp(-(2**62)), []]
    payloads = [_message(i, message_annotations={SCHEDULED_TIME: v}) for i, v in enumerate(ignored)]
    payloads.append(_message(99, message_annotations={SCHEDULED_TIME: t.Timestamp(in_an_hour)}))  # honoured
    outcomes = asyncio.run(_send_all(broker.server.port, q, payloads))
    assert all(isinstance(o, Accepted) for o in outcomes)
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_receiver(q) as receiver:
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) < len(ignored) and time.monotonic() < deadline:
            got += receiver.receive_messages(max_message_count=10, max_wait_time=1)
        assert sorted(str(m.message_id) for m in got) == [str(i) for i in range(len(ignored))]
        assert all(m.scheduled_enqueue_time_utc is None for m in got)
        for m in got:
            receiver.complete_message(m)
        [scheduled] = receiver.peek_messages(max_message_count=10)
        assert str(scheduled.message_id) == "99"
        assert scheduled.scheduled_enqueue_time_utc == datetime.fromtimestamp(in_an_hour / 1000, UTC)


APP_PROPERTIES = {
    "uint": t.UInt(7),
    "ulong": t.ULong(2**63),
    "short": t.Short(-3),
    "symbol": t.Symbol("sym"),
    "float": t.Float(1.5),
    "timestamp": t.Timestamp(1_700_000_000_000),
    "char": t.Char("é"),
    "decimal": t.Decimal128(bytes(range(16))),
    "uri": t.Described(t.Symbol("com.microsoft:uri"), "https://example.com/"),
    "array": t.Array(t.UInt, [t.UInt(1), t.UInt(2), t.UInt(3)]),
    "list": [t.Byte(1), "two", None],
}


def _typed(values: dict) -> str:
    return repr(sorted(values.items()))  # the reprs name the AMQP types


@PARTITIONED
def test_application_properties_keep_their_amqp_types_across_a_restart(tmp_path, partitioned):
    data = tmp_path / "data"
    with Broker(data_dir=data, port=0) as b:
        b.namespace.create_queue("q", enable_partitioning=partitioned)
        outcomes = asyncio.run(
            _send_all(b.server.port, "q", [_message(i, application_properties=APP_PROPERTIES) for i in range(2)])
        )
        assert all(isinstance(o, Accepted) for o in outcomes)
        [before] = asyncio.run(_receive_all(b.server.port, "q", 1))
        assert _typed(before.application_properties) == _typed(APP_PROPERTIES)
    with Broker(data_dir=data, port=0) as b:  # the other message is now encoded from what the store kept
        after = asyncio.run(_receive_all(b.server.port, "q", 2))
        for m in after:
            assert _typed(m.application_properties) == _typed(APP_PROPERTIES)


SESSION_FILTER = t.Symbol("com.microsoft:session-filter")
REFUSED_LINKS = [  # (receiving?, address, source filter, the condition of the refusal)
    (True, b"\xff\xfe", None, "amqp:not-found"),  # an address that is not UTF-8
    (False, b"\xff\xfe", None, "amqp:not-found"),
    (True, "sq", {SESSION_FILTER: 5}, "com.microsoft:argument-error"),  # a session id that is not a string
    (True, "sq", {SESSION_FILTER: b"\xff"}, "com.microsoft:argument-error"),
    (True, "sq", {SESSION_FILTER: [1]}, "com.microsoft:argument-error"),
]


def test_odd_link_addresses_and_session_filters_are_refused_and_the_connection_goes_on(broker, ns):
    """Each used to close the connection with amqp:internal-error."""
    ns.create_queue("sq", requires_session=True)
    ns.send("sq", Message(b"x", session_id="s"))

    async def run() -> list:
        client = await _connect(broker.server.port)
        try:
            session = await client.session()
            conditions = []
            for receiving, address, filters, _ in REFUSED_LINKS:
                with pytest.raises(AmqpClientError) as refused:
                    if receiving:
                        await session.receiver(address, filters=filters)
                    else:
                        await session.sender(address)
                conditions.append(str(refused.value.error.condition))
            receiver = await session.receiver("sq", filters={SESSION_FILTER: "s"}, credit=1)  # the same connection
            assert decode_message((await receiver.receive(timeout=10)).payload).body == [b"x"]
            return conditions
        finally:
            await client.close()

    assert asyncio.run(run()) == [condition for *_, condition in REFUSED_LINKS]
