"""The asyncio adapter and AmqpClient against a tiny in-process broker over loopback TCP."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from shardbus.amqp import events as E
from shardbus.amqp.message import AmqpMessage, decode_message
from shardbus.amqp.performatives import Accepted, Error
from shardbus.amqp.transport import AmqpClient, AmqpProtocol, serve


class QueueBroker:
    """Stores messages sent to an address; delivers them to receivers of that address on credit."""

    queues: dict[str, collections.deque[bytes]] = collections.defaultdict(collections.deque)

    def __init__(self) -> None:
        self.receivers: list[Any] = []

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        c = proto.conn
        if isinstance(ev, E.SaslInit):
            if ev.mechanism == "PLAIN" and ev.password != "secret":
                c.reject_sasl()
            else:
                c.accept_sasl()
        elif isinstance(ev, E.ConnectionOpened):
            c.open()
        elif isinstance(ev, E.SessionBeginRequested):
            c.begin(ev.session, incoming_window=2**31 - 1)
        elif isinstance(ev, E.LinkAttachRequested):
            if ev.attach.target is not None and getattr(ev.attach.target, "address", None) == "missing":
                c.detach(ev.link, error=Error("amqp:not-found", "no entity"))
                return
            c.attach_reply(ev.link)
            if ev.link.is_sender:
                self.receivers.append(ev.link)
            else:
                c.flow(ev.link, link_credit=1000)
        elif isinstance(ev, E.DeliveryReceived):
            self.queues[ev.link.remote_target.address].append(ev.payload)
            if not ev.settled:
                c.settle(ev.link, ev.delivery_id, Accepted())
        elif isinstance(ev, E.LinkDetached) and ev.reply_needed:
            c.detach(ev.link)
        elif isinstance(ev, E.SessionEnded) and ev.reply_needed:
            c.end(ev.session)
        elif isinstance(ev, E.ConnectionClosed) and ev.reply_needed:
            c.close()
        self._deliver(proto)

    def _deliver(self, proto: AmqpProtocol) -> None:
        for link in self.receivers:
            if not link.attached:
                continue
            q = self.queues[link.remote_source.address]
            while q and link.credit > 0:
                proto.conn.send_transfer(link, b"%016d" % link.delivery_count, q.popleft(), settled=False)

    def connection_lost(self, proto: AmqpProtocol) -> None:
        pass


@contextlib.asynccontextmanager
async def served(handler: Callable[[], Any]) -> AsyncIterator[int]:
    """A loopback server whose connections ``handler()`` handles; yields its port and closes it afterwards."""
    server = await serve(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_client_server_round_trip_over_tcp() -> None:
    async with served(QueueBroker) as port:
        client = await AmqpClient.connect("127.0.0.1", port, timeout=5)
        session = await client.session()
        sender = await session.sender("q1")
        outcomes = [await sender.send(AmqpMessage.with_data(b"m%d" % i).encode()) for i in range(5)]
        assert all(isinstance(o, Accepted) for o in outcomes)
        await sender.send(AmqpMessage.with_data(b"big" * 400_000).encode())  # multi-frame (1 MiB frames)
        receiver = await session.receiver("q1", credit=10)
        got = [await receiver.receive(timeout=5) for _ in range(6)]
        for d in got:
            receiver.settle(d, Accepted())
        assert [decode_message(d.payload).data for d in got[:5]] == [b"m%d" % i for i in range(5)]
        assert len(decode_message(got[5].payload).data) == 1_200_000
        await receiver.close()
        await sender.close()
        await client.close()
        assert client._conn.is_done


async def test_client_plain_auth_and_refused_link() -> None:
    async with served(QueueBroker) as port:
        bad = None
        try:
            await AmqpClient.connect("127.0.0.1", port, sasl_mechanism="PLAIN", username="u", password="x", timeout=5)
        except Exception as exc:
            bad = exc
        assert bad is not None
        client = await AmqpClient.connect(
            "127.0.0.1", port, sasl_mechanism="PLAIN", username="u", password="secret", timeout=5
        )
        session = await client.session()
        refused = None
        try:
            await session.sender("missing")
        except Exception as exc:
            refused = exc
        assert refused is not None
        await client.close()


async def test_server_survives_garbage_connection() -> None:
    async with served(QueueBroker) as port:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"AMQP\x00\x01\x00\x00" + b"\x00\x00\x00\x0c\x02\x00\x00\x00\xde\xad\xbe\xef")
        data = await asyncio.wait_for(r.read(), 5)  # server closes after its close frame
        assert data.startswith(b"AMQP\x00\x01\x00\x00") and b"amqp:decode-error" in data
        w.close()
        client = await AmqpClient.connect("127.0.0.1", port, timeout=5)  # still serving
        await client.close()


class ReadBatchingBroker(QueueBroker):
    """Settles each read's transfers only in ``events_done``: their outcomes must still share the read's write."""

    instances: list[ReadBatchingBroker] = []

    def __init__(self) -> None:
        super().__init__()
        self.unseen = 0  # events handled since the last events_done
        self.batches: list[int] = []
        self.held: list[tuple[Any, int]] = []
        self.instances.append(self)

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        self.unseen += 1
        if isinstance(ev, E.DeliveryReceived) and not ev.settled:
            self.held.append((ev.link, ev.delivery_id))
            return
        super().handle_event(proto, ev)

    def events_done(self, proto: AmqpProtocol) -> None:
        self.batches.append(self.unseen)
        self.unseen = 0
        for link, delivery_id in self.held:
            proto.conn.settle(link, delivery_id, Accepted())
        self.held.clear()


async def test_events_done_follows_each_read_and_its_answers_are_written() -> None:
    async with served(ReadBatchingBroker) as port:
        client = await AmqpClient.connect("127.0.0.1", port, timeout=5)
        session = await client.session()
        sender = await session.sender("batched")
        # Sent together, so the broker gets several transfers in one read; each outcome comes back.
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(sender.send(AmqpMessage.with_data(b"m%d" % i).encode()) for i in range(20))), 5
        )
        assert all(isinstance(o, Accepted) for o in outcomes)
        await client.close()
    broker = ReadBatchingBroker.instances[-1]
    assert broker.unseen == 0  # every handled event was followed by an events_done
    assert broker.batches and all(n > 0 for n in broker.batches)  # never called for a read without events
    assert max(broker.batches) > 1  # one call for many events of one read
