"""A full store (SQLITE_FULL: the write stored nothing) is transient: sends are refused with PartitionFull
(ServerBusy), the partition stays available and consistent, receives and settlements go on, and everything
catches up once writes succeed again, without a restart. The real thing, a full file system under the SDK, is
tests/endpoint/test_full_disk.py; here the store is made full by fault injection (``tests/support/faults.py``)."""

from __future__ import annotations

import time

import pytest

import shardbus
from shardbus import Message
from shardbus.store import committer
from support.faults import Faults


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer, "FULL_RETRY", 0.1)  # embedded partitions; a worker's keeps its 1 s


def _send_when_space(ns: shardbus.Namespace, entity: str, message: Message, limit: float = 10) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            ns.send(entity, message)
            return
        except shardbus.PartitionFull:
            assert time.monotonic() < deadline, "sends still refused"
            time.sleep(0.05)


def test_refused_sends_leave_nothing_behind_and_the_partition_keeps_serving(ns) -> None:
    ns.create_queue("q", requires_duplicate_detection=True)
    for i in range(5):
        ns.send("q", Message(f"m{i}", message_id=f"id{i}"))
    size = ns.get_runtime_properties("q").size_in_bytes
    Faults(ns).fill_store("q", 0, writes=3)
    with pytest.raises(shardbus.ServerBusy) as info:
        ns.send("q", Message(b"refused", message_id="again"))
    assert isinstance(info.value, shardbus.PartitionFull) and "full" in str(info.value)
    with pytest.raises(shardbus.PartitionFull):  # refused at once for a moment, the store not even asked
        ns.send("q", Message(b"refused too", message_id="again"))
    props = ns.get_runtime_properties("q")
    assert props.availability == "Available" and props.size_in_bytes == size and props.active_message_count == 5
    with ns.receiver("q") as r:  # receives and completes go on; their writes wait for space
        got = r.receive(5, max_wait=1)
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)]
        r.complete(*got[:3])
        for m in got[3:]:
            r.abandon(m)
    _send_when_space(ns, "q", Message(b"after", message_id="again"))  # not dropped as a duplicate
    assert sorted(m.body for m in ns.browse("q")) == [b"after", b"m3", b"m4"]
    assert ns.get_runtime_properties("q").availability == "Available"


def test_settlements_made_while_full_reach_the_store(open_ns) -> None:
    ns = open_ns()
    ns.create_queue("q")
    for i in range(4):
        ns.send("q", Message(f"m{i}"))
    Faults(ns).fill_store("q", 0, writes=2)
    with ns.receiver("q") as r:
        got = r.receive(4, max_wait=1)
        r.complete(*got[:2])
        r.dead_letter(got[2], reason="why")
    _send_when_space(ns, "q", Message(b"after"))
    ns.close()
    again = open_ns()  # what the store holds: completions and the dead-lettering were written
    assert sorted(m.body for m in again.browse("q")) == [b"after", b"m3"]
    assert [m.body for m in again.browse("q/$deadletterqueue")] == [b"m2"]
    props = again.get_runtime_properties("q")  # the kept counts too, though refused writes carried some of them
    assert (props.active_message_count, props.dead_letter_message_count) == (2, 1)


def test_keyless_sends_go_to_a_partition_with_space(ns) -> None:
    ns.create_queue("q", enable_partitioning=True)
    Faults(ns).fill_store("q", 0, writes=1)
    Faults(ns).fill_store("q", 1, writes=1)
    for i in range(20):
        ns.send("q", Message(f"m{i}"))  # partitions 0 and 1 refuse once each; the next partition takes it
    assert len(list(ns.browse("q"))) == 20


def test_a_partition_whose_writes_cannot_wait_reloads_by_itself(ns, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committer, "MAX_KEPT_OPS", 1)
    ns.create_queue("q")
    for i in range(3):
        ns.send("q", Message(f"m{i}"))
    Faults(ns).fill_store("q", 0, writes=3)
    with ns.receiver("q") as r:
        got = r.receive(3, max_wait=1)
        r.complete(*got)  # more than may wait: the partition gives up on them and reloads from its store
    partition = ns._queue("q").partitions[0]
    deadline = time.monotonic() + 10
    while not partition.healthy and time.monotonic() < deadline:
        time.sleep(0.05)
    _send_when_space(ns, "q", Message(b"after"))
    bodies = sorted(m.body for m in ns.browse("q"))
    assert b"after" in bodies and set(bodies) <= {b"after", b"m0", b"m1", b"m2"}  # at-least-once: some came back
