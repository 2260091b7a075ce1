"""A large answer to a flow is taken and written in chunks that grow threefold (8, 24, 72, ...), so that the client
decodes the first deliveries while the broker locks and encodes the next ones; every delivery still arrives, in order.
Partitions in worker processes are asked for the whole credit at once (one round trip), so with them a flow is
answered in one piece."""

from __future__ import annotations

import asyncio
import os

import pytest

from shardbus import Message
from shardbus.amqp.transport import AmqpProtocol
from shardbus.endpoint import receiving as endpoint
from shardbus.endpoint.connection import ServiceBusConnection

REMOTE = bool(int(os.environ.get("SHARDBUS_TEST_WORKERS", "0")))  # tests/conftest.py


@pytest.mark.parametrize("credit", [100, 5])
def test_a_flow_is_answered_in_growing_chunks_each_written_at_once(root_client, ns, queue, monkeypatch, credit):
    name = queue()
    ns.send(name, [Message(f"m{i}") for i in range(100)])
    steps: list[tuple[str, int]] = []  # ("take", delivered) and ("write", 0), in the broker's order
    transfer, flush_now = ServiceBusConnection._transfer, AmqpProtocol.flush_now

    def record_transfer(self, link, receiver, messages):
        if link.source.address == name:
            steps.append(("take", len(messages)))
        return transfer(self, link, receiver, messages)

    def record_flush(self):
        if steps and steps[-1][0] == "take":
            steps.append(("write", 0))
        flush_now(self)

    monkeypatch.setattr(ServiceBusConnection, "_transfer", record_transfer)
    monkeypatch.setattr(AmqpProtocol, "flush_now", record_flush)

    async def run() -> list[bytes]:
        client = await root_client()
        try:
            session = await client.session()
            receiver = await session.receiver(name, credit=credit)
            return [(await receiver.receive(timeout=10)).payload for _ in range(credit)]
        finally:
            await client.close()

    payloads = asyncio.run(run())
    assert [p.endswith(f"m{i}".encode()) for i, p in enumerate(payloads)] == [True] * credit
    chunks = [n for kind, n in steps if kind == "take"]
    assert sum(chunks) == credit
    first = endpoint.FIRST_CHUNK
    if REMOTE or credit < first:
        assert chunks == [credit]
        return
    growth = endpoint.CHUNK_GROWTH
    assert growth == 3  # three chunks for the usual flow of 100: 8, 24, 68
    assert chunks == [first, growth * first, credit - (1 + growth) * first]
    # each chunk but the last is written as soon as it is encoded; the last one goes out with the flow's answer
    assert [kind for kind, _ in steps] == ["take", "write"] * (len(chunks) - 1) + ["take"]
