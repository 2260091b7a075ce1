"""AmqpClient's unsettled send waits for the outcome with a timer of its own (not ``wait_for``): it times out
as before, and the outcomes of other sends on the link still arrive."""

from __future__ import annotations

import asyncio

import pytest
from test_transport import QueueBroker, served

from shardbus.amqp import events as E
from shardbus.amqp.message import AmqpMessage
from shardbus.amqp.performatives import Accepted
from shardbus.amqp.transport import AmqpClient, AmqpProtocol


class SilentOnOdd(QueueBroker):
    """Accepts every transfer but the odd-numbered ones, which it never settles."""

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        if isinstance(ev, E.DeliveryReceived) and ev.delivery_id % 2 == 1:
            return
        super().handle_event(proto, ev)


async def test_send_times_out_and_the_link_goes_on() -> None:
    async with served(SilentOnOdd) as port:
        client = await AmqpClient.connect("127.0.0.1", port, timeout=5)
        session = await client.session()
        sender = await session.sender("q-timeout")
        assert isinstance(await sender.send(AmqpMessage.with_data(b"0").encode(), timeout=5), Accepted)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await sender.send(AmqpMessage.with_data(b"1").encode(), timeout=0.2)
        assert asyncio.get_running_loop().time() - started >= 0.2
        # Sends in flight together: each gets its own outcome (or its own timeout).
        results = await asyncio.gather(
            *(sender.send(AmqpMessage.with_data(b"%d" % i).encode(), timeout=0.3) for i in range(2, 6)),
            return_exceptions=True,
        )
        assert [type(r) for r in results] == [Accepted, TimeoutError, Accepted, TimeoutError]
        assert isinstance(await sender.send(AmqpMessage.with_data(b"6").encode(), timeout=None), Accepted)
        await client.close()
