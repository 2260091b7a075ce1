"""The Python API enforces the sizes the AMQP path enforces (``message_size.check_send_size``): the entity's
largest message (Standard 256 KB; Premium its MaxMessageSizeInKilobytes, 1 MB by default) and the tier's largest
batch, with the same error (``MessageSizeExceeded``), storing nothing of what it refuses. A message is measured as
the AMQP message a client sends for it, so the same message gets the same answer on either path."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

import shardbus
from shardbus import Message
from shardbus.amqp import types as t
from shardbus.amqp.message import AmqpMessage, Header, Properties, build_batch
from shardbus.message_size import check_send_size, wire_size

KB = 1024
MB = 1024 * KB


def _sdk_encoding(m: Message) -> bytes:
    """What the SDK sends for ``m``: header with the ttl, annotations, properties, application properties, data."""
    annotations = {}
    if m.partition_key is not None:
        annotations[t.Symbol("x-opt-partition-key")] = m.partition_key
    if m.scheduled_enqueue_time is not None:
        ms = int(m.scheduled_enqueue_time.timestamp() * 1000)
        annotations[t.Symbol("x-opt-scheduled-enqueue-time")] = t.Timestamp(ms)
    return AmqpMessage.with_data(
        m.body,
        header=Header(ttl=int(m.time_to_live.total_seconds() * 1000)) if m.time_to_live else None,
        message_annotations=annotations or None,
        properties=Properties(
            message_id=m.message_id, subject=m.subject, correlation_id=m.correlation_id, group_id=m.session_id
        ),
        application_properties=m.application_properties,
    ).encode()


@pytest.mark.parametrize("size", [0, 10, 255, 256, 70_000])
def test_a_message_measures_as_its_amqp_encoding(size: int) -> None:
    plain = Message(b"x" * size)
    full = Message(
        b"y" * size,
        message_id=str(uuid.uuid4()),
        session_id="s1",
        partition_key="s1",
        subject="subject",
        correlation_id="c",
        time_to_live=timedelta(minutes=5),
        scheduled_enqueue_time=datetime(2030, 1, 1, tzinfo=UTC),
        application_properties={"a": 1, "b": "two", "c": 3.5},
    )
    for m in (plain, full):
        assert wire_size(m) == len(_sdk_encoding(m))
    batch = [full, plain]
    envelope = len(build_batch([_sdk_encoding(m) for m in batch], properties=Properties()))
    with pytest.raises(shardbus.MessageSizeExceeded):
        check_send_size(batch, 1 << 30, envelope - 40, "q")  # the envelope's own sections are within 40 bytes


def test_standard_refuses_a_message_and_a_batch_over_256_kb(ns) -> None:
    ns.create_queue("q")
    with pytest.raises(shardbus.MessageSizeExceeded, match="exceeds the limit"):
        ns.send("q", Message(b"x" * (256 * KB)))
    with pytest.raises(shardbus.MessageSizeExceeded, match="batch of 10 messages"):
        ns.send("q", [Message(b"z" * (40 * KB)) for _ in range(10)])  # the probe: 400 KB in one batch
    with pytest.raises(shardbus.MessageSizeExceeded):
        ns.schedule_messages("q", Message(b"x" * (300 * KB)), datetime.now(UTC) + timedelta(hours=1))
    assert ns.get_runtime_properties("q").total_message_count == 0  # nothing of the refused ones stored
    ns.send("q", [Message(b"z" * (40 * KB)) for _ in range(6)])
    ns.send("q", Message(b"x" * (256 * KB - 100)))
    assert ns.get_runtime_properties("q").active_message_count == 7


def test_premium_follows_the_entity_max_message_size_and_keeps_batches_at_1_mb(open_ns) -> None:
    ns = open_ns(tier="premium")
    ns.create_queue("plain")
    ns.create_queue("large", max_message_size_in_kilobytes=4096)
    body = b"b" * (3 * MB // 2)  # 1.5 MB: over the default, within 4096 KB
    with pytest.raises(shardbus.MessageSizeExceeded, match=str(1 * MB)):
        ns.send("plain", Message(body))
    ns.send("large", Message(body))
    with pytest.raises(shardbus.MessageSizeExceeded, match="batch"):
        ns.send("large", [Message(b"c" * (300 * KB)) for _ in range(4)])  # 1.2 MB: a batch stays at 1 MB
    ns.send("large", [Message(b"c" * (300 * KB)) for _ in range(3)])
    assert ns.get_runtime_properties("large").active_message_count == 4
    assert ns.get_runtime_properties("plain").total_message_count == 0
