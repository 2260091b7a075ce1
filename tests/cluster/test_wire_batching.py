"""The cluster wire format: several frames in one transfer, in order, and values that survive the trip."""

from __future__ import annotations

import threading
import uuid

from shardbus.cluster import wire
from shardbus.model.message import BodyType, Message, MessageState, SubQueue
from shardbus.partition.broker import Settle


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


def test_frames_share_transfers_in_order() -> None:
    frames = [[i, "ns/entities/1/p00.db", 1.5, "enqueue", [[_message(i)], SubQueue.DEAD_LETTER]] for i in range(1, 40)]
    payloads = wire.transfers([wire.pack_frame(f) for f in frames])
    assert len(payloads) == 1
    got = wire.decode_frames(payloads[0])
    assert [g[0] for g in got] == list(range(1, 40))
    for sent, back in zip(frames, got, strict=True):
        assert _same(sent[4][0][0], back[4][0][0])
        assert back[4][1] is SubQueue.DEAD_LETTER


def test_big_batches_split_and_a_big_frame_travels_alone() -> None:
    big = [1, True, b"x" * (wire.BATCH_BYTES + 10), None]
    small = [[i, True, b"y" * 1000, None] for i in range(2, 600)]
    payloads = wire.transfers([wire.pack_frame(f) for f in [*small[:300], big, *small[300:]]])
    assert len(payloads) >= 3
    got = [f for p in payloads for f in wire.decode_frames(p)]
    assert [f[0] for f in got] == [*range(2, 302), 1, *range(302, 600)]
    assert got[300][2] == big[2]


def test_a_transfer_of_one_bare_frame_still_reads() -> None:
    """What a worker or front end from before batching sends: one frame, not an array of them."""
    body = wire._pack([7, True, [Settle(outcome="complete", token=uuid.uuid4())], None])
    payload = wire._DATA_SECTION + len(body).to_bytes(4, "big") + body
    (frame,) = wire.decode_frames(payload)
    assert frame[0] == 7 and isinstance(frame[2][0], Settle)
    assert wire.decode_frame(wire.encode_frame([0, "key", 3])) == [0, "key", 3]


def test_packing_from_many_threads_at_once() -> None:
    """Packers are pooled: threads packing (and nesting, for messages) at the same time never share one."""
    failures: list[str] = []

    def pack(t: int) -> None:
        for i in range(300):
            frame = [i, f"t{t}", [_message(i + t)]]
            back = wire.decode_frame(wire.encode_frame(frame))
            if back[0] != i or back[1] != f"t{t}" or not _same(frame[2][0], back[2][0]):
                failures.append(f"thread {t} frame {i}")

    threads = [threading.Thread(target=pack, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []
