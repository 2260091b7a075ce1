"""The cluster wire's hot batches built in line (``wire.py``): what comes back behaves as what went."""

from __future__ import annotations

import pickle
import uuid

from shardbus.cluster import wire
from shardbus.model.message import Message
from shardbus.model.routing import new_lock_tokens


def _read(data: bytes) -> list:
    reader = wire.reader()
    reader.feed(data)
    return list(reader)


def test_lock_tokens_come_back_as_the_constructors_uuids() -> None:
    """A token rebuilt in line (a lock reply's, a complete's) equals, hashes, prints and pickles as
    ``uuid.UUID(int=...)`` does."""
    tokens = [*new_lock_tokens(7, 5), uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)]
    messages = [Message(b"x", lock_token=t) for t in tokens]
    (reply, complete) = _read(
        wire.pack_frame([1, True, wire.wrap_reply(messages), None])
        + wire.pack_frame([2, "k", 1.0, "complete", [0, wire.Tokens(tokens)]])
    )
    for got in ([m.lock_token for m in reply[2]], complete[4][1]):
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
