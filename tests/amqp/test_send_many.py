"""``ClientSender.send_many``: one window of unsettled transfers for a whole call, over loopback TCP against small
in-process brokers. The payloads go out in order and each exactly once, however the window compares with the
link's credit; a refusal stops further sends and is returned after the transfers in flight are settled; a
connection closed, a link detached or outcomes that never come fail the call instead of leaving it hanging."""

from __future__ import annotations

import asyncio

import pytest
from test_transport import QueueBroker, served

from shardbus.amqp import events as E
from shardbus.amqp.performatives import Error, Rejected
from shardbus.amqp.transport import AmqpClient, AmqpClientError, AmqpProtocol

CREDIT = 3


class StingyBroker(QueueBroker):
    """Grants CREDIT at a time, and CREDIT more only once the link has spent all of it."""

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        super().handle_event(proto, ev)
        attached = isinstance(ev, E.LinkAttachRequested) and not ev.link.is_sender
        if attached or (isinstance(ev, E.DeliveryReceived) and ev.link.credit == 0):
            proto.conn.flow(ev.link, link_credit=CREDIT)


class RejectsFifth(QueueBroker):
    """Refuses delivery id 4 (the fifth transfer), stores and accepts the others."""

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        if isinstance(ev, E.DeliveryReceived) and ev.delivery_id == 4:
            proto.conn.settle(ev.link, ev.delivery_id, Rejected(error=Error("amqp:precondition-failed", "no")))
            return
        super().handle_event(proto, ev)


class ClosesAtTenth(QueueBroker):
    """Closes the connection (with an error) on the tenth transfer, leaving the rest of the window unsettled."""

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        if isinstance(ev, E.DeliveryReceived) and ev.delivery_id == 9:
            proto.conn.close(Error("amqp:internal-error", "going away"))
            return
        super().handle_event(proto, ev)


class DetachesAtTenth(QueueBroker):
    """Detaches the sending link (with an error) on the tenth transfer."""

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        if isinstance(ev, E.DeliveryReceived) and ev.delivery_id == 9:
            proto.conn.detach(ev.link, error=Error("amqp:link:detach-forced", "bye"))
            return
        super().handle_event(proto, ev)


class NeverSettles(QueueBroker):
    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        if not isinstance(ev, E.DeliveryReceived):
            super().handle_event(proto, ev)


async def _sender(port: int, address: str) -> tuple[AmqpClient, object]:
    client = await AmqpClient.connect("127.0.0.1", port, timeout=5)
    session = await client.session()
    return client, await session.sender(address)


@pytest.mark.parametrize("window", [1, 2, CREDIT, 50])
async def test_every_payload_once_in_order_whatever_the_credit(window: int) -> None:
    address = f"q-window-{window}"
    QueueBroker.queues[address].clear()
    async with served(StingyBroker) as port:
        client, sender = await _sender(port, address)
        payloads = [b"m%03d" % i for i in range(40)]
        assert await sender.send_many(payloads, window=window, timeout=5) == (False, None)
        assert list(QueueBroker.queues[address]) == payloads
        assert not client._outcomes  # every outcome came and was taken
        assert await sender.send_many([], window=window) == (False, None)
        await client.close()


async def test_overlapping_calls_on_one_link_share_its_credit() -> None:
    address = "q-window-overlap"
    QueueBroker.queues[address].clear()
    async with served(StingyBroker) as port:
        client, sender = await _sender(port, address)
        a = [b"a%02d" % i for i in range(20)]
        b = [b"b%02d" % i for i in range(20)]
        assert await asyncio.gather(sender.send_many(a, window=4), sender.send_many(b, window=4)) == [
            (False, None),
            (False, None),
        ]
        stored = list(QueueBroker.queues[address])
        assert sorted(stored) == sorted(a + b)
        assert [p for p in stored if p in a] == a and [p for p in stored if p in b] == b  # each call in order
        await client.close()


async def test_a_refusal_stops_the_window_and_is_returned() -> None:
    address = "q-window-reject"
    QueueBroker.queues[address].clear()
    async with served(RejectsFifth) as port:
        client, sender = await _sender(port, address)
        payloads = [b"m%03d" % i for i in range(200)]
        refused, outcome = await sender.send_many(payloads, window=10, timeout=5)
        assert refused and isinstance(outcome, Rejected) and outcome.error.condition == "amqp:precondition-failed"
        stored = list(QueueBroker.queues[address])
        # The four before it are stored, the fifth is not; what was in flight with it may be, nothing later.
        assert stored[:4] == payloads[:4] and payloads[4] not in stored
        assert stored == [p for p in payloads if p in stored] and len(stored) < 4 + 10 + 10
        assert not client._outcomes  # it waited for the transfers in flight
        await client.close()


@pytest.mark.parametrize("broker", [ClosesAtTenth, DetachesAtTenth])
async def test_the_connection_or_link_going_mid_window_fails_the_call_at_once(broker: type) -> None:
    async with served(broker) as port:
        client, sender = await _sender(port, f"q-window-{broker.__name__}")
        started = asyncio.get_running_loop().time()
        with pytest.raises(AmqpClientError):
            await sender.send_many([b"m%03d" % i for i in range(100)], window=30, timeout=30)
        assert asyncio.get_running_loop().time() - started < 5  # not the timeout
        await client.close()


async def test_outcomes_that_never_come_time_out() -> None:
    async with served(NeverSettles) as port:
        client, sender = await _sender(port, "q-window-silent")
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await sender.send_many([b"x"] * 5, window=5, timeout=0.3)
        assert 0.3 <= asyncio.get_running_loop().time() - started < 3
        assert not sender._windows
        await client.close()


async def test_payloads_of_several_frames_among_small_ones() -> None:
    address = "q-window-big"
    QueueBroker.queues[address].clear()
    async with served(StingyBroker) as port:
        client, sender = await _sender(port, address)
        payloads = [b"s0", b"B" * 2_500_000, b"s1", b"s2", b"b" * 1_100_000, b"s3"]  # 1 MiB frames
        assert await sender.send_many(payloads, window=4, timeout=5) == (False, None)
        assert list(QueueBroker.queues[address]) == payloads
        await client.close()
