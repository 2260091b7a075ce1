"""The cluster connection (``cluster/stream.py``) over real sockets: only a front end that holds the cluster key
is served, a peer that is not one is closed without harm to the others, and a dropped connection fails what was
in flight and comes back."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbus.cluster import wire
from shardbus.cluster.remote import ClusterClient, RemotePartition
from shardbus.cluster.worker import Worker
from shardbus.model.errors import PartitionUnavailable
from shardbus.partition.handle import PartitionSpec
from shardbus.partition.values import PartitionConfig
from shardbus.runtime import new_event_loop

KEY = "the-cluster-key"


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[Worker, int]]:
    w = Worker(tmp_path, KEY)
    loop = new_event_loop()
    port: list[int] = []
    ready = threading.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(w.serve("127.0.0.1", 0, lambda b: (port.append(b), ready.set()))),
        daemon=True,
    )
    thread.start()
    assert ready.wait(10)
    yield w, port[0]
    w.call_soon(w._stop_event.set)
    thread.join(10)


def _client(port: int, key: str = KEY) -> tuple[ClusterClient, object]:
    client = ClusterClient(key, time.time, tick_interval=1.0)
    return client, client.link("w", ("127.0.0.1", port))


def test_a_front_end_with_the_key_is_served_and_one_without_is_refused(worker, tmp_path) -> None:
    _, port = worker
    wrong, wrong_link = _client(port, "not-the-key")
    right, right_link = _client(port)
    try:
        assert right.wait_connected(10)
        time.sleep(0.5)  # several attempts of the wrong one
        assert not wrong_link.connected
        assert "refused the cluster key" in wrong_link.failure
        key = "ns/entities/1/p00.db"
        (tmp_path / key).parent.mkdir(parents=True)
        config = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
        p = RemotePartition(right_link, key, PartitionSpec(1, config, tmp_path / key, time.time, lambda: None))
        p.start()
        assert p.healthy
        p.close()
    finally:
        wrong.close()
        right.close()


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    opening = b""
    while len(opening) < wire.CHALLENGE_BYTES:
        opening += s.recv(wire.CHALLENGE_BYTES - len(opening))
    assert opening.startswith(wire.MAGIC)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True


def test_a_wrong_answer_or_an_unreadable_frame_closes_only_that_connection(worker) -> None:
    _, port = worker
    client, link = _client(port)
    try:
        assert client.wait_connected(10)
        bad = _raw(port)
        bad.sendall(wire.MAGIC + b"\0" * (wire.ANSWER_BYTES - len(wire.MAGIC)))
        assert bad.recv(1) == wire.REFUSED
        assert _closed_by_peer(bad)
        # an authenticated peer whose frames cannot be read is closed as well
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        opening = b""
        while len(opening) < wire.CHALLENGE_BYTES:
            opening += s.recv(wire.CHALLENGE_BYTES - len(opening))
        s.sendall(wire.answer(KEY, opening))
        assert s.recv(1) == wire.ACCEPTED
        s.sendall(b"\xc1" * 16)  # 0xc1 is never used in MessagePack
        assert _closed_by_peer(s)
        # the front end that holds the key was served throughout
        assert link.connected
        assert link.call(None, "", "health", [], time.time()).result(5) == {}
    finally:
        client.close()


def test_a_dropped_connection_fails_calls_in_flight_and_comes_back(worker) -> None:
    w, port = worker
    client, link = _client(port)
    try:
        assert client.wait_connected(10)
        for conn in list(w.connections):
            w.call_soon(conn.stream.close)
        deadline = time.monotonic() + 5
        while link.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not link.connected
        with pytest.raises(PartitionUnavailable):
            link.call(None, "", "health", [], time.time()).result(5)
        assert client.wait_connected(10)
        assert link.call(None, "", "health", [], time.time()).result(5) == {}
    finally:
        client.close()


def _receive(stream, data: bytes, read: int | None = None) -> None:
    """What the transport does with received bytes: reads of at most ``read`` bytes into the stream's buffer."""
    while data:
        room = stream.get_buffer(-1)
        n = min(len(room), len(data), read or len(data))
        room[:n] = data[:n]
        stream.buffer_updated(n)
        data = data[n:]


