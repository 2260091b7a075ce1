"""A message read back from the store has no sender's encoding kept (``wire_sections``): ``encode_deliveries``
makes its sections (``stored_sections``) and joins them as it does a message sent moments ago, byte for byte what
``encode_delivery``'s general path gives for the same message, which is what a backlog read from disk was
delivered with before (at three times the cost)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardbus.amqp import types as t
from shardbus.amqp.message import AmqpMessage, BodyType, Properties, encode_message
from shardbus.endpoint.mapping import decode_to_message, encode_deliveries, encode_delivery
from shardbus.model.message import Message
from shardbus.store.records import pack_message, unpack_message

SENT = [
    AmqpMessage(properties=Properties(message_id=str(uuid.uuid4())), body=[b"x" * 1024], body_type=BodyType.DATA),
    AmqpMessage(body=[b""], body_type=BodyType.DATA),
    AmqpMessage(body=[b"y" * 255], body_type=BodyType.DATA, properties=Properties(message_id=uuid.uuid4())),
    AmqpMessage(body=[b"z" * 256], body_type=BodyType.DATA, properties=Properties(message_id=t.ULong(7))),
    AmqpMessage(body=[b"w" * 70_000], body_type=BodyType.DATA, properties=Properties(message_id=b"\x01\x02")),
    AmqpMessage(
        properties=Properties(
            message_id="m",
            to="orders",
            subject="label",
            reply_to="replies",
            correlation_id=uuid.uuid4(),
            content_type=t.Symbol("application/json"),
            group_id="session-1",
            reply_to_group_id="session-2",
        ),
        application_properties={
            "int": 1,
            "long": t.Long(1 << 40),
            "text": "é" * 300,
            "when": datetime(2030, 1, 2, tzinfo=UTC),
            "id": uuid.uuid4(),
            "none": None,
            "bytes": b"\x00" * 3,
            "double": 1.5,
            "flag": True,
        },
        body=[b"{}"],
        body_type=BodyType.DATA,
    ),
]

BROKER: list[dict[str, Any]] = [
    {},
    {"lock_token": None, "locked_until_ms": None},  # receive-and-delete
    {"time_to_live": timedelta(seconds=30), "expires_at_ms": 1_700_000_030_000},
    {"expires_at_ms": 1_700_000_000_000 + 2**33},  # too long for header.ttl: "never"
    {"enqueued_sequence_number": 77},
    {"partition_key": "pk"},
    {"delivery_count": 3},
]


def _from_store(sent: AmqpMessage, fields: dict[str, Any]) -> Message:
    """The message as a partition hands it to a receiver after reading its row: unpacked, broker fields set."""
    m = unpack_message(pack_message(decode_to_message(sent.encode())))
    m.sequence_number = (1 << 48) | 12345
    m.enqueued_time_ms = 1_700_000_000_000
    m.delivery_count = 1
    m.lock_token = uuid.uuid4()
    m.locked_until_ms = 1_700_000_060_000
    for k, v in fields.items():
        setattr(m, k, v)
    return m


@pytest.mark.parametrize("sent", SENT)
def test_a_stored_message_is_delivered_as_the_general_path_writes_it(sent: AmqpMessage) -> None:
    for fields in BROKER:
        if fields.get("partition_key") and sent.properties is not None and sent.properties.group_id:
            continue  # a session's messages carry their session as the key
        general = _from_store(sent, fields)
        assert general.wire_sections is None
        m = _from_store(sent, fields)
        m.lock_token, m.locked_until_ms = general.lock_token, general.locked_until_ms
        expected = encode_delivery(general)  # wire_sections None: the general path
        assert encode_deliveries([m]) == [expected]
        assert m.wire_sections is not None  # made once, kept on the receiver's copy
        assert encode_delivery(m) == expected  # and encode_delivery's fast path gives the same


def test_bodies_that_are_not_data_still_take_the_general_path() -> None:
    for sent in (
        AmqpMessage(properties=Properties(message_id="v"), body={"k": 1}, body_type=BodyType.VALUE),
        AmqpMessage(body=[[1, 2]], body_type=BodyType.SEQUENCE),
    ):
        general, m = _from_store(sent, {}), _from_store(sent, {})
        m.lock_token, m.locked_until_ms = general.lock_token, general.locked_until_ms
        assert encode_deliveries([m]) == [encode_delivery(general)]
        assert m.wire_sections is None
    built = [Message(b"body", message_id="m") for _ in range(2)]  # built in Python (no wire), as a forwarded copy is
    for b in built:
        b.sequence_number, b.enqueued_time_ms, b.delivery_count = 1, 1_700_000_000_000, 1
    assert encode_deliveries([built[0]]) == [encode_delivery(built[1])]


def test_the_sections_made_decode_to_the_same_message() -> None:
    from shardbus.amqp.message import decode_message

    m = _from_store(SENT[-1], {"time_to_live": timedelta(seconds=30), "expires_at_ms": 1_700_000_030_000})
    (payload,) = encode_deliveries([m])
    decoded = decode_message(payload)
    assert decoded.properties is not None
    assert decoded.properties.creation_time == 1_700_000_000_000
    assert decoded.properties.absolute_expiry_time == 1_700_000_030_000
    assert decoded.properties.group_id == "session-1"
    assert decoded.application_properties["text"] == "é" * 300
    assert decoded.body == [b"{}"]
    assert encode_message(decoded)  # a well-formed message
