"""The send path's written-out routing gives what the functions it replaces give.

``QueueEntity.submit_many`` routes a queue's usual send (one owned message, no session id) without ``_route``,
``partition_key_of`` and ``_fan_out``; ``_route`` itemises an owned batch without ``_fan_out``; and
``batch_partition_key`` calls ``partition_key_of`` only for a message with a key. For every combination of the fields
the rules read, the partition key and the duplicate-detection id must be the ones the general path gives.
"""

from __future__ import annotations

import itertools
import uuid
from concurrent.futures import Future

import pytest

from shardbus import Message
from shardbus.entity.entity import QUEUE_SLOT, _dedup_id
from shardbus.model.errors import ShardbusError
from shardbus.model.routing import batch_partition_key, partition_for_key, partition_key_of

MESSAGE_IDS = [None, "m-1", uuid.UUID(int=7), 42]
PARTITION_KEYS = [None, "", "p"]
TRANSFER_IDS = [None, "t-1"]


def _messages() -> list[Message]:
    out = []
    for message_id, key, transfer_id in itertools.product(MESSAGE_IDS, PARTITION_KEYS, TRANSFER_IDS):
        m = Message(b"x", message_id=message_id, partition_key=key)
        m.transfer_id = transfer_id
        out.append(m)
    return out


@pytest.mark.parametrize("duplicate_detection", [False, True])
def test_single_send_routed_as_by_the_rules(ns, duplicate_detection):
    ns.create_queue("q", enable_partitioning=True, requires_duplicate_detection=duplicate_detection)
    queue = ns.resolve("q")[0]
    captured: list[list] = []
    for p in queue.partitions:  # what each partition is handed, not stored (the test is about routing)
        p.enqueue = lambda items, p=p: captured.append([p.id, items]) or _done()
    for m in _messages():
        captured.clear()
        expected_key = partition_key_of(m, duplicate_detection)
        expected_id = _dedup_id(m)
        queue.submit_many([[m]], lambda indices, outcomes: None, owned=True)
        [(pid, items)] = captured
        assert items == [(expected_id, [(QUEUE_SLOT, m)])]
        if expected_key is not None:
            assert pid == partition_for_key(expected_key, len(queue.partitions))


@pytest.mark.parametrize("duplicate_detection", [False, True])
def test_batch_partition_key_as_by_the_rules(duplicate_detection):
    messages = _messages()
    for a, b in itertools.product(messages, repeat=2):
        batch = [a, b]
        keys = {partition_key_of(m, duplicate_detection) for m in batch}  # the rule as it was written
        if len(keys) > 1:
            with pytest.raises(ShardbusError):
                batch_partition_key(batch, duplicate_detection, True)
            assert batch_partition_key(batch, duplicate_detection, False) is None
        else:
            assert batch_partition_key(batch, duplicate_detection, True) == next(iter(keys))


def _done() -> Future:
    f: Future = Future()
    f.set_result([])
    return f


def test_a_group_refused_by_its_partition_is_sent_again_batch_by_batch(ns):
    """``submit_many`` hands a partition one list of every item of its batches; when the partition refuses it (here
    a message over the size limit), each batch is sent again alone with its own items: the others are stored whole,
    the large one alone is refused, and every batch gets exactly one outcome."""
    ns.create_queue("g", enable_partitioning=True)
    queue = ns.resolve("g")[0]
    big = Message(b"x" * (queue.partitions[0].config.max_message_size_bytes + 1), message_id="big")
    batches = [
        [Message(b"a", message_id="a")],
        [Message(b"b1", message_id="b1"), Message(b"b2", message_id="b2")],  # a batch: routed by ``_route``
        [big],
        [Message(b"c", message_id="c")],
    ]
    outcomes: dict[int, object] = {}
    finished = Future()

    def on_done(indices: list[int], results: list[object]) -> None:
        for i, result in zip(indices, results, strict=True):
            assert i not in outcomes
            outcomes[i] = result
        if len(outcomes) == len(batches):
            finished.set_result(None)

    queue.submit_many(batches, on_done, owned=True)
    finished.result(timeout=10)
    assert [outcomes[i] is None for i in range(4)] == [True, True, False, True]
    assert isinstance(outcomes[2], ShardbusError)
    assert sorted(m.body for m in ns.browse("g")) == [b"a", b"b1", b"b2", b"c"]


@pytest.mark.parametrize("keyed_last", [False, True])
def test_a_reads_keyless_sends_go_to_one_partition_in_order(ns, keyed_last):
    """A call of keyless single sends (``_keyless_items``, one pass) hands one partition their items in order, as
    the loop does; one keyed send among them sends the whole call through the loop, with the same keyless group."""
    ns.create_queue("k", enable_partitioning=True)
    queue = ns.resolve("k")[0]
    captured: list[list] = []
    for p in queue.partitions:
        p.enqueue = lambda items, p=p: captured.append([p.id, items]) or _done()
    keyless = [m for m in _messages() if partition_key_of(m, False) is None]
    batches = [[m] for m in keyless] + ([[Message(b"k", partition_key="p")]] if keyed_last else [])
    answered: list[int] = []
    queue.submit_many(batches, lambda indices, outcomes: answered.extend(indices), owned=True)
    assert sorted(answered) == list(range(len(batches)))
    assert len(captured) <= (2 if keyed_last else 1)  # one enqueue per partition
    [keyless_items] = [items for _, items in captured if items[0][1][0][1] is keyless[0]]
    keyed = batches[-1][0] if keyed_last else None
    assert [item for item in keyless_items if item[1][0][1] is not keyed] == [
        (_dedup_id(m), [(QUEUE_SLOT, m)]) for m in keyless
    ]


def test_an_owned_batch_itemised_as_by_the_rules(ns):
    """``_route`` itemises a queue's owned batch with ``_dedup_id`` written out: the same ids, in order."""
    ns.create_queue("b", enable_partitioning=True)
    queue = ns.resolve("b")[0]
    batch = [m for m in _messages() if partition_key_of(m, False) is None]
    key, items = queue._route(batch, True, False, False)
    assert key is None
    assert items == [(_dedup_id(m), [(QUEUE_SLOT, m)]) for m in batch]
    assert [type(i) for i, _ in items] == [type(_dedup_id(m)) for m in batch]