def _framed(*frames: bytes) -> bytes:
    return b"".join(len(f).to_bytes(wire.LENGTH, "big") + f for f in frames)


def test_a_big_frame_leaves_no_big_buffer_behind() -> None:
    """The receive buffer grows to the biggest frame being received; after one over ``KEEP_READER_BELOW`` the
    stream goes back to a small buffer, and the frame that was only partly received continues in it."""
    import asyncio

    from shardbus.cluster.stream import BUFFER_BYTES, FrameStream

    async def main() -> None:
        got: list[list] = []
        stream = FrameStream(KEY, server=False, on_frame=got.append)
        stream._open()
        big = wire.pack_frame([1, True, b"x" * (2 * wire.KEEP_READER_BELOW), None])
        small = [wire.pack_frame([i, True, b"y" * 100, None]) for i in range(2, 6)]
        data = _framed(small[0], big, small[1], small[2], small[3])
        cut = len(data) - len(_framed(small[3])) - 50  # ends inside a frame
        _receive(stream, data[:cut], read=65536)
        assert len(stream._buffer) == BUFFER_BYTES
        _receive(stream, data[cut:])
        assert [f[0] for f in got] == [2, 1, 3, 4, 5]
        assert got[1][2] == b"x" * (2 * wire.KEEP_READER_BELOW)
        assert len(stream._buffer) == BUFFER_BYTES

    asyncio.run(main())


@pytest.mark.parametrize("read", [1, 3, 4, 5, 1000, 65536, 300_000])
def test_frames_cut_anywhere_by_reads_come_out_whole_and_in_order(read: int) -> None:
    """However reads cut the stream (inside a length, right after one, inside a frame, several frames in one
    read), each frame comes out once, whole, in order; frames bigger than the buffer included."""
    import asyncio

    from shardbus.cluster.stream import BUFFER_BYTES, FrameStream

    async def main() -> None:
        got: list[list] = []
        stream = FrameStream(KEY, server=False, on_frame=got.append)
        stream._open()
        sizes = [0, 10, 1000, BUFFER_BYTES, 5, 3 * BUFFER_BYTES, 70_000, 1]
        frames = [wire.pack_frame([i + 1, True, bytes([i]) * n, None]) for i, n in enumerate(sizes)]
        _receive(stream, _framed(*frames), read=read)
        assert [(f[0], f[2]) for f in got] == [(i + 1, bytes([i]) * n) for i, n in enumerate(sizes)]
        assert stream._start == stream._end == 0

    asyncio.run(main())


def test_a_frame_longer_than_the_limit_closes_the_stream() -> None:
    import asyncio

    from shardbus.cluster.stream import FrameStream

    async def main() -> None:
        got: list[list] = []
        closed: list[bool] = []
        stream = FrameStream(KEY, server=False, on_frame=got.append)
        stream.close = lambda: closed.append(True)  # type: ignore[method-assign]
        stream._open()
        _receive(stream, (wire.MAX_FRAME_BYTES + 1).to_bytes(wire.LENGTH, "big") + b"\x90")
        assert closed and not got

    asyncio.run(main())


def test_a_worker_of_another_frame_version_is_told_apart_at_the_handshake() -> None:
    """Version 2 added frames a version-1 peer cannot read: the handshake says so instead of a broken stream."""
    with pytest.raises(ValueError, match=r"another version \(SBW1"):
        wire.answer(KEY, b"SBW1" + bytes(wire.NONCE_BYTES))
    opening, _ = wire.challenge()
    assert wire.answer(KEY, opening).startswith(wire.MAGIC)
