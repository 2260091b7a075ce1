"""The cluster wire's hot batches built in line (``wire.py``): what comes back behaves as what went."""

from __future__ import annotations

import pickle
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from shardbus.cluster import wire
from shardbus.model.message import BodyType, Message, MessageState
from shardbus.model.routing import new_lock_tokens


def _read(data: bytes) -> list:
    reader = wire.reader()
    reader.feed(data)
    return list(reader)


def test_lock_tokens_come_back_as_the_constructors_uuids() -> None:
    """A token rebuilt in line (a lock reply's) equals, hashes, prints and pickles as ``uuid.UUID(int=...)`` does;
    a complete's come back as the tokens' ints, in order, the extremes too."""
    tokens = [*new_lock_tokens(7, 5), uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)]
    messages = [Message(b"x", lock_token=t) for t in tokens]
    (reply, complete) = _read(
        wire.pack_frame([1, True, wire.wrap_reply(messages), None])
        + wire.pack_frame([2, "k", 1.0, "complete", [0, wire.Tokens(tokens)]])
    )
    assert complete[4][1] == [t.int for t in tokens] and all(type(k) is int for k in complete[4][1])
    for got in ([m.lock_token for m in reply[2]],):
        for sent, back in zip(tokens, got, strict=True):
            made = uuid.UUID(int=sent.int)
            assert type(back) is uuid.UUID
            assert back == made and hash(back) == hash(made) and str(back) == str(made)
            assert back.is_safe is made.is_safe
            assert pickle.loads(pickle.dumps(back)) == made
            assert {back: 1}[made] == 1


def test_enqueue_items_of_one_copy_and_of_many() -> None:
    """The one-copy fast path and the general one read back the same shape, in order."""
    a, b, c = (Message(bytes([i]) * 10, message_id=f"m{i}") for i in range(3))
    items = [(None, [(0, a)]), ("dedup", [(0, b), (2, b), (5, c)]), (None, [(4, c)]), ("empty", [])]
    (frame,) = _read(wire.pack_frame([1, "k", 1.0, "enqueue", [wire.Items(items), "batch"]]))
    got = frame[4][0]
    assert [key for key, _ in got] == [key for key, _ in items]
    assert [[slot for slot, _ in copies] for _, copies in got] == [[0], [0, 2, 5], [4], []]
    assert [[m.message_id for _, m in copies] for _, copies in got] == [["m0"], ["m1", "m1", "m2"], ["m2"], []]
    assert all(type(m) is Message for _, copies in got for _, m in copies)


def test_a_reply_of_messages_travels_as_a_messages_frame() -> None:
    """A list of messages in a reply (a lock's) is the frame's own value, as records, read back by
    ``messages_of``; any other reply keeps the plain four-element frame."""
    from datetime import timedelta

    messages = [Message(bytes([i]) * 50, message_id=f"m{i}", time_to_live=timedelta(seconds=i)) for i in range(4)]
    messages[1].application_properties = {"k": [1, "two"]}
    messages[2].lock_token = uuid.uuid4()
    frames = _read(
        wire.reply_frame(1, True, messages, None)
        + wire.reply_frame(2, True, [], "down")
        + wire.reply_frame(3, False, ["EntityNotFound", "gone"], None)
        + wire.reply_frame(4, True, 7, None)
    )
    first, *rest = frames
    assert len(first) == 5 and first[4] == wire.MESSAGES and first[4] != wire.APPLIED
    back = wire.messages_of(first[2])
    assert [type(m) for m in back] == [Message] * 4
    assert [(m.body, m.message_id, m.time_to_live) for m in back] == [
        (m.body, m.message_id, m.time_to_live) for m in messages
    ]
    assert back[1].application_properties == {"k": [1, "two"]} and back[2].lock_token == messages[2].lock_token
    assert rest == [[2, True, [], "down"], [3, False, ["EntityNotFound", "gone"], None], [4, True, 7, None]]


def test_a_worker_of_the_previous_version_is_named_as_such() -> None:
    """An enqueue's send records are in their items' arrays from version 8 on (version 7 nested each in an array of
    its own): a version-7 worker, and any older, is refused at connect, saying so."""
    assert wire.MAGIC == b"SBW8"
    for older in (b"SBW2", b"SBW3", b"SBW4", b"SBW5", b"SBW6", b"SBW7"):
        with pytest.raises(ValueError, match="another version"):
            wire.answer("k", older + bytes(wire.NONCE_BYTES))


def test_an_enqueues_items_travel_in_the_request_and_the_worker_reads_them_back() -> None:
    """``ItemsArg`` (what ``RemotePartition`` sends) is plain arrays in the frame; ``items_of`` (the worker, by the
    operation: ``worker.ITEMS_ARGUMENT``) gives the items back, as the extension value ``Items`` does."""
    from shardbus.cluster.worker import ITEMS_ARGUMENT

    assert ITEMS_ARGUMENT == {"enqueue": 0, "transact": 0}
    a, b = Message(b"a" * 30, message_id="a"), Message(b"b" * 30, message_id="b", application_properties={"n": 1})
    items = [(None, [(0, a)]), ("d", [(1, b), (2, a)])]
    inline, ext = _read(
        wire.pack_frame([1, "k", 1.0, "enqueue", [wire.ItemsArg(items), "batch"]])
        + wire.pack_frame([2, "k", 1.0, "enqueue", [wire.Items(items), "batch"]])
    )
    assert inline[4][1] == "batch" and type(inline[4][0]) is list
    for got in (wire.items_of(inline[4][0]), ext[4][0]):
        assert [(key, [(slot, m.message_id, m.body) for slot, m in copies]) for key, copies in got] == [
            (None, [(0, "a", a.body)]),
            ("d", [(1, "b", b.body), (2, "a", a.body)]),
        ]
        assert got[1][1][0][1].application_properties == {"n": 1}


