"""A worker's lock reply names the messages its front end sent and still holds instead of carrying them back
(``wire.Held``, SBW6), through a real socket: what the front end delivers is what a local broker's lock gives,
field for field; a message the front end no longer holds (dropped past the bounds, sent through another
connection, changed since) comes back in full, its body from the worker."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from shardbus.cluster import wire
from shardbus.cluster.remote import ClusterClient, RemotePartition
from shardbus.cluster.worker import Worker
from shardbus.model.message import Message
from shardbus.model.routing import new_lock_token
from shardbus.partition.broker import PartitionBroker
from shardbus.partition.handle import PartitionSpec
from shardbus.partition.values import PartitionConfig, SlotSettings
from shardbus.runtime import new_event_loop
from shardbus.store.sqlite import SqliteStore

KEY = "ns/entities/1/p00.db"
CONFIG = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
# what differs between two partitions by chance: the lock (a random token, the clock) and the enqueue time
_BY_CHANCE = {"lock_token", "locked_until_ms", "enqueued_time_ms", "expires_at_ms"}


def _messages(tag: str, n: int = 4) -> list[Message]:
    out = []
    for i in range(n):
        m = Message(
            f"{tag}-{i}".encode() * (i * 200 + 1),
            message_id=f"{tag}{i}",
            application_properties={"n": i, "s": "x"} if i % 2 == 0 else None,
            annotations={"x-opt-custom": "v"} if i == 1 else None,
            subject="s" if i == 2 else None,
            time_to_live=timedelta(hours=1) if i == 3 else None,
            wire_sections=b"\x00S" if i == 0 else None,
        )
        out.append(m)
    return out


def _fields(m: Message) -> dict:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(Message) if f.name not in _BY_CHANCE}


class _Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.worker = Worker(tmp_path / "worker", "k")
        self.loop = new_event_loop()
        ready = threading.Event()
        port: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(
                self.worker.serve("127.0.0.1", 0, lambda b: (port.append(b), ready.set()))
            ),
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(10)
        self.port = port[0]
        self.clients: list[ClusterClient] = []

    def partition(self) -> RemotePartition:
        """The partition through a connection of its own (a front end of its own)."""
        client = ClusterClient("k", time.time, tick_interval=1.0)
        self.clients.append(client)
        link = client.link("0", ("127.0.0.1", self.port))
        assert client.wait_connected(10)
        spec = PartitionSpec(1, CONFIG, self.tmp_path / KEY, time.time, lambda: None)
        p = RemotePartition(link, KEY, spec)
        p.configure_slot(0, SlotSettings("q"))
        p.start()
        p.create_slot(0, SlotSettings("q")).result(5)
        return p

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.worker.call_soon(self.worker._stop_event.set)
        self.thread.join(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[_Cluster]:
    c = _Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many records of the lock replies came named and how many in full."""
    counts = {"named": 0, "full": 0}
    locked_of = wire.locked_of

    def counting(lock: list | None, records: list, held: dict) -> list[Message]:
        for r in records:
            counts["named" if len(r) == len(wire._NAMED) else "full"] += 1
        return locked_of(lock, records, held)

    monkeypatch.setattr(wire, "locked_of", counting)
    return counts


def _lock_all(p: RemotePartition | PartitionBroker) -> list[Message]:
    out: list[Message] = []
    while True:
        got = p.submit_lock_messages(0, 0, 3).result(5)
        if not got:
            return out
        out += got


