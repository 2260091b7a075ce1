"""FrameReader gathers a large frame read by read (amqp/framing.py, GATHER_FROM) and gives the same frames, in the
same order, as it does for small ones, whatever the reads' boundaries."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.amqp.framing import FRAME_AMQP, GATHER_FROM, FrameReader, FramingError, encode_frame, heartbeat_frame


def _frames(reader: FrameReader, stream: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    got = []
    start = 0
    for end in [*sorted(set(cuts)), len(stream)]:
        if end <= start:
            continue
        reader.feed(memoryview(stream)[start:end])  # a view: the reader must copy what it keeps
        start = end
        while (f := reader.next_frame()) is not None:
            assert type(f.body) is bytes
            got.append((f.channel, f.body))
    return got


BODIES = [os.urandom(GATHER_FROM * 3 + 17), b"small", os.urandom(GATHER_FROM - 8), b"", os.urandom(GATHER_FROM + 1)]
STREAM = b"".join(encode_frame(FRAME_AMQP, i, b) if b else heartbeat_frame() for i, b in enumerate(BODIES))
EXPECTED = [(i if b else 0, b) for i, b in enumerate(BODIES)]


@pytest.mark.parametrize("chunk", [1000, 4096, 65536, GATHER_FROM + 5, len(STREAM)])
def test_large_frames_in_reads_of_any_size(chunk: int) -> None:
    r = FrameReader()
    assert _frames(r, STREAM, list(range(chunk, len(STREAM), chunk))) == EXPECTED
    assert r.buffered == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=40))
def test_large_frames_at_random_read_boundaries(cuts: list[int]) -> None:
    r = FrameReader()
    assert _frames(r, STREAM, cuts) == EXPECTED
    assert r.buffered == 0


def test_buffered_counts_a_frame_being_gathered_and_the_limit_comes_first() -> None:
    frame = encode_frame(FRAME_AMQP, 1, bytes(GATHER_FROM * 2))
    r = FrameReader()
    r.feed(frame[:1000])
    assert r.next_frame() is None
    r.feed(frame[1000:5000])
    assert r.next_frame() is None and r.buffered == 5000
    r.feed(frame[5000:] + heartbeat_frame())
    assert r.next_frame() == (FRAME_AMQP, 1, bytes(GATHER_FROM * 2))
    assert r.next_frame() == (FRAME_AMQP, 0, b"")
    assert r.buffered == 0
    small = FrameReader(max_frame_size=GATHER_FROM)  # refused on its header, before anything is gathered
    small.feed(frame[:100])
    with pytest.raises(FramingError):
        small.next_frame()


def test_extended_header_of_a_gathered_frame_is_skipped() -> None:
    body = os.urandom(GATHER_FROM)
    head = (8 + 8 + len(body)).to_bytes(4, "big") + bytes([4, FRAME_AMQP, 0, 3]) + b"EXTENDED"
    frame = head + body
    for first in (8, 12, 16, 100):  # the first read ends inside the extended header, or after it
        r = FrameReader()
        assert _frames(r, frame + heartbeat_frame(), [first, first + 30000]) == [(3, body), (0, b"")]
