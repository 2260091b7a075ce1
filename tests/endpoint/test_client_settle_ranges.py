"""Our own client (``shardbus.client``) completes a batch with one disposition per run of consecutive delivery
ids; every message of the run is settled, none outside it, and a lost lock still fails the call."""

from __future__ import annotations

from shardbus.client import OutgoingMessage, ShardbusClient


def test_complete_settles_runs_of_consecutive_deliveries(broker):
    broker.namespace.create_queue("ranges")
    with ShardbusClient(broker.connection_string, timeout=30) as client:
        client.send("ranges", [OutgoingMessage(f"m{i}".encode(), message_id=f"m{i}") for i in range(12)])
        with client.receiver("ranges") as receiver:
            got = []
            while len(got) < 12:
                got += receiver.receive(max_count=12 - len(got), max_wait=5)
            assert len(got) == 12
            # every other one first (runs of one), then a run of the rest but one, then the last alone
            receiver.complete(got[::2])
            receiver.complete(got[1:-1:2])
            receiver.complete([got[-1], got[-1]])  # the same message twice is one settlement
        with client.receiver("ranges") as receiver:
            assert receiver.receive(max_count=12, max_wait=1) == []
