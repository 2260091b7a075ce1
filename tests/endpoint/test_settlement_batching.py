"""Accepted dispositions that arrive in one socket read are settled together (one store operation per partition)
and echoed with range dispositions; each delivery still gets its own outcome."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from shardbus import Message
from shardbus.amqp.performatives import Accepted, Rejected
from shardbus.entity.receiver import Receiver
from support.echo_client import EchoRecordingClient


def test_accepts_of_one_read_are_settled_together_each_with_its_outcome(root_client, ns, queue):
    name = queue(enable_partitioning=True)
    count = 12
    ns.send(name, [Message(f"m{i}", partition_key="k") for i in range(count // 2)])  # one partition
    for i in range(count // 2):
        ns.send(name, Message(f"n{i}"))  # spread round-robin over the others

    async def run() -> tuple[int, list[int], dict[int, Any]]:
        client = await root_client(EchoRecordingClient)
        try:
            session = await client.session()
            receiver = await session.receiver(name, credit=count)
            deliveries = [await receiver.receive(timeout=10) for _ in range(count)]
            # Another receiver completes one of them first: its lock is gone when the client's accept arrives.
            stolen = deliveries[3]
            Receiver(ns._sender_entity(name)).complete(uuid.UUID(bytes_le=stolen.delivery_tag))
            for d in deliveries:  # all in one write, so the broker reads them together
                client._conn.disposition(receiver.link, d.delivery_id, settled=False, state=Accepted())
            client._flush()
            for _ in range(100):
                if len(client.echoes) == count:
                    break
                await asyncio.sleep(0.05)
            return stolen.delivery_id, [d.delivery_id for d in deliveries], client.echoes
        finally:
            await client.close()

    stolen, delivered, echoes = asyncio.run(run())
    assert sorted(echoes) == sorted(delivered)
    lost = echoes.pop(stolen)
    assert isinstance(lost, Rejected) and lost.error.condition == "com.microsoft:message-lock-lost"
    assert all(isinstance(state, Accepted) for state in echoes.values())
    assert ns.get_runtime_properties(name).active_message_count == 0


def test_a_range_with_a_lost_lock_gives_each_delivery_its_outcome(root_client, ns, queue):
    """Ranged accepts (our client's complete): one range alone is settled as a run (``_flush_run``), two in one
    read through the general grouping; either way a group holding a lost lock is settled one by one, so only
    that delivery is refused and the rest are accepted and echoed."""
    name = queue(enable_partitioning=True)
    count = 24
    ns.send(name, [Message(f"m{i}", partition_key="k") for i in range(count // 2)])  # one partition
    for i in range(count // 2):
        ns.send(name, Message(f"n{i}"))  # spread round-robin over the others

    async def run(split: bool) -> tuple[int, list[int], dict[int, Any]]:
        client = await root_client(EchoRecordingClient)
        try:
            session = await client.session()
            receiver = await session.receiver(name, credit=count)
            deliveries = [await receiver.receive(timeout=10) for _ in range(count)]
            ids = sorted(d.delivery_id for d in deliveries)
            assert ids == list(range(ids[0], ids[0] + count))
            stolen = deliveries[5]
            Receiver(ns._sender_entity(name)).complete(uuid.UUID(bytes_le=stolen.delivery_tag))
            if split:  # two ranges in one write: the broker reads them together
                middle = ids[count // 2]
                client._conn.disposition(receiver.link, ids[0], middle - 1, settled=False, state=Accepted())
                client._conn.disposition(receiver.link, middle, ids[-1], settled=False, state=Accepted())
            else:
                client._conn.disposition(receiver.link, ids[0], ids[-1], settled=False, state=Accepted())
            client._flush()
            for _ in range(100):
                if len(client.echoes) == count:
                    break
                await asyncio.sleep(0.05)
            return stolen.delivery_id, ids, client.echoes
        finally:
            await client.close()

    for split in (False, True):
        if split:
            for i in range(count):
                ns.send(name, Message(f"again{i}", partition_key="k" if i % 2 else None))
        stolen, delivered, echoes = asyncio.run(run(split))
        assert sorted(echoes) == delivered
        lost = echoes.pop(stolen)
        assert isinstance(lost, Rejected) and lost.error.condition == "com.microsoft:message-lock-lost"
        assert all(isinstance(state, Accepted) for state in echoes.values())
        assert ns.get_runtime_properties(name).active_message_count == 0