def _every_field(m: Message) -> dict:
    return {f: getattr(m, f) for f in Message.__slots__}


@pytest.mark.parametrize("rare", [None, *wire._RARE])
def test_a_record_gives_back_every_field_whichever_are_at_their_defaults(rare: str | None) -> None:
    """A compact record carries the fields mostly at their defaults (``wire._RARE``) as one element, None while all
    are: a message comes back field for field, with none of them set, with one, and with all of them."""
    values = {
        "session_id": "s",
        "partition_key": "pk",
        "correlation_id": "c",
        "subject": "sub",
        "content_type": "text/plain",
        "to": "to",
        "reply_to": "rt",
        "reply_to_session_id": "rts",
        "time_to_live": timedelta(seconds=90),
        "scheduled_enqueue_time": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "annotations": {"x-custom": 1},
        "dead_letter_reason": "r",
        "dead_letter_error_description": "d",
        "dead_letter_source": "src",
        "forward_hops": 2,
        "transfer_id": "t",
    }
    assert set(values) == set(wire._RARE)
    locked = dict(
        body=b"body",
        message_id="m",
        application_properties={"k": [1, "two"]},
        body_type=BodyType.VALUE,
        sequence_number=7,
        enqueued_time_ms=1_700_000_000_000,
        expires_at_ms=1_800_000_000_000,
        delivery_count=3,
        lock_token=uuid.uuid4(),
        locked_until_ms=1_700_000_060_000,
        state=MessageState.DEFERRED,
        partition_id=4,
        enqueued_sequence_number=9,
        wire_sections=b"sections",
    )
    messages = [
        Message(b"plain"),
        Message(**locked),
        Message(**locked, **({rare: values[rare]} if rare else values)),
        Message(b"none hops", forward_hops=None),  # type: ignore[arg-type]
    ]
    items = [(None, [(0, m)]) for m in messages]
    assert wire.records_of(messages) == [wire.record_of(m) for m in messages]  # a lock reply's, in one loop
    request, reply, ext = _read(
        wire.pack_frame([1, "k", 1.0, "enqueue", [wire.ItemsArg(items), "b"]])
        + wire.reply_frame(2, True, wire.Records(wire.records_of(messages)), None)
        + wire.pack_frame([3, True, wire.Messages(messages), None])
    )
    for back in ([m for _, [(_, m)] in wire.items_of(request[4][0])], wire.messages_of(reply[2]), ext[2]):
        assert [_every_field(m) for m in back] == [_every_field(m) for m in messages]
        assert [type(m.body_type) for m in back] == [BodyType] * 4 and [type(m.state) for m in back] == [
            MessageState
        ] * 4


def test_a_send_record_carries_what_a_partition_keeps_and_not_what_it_sets() -> None:
    """An enqueue's message of one copy travels as a send record (SBW6), in its item's array (SBW8): the sender's
    fields and those a partition keeps as sent (a lock token, an enqueued sequence number, the rare ones), not those
    every enqueue sets (the worker gives them their defaults, which the partition overwrites)."""
    plain = Message(b"p" * 100, message_id="p")
    kept = Message(b"k", message_id="k", subject="s", application_properties={"n": 1}, time_to_live=timedelta(1))
    kept.lock_token, kept.locked_until_ms, kept.enqueued_sequence_number = uuid.uuid4(), 5, 7
    kept.sequence_number, kept.delivery_count, kept.state, kept.partition_id = 99, 3, MessageState.DEFERRED, 2
    topic = [(1, Message(b"t1", message_id="t")), (2, Message(b"t2", message_id="t"))]
    arrays, held = wire.held_item_arrays([("d1", [(0, plain)]), (None, [(0, kept)])])
    assert held is not None and [m is s for m, s in zip(held, (plain, kept), strict=True)] == [True, True]
    assert [len(item) for item in arrays] == [8, 8] and arrays[0][:2] == ["d1", 0] and arrays[0][-1] is None
    (frame,) = _read(wire.pack_frame([1, "k", 1.0, "enqueue", [arrays, "b"]]))
    items, messages = wire.held_items_of(frame[4][0])
    assert [(key, [slot for slot, _ in copies]) for key, copies in items] == [("d1", [0]), (None, [0])]
    p, k = messages
    assert _every_field(p) == _every_field(Message(b"p" * 100, message_id="p"))  # every other field at its default
    assert [type(m.state) for m in messages] == [MessageState] * 2
    assert (p.body, p.message_id, p.lock_token, p.enqueued_sequence_number, p.subject) == (
        b"p" * 100,
        "p",
        None,
        None,
        None,
    )
    assert (k.lock_token, k.locked_until_ms, k.enqueued_sequence_number) == (kept.lock_token, 5, 7)
    assert (k.subject, k.application_properties, k.time_to_live) == ("s", {"n": 1}, timedelta(1))
    for m in messages:
        assert (m.sequence_number, m.enqueued_time_ms, m.expires_at_ms, m.partition_id) == (None, None, None, None)
        assert m.delivery_count == 0 and m.state is MessageState.ACTIVE and m.body_type is BodyType.DATA
    # a topic's item of several copies: compact records, nothing held
    arrays, held = wire.held_item_arrays([(None, topic)])
    (frame,) = _read(wire.pack_frame([1, "k", 1.0, "enqueue", [arrays, "b"]]))
    items, messages = wire.held_items_of(frame[4][0])
    assert held is None and messages is None
    assert [(slot, m.body) for slot, m in items[0][1]] == [(1, b"t1"), (2, b"t2")]
