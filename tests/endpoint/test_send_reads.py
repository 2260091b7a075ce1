"""Sends that arrive in one socket read are stored together (``SendLinks._flush_sends``: one store operation per
partition) and their dispositions answered together, yet each transfer keeps its own semantics: its size check,
duplicate detection, partition key or session id, and an outcome of its own, given only once it is durable."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from shardbus.amqp.message import BATCH_MESSAGE_FORMAT, AmqpMessage, Properties, build_batch
from shardbus.amqp.performatives import Accepted, Rejected
from shardbus.amqp.types import Symbol
from shardbus.model.message import BodyType as ModelBody
from shardbus.model.routing import decode_sequence_number, partition_for_key

KB = 1024
PARTITION_KEY = Symbol("x-opt-partition-key")
_ids = itertools.count()


def _message(body: bytes, message_id: str | None = None, session: str | None = None, key: str | None = None) -> bytes:
    annotations = {PARTITION_KEY: key} if key is not None else None
    properties = Properties(message_id=message_id or f"id-{next(_ids)}", group_id=session)
    return AmqpMessage.with_data(body, properties=properties, message_annotations=annotations).encode()


async def _send_together(root_client: Any, address: str, sends: list[tuple[bytes, int]]) -> list[Any]:
    """Send every (payload, message format) unsettled in one write (so the broker reads them together, or in as few
    reads as their size allows); their outcomes, in order."""
    client = await root_client()
    try:
        session = await client.session()
        sender = await session.sender(address)
        return await asyncio.gather(*(sender.send(p, message_format=f) for p, f in sends))
    finally:
        await client.close()


@pytest.fixture
def grouped(ns, monkeypatch):
    """The number of sends each ``submit_many`` call stored together (the broker's entities, not replaced)."""
    from shardbus.entity.entity import _Sender

    sizes: list[int] = []
    original = _Sender.submit_many

    def counting(self: Any, batches: list[Any], *args: Any, **kwargs: Any) -> None:
        sizes.append(len(batches))
        original(self, batches, *args, **kwargs)

    monkeypatch.setattr(_Sender, "submit_many", counting)
    return sizes


def test_mixed_sizes_and_a_batch_in_one_read_are_stored_in_order(root_client, ns, queue, grouped):
    name = queue()
    sizes = [10, 5 * KB, 100, 70 * KB, 1, 0, 3 * KB]
    sends = [(_message(bytes([i]) * n), 0) for i, n in enumerate(sizes)]
    inner = [AmqpMessage.with_data(f"b{i}".encode()).encode() for i in range(3)]
    sends.insert(3, (build_batch(inner), BATCH_MESSAGE_FORMAT))
    outcomes = asyncio.run(_send_together(root_client, name, sends))
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert max(grouped) > 1  # some were stored together
    bodies = [m.body for m in ns.browse(name)]
    expected = [bytes([i]) * n for i, n in enumerate(sizes)]
    expected[3:3] = [b"b0", b"b1", b"b2"]
    assert bodies == expected  # one partition: the order they were sent in


def test_one_oversize_transfer_is_refused_and_the_others_of_its_read_stored(root_client, ns, queue, broker):
    name = queue()  # standard: 256 KB
    bodies = [b"a" * 100, b"b" * (300 * KB), b"c" * 100, b"d" * 2 * KB]
    outcomes = asyncio.run(_send_together(root_client, name, [(_message(b), 0) for b in bodies]))
    refused = outcomes[1]
    assert isinstance(refused, Rejected) and refused.error.condition == "amqp:link:message-size-exceeded"
    assert all(isinstance(o, Accepted) for i, o in enumerate(outcomes) if i != 1)
    assert [m.body for m in ns.browse(name)] == [bodies[0], bodies[2], bodies[3]]


def test_duplicates_within_one_read_are_accepted_and_stored_once(root_client, ns, queue, grouped):
    name = queue(requires_duplicate_detection=True, enable_partitioning=True)
    ids = ["a", "b", "a", "c", "b", "a", "d"]
    sends = [(_message(f"{i}:{mid}".encode(), message_id=mid), 0) for i, mid in enumerate(ids)]
    outcomes = asyncio.run(_send_together(root_client, name, sends))
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert max(grouped) > 1
    stored = sorted(m.body for m in ns.browse(name))
    assert stored == [b"0:a", b"1:b", b"3:c", b"6:d"]  # the first of each id


def test_partition_keys_and_keyless_mixed_in_one_read_route_each_by_its_own_key(root_client, ns, queue, grouped):
    name = queue(enable_partitioning=True)
    keys = ["k1", None, "k2", "k1", None, "k3", "k2", None]
    sends = [(_message(f"{i}".encode(), key=k), 0) for i, k in enumerate(keys)]
    outcomes = asyncio.run(_send_together(root_client, name, sends))
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert max(grouped) > 1
    messages = list(ns.browse(name))
    assert sorted(int(m.body) for m in messages) == list(range(len(keys)))
    partitions = len(ns.resolve(name)[0].partitions)
    for m in messages:
        key = keys[int(m.body)]
        if key is not None:
            assert m.partition_key == key
            assert decode_sequence_number(m.sequence_number)[0] == partition_for_key(key, partitions)
    # keyless sends of one read share one partition (chosen round-robin)
    assert len({decode_sequence_number(m.sequence_number)[0] for m in messages if m.partition_key is None}) == 1


def test_sessions_mixed_in_one_read_and_a_sessionless_send_refused_alone(root_client, ns, queue):
    name = queue(requires_session=True, enable_partitioning=True)
    sessions = ["s1", "s2", None, "s1", "s3", "s2"]
    sends = [(_message(f"{i}".encode(), session=s), 0) for i, s in enumerate(sessions)]
    outcomes = asyncio.run(_send_together(root_client, name, sends))
    assert isinstance(outcomes[2], Rejected)
    assert all(isinstance(o, Accepted) for i, o in enumerate(outcomes) if i != 2)
    partitions = len(ns.resolve(name)[0].partitions)
    messages = list(ns.browse(name))
    assert sorted(int(m.body) for m in messages) == [0, 1, 3, 4, 5]
    for m in messages:
        assert m.session_id == sessions[int(m.body)]
        assert decode_sequence_number(m.sequence_number)[0] == partition_for_key(m.session_id, partitions)


def test_sdk_sync_sender_mixed_sizes_duplicates_and_single_sends(conn_str, ns, queue):
    name = queue(requires_duplicate_detection=True)
    batch = [ServiceBusMessage(b"x" * n, message_id=mid) for n, mid in [(10, "a"), (20 * KB, "b"), (1, "a")]]
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender(name) as sender:
        sender.send_messages(batch)  # one batch transfer: its second "a" is dropped as a duplicate
        for n, mid in [(5 * KB, "c"), (3, "b"), (7, "d")]:
            sender.send_messages(ServiceBusMessage(b"y" * n, message_id=mid))
    assert [(len(m.body), m.message_id) for m in ns.browse(name)] == [
        (10, "a"),
        (20 * KB, "b"),
        (5 * KB, "c"),
        (7, "d"),
    ]


def test_sends_to_two_queues_interleaved_in_one_read_are_each_stored_in_order(root_client, ns, queue, grouped):
    """One connection, a sender link to each of two queues, their sends alternating in one write: each queue's
    sends are gathered apart (one ``submit_many`` each) and stored in the order they came, all accepted."""
    first, second = queue(), queue()

    async def run() -> list[Any]:
        client = await root_client()
        try:
            session = await client.session()
            a = await session.sender(first)
            b = await session.sender(second)
            sends = [(a if i % 2 == 0 else b).send(_message(f"m{i}".encode())) for i in range(40)]
            return await asyncio.gather(*sends)
        finally:
            await client.close()

    outcomes = asyncio.run(run())
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert sum(grouped) == 40 and max(grouped) > 1  # gathered per queue, several to a call
    for name, sent in ((first, range(0, 40, 2)), (second, range(1, 40, 2))):
        stored = ns.browse(name)
        assert sorted(int(m.body[1:]) for m in stored) == list(sent)
        by_partition: dict[int, list[int]] = {}
        for m in stored:  # a read's keyless sends share a partition; each partition keeps the order they came in
            by_partition.setdefault(decode_sequence_number(m.sequence_number)[0], []).append(int(m.body[1:]))
        assert all(numbers == sorted(numbers) for numbers in by_partition.values())


def test_a_run_of_sends_with_messages_the_plain_decoder_leaves_keeps_each_outcome_in_order(root_client, ns, queue):
    """``SendLinks._on_sends`` takes a read's run of sends in one loop and hands what the plain decoder leaves (a
    malformed message, a value body, a batch) to ``_on_send``: each keeps its own outcome, the rest of the run goes
    on, and what was stored is stored in the order it came."""
    name = queue()
    value = AmqpMessage.with_value("a value", properties=Properties(message_id="v")).encode()
    malformed = b"\x00\x53\x75\xb0\x00\x00\x00\x09ab"  # a data section shorter than its length
    batch = build_batch([AmqpMessage.with_data(b"in batch").encode()])
    sends = [(_message(b"p0"), 0), (malformed, 0), (_message(b"p1"), 0), (value, 0), (batch, BATCH_MESSAGE_FORMAT)]
    sends += [(_message(b"p2"), 0), (malformed, 0), (_message(b"p3"), 0)]
    outcomes = asyncio.run(_send_together(root_client, name, sends))
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, Rejected)]
    assert refused == [1, 6]
    assert all(outcomes[i].error.condition == Symbol("amqp:decode-error") for i in refused)
    assert all(isinstance(o, Accepted) for i, o in enumerate(outcomes) if i not in refused)
    stored = list(ns.browse(name))
    assert [m.body_type == ModelBody.DATA for m in stored] == [True, True, False, True, True, True]  # p1, the value
    assert [m.body for m in stored if m.body_type == ModelBody.DATA] == [b"p0", b"p1", b"in batch", b"p2", b"p3"]
