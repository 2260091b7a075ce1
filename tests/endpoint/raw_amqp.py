"""Raw AMQP bytes for tests that talk to the broker over a plain socket (no client library): a frame from a
performative, and the performatives of what the broker wrote back."""

from __future__ import annotations

import struct
from typing import Any

from shardbus.amqp.framing import FrameReader
from shardbus.amqp.performatives import decode_performative

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def frame(perf: Any, payload: bytes = b"", channel: int = 0, frame_type: int = 0) -> bytes:
    """One frame: ``perf`` encoded, then ``payload`` (a transfer's message bytes)."""
    body = perf.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


def performatives(data: bytes) -> list[Any]:
    """The performatives of every complete frame in ``data`` (protocol headers and empty frames skipped)."""
    reader = FrameReader()
    reader.feed(data)
    perfs = []
    while reader.buffered:
        if reader.peek(4) == b"AMQP":
            reader.read_protocol_header()
            continue
        read = reader.next_frame()
        if read is None:
            break
        if read.body:
            perfs.append(decode_performative(read.body)[0])
    return perfs
