"""A loop turn's frames go out in one write (``stream.FrameStream.queue``), and a frame packed only as that write
goes (``queue_last``: a worker's ``written`` ids) rides last in it, over a real loopback connection after the real
handshake."""

from __future__ import annotations

import asyncio

from shardbus.cluster import wire
from shardbus.cluster.stream import FrameStream

KEY = "the-cluster-key"


async def _pair(on_frame) -> tuple[FrameStream, FrameStream, asyncio.AbstractServer]:
    """A worker-side and a front-end-side stream connected on loopback, both open."""
    loop = asyncio.get_running_loop()
    servers: list[FrameStream] = []

    def make() -> FrameStream:
        servers.append(FrameStream(KEY, server=True, on_frame=lambda frame: None))
        return servers[-1]

    server = await loop.create_server(make, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await loop.create_connection(
        lambda: FrameStream(KEY, server=False, on_frame=on_frame), "127.0.0.1", port
    )
    await asyncio.wait_for(client.opened, 5)
    await asyncio.wait_for(servers[0].opened, 5)
    return servers[0], client, server


def test_a_frame_queued_last_rides_at_the_end_of_its_turns_write() -> None:
    async def main() -> None:
        got: list[list] = []
        arrived = asyncio.Event()

        def on_frame(frame: list) -> None:
            got.append(frame)
            if len(got) in (4, 6):
                arrived.set()

        worker, front_end, server = await _pair(on_frame)
        writes: list[int] = []
        writelines = worker.transport.writelines

        def counted(parts) -> None:
            writes.append(len(parts))
            writelines(parts)

        worker.transport.writelines = counted  # type: ignore[method-assign]
        packed: list[int] = []

        def last() -> bytes:
            packed.append(len(writes))  # packed when the turn's write is made, not before
            return wire.pack_frame([-1, [7, 8], None])

        # one turn: a reply, the maker, two more replies (queued after it, written before its frame)
        worker.queue(wire.pack_frame([1, True, "a", None]))
        worker.queue_last(last)
        worker.queue(wire.pack_frame([2, True, "b", None]))
        worker.queue(wire.pack_frame([3, True, "c", None]))
        assert packed == []  # nothing packed in the turn itself
        await asyncio.wait_for(arrived.wait(), 5)
        assert [f[0] for f in got] == [1, 2, 3, -1]
        assert got[3] == [-1, [7, 8], None]
        assert writes == [8]  # one write: four frames, each after its length
        assert packed == [0]

        # the next turn writes again: a maker alone gets a write of its own
        arrived.clear()
        worker.queue_last(lambda: wire.pack_frame([-1, [9], None]))
        worker.queue(wire.pack_frame([4, True, "d", None]))
        await asyncio.wait_for(arrived.wait(), 5)
        assert [f[0] for f in got[4:]] == [4, -1]
        assert writes == [8, 4]

        front_end.close()
        worker.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_closed_stream_drops_what_it_had_queued_last() -> None:
    async def main() -> None:
        worker, front_end, server = await _pair(lambda frame: None)
        made: list[bool] = []
        worker.queue_last(lambda: (made.append(True), wire.pack_frame([-1, [1], None]))[1])
        worker.connection_lost(None)  # before the turn's write: nothing is written, nothing packed
        await asyncio.sleep(0.05)
        assert made == []
        front_end.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
