"""A partition lends its locked messages to a front end that only reads them (``submit_lock_messages(lend=True)``,
``PartitionBroker.lock_messages_as`` with ``LEND``) instead of copying each one: what was lent must stay exactly as
it was locked whatever then happens to the message in the partition (its lock ends, is renewed, it is deferred or
dead-lettered, locked again), as a copy would."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardbus.model.message import Message, MessageState
from shardbus.partition.broker import PartitionBroker
from shardbus.partition.values import PartitionConfig, SlotSettings
from shardbus.store.sqlite import SqliteStore

CONFIG = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _seen(m: Message) -> tuple:
    return (
        m.message_id,
        m.lock_token,
        m.locked_until_ms,
        m.delivery_count,
        m.state,
        m.dead_letter_reason,
        m.application_properties,
    )


@pytest.fixture
def broker(tmp_path: Path):
    clock = Clock()
    b = PartitionBroker(CONFIG, lambda: SqliteStore(tmp_path / "p.db"), clock)
    b.clock = clock  # type: ignore[attr-defined]
    settings = SlotSettings("q", lock_duration_ms=5_000, max_delivery_count=10)
    b.configure_slot(0, settings)
    b.start()
    b.create_slot(0, settings).result(5)
    yield b
    b.stop()


def _lend(b: PartitionBroker, n: int) -> list[Message]:
    return b.submit_lock_messages(0, 0, n, lend=True).result(5)


def test_lent_messages_are_the_partitions_own_and_never_change(broker: PartitionBroker) -> None:
    broker.enqueue(
        [(None, [(0, Message(b"x", message_id=str(i), application_properties={"i": i}))]) for i in range(6)]
    ).result(5)
    lent = _lend(broker, 6)
    assert [m.message_id for m in lent] == [str(i) for i in range(6)]
    before = [_seen(m) for m in lent]
    assert all(m.lock_token is not None and m.delivery_count == 1 for m in lent)

    broker.abandon(0, lent[0].lock_token).result(5)
    broker.defer(0, lent[1].lock_token).result(5)
    broker.dead_letter(0, lent[2].lock_token, "why", "because").result(5)
    broker.release(0, lent[3].lock_token)
    broker.clock.now += 1  # type: ignore[attr-defined]
    until = broker.renew_lock(0, lent[4].lock_token)
    broker.complete(0, [lent[5].lock_token]).result(5)
    assert [_seen(m) for m in lent] == before  # none of them changed

    # what the partition holds now is what the settlements made, and a lock of it is a new lent object
    again = _lend(broker, 10)
    assert sorted(m.message_id for m in again) == ["0", "3"]
    by_id = {m.message_id: m for m in again}
    assert by_id["0"].delivery_count == 2 and by_id["3"].delivery_count == 1  # release counts no delivery
    assert by_id["0"] is not lent[0] and by_id["0"].lock_token != lent[0].lock_token
    assert lent[0].delivery_count == 1 and lent[0].lock_token == before[0][1]
    assert until > before[4][2]
    assert [m.message_id for m in broker.peek(0, 0, 1, 10)] == ["0", "1", "3", "4"]
    (deferred,), _ = broker.receive_deferred(0, 0, [lent[1].sequence_number & 0xFFFFFFFFFFFF], True)
    assert deferred.state is MessageState.DEFERRED and deferred.delivery_count == 2
    (dead,) = _lend_dead_letters(broker)
    assert dead.message_id == "2" and dead.dead_letter_reason == "why" and lent[2].dead_letter_reason is None


def _lend_dead_letters(b: PartitionBroker) -> list[Message]:
    return b.submit_lock_messages(0, 1, 10, lend=True).result(5)


def test_a_lent_message_whose_lock_expires_stays_as_it_was_locked(broker: PartitionBroker) -> None:
    broker.enqueue([(None, [(0, Message(b"x", message_id="m"))])]).result(5)
    (lent,) = _lend(broker, 1)
    before = _seen(lent)
    broker.clock.now += 6  # type: ignore[attr-defined]  # past the 5 s lock
    (again,) = _lend(broker, 1)  # the expiry is found by the next lock
    assert _seen(lent) == before
    assert again is not lent and again.delivery_count == 2 and again.lock_token != lent.lock_token
    broker.complete(0, [again.lock_token]).result(5)


def test_without_lend_the_caller_gets_copies(broker: PartitionBroker) -> None:
    broker.enqueue([(None, [(0, Message(b"x", message_id="m", application_properties={"n": 1}))])]).result(5)
    (copy,) = broker.submit_lock_messages(0, 0, 1).result(5)
    copy.application_properties["n"] = 2  # the caller's own: the partition's message does not change
    broker.abandon(0, copy.lock_token).result(5)
    (again,) = _lend(broker, 1)
    assert again.application_properties == {"n": 1}
