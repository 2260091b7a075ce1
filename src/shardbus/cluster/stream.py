"""One cluster connection's byte stream: the HMAC handshake, then ``wire.py`` frames both ways.

Theory of operation. A ``FrameStream`` is an asyncio ``Protocol`` in one of three states; every transition is
here:

    opening --(handshake done)--> open --(connection lost, or close())--> closed
    opening --(wrong answer, a peer that is not ours, timeout)--> closed

- Opening, worker side (``server=True``): on connect it writes ``wire.challenge()`` and waits for the front end's
  answer (``wire.ANSWER_BYTES``); a right one gets ``wire.ACCEPTED`` and the stream is open, a wrong one gets
  ``wire.REFUSED`` and the stream closes. A peer that says nothing is closed after ``HANDSHAKE_TIMEOUT``.
- Opening, front-end side: it waits for the challenge, writes its answer, and is open once ``ACCEPTED`` arrives
  (``opened`` resolves; it fails if the connection closes first or the peer is not a shardbus worker).
- Open: each frame travels after its length (``wire.LENGTH``). The transport reads straight into the stream's
  receive buffer (an ``asyncio.BufferedProtocol``), and each complete frame is unpacked from that buffer where
  it lies and goes to ``on_frame`` at once, on the loop thread: no bytes object per read and no copy into a
  streaming unpacker's buffer, two copies of every frame fewer than ``data_received`` and ``Unpacker.feed`` (a
  frame of a hundred 1 KB messages is 120 KB). Only a frame that a read left partly received is moved, to the
  buffer's start, when the room after it runs short. ``queue`` collects frames written during a loop turn and
  writes them in one ``writelines`` at its end (``queue_last``: a frame packed only then, last in that write);
  ``write`` writes a list of frames now. A frame that cannot be
  read, or longer than ``wire.MAX_FRAME_BYTES`` (a broken peer), closes the stream.
- Closed: ``closed`` resolves and ``on_lost`` is called once; writes are dropped (the caller fails what was in
  flight: ``remote.WorkerLink._lost``).

Memory: the handshake's few bytes, a turn's queued frames, and the receive buffer: ``BUFFER_BYTES``, or as much
as the largest frame being received (bounded by ``wire.MAX_FRAME_BYTES``); once what is left in a buffer grown
past ``wire.KEEP_READER_BELOW`` fits a small one again, the stream goes back to a small one.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any

from . import wire

log = logging.getLogger("shardbus.cluster")

HANDSHAKE_TIMEOUT = 5.0


BUFFER_BYTES = 256 * 1024  # the receive buffer: two frames of a hundred 1 KB messages
READ_ROOM = 64 * 1024  # the least room a read is offered; less left after the received bytes: they move first

# Read once per frame: bound here, not looked up in ``wire`` per frame
_LENGTH = wire.LENGTH
_LENGTH_FORMAT = struct.Struct({4: ">I", 8: ">Q"}[_LENGTH])
_read_length = _LENGTH_FORMAT.unpack_from  # a frame's length where it lies in the buffer, no slice made first
_pack_length = _LENGTH_FORMAT.pack
_unpack = wire.unpack_frame
_MAX_FRAME = wire.MAX_FRAME_BYTES
_KEEP_BELOW = wire.KEEP_READER_BELOW


class FrameStream(asyncio.BufferedProtocol):
    """A cluster connection (either side): see the module's theory of operation."""

    def __init__(
        self,
        key: str,
        *,
        server: bool,
        on_frame: Callable[[list[Any]], None],
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.key = key
        self.server = server
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.state = "opening"
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._head = b""  # handshake bytes received so far
        self._nonce = b""
        self._buffer = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._start = 0  # where the bytes not yet read as frames begin in the buffer
        self._end = 0  # where the bytes received end
        self._queued: list[bytes] = []
        self._last: list[Callable[[], bytes]] = []  # makers of frames that go last in the turn's write
        self._write_due = False  # ``_write_queued`` is scheduled
        self.frame_bytes = 0  # the length of the frame ``on_frame`` is given
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.server:
            opening, self._nonce = wire.challenge()
            self.transport.write(opening)  # type: ignore[union-attr]
            self._timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._give_up)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < READ_ROOM:
            self._make_room(READ_ROOM)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self.state == "open":
            self._frames()
        elif self.state == "opening":
            data = bytes(self._view[self._start : self._end])
            self._start = self._end = 0
            self._handshake(data)
        else:
            self._start = self._end = 0  # closed: dropped

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        if self._timer is not None:
            self._timer.cancel()
        self._queued = []
        self._last = []
        if not self.opened.done():
            why = f" ({exc})" if exc is not None else ""
            self.opened.set_exception(ConnectionError(f"the connection closed during the handshake{why}"))
            self.opened.exception()  # retrieved: nobody may be waiting for it any more
        if not self.closed.done():
            self.closed.set_result(None)
        if self.on_lost is not None:
            self.on_lost()

    # --- the handshake (opening) ---------------------------------------------------------------------
    def _handshake(self, data: bytes) -> None:
        head = self._head + data
        if self.server:
            if len(head) < wire.ANSWER_BYTES:
                self._head = head
                return
            reply, rest = head[: wire.ANSWER_BYTES], head[wire.ANSWER_BYTES :]
            if not wire.accepts(self.key, self._nonce, reply):
                log.warning("a cluster connection did not prove the cluster key: refused")
                self.transport.write(wire.REFUSED)  # type: ignore[union-attr]
                self.close()
                return
            self.transport.write(wire.ACCEPTED)  # type: ignore[union-attr]
        else:
            if not self._nonce:  # waiting for the challenge
                if len(head) < wire.CHALLENGE_BYTES:
                    self._head = head
                    return
                try:
                    self.transport.write(wire.answer(self.key, head[: wire.CHALLENGE_BYTES]))  # type: ignore[union-attr]
                except ValueError as exc:
                    self._fail_opening(exc)
                    return
                self._nonce, head = head[len(wire.MAGIC) : wire.CHALLENGE_BYTES], head[wire.CHALLENGE_BYTES :]
                if not head:
                    self._head = b""
                    return
            if head[:1] != wire.ACCEPTED:
                refused = head[:1] == wire.REFUSED
                self._fail_opening(
                    PermissionError("the worker refused the cluster key (its --key differs)")
                    if refused
                    else ValueError("the peer is not a shardbus worker")
                )
                return
            rest = head[1:]
        self._head = b""
        self._open()
        if rest:  # frames right behind the handshake, in the same read
            self._make_room(len(rest))
            self._view[self._end : self._end + len(rest)] = rest
            self._end += len(rest)
            self._frames()

    def _open(self) -> None:
        self.state = "open"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.opened.done():
            self.opened.set_result(None)

    def _fail_opening(self, exc: Exception) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
            self.opened.exception()  # retrieved: a worker's side has nobody waiting for it
        self.close()

    def _give_up(self) -> None:
        if self.state == "opening":
            self._fail_opening(TimeoutError("no handshake"))

    # --- frames (open) -----------------------------------------------------------------------------
    def _frames(self) -> None:
        """Every complete frame received, read where it lies in the buffer, to ``on_frame``."""
        buffer, view, start, end = self._buffer, self._view, self._start, self._end
        partial = 0  # the whole size of a frame only partly received
        try:
            while end - start >= _LENGTH:
                (size,) = _read_length(buffer, start)
                if size > _MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes, more than {_MAX_FRAME}")
                stop = start + _LENGTH + size
                if stop > end:
                    partial = stop - start
                    break
                frame = _unpack(view[start + _LENGTH : stop])
                start = self._start = stop
                self.frame_bytes = size  # what ``on_frame`` may ask: the frame's length (remote.py's ``Held``)
                self.on_frame(frame)
        except Exception as exc:  # a frame we cannot read: the stream is lost (the caller fails what was in flight)
            log.warning("closing a cluster connection: unreadable frame (%s: %s)", type(exc).__name__, exc)
            self._start = self._end = 0
            self.close()
            return
        if start == end:  # every byte read as frames (nearly always): the next read starts the buffer over
            self._start = self._end = 0
        if len(buffer) > _KEEP_BELOW and max(partial, end - start) <= BUFFER_BYTES - READ_ROOM:
            self._move_to(bytearray(BUFFER_BYTES))  # done with a big frame: a small buffer again
        elif partial > len(buffer) - start:
            self._make_room(partial - (end - start))  # room for all of the frame partly received

    def _make_room(self, room: int) -> None:
        """At least ``room`` bytes free after the received ones: they move to the buffer's start, or to a bigger
        buffer (a frame longer than this one is being received)."""
        unread = self._end - self._start
        if unread + room > len(self._buffer):  # doubling, as the unpacker did, up to the largest frame
            self._move_to(bytearray(max(unread + room, min(2 * len(self._buffer), wire.MAX_FRAME_BYTES))))
        elif self._start:
            self._view[:unread] = self._view[self._start : self._end]
            self._start, self._end = 0, unread

    def _move_to(self, buffer: bytearray) -> None:
        unread = self._end - self._start
        buffer[:unread] = self._view[self._start : self._end]
        self._buffer, self._view = buffer, memoryview(buffer)
        self._start, self._end = 0, unread

    def write(self, frames: list[bytes]) -> None:
        """Write packed frames now, each after its length, in one call (on the loop thread)."""
        if self.state == "open" and frames:
            parts = []
            for f in frames:
                parts += (_pack_length(len(f)), f)
            self.transport.writelines(parts)  # type: ignore[union-attr]

    def queue(self, frame: bytes) -> None:
        """Write a packed frame at the end of this loop turn, with the others queued in it (on the loop thread)."""
        self._queued.append(frame)
        if not self._write_due:
            self._write_due = True
            self.loop.call_soon(self._write_queued)

    def queue_last(self, make: Callable[[], bytes]) -> None:
        """Have ``make()`` pack a frame as this turn's queued frames are written, after them and in the same write
        (on the loop thread): a frame that gathers what the turn brings (a worker's ``written`` ids) goes with
        the replies of that turn instead of in a write of its own one callback later."""
        self._last.append(make)
        if not self._write_due:
            self._write_due = True
            self.loop.call_soon(self._write_queued)

    def _write_queued(self) -> None:
        self._write_due = False
        if self._last:
            last, self._last = self._last, []
            self._queued.extend([make() for make in last])
        frames, self._queued = self._queued, []
        self.write(frames)

    def close(self) -> None:
        """Close the connection once what is written is sent; ``connection_lost`` follows."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
