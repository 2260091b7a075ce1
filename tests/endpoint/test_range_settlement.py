"""One disposition for a range of delivery ids (first..last), as our own client sends for a received batch: it may
cover the deliveries of several receiver links of the session; each gets its outcome, the unsettled range is
echoed, a settled one is not, and every covered message is completed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardbus import Message
from shardbus.amqp.performatives import Accepted
from support.echo_client import EchoRecordingClient


@pytest.mark.parametrize("settled", [False, True])
def test_a_range_over_two_links_completes_all_and_echoes_unless_settled(root_client, ns, queue, settled: bool):
    name = queue(enable_partitioning=True)
    count = 10
    ns.send(name, [Message(f"m{i}") for i in range(count)])

    async def run() -> tuple[list[int], dict[int, Any]]:
        client = await root_client(EchoRecordingClient)
        try:
            session = await client.session()
            first = await session.receiver(name, credit=count // 2)
            second = await session.receiver(name, credit=count // 2)
            deliveries = [await first.receive(timeout=10) for _ in range(count // 2)]
            deliveries += [await second.receive(timeout=10) for _ in range(count // 2)]
            ids = sorted(d.delivery_id for d in deliveries)
            assert ids == list(range(ids[0], ids[0] + count))  # one session: one run of ids over both links
            client._conn.disposition(first.link, ids[0], ids[-1], settled=settled, state=Accepted())
            client._flush()
            for _ in range(100):
                if len(client.echoes) == count or (
                    settled and ns.get_runtime_properties(name).active_message_count == 0
                ):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # a settled range must stay unanswered
            return ids, client.echoes
        finally:
            await client.close()

    ids, echoes = asyncio.run(run())
    if settled:
        assert echoes == {}
    else:
        assert sorted(echoes) == ids
        assert all(isinstance(state, Accepted) for state in echoes.values())
    assert ns.get_runtime_properties(name).active_message_count == 0


class _FrameCountingClient(EchoRecordingClient):
    """Also counts the disposition frames the broker sends (a range is one frame)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames = 0

    def handle_event(self, protocol: Any, ev: Any) -> None:
        if type(ev).__name__ == "DispositionReceived" and not ev.role and ev.settled:
            self.frames += 1
        super().handle_event(protocol, ev)


def test_a_range_over_every_partition_is_echoed_in_few_frames(root_client, ns, queue):
    """A client's range of completes spread over all 16 partitions: in one process one range disposition echoes
    it; with workers (SHARDBUS_TEST_WORKERS) every partition's verdict comes in its own reply, and the verdicts that
    arrive together are echoed together (``_group_verdict``), not one disposition per partition as before."""
    name = queue(enable_partitioning=True)
    count = 64
    for i in range(count):  # one send each: a batch goes to one partition, single sends are spread over all
        ns.send(name, Message(f"m{i}"))

    async def run() -> tuple[list[int], _FrameCountingClient]:
        client = await root_client(_FrameCountingClient)
        try:
            session = await client.session()
            receiver = await session.receiver(name, credit=count)
            deliveries = [await receiver.receive(timeout=10) for _ in range(count)]
            ids = sorted(d.delivery_id for d in deliveries)
            assert len({d.delivery_tag[-2:] for d in deliveries}) == 16  # (a lock token's partition: every one)
            client._conn.disposition(receiver.link, ids[0], ids[-1], settled=False, state=Accepted())
            client._flush()
            for _ in range(200):
                if len(client.echoes) == count:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            return ids, client
        finally:
            await client.close()

    ids, client = asyncio.run(run())
    assert sorted(client.echoes) == ids and all(isinstance(s, Accepted) for s in client.echoes.values())
    assert client.frames <= 8  # one per partition (16) before; one process sends 1, two workers a few
    assert ns.get_runtime_properties(name).active_message_count == 0