def test_a_lock_reply_names_what_was_sent_and_delivers_what_a_local_lock_gives(
    cluster: _Cluster, counted: dict[str, int], tmp_path: Path
) -> None:
    local = PartitionBroker(CONFIG, lambda: SqliteStore(tmp_path / "local.db"), time.time)
    local.configure_slot(0, SlotSettings("q"))
    local.start()
    try:
        local.create_slot(0, SlotSettings("q")).result(5)
        remote = cluster.partition()
        got, sent = {}, {}
        for name, p in (("local", local), ("remote", remote)):
            sent[name] = _messages("a")
            p.enqueue([(None, [(0, m)]) for m in sent[name]]).result(5)
            got[name] = _lock_all(p)
        assert counted == {"named": 4, "full": 0}
        # handed over to the partition, a sent message is what its lock delivers (a local one lends it as well)
        assert all(r is s for r, s in zip(got["remote"], sent["remote"], strict=True))
        for r, loc in zip(got["remote"], got["local"], strict=True):
            assert {k: v for k, v in _fields(r).items() if v != _fields(loc)[k]} == {}
        assert all(m.lock_token is not None and m.delivery_count == 1 for m in got["remote"])
        assert remote.link.held.of(KEY) == {}  # taken out as delivered
        # what is delivered is the receiver's own: changing it changes nothing held or stored
        got["remote"][0].application_properties["n"] = 7
        remote.abandon(0, got["remote"][0].lock_token).result(5)
        (again,) = remote.submit_lock_messages(0, 0, 10).result(5)
        assert again.application_properties == {"n": 0, "s": "x"} and again.delivery_count == 2
        assert counted == {"named": 4, "full": 1}  # the abandoned one's copy is not what was sent: in full
        remote.complete(0, [again.lock_token] + [m.lock_token for m in got["remote"][1:]]).result(5)
        assert remote.submit_lock_messages(0, 0, 10).result(5) == []
    finally:
        local.stop()


