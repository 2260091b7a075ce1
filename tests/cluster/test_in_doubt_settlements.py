"""Settlements whose outcome a client was told but whose write may not be stored: a worker answers a complete
(defer, dead-letter) once applied and writes it up to 20 ms later, so a worker killed in between forgets what its
front end already echoed. The front end keeps those settlements by sequence number (lock tokens carry it) and
applies them again (``settle_by_sequence``) before the partition is healthy: a completed message never comes
back. The broker operation on a real partition broker, then real worker processes killed in the window."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import shardbus
from shardbus.cluster.supervisor import LocalCluster
from shardbus.model.message import MessageState, SubQueue
from shardbus.model.routing import local_seq_of_lock_token, partition_for_key, partition_of_lock_token
from shardbus.namespace import Namespace
from shardbus.partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from shardbus.store.sqlite import SqliteStore
from support.faults import FAULTY_WORKER, inject

pytestmark = pytest.mark.timeout(120)

_LOCAL = (1 << 48) - 1


def _wait_until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _broker(path: Path) -> PartitionBroker:
    config = PartitionConfig("q", 7, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, lambda: SqliteStore(path), time.time)
    broker.configure_slot(0, SlotSettings("q"))
    broker.start()
    broker.create_slot(0, SlotSettings("q")).result()
    return broker


def _send(broker: PartitionBroker, count: int) -> None:
    for i in range(count):
        broker.enqueue([(None, [(0, shardbus.Message(f"m{i}".encode(), message_id=f"m{i}"))])]).result()


def _where(broker: PartitionBroker) -> dict[str, tuple[int, int]]:
    """Every stored message of slot 0: message id -> (sub-queue, state), as a restarted broker loads them."""
    broker.stop()
    broker.start()
    out = {}
    for queue in SubQueue:
        for m in broker.peek(0, int(queue), 1, 100):
            out[str(m.message_id)] = (int(queue), int(m.state))
    return out


def test_lock_tokens_name_their_message_and_partition(tmp_path):
    broker = _broker(tmp_path / "p.db")
    try:
        _send(broker, 5)
        first = broker.lock_messages(0, 0, 5)
        assert [local_seq_of_lock_token(m.lock_token) for m in first] == [m.sequence_number & _LOCAL for m in first]
        assert {partition_of_lock_token(m.lock_token) for m in first} == {7}
        broker.abandon(0, first[0].lock_token).result()
        again = broker.lock_messages(0, 0, 1)[0]
        assert again.sequence_number == first[0].sequence_number
        assert again.lock_token != first[0].lock_token  # a re-lock gets another token all the same
        assert local_seq_of_lock_token(again.lock_token) == local_seq_of_lock_token(first[0].lock_token)
    finally:
        broker.stop()


def test_settle_by_sequence_applies_each_outcome_once(tmp_path):
    """After a restart (locks gone, the lingering write lost): complete, defer and dead-letter by sequence
    number; applying them again (the worker had stored them after all) changes nothing."""
    broker = _broker(tmp_path / "p.db")
    try:
        _send(broker, 6)
        seqs = [m.sequence_number & _LOCAL for m in broker.peek(0, 0, 1, 10)]
        settles = [
            (0, "complete", seqs[0:2], None, None, 0),
            (0, "defer", [seqs[2]], None, None, 0),
            (0, "dead_letter", [seqs[3]], "why", "because", int(SubQueue.DEAD_LETTER)),
            (0, "dead_letter", [seqs[4]], "hop", None, int(SubQueue.TRANSFER_DEAD_LETTER)),
        ]
        assert broker.settle_by_sequence(settles).result() == 5
        assert broker.settle_by_sequence(settles).result() == 0  # idempotent
        where = _where(broker)
        assert where == {
            "m2": (SubQueue.MAIN, MessageState.DEFERRED),
            "m3": (SubQueue.DEAD_LETTER, MessageState.ACTIVE),
            "m4": (SubQueue.TRANSFER_DEAD_LETTER, MessageState.ACTIVE),
            "m5": (SubQueue.MAIN, MessageState.ACTIVE),
        }
        assert broker.settle_by_sequence(settles).result() == 0  # after a restart too (read from the store)
        dead = broker.peek(0, int(SubQueue.DEAD_LETTER), 1, 10)[0]
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("why", "because")
        assert [m.message_id for m in broker.lock_messages(0, 0, 10)] == ["m5"]
    finally:
        broker.stop()


def test_settle_by_sequence_reaches_messages_on_disk_only_and_locked_ones(tmp_path):
    """A restarted partition holds only a window of its messages in memory; a message locked again (a live
    worker reloaded) loses its lock: the outcome was promised first."""
    broker = _broker(tmp_path / "p.db")
    broker.read_ahead = 2
    try:
        _send(broker, 40)
        broker.stop()
        broker.start()
        seqs = [m.sequence_number & _LOCAL for m in broker.peek(0, 0, 1, 100)]
        locked = broker.lock_messages(0, 0, 1)[0]
        settles = [
            (0, "complete", [seqs[0], *seqs[30:35]], None, None, 0),
            (0, "defer", [seqs[36]], None, None, 0),
            (0, "dead_letter", [seqs[37]], "r", None, int(SubQueue.DEAD_LETTER)),
        ]
        assert broker.settle_by_sequence(settles).result() == 8
        with pytest.raises(shardbus.MessageLockLost):
            broker.complete(0, [locked.lock_token]).result()
        where = _where(broker)
        assert len(where) == 40 - 6  # the dead-lettered one is in its sub-queue, the deferred one stays
        assert where["m36"] == (SubQueue.MAIN, MessageState.DEFERRED)
        assert where["m37"] == (SubQueue.DEAD_LETTER, MessageState.ACTIVE)
        got = []
        while batch := broker.lock_messages(0, 0, 10):
            got += [str(m.message_id) for m in batch]
            broker.complete(0, [m.lock_token for m in batch]).result()
        assert got == [f"m{i}" for i in range(1, 40) if not (30 <= i <= 34 or i in (36, 37))]
    finally:
        broker.stop()


# --- worker processes -------------------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path / "data", 2, "k", worker_command=FAULTY_WORKER).start() as c:
        yield c


@pytest.mark.parametrize("by_keys", [False, True], ids=["tokens", "keys"])
def test_a_worker_killed_before_its_echoed_settlements_were_written_does_not_deliver_them_again(
    cluster, tmp_path, by_keys
):
    """The settlements' verdicts are in (what the AMQP front end echoes to its client), their writes linger (made
    long here, so the kill lands in the window for certain); the worker is killed and restarted. ``by_keys``: the
    completes given as the tokens' ints (``complete_keys``, as the AMQP front end completes a range)."""
    ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
    try:
        ns.create_queue("q", enable_partitioning=True)
        pid = partition_for_key("k", 16)
        p = ns._queue("q").partitions[pid]
        for i in range(10):
            ns.send("q", shardbus.Message(f"m{i}".encode(), message_id=f"m{i}", partition_key="k"))
        inject(p, settle_linger=60.0)
        got = ns.receiver("q").receive(10, max_wait=5)
        assert sorted(str(m.message_id) for m in got) == [f"m{i}" for i in range(10)]
        by_id = {str(m.message_id): m for m in got}
        verdicts = [
            (
                p.complete_keys(0, [by_id[f"m{i}"].lock_token.int for i in range(5)])
                if by_keys
                else p.complete(0, [by_id[f"m{i}"].lock_token for i in range(5)])
            ).verdict,
            p.defer(0, by_id["m5"].lock_token).verdict,
            p.dead_letter(0, by_id["m6"].lock_token, "why", "because").verdict,
            p.abandon(0, by_id["m7"].lock_token).verdict,
        ]
        for v in verdicts:
            v.result(10)  # echoed
        assert len(p.link._writing) == 4  # none of them durable yet
        cluster.kill((ns._queue("q").entity_id + pid) % len(cluster.workers))
        _wait_until(lambda: not p.link.connected)
        assert not p.healthy and len(p.settles_in_doubt) == 3  # the abandon needs nothing
        _wait_until(lambda: p.healthy)
        assert p.settles_in_doubt == []
        receiver = ns.receiver("q")
        again = []
        while batch := receiver.receive(10, max_wait=2):
            again += [str(m.message_id) for m in batch]
            receiver.complete(*batch)
        assert sorted(again) == ["m7", "m8", "m9"]
        deferred = ns.receiver("q").receive_deferred([by_id["m5"].sequence_number])
        assert [m.message_id for m in deferred] == ["m5"]
        dead = ns.receiver("q", sub_queue=SubQueue.DEAD_LETTER).receive(10, max_wait=2)
        assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("m6", "why")]
    finally:
        ns.close()


