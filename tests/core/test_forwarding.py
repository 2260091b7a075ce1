"""Auto-forwarding: keys keep their partitions, chains, the hop limit, dead-letter forwarding, missing
destinations, and exactly-once hand-off across crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

import shardbus
from shardbus import Message, SubQueue
from shardbus.entity import forwarding
from shardbus.model.routing import partition_for_key


def wait_for(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def count(ns, path: str) -> int:
    return ns.get_runtime_properties(path).active_message_count


@pytest.mark.parametrize(("source_partitioned", "dest_partitioned"), [(True, False), (False, True), (True, True)])
def test_forwarded_messages_keep_their_key_partition(ns, source_partitioned, dest_partitioned):
    ns.create_queue("dest", enable_partitioning=dest_partitioned)
    ns.create_queue("src", enable_partitioning=source_partitioned, forward_to="dest")
    for key in ("alpha", "beta", "gamma"):
        ns.send("src", [Message(f"{key}-{i}", partition_key=key) for i in range(3)])
    ns.send("src", Message(b"keyless"))
    wait_for(lambda: count(ns, "dest") == 10)
    n = 16 if dest_partitioned else 1
    for m in ns.browse("dest"):
        if m.partition_key is not None:
            assert m.partition_id == partition_for_key(m.partition_key, n)
    by_key = {}
    for m in ns.browse("dest"):
        by_key.setdefault(m.partition_key, []).append(m.body)
    assert by_key["alpha"] == [b"alpha-0", b"alpha-1", b"alpha-2"]  # one key, one partition, in order
    wait_for(lambda: ns.get_runtime_properties("src").total_message_count == 0)


def test_sessions_and_message_ids_are_keys_too(ns):
    ns.create_queue("dest", enable_partitioning=True, requires_session=True)
    ns.create_queue("src", enable_partitioning=True, requires_session=True, forward_to="dest")
    ns.send("src", [Message(f"{i}", session_id="s1") for i in range(3)])
    wait_for(lambda: count(ns, "dest") == 3)
    with ns.session_receiver("dest", "s1") as r:
        assert [m.body for m in r.receive(5, max_wait=0)] == [b"0", b"1", b"2"]


def test_subscription_forwards_to_a_queue_and_queue_to_a_topic(ns):
    ns.create_queue("final")
    ns.create_topic("t2", enable_partitioning=True)
    ns.create_subscription("t2", "to-final", forward_to="final")
    ns.create_queue("entry", forward_to="t2")
    ns.send("entry", Message(b"x", partition_key="k"))
    wait_for(lambda: count(ns, "final") == 1)
    (m,) = ns.peek_messages("final")
    assert m.forward_hops == 2 and m.partition_key == "k"


def test_chain_of_four_hops_then_transfer_dead_letter(ns):
    names = [f"q{i}" for i in range(6)]
    ns.create_queue(names[-1])
    for name, nxt in zip(reversed(names[:-1]), reversed(names[1:]), strict=True):
        ns.create_queue(name, forward_to=nxt)
    ns.send("q0", Message(b"travel"))
    wait_for(lambda: ns.get_runtime_properties("q4").transfer_dead_letter_message_count == 1)
    assert count(ns, "q5") == 0
    assert all(ns.get_runtime_properties(q).total_message_count == 0 for q in names[:4])
    (dead,) = ns.peek_messages("q4/$Transfer/$DeadLetterQueue")
    assert dead.dead_letter_reason == forwarding.HOP_LIMIT_REASON
    assert dead.forward_hops == 4


def test_dead_lettered_messages_forward_with_their_reason(ns):
    ns.create_queue("dlq-sink")
    ns.create_queue("work", forward_dead_lettered_messages_to="dlq-sink")
    ns.send("work", Message(b"bad"))
    with ns.receiver("work") as r:
        (m,) = r.receive(1, max_wait=1)
        r.dead_letter(m, "Invalid", "no customer")
    wait_for(lambda: count(ns, "dlq-sink") == 1)
    (m,) = ns.peek_messages("dlq-sink")
    assert m.application_properties == {"DeadLetterReason": "Invalid", "DeadLetterErrorDescription": "no customer"}
    # The source is completed just after the destination stored the copy.
    wait_for(lambda: ns.get_runtime_properties("work").dead_letter_message_count == 0)


def test_missing_destination_waits_in_transfer_dead_letter_queue(ns):
    ns.create_queue("dest")
    ns.create_queue("src", forward_to="dest", enable_partitioning=True)
    ns.delete_queue("dest")
    ns.send("src", Message(b"orphan"))
    wait_for(lambda: ns.get_runtime_properties("src").transfer_dead_letter_message_count == 1)
    (m,) = ns.peek_messages("src/$Transfer/$DeadLetterQueue")
    assert m.body == b"orphan" and m.dead_letter_reason == "EntityNotFound"
    with ns.receiver("src", sub_queue=SubQueue.TRANSFER_DEAD_LETTER) as r:
        (again,) = r.receive(1, max_wait=1)
        r.complete(again)


def test_disabled_destination_dead_letters_and_busy_one_waits(ns):
    ns.create_queue("dest", enable_partitioning=True)
    ns.create_queue("src", forward_to="dest")
    ns.faults.stop_partition("dest", partition_for_key("k", 16))
    ns.send("src", Message(b"pinned", partition_key="k"))
    time.sleep(0.5)
    assert ns.get_runtime_properties("src").transfer_message_count == 1  # waits while the partition is down
    ns.faults.restore_partition("dest", partition_for_key("k", 16))
    wait_for(lambda: count(ns, "dest") == 1)
    ns.update_queue("dest", status="Disabled")
    ns.send("src", Message(b"refused"))
    wait_for(lambda: ns.get_runtime_properties("src").transfer_dead_letter_message_count == 1)


@pytest.mark.parametrize("key", ["k", None])
def test_crash_between_destination_and_source_commits_delivers_once(open_ns, monkeypatch, key):
    # keyless copies too: forwarded again, each must meet the partition that holds the first copy (round-robin
    # would put it in another, whose transfer ids do not know it)
    ns = open_ns(maintenance=False)
    ns.create_queue("dest", enable_partitioning=True)
    ns.create_queue("src", enable_partitioning=True, forward_to="dest")
    ns.send("src", [Message(f"{i}", partition_key=key) for i in range(5)])
    real_complete = forwarding.Receiver.submit_complete

    def crash(self, refs):
        raise SystemExit("crash after the destination stored the copies")

    monkeypatch.setattr(forwarding.Receiver, "submit_complete", crash)
    with pytest.raises(SystemExit):
        ns._forward_all()
    assert count(ns, "dest") == 5  # stored at the destination, still present at the source
    ns.close()
    monkeypatch.setattr(forwarding.Receiver, "submit_complete", real_complete)
    ns = open_ns(maintenance=False)
    assert ns.get_runtime_properties("src").transfer_message_count == 5
    ns.send("dest", Message(b"other"))  # the round-robin is where it was before the crash no more
    ns._forward_all()
    assert ns.get_runtime_properties("src").total_message_count == 0
    assert sorted(m.body for m in ns.browse("dest")) == [b"0", b"1", b"2", b"3", b"4", b"other"]  # no duplicate


WRITER = textwrap.dedent(
    """
    import sys, time
    import shardbus
    ns = shardbus.Namespace.open(sys.argv[1])
    ns.create_queue("dest", enable_partitioning=True)
    ns.create_queue("src", enable_partitioning=True, forward_to="dest")
    for i in range(int(sys.argv[2])):
        ns.send("src", shardbus.Message(f"m{i}", partition_key=None if i % 2 else f"k{i % 5}"))
    print("sent", flush=True)
    time.sleep(60)
    """
)


def test_kill_9_while_forwarding_loses_and_duplicates_nothing(tmp_path):
    data, n = tmp_path / "data", 600
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(n)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "sent"
    time.sleep(0.05)  # forwarding is under way
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with shardbus.Namespace.open(data) as ns:
        wait_for(lambda: ns.get_runtime_properties("src").total_message_count == 0, timeout=30)
        bodies = Counter(m.body for m in ns.browse("dest"))
    assert len(bodies) == n and set(bodies.values()) == {1}