def test_a_message_the_front_end_no_longer_holds_comes_back_with_its_body(
    cluster: _Cluster, counted: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``HELD_BYTES`` both ends drop what they hold at the same point: the first batch comes back in full
    (its bodies from the worker), the second named."""
    p = cluster.partition()
    first, second = _messages("first"), _messages("second")
    frame = len(
        wire.pack_frame([1, KEY, 0.0, "enqueue", [wire.held_item_arrays([(None, [(0, m)]) for m in first])[0], "b"]])
    )
    monkeypatch.setattr(wire, "HELD_BYTES", frame + frame // 2)  # room for one batch's frame, not two
    p.enqueue([(None, [(0, m)]) for m in first]).result(5)
    p.enqueue([(None, [(0, m)]) for m in second]).result(5)
    locked = _lock_all(p)
    assert counted == {"named": 4, "full": 4}
    assert [(m.message_id, m.body) for m in locked] == [(m.message_id, m.body) for m in first + second]
    p.complete(0, [m.lock_token for m in locked]).result(5)


def test_messages_sent_through_another_connection_come_back_in_full(cluster: _Cluster, counted: dict[str, int]) -> None:
    sender, receiver = cluster.partition(), cluster.partition()
    sent = _messages("other")
    sender.enqueue([(None, [(0, m)]) for m in sent]).result(5)
    locked = _lock_all(receiver)
    assert counted["named"] == 0
    assert [(m.message_id, m.body) for m in locked] == [(m.message_id, m.body) for m in sent]
    receiver.complete(0, [m.lock_token for m in locked]).result(5)
    # the sender still holds them until it drops them: it never locks them, and nothing is named wrongly
    assert sender.submit_lock_messages(0, 0, 10).result(5) == []


def test_the_dead_letter_queue_comes_back_in_full(cluster: _Cluster, counted: dict[str, int]) -> None:
    p = cluster.partition()
    sent = _messages("dl", 2)
    p.enqueue([(None, [(0, m)]) for m in sent]).result(5)
    first = p.submit_lock_messages(0, 0, 1).result(5)
    p.dead_letter(0, first[0].lock_token, "why", "because").result(5)
    (dead,) = p.submit_lock_messages(0, 1, 10).result(5)  # the dead-letter queue: never named
    assert (dead.message_id, dead.body, dead.dead_letter_reason) == ("dl0", sent[0].body, "why")
    (rest,) = p.submit_lock_messages(0, 0, 10).result(5)
    assert (rest.message_id, rest.body) == ("dl1", sent[1].body)
    assert counted == {"named": 2, "full": 0}  # the dead-letter queue's lock went as a plain messages frame


def test_the_lock_fields_sent_once_per_reply_are_each_message_s_own(cluster: _Cluster, counted: dict[str, int]) -> None:
    """Since SBW7 a ``locked`` frame carries the fields a lock sets alike (``wire._LOCK``) once: every message
    delivered has the worker's own values of them and of every broker field, through the socket."""
    p = cluster.partition()
    sent = _messages("lock", 4)
    p.enqueue([(None, [(0, m)]) for m in sent]).result(5)
    locked = p.submit_lock_messages(0, 0, 10).result(5)
    assert counted == {"named": 4, "full": 0}
    broker = cluster.worker.host.get(KEY)
    for m in locked:
        theirs = broker._locks[m.lock_token.int].msg
        assert {f: getattr(m, f) for f in wire._BROKER} == {f: getattr(theirs, f) for f in wire._BROKER}
    p.complete(0, [m.lock_token for m in locked]).result(5)


def test_a_held_message_locked_unlike_the_others_of_its_reply_goes_in_full() -> None:
    """The reply's ``_LOCK`` fields are its first named message's; one that differs (not seen from one
    ``lock_messages``, but not assumed) travels as its full record, and both ends take every one out of what they
    hold."""
    sent = _messages("odd", 3)
    arrays, held = wire.held_item_arrays([(None, [(0, m)]) for m in sent])
    assert held is not None
    stored = [wire.held_items_of(arrays)[1][i] for i in range(3)]  # the worker's objects (one decoding each)
    for seq, m in enumerate(stored, start=10):
        m.sequence_number = m.enqueued_sequence_number = seq
        m.enqueued_time_ms, m.partition_id = 1_000 + seq, 0
        m.lock_token, m.locked_until_ms, m.delivery_count = new_lock_token(0, seq), 61_000, 1
    stored[2].locked_until_ms = 62_000  # renewed, say
    stored[1].enqueued_sequence_number = 3  # (a scheduled message's is its schedule's, say)
    worker_held = {m.sequence_number: m for m in stored}
    lock, named = wire.named_records_of(stored, worker_held)
    assert lock == [61_000, 0, 0] and [len(r) for r in named] == [len(wire._NAMED)] + [len(wire._COMMON) + 1] * 2
    front_held = dict(zip((10, 11, 12), held, strict=True))
    frame = wire.unpack_frame(wire.reply_frame(1, True, wire.Locked((lock, named)), None))
    got = wire.locked_of(frame[5], frame[2], front_held)
    assert worker_held == {} and front_held == {}
    assert [{f: getattr(m, f) for f in _FIELDS} for m in got] == [{f: getattr(m, f) for f in _FIELDS} for m in stored]


_FIELDS = [f.name for f in dataclasses.fields(Message)]


def test_a_complete_s_tokens_read_as_their_ints_settle_all_or_none(cluster: _Cluster) -> None:
    """A worker reads a complete's tokens as their ints (``wire.Tokens``, ``PartitionBroker.complete_keys``),
    through the socket: a token that locks nothing refuses the whole complete, the valid ones then complete, and
    completing them again is refused."""
    from shardbus.model.errors import MessageLockLost

    p = cluster.partition()
    p.enqueue([(None, [(0, m)]) for m in _messages("ints", 3)]).result(5)
    locked = p.submit_lock_messages(0, 0, 10).result(5)
    tokens = [m.lock_token for m in locked]
    with pytest.raises(MessageLockLost):
        p.complete(0, [*tokens, new_lock_token(0, 99)]).result(5)
    p.complete(0, tokens).result(5)  # none of them was settled by the refused one
    with pytest.raises(MessageLockLost):
        p.complete(0, tokens[:1]).result(5)
    assert p.submit_lock_messages(0, 0, 10).result(5) == []
