"""``encode_deliveries`` (a receiver's batch of deliveries encoded in one pass) gives byte for byte what
``encode_delivery`` gives for each message, on its inlined path and on the messages it leaves to the general one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardbus.amqp import types as t
from shardbus.amqp.message import AmqpMessage, BodyType, Header, Properties, encode_message
from shardbus.endpoint.mapping import decode_to_message, encode_deliveries, encode_delivery
from shardbus.model.message import Message, MessageState

PAYLOADS = [
    encode_message(AmqpMessage(body=[b"y" * 1024], body_type=BodyType.DATA, properties=Properties(message_id="i"))),
    encode_message(AmqpMessage(header=Header(durable=True), body=[b"d"], body_type=BodyType.DATA)),
    encode_message(
        AmqpMessage(properties=Properties(message_id="a"), application_properties={"a": 1}, body=[b""], body_type=0)
    ),
    encode_message(AmqpMessage(properties=Properties(message_id="v"), body={"k": 1}, body_type=BodyType.VALUE)),
    encode_message(AmqpMessage(body=[[1, 2]], body_type=BodyType.SEQUENCE)),
    encode_message(AmqpMessage(properties=Properties(message_id="none"))),
]

FIELDS: list[dict[str, Any]] = [
    {},
    {"sequence_number": 5},
    {"sequence_number": -128},
    {"sequence_number": (3 << 48) | 12345},
    {"locked_until_ms": None, "lock_token": None},  # receive-and-delete
    {"delivery_count": 4},
    {"delivery_count": 0, "lock_token": uuid.uuid4()},  # a wire count below zero is written as 0
    {"expires_at_ms": 1_700_000_005_000},  # a TTL
    {"expires_at_ms": 1_700_000_000_000 + 2**33},  # too long for header.ttl: "never"
    {"expires_at_ms": 1_600_000_000_000},  # negative: "never" too
    {"enqueued_sequence_number": 77},
    {"enqueued_sequence_number": 1 << 40, "sequence_number": 1 << 41},
    {"enqueued_sequence_number": 3, "locked_until_ms": None, "lock_token": None},
    # the commonest annotations, packed in one call: a long sequence number that is also the enqueue sequence
    # number, and a lock; the header a chunk's deliveries share is reused, so its (ttl, count) changes in between
    {"sequence_number": 128, "enqueued_sequence_number": 128},
    {"sequence_number": (3 << 48) | 12345, "enqueued_sequence_number": (3 << 48) | 12345},
    {"sequence_number": (3 << 48) | 12346, "enqueued_sequence_number": (3 << 48) | 12346},
    {"sequence_number": 1000, "enqueued_sequence_number": 1000, "delivery_count": 3},
    {"sequence_number": 1001, "enqueued_sequence_number": 1001, "delivery_count": 3},
    {"sequence_number": 1002, "enqueued_sequence_number": 1002, "expires_at_ms": 1_700_000_005_000},
    {"sequence_number": 1003, "enqueued_sequence_number": 1003, "expires_at_ms": 1_700_000_006_000},
    {"sequence_number": 1004, "enqueued_sequence_number": 1004, "locked_until_ms": 2**62},
    {"sequence_number": 1005, "enqueued_sequence_number": 1005, "enqueued_time_ms": 0},
    {"sequence_number": 1006, "enqueued_sequence_number": 1006, "locked_until_ms": None, "lock_token": None},
    {"sequence_number": 1007, "enqueued_sequence_number": 1006},  # forwarded: the two numbers differ
    {"sequence_number": 127, "enqueued_sequence_number": 127},
    {"sequence_number": 2**63 - 1, "enqueued_sequence_number": 2**63 - 1},
    # the general path: annotations, keys, schedules, dead-letter fields
    {"annotations": {"x-custom": "v"}},
    {"partition_key": "pk"},
    {"session_id": "s"},
    {"scheduled_enqueue_time": datetime(2030, 1, 1, tzinfo=UTC), "state": MessageState.SCHEDULED},
    {"dead_letter_source": "q"},
    {"dead_letter_reason": "r"},
    {"dead_letter_error_description": "d"},
    {"wire_sections": None},
]


def _message(payload: bytes, extra: dict[str, Any]) -> Message:
    m = decode_to_message(payload)
    m.sequence_number = 9
    m.enqueued_time_ms = 1_700_000_000_000
    m.locked_until_ms = 1_700_000_060_000
    m.lock_token = uuid.uuid4()
    m.delivery_count = 1
    for k, v in extra.items():
        setattr(m, k, v)
    return m


@pytest.mark.parametrize("payload", PAYLOADS)
def test_encode_deliveries_matches_encode_delivery(payload: bytes) -> None:
    messages = [_message(payload, extra) for extra in FIELDS]
    assert encode_deliveries(messages) == [encode_delivery(m) for m in messages]
    for m in messages:  # alone too: no header carried over from the message before
        assert encode_deliveries([m]) == [encode_delivery(m)]
    assert encode_deliveries(messages[::-1]) == [encode_delivery(m) for m in messages[::-1]]


def test_a_message_built_without_the_wire_is_encoded_too() -> None:
    m = Message(b"body", message_id="m", time_to_live=timedelta(seconds=5))
    m.sequence_number, m.enqueued_time_ms, m.delivery_count = 1, 1_700_000_000_000, 1
    m.application_properties = {"k": t.Long(1)}
    assert encode_deliveries([m]) == [encode_delivery(m)]
    assert encode_deliveries([]) == []
