"""AMQP 1.0 framing (part 2.3): protocol headers, the 8-byte frame header, and an incremental splitter.

A frame is ``size:uint32 | doff:uint8 | type:uint8 | channel:uint16 | extended header | body``. ``doff`` counts
4-byte words; we always write ``doff=2`` (no extended header), the only value the Azure SDK reads correctly,
and skip any extended header a peer sends. A frame of size 8 is an empty frame (heartbeat).

``FrameReader`` owns one ``bytearray``: bytes are appended as they arrive and whole frames are cut out of it.
Consumed bytes are dropped lazily (once they are more than half of the buffer), so feeding many small chunks
stays linear. Size limits are enforced before any frame body is buffered in full, so a peer announcing a 4 GiB
frame is refused at once.

A large frame (``GATHER_FROM`` bytes or more, e.g. the SDK's 1 MB frames of a batch) that has not fully arrived
is gathered instead: the reads that bring it are kept as they come (a list of them) and joined once, into the
frame's body, when the last one is in. Grown in the ``bytearray`` and then cut out of it, each of its bytes was
copied three times (the growing buffer, the slice, the ``bytes`` of the slice), each copy into fresh memory the
kernel had to map: 1.7 ms of CPU for a 1 MB SDK batch frame read in 64 KB pieces, 0.09 ms gathered (measured
alone; in bench/amqp.py the SDK's writes arrive in larger reads and the broker's CPU did not move). Memory: the
unconsumed bytes, at most one frame (``max_frame_size``) plus one read.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "AMQP_HEADER",
    "FRAME_AMQP",
    "FRAME_SASL",
    "MIN_MAX_FRAME_SIZE",
    "SASL_HEADER",
    "TLS_HEADER",
    "Frame",
    "FrameReader",
    "FramingError",
    "encode_frame",
    "encode_frame_into",
    "heartbeat_frame",
]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

FRAME_AMQP = 0x00
FRAME_SASL = 0x01

MIN_MAX_FRAME_SIZE = 512
"""Every peer must accept frames up to this size, whatever it advertises."""

_HDR = struct.Struct(">IBBH")
_HDR_unpack = _HDR.unpack_from
_HDR_pack = _HDR.pack
GATHER_FROM = 65536  # a frame at least this large that has not fully arrived is gathered read by read (above)


class FramingError(Exception):
    """The byte stream is not a valid sequence of frames (maps to ``amqp:connection:framing-error``)."""


class Frame(NamedTuple):
    """One received frame. ``body`` excludes the header and any extended header; empty for heartbeats."""

    type: int
    channel: int
    body: bytes


def encode_frame(frame_type: int, channel: int, body: bytes | bytearray) -> bytes:
    """Return a complete frame with ``doff=2`` around ``body`` (already-encoded performative + payload)."""
    return _HDR_pack(len(body) + 8, 2, frame_type, channel) + body


def encode_frame_into(out: bytearray, frame_type: int, channel: int, *parts: bytes | bytearray) -> None:
    """Append a frame made of ``parts`` to ``out`` without joining the parts first."""
    out += _HDR_pack(8 + sum(len(p) for p in parts), 2, frame_type, channel)
    for p in parts:
        out += p


def heartbeat_frame() -> bytes:
    """An empty AMQP frame, used to keep an idle connection alive."""
    return _HDR_pack(8, 2, FRAME_AMQP, 0)


_new_frame = tuple.__new__  # Frame(...) without the NamedTuple's Python-level __new__: one per frame received


class FrameReader:
    """Incremental splitter over a growing buffer: ``feed`` bytes, then pull headers or frames.

    ``max_frame_size`` bounds accepted frames; it can be changed at any time (e.g. after ``open``). One reader
    besides ``next_frame``: the connection hands ``_buf`` and ``_pos`` to ``transfer_run.take_transfers``, which
    reads a run of transfer frames in place and moves ``_pos`` past them (never while a frame is gathered: ``_buf``
    is empty then).
    """

    __slots__ = ("_buf", "_have", "_parts", "_pos", "_want", "max_frame_size")

    def __init__(self, max_frame_size: int = 0xFFFFFFFF) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame_size = max_frame_size
        self._parts: list[bytes] | None = None  # a large frame being gathered: the reads so far, its header first
        self._have = 0  # bytes in ``_parts``
        self._want = 0  # the gathered frame's size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        parts = self._parts
        if parts is not None:
            parts.append(data if type(data) is bytes else bytes(data))  # a caller's buffer may be reused
            self._have += len(data)
            return
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet consumed."""
        return len(self._buf) - self._pos + self._have

    def read_protocol_header(self) -> bytes | None:
        """Consume and return the next 8 bytes (a protocol header), or ``None`` if fewer are buffered."""
        p = self._pos
        if len(self._buf) - p < 8:
            return None
        self._pos = p + 8
        return bytes(self._buf[p : p + 8])

    def peek(self, n: int) -> bytes:
        """Up to ``n`` unconsumed bytes, without consuming them."""
        return bytes(self._buf[self._pos : self._pos + n])

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or ``None`` if it has not fully arrived yet.

        Raises ``FramingError`` for a malformed header or a frame above ``max_frame_size``.
        """
        if self._parts is not None:
            if self._have < self._want:
                return None
            return self._gathered()
        buf = self._buf
        p = self._pos
        if len(buf) - p < 8:
            return None
        size, doff, ftype, channel = _HDR_unpack(buf, p)
        if doff < 2 or doff * 4 > size:  # so size is at least 8 too
            raise FramingError(f"invalid frame header (size={size}, doff={doff})")
        if size > self.max_frame_size:
            raise FramingError(f"frame of {size} bytes exceeds max-frame-size {self.max_frame_size}")
        end = p + size
        if end > len(buf):
            if size >= GATHER_FROM:  # gather the rest read by read (see the module docstring)
                self._parts = [bytes(buf[p:])]
                self._have = len(buf) - p
                self._want = size
                self._buf = bytearray()
                self._pos = 0
            return None
        self._pos = end
        return _new_frame(Frame, (ftype, channel, bytes(buf[p + doff * 4 : end])))

    def _gathered(self) -> Frame:
        """The gathered large frame, all of whose bytes are in ``_parts``: its body joined in one copy; what
        came after it goes back to the buffer."""
        parts = self._parts
        assert parts is not None
        size, doff, ftype, channel = _HDR_unpack(parts[0], 0)  # the header's 8 bytes came before gathering began
        head = doff * 4
        extra = self._have - size  # bytes of the last read beyond this frame
        self._parts = None
        self._have = self._want = 0
        if len(parts[0]) >= head:
            last = parts[-1]
            views = [memoryview(part) for part in parts]
            views[0] = views[0][head:]
            views[-1] = views[-1][: len(last) - extra]
            body = b"".join(views)
            for view in views:
                view.release()
            if extra:
                self._buf += memoryview(last)[len(last) - extra :]
        else:  # an extended header longer than the first read: join, then cut (never seen from a real peer)
            joined = b"".join(parts)
            body = joined[head:size]
            self._buf += joined[size:]
        return _new_frame(Frame, (ftype, channel, body))
