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
- Open: received bytes feed a streaming unpacker and each complete frame goes to ``on_frame`` at once, on the
  loop thread. ``queue`` collects frames written during a loop turn and writes them in one ``writelines`` at
  its end; ``write`` writes a list of frames now. A frame that cannot be read (a broken peer) closes the stream.
- Closed: ``closed`` resolves and ``on_lost`` is called once; writes are dropped (the caller fails what was in
  flight: ``remote.WorkerLink._lost``).

Memory: the handshake's few bytes, a turn's queued frames, and one partial frame in the unpacker (bounded by
``wire.MAX_FRAME_BYTES``); an unpacker keeps its buffer at the largest frame it read, so after a frame bigger than
``wire.KEEP_READER_BELOW`` the stream starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from . import wire

log = logging.getLogger("shardbus.cluster")

HANDSHAKE_TIMEOUT = 5.0


class FrameStream(asyncio.Protocol):
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
        self._reader = wire.reader()
        self._fed = 0  # bytes fed to the reader
        self._frame_start = 0  # the reader's position where its next frame begins
        self._queued: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.server:
            opening, self._nonce = wire.challenge()
            self.transport.write(opening)  # type: ignore[union-attr]
            self._timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._give_up)

    def data_received(self, data: bytes) -> None:
        if self.state == "open":
            self._frames(data)
        elif self.state == "opening":
            self._handshake(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        if self._timer is not None:
            self._timer.cancel()
        self._queued = []
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
        if rest:
            self._frames(rest)

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
    def _frames(self, data: bytes) -> None:
        reader = self._reader
        start = self._frame_start  # where the next frame begins in the reader's stream
        big = False
        try:
            reader.feed(data)
            self._fed += len(data)
            for frame in reader:
                end = reader.tell()
                big = big or end - start > wire.KEEP_READER_BELOW
                start = end
                self.on_frame(frame)
        except Exception as exc:  # a frame we cannot read: the stream is lost (the caller fails what was in flight)
            log.warning("closing a cluster connection: unreadable frame (%s: %s)", type(exc).__name__, exc)
            self.close()
            return
        self._frame_start = start
        if big:  # a new reader, given the partial frame that follows (it began in ``data``: a frame ended there)
            rest = self._fed - start
            self._reader = wire.reader()
            self._fed = self._frame_start = 0
            if rest:
                self._reader.feed(data[len(data) - rest :])
                self._fed = rest

    def write(self, frames: list[bytes]) -> None:
        """Write packed frames now, in one call (on the loop thread)."""
        if self.state == "open" and frames:
            self.transport.writelines(frames)  # type: ignore[union-attr]

    def queue(self, frame: bytes) -> None:
        """Write a packed frame at the end of this loop turn, with the others queued in it (on the loop thread)."""
        self._queued.append(frame)
        if len(self._queued) == 1:
            self.loop.call_soon(self._write_queued)

    def _write_queued(self) -> None:
        frames, self._queued = self._queued, []
        self.write(frames)

    def close(self) -> None:
        """Close the connection once what is written is sent; ``connection_lost`` follows."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
