"""The cluster wire format: frames back to back on a stream, in order, the handshake, and values that survive
the trip."""

from __future__ import annotations

import threading
import uuid

import pytest

from shardbus.cluster import wire
from shardbus.model.message import BodyType, Message, MessageState, SubQueue


def _message(i: int) -> Message:
    return Message(
        body=bytes([i % 256]) * 100,
        message_id=f"m{i}",
        application_properties={"i": i},
        sequence_number=i,
        lock_token=uuid.uuid4(),
        state=MessageState.DEFERRED,
        body_type=BodyType.VALUE,
    )


def _same(a: Message, b: Message) -> bool:
    return all(
        getattr(a, f) == getattr(b, f) and type(getattr(a, f)) is type(getattr(b, f)) for f in wire._MESSAGE_FIELDS
    )


def _read(chunks: list[bytes]) -> list[list]:
    """The frames a stream's reader gives for these received chunks, in order."""
    reader = wire.reader()
    out = []
    for chunk in chunks:
        reader.feed(chunk)
        out.extend(reader)
    return out


def test_frames_read_back_in_order_however_the_stream_splits_them() -> None:
    frames = [[i, "ns/entities/1/p00.db", 1.5, "enqueue", [[_message(i)], SubQueue.DEAD_LETTER]] for i in range(1, 40)]
    stream = b"".join(wire.pack_frame(f) for f in frames)
    for size in (1, 7, 1000, len(stream)):  # one byte at a time, odd cuts, all at once
        got = _read([stream[i : i + size] for i in range(0, len(stream), size)])
        assert [g[0] for g in got] == list(range(1, 40))
        for sent, back in zip(frames, got, strict=True):
            assert _same(sent[4][0][0], back[4][0][0])
            assert back[4][1] is SubQueue.DEAD_LETTER


def test_a_big_frame_between_small_ones() -> None:
    big = [1, True, b"x" * (4 * 1024 * 1024), None]
    small = [[i, True, b"y" * 1000, None] for i in range(2, 600)]
    stream = b"".join(wire.pack_frame(f) for f in [*small[:300], big, *small[300:]])
    got = _read([stream[i : i + 65536] for i in range(0, len(stream), 65536)])
    assert [f[0] for f in got] == [*range(2, 302), 1, *range(302, 600)]
    assert got[300][2] == big[2]


def test_the_handshake_proves_the_key_without_sending_it() -> None:
    opening, nonce = wire.challenge()
    reply = wire.answer("secret", opening)
    assert b"secret" not in reply
    assert wire.accepts("secret", nonce, reply)
    assert not wire.accepts("other", nonce, reply)
    assert not wire.accepts("secret", wire.challenge()[1], reply)  # an answer to another challenge
    with pytest.raises(ValueError, match="AMQP"):
        wire.answer("secret", b"AMQP\x00\x01\x00\x00")


def test_packing_from_many_threads_at_once() -> None:
    """Packers are pooled: threads packing (and nesting, for messages) at the same time never share one."""
    failures: list[str] = []

    def pack(t: int) -> None:
        for i in range(300):
            frame = [i, f"t{t}", [_message(i + t)]]
            (back,) = _read([wire.pack_frame(frame)])
            if back[0] != i or back[1] != f"t{t}" or not _same(frame[2][0], back[2][0]):
                failures.append(f"thread {t} frame {i}")

    threads = [threading.Thread(target=pack, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []


def _full_message(i: int) -> Message:
    """Every field set, with the value types that need care (enums, a lock token, times, AMQP types)."""
    from datetime import UTC, datetime, timedelta

    from shardbus.amqp import types as t
    from shardbus.store.amqp_values import register_stored_types

    register_stored_types()  # what a worker does where it starts

    m = _message(i)
    m.session_id, m.partition_key, m.correlation_id, m.subject = "s", "pk", uuid.uuid4(), "subj"
    m.content_type, m.to, m.reply_to, m.reply_to_session_id = "text/plain", "to", "rt", "rts"
    m.time_to_live = timedelta(seconds=30)
    m.scheduled_enqueue_time = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    m.application_properties = {"sym": t.Symbol("x"), "u": t.UInt(7), "when": datetime(2031, 1, 1, tzinfo=UTC)}
    m.annotations = {"x-custom": t.Long(3)}
    m.enqueued_time_ms, m.expires_at_ms, m.delivery_count, m.locked_until_ms = 10, 20, 3, 30
    m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source = "r", "d", "src"
    m.partition_id, m.enqueued_sequence_number, m.forward_hops = 5, 99, 2
    m.wire_sections, m.transfer_id = b"\x00\x53\x73", "transfer"
    return m


def test_compact_records_keep_every_field_and_type() -> None:
    """The hot calls' batches (a lock reply's messages, an enqueue's items, a complete's tokens) travel as one
    extension value of compact records each, and come back equal, field by field and type by type."""
    messages = [_full_message(i) for i in range(5)] + [_message(7), Message(body=b"plain")]
    items = [(f"dedup{i}", [(0, m), (3, m)]) for i, m in enumerate(messages)] + [(None, [(1, messages[0])])]
    tokens = [uuid.uuid4() for _ in range(20)]
    frame = [1, "k", 2.0, "enqueue", [wire.Items(items), wire.Tokens(tokens), messages[0]]]
    reply = [1, True, wire.wrap_reply(messages), None]
    assert isinstance(reply[2], wire.Messages)
    back_frame, back_reply = _read([wire.pack_frame(frame) + wire.pack_frame(reply)])
    got_items, got_tokens, got_one = back_frame[4]
    assert [key for key, _ in got_items] == [key for key, _ in items]
    for (_, sent), (_, got) in zip(items, got_items, strict=True):
        assert [slot for slot, _ in got] == [slot for slot, _ in sent]
        assert all(_same(a, b) for (_, a), (_, b) in zip(sent, got, strict=True))
    assert got_tokens == [t.int for t in tokens] and all(type(x) is int for x in got_tokens)  # what a worker needs
    assert _same(got_one, messages[0])
    assert len(back_reply[2]) == len(messages)
    assert all(_same(a, b) for a, b in zip(messages, back_reply[2], strict=True))
    assert wire.wrap_reply([]) == [] and wire.wrap_reply([1, 2]) == [1, 2]
