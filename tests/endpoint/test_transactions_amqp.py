"""AMQP 1.0 transactions (coordinator link, declare/discharge, transactional state) through our engine's client."""

from __future__ import annotations

import asyncio

import pytest

from shardbus import Message
from shardbus.amqp.message import AmqpMessage
from shardbus.amqp.performatives import (
    SENDER,
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Rejected,
    Source,
    TransactionalState,
)
from shardbus.amqp.transport import ClientSender
from shardbus.amqp.types import Symbol


async def _coordinator(session) -> ClientSender:
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    link = await session._attach("coordinator", SENDER, Source(), target)
    return ClientSender(session, link)


async def _declare(coordinator: ClientSender) -> bytes:
    outcome = await coordinator.send(AmqpMessage.with_value(Declare()).encode())
    assert isinstance(outcome, Declared)
    return outcome.txn_id


async def _discharge(coordinator: ClientSender, txn_id: bytes, fail: bool = False):
    return await coordinator.send(AmqpMessage.with_value(Discharge(txn_id=txn_id, fail=fail)).encode())


def _payload(body: bytes, key: str | None = "k") -> bytes:
    annotations = {Symbol("x-opt-partition-key"): key} if key is not None else None
    return AmqpMessage.with_data(body, message_annotations=annotations).encode()


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_commit_applies_sends_and_settlements_together(root_client, ns, queue, partitioned):
    q = queue(enable_partitioning=partitioned)
    ns.send(q, Message(b"input", partition_key="k"))

    async def work() -> None:
        client = await root_client(timeout=10)
        try:
            session = await client.session()
            coordinator = await _coordinator(session)
            sender = await session.sender(q)
            receiver = await session.receiver(q, credit=1)
            txn = await _declare(coordinator)
            delivery = await receiver.receive(timeout=5)
            client._conn.disposition(
                receiver.link,
                delivery.delivery_id,
                settled=True,
                state=TransactionalState(txn_id=txn, outcome=Accepted()),
            )
            client._flush()
            outcome = await sender.send(_payload(b"output"), state=TransactionalState(txn_id=txn))
            assert isinstance(outcome, TransactionalState) and isinstance(outcome.outcome, Accepted)
            await asyncio.sleep(0.1)
            assert sorted(m.body for m in ns.browse(q)) == [b"input"]  # nothing before the discharge
            assert isinstance(await _discharge(coordinator, txn), Accepted)
        finally:
            await client.close()

    run(work())
    assert [m.body for m in ns.browse(q)] == [b"output"]


def test_rollback_applies_nothing(root_client, ns, queue):
    q = queue(enable_partitioning=True)

    async def work() -> None:
        client = await root_client(timeout=10)
        try:
            session = await client.session()
            coordinator = await _coordinator(session)
            sender = await session.sender(q)
            txn = await _declare(coordinator)
            await sender.send(_payload(b"never"), state=TransactionalState(txn_id=txn))
            assert isinstance(await _discharge(coordinator, txn, fail=True), Accepted)
        finally:
            await client.close()

    run(work())
    assert ns.get_runtime_properties(q).total_message_count == 0


def test_a_rule_violation_dooms_the_transaction(root_client, ns, queue):
    q = queue(enable_partitioning=True)

    async def work() -> None:
        client = await root_client(timeout=10)
        try:
            session = await client.session()
            coordinator = await _coordinator(session)
            sender = await session.sender(q)
            txn = await _declare(coordinator)
            ok = await sender.send(_payload(b"keyed"), state=TransactionalState(txn_id=txn))
            assert isinstance(ok.outcome, Accepted)
            refused = await sender.send(_payload(b"keyless", key=None), state=TransactionalState(txn_id=txn))
            assert isinstance(refused.outcome, Rejected)
            assert refused.outcome.error.condition == "amqp:not-allowed"
            assert "partition key" in refused.outcome.error.description
            other = await sender.send(_payload(b"other key", key="k2"), state=TransactionalState(txn_id=txn))
            assert "share one partition key" in other.outcome.error.description
            discharged = await _discharge(coordinator, txn)
            assert isinstance(discharged, Rejected)
            assert discharged.error.condition == "amqp:transaction:rollback"
        finally:
            await client.close()

    run(work())
    assert ns.get_runtime_properties(q).total_message_count == 0


def test_unknown_transaction_ids_are_refused(root_client, ns, queue):
    q = queue()

    async def work() -> None:
        client = await root_client(timeout=10)
        try:
            session = await client.session()
            coordinator = await _coordinator(session)
            sender = await session.sender(q)
            outcome = await sender.send(_payload(b"x"), state=TransactionalState(txn_id=b"nope"))
            assert isinstance(outcome, Rejected) and outcome.error.condition == "amqp:transaction:unknown-id"
            discharged = await _discharge(coordinator, b"nope")
            assert isinstance(discharged, Rejected) and discharged.error.condition == "amqp:transaction:unknown-id"
        finally:
            await client.close()

    run(work())
    assert ns.get_runtime_properties(q).total_message_count == 0