def test_a_dropped_connection_to_a_live_worker_applies_its_settlements_once(cluster, tmp_path):
    """The worker lives on and writes them: applying them again by sequence number changes nothing."""
    ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
    try:
        ns.create_queue("q", enable_partitioning=True)
        pid = partition_for_key("k", 16)
        p = ns._queue("q").partitions[pid]
        for i in range(4):
            ns.send("q", shardbus.Message(f"m{i}".encode(), message_id=f"m{i}", partition_key="k"))
        inject(p, settle_linger=0.5)
        got = ns.receiver("q").receive(4, max_wait=5)
        p.complete(0, [m.lock_token for m in got[:2]]).verdict.result(10)
        assert len(p.link._writing) == 1
        p.link.client.loop.call_soon_threadsafe(p.link._abort, "test: the connection drops")
        _wait_until(lambda: not p.healthy)
        _wait_until(lambda: p.healthy)
        for m in got[2:]:  # their locks live on in the worker
            p.abandon(0, m.lock_token).result(10)
        receiver = ns.receiver("q")
        again = []
        while batch := receiver.receive(10, max_wait=2):
            again += [str(m.message_id) for m in batch]
            receiver.complete(*batch)
        assert sorted(again) == sorted(str(m.message_id) for m in got[2:])
    finally:
        ns.close()
