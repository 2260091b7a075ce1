"""Transactions through the Python API: atomic commit, rollback, the seeds' rules, and crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import shardbus
from shardbus import Message
from shardbus.model.routing import partition_for_key
from support.faults import Faults


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_sends_and_settlements_commit_together(ns, partitioned):
    ns.create_queue("q", enable_partitioning=partitioned)
    ns.send("q", Message(b"order", partition_key="k"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        with ns.transaction() as tx:
            tx.complete(r, m)
            tx.send("q", [Message(b"invoice", partition_key="k"), Message(b"receipt", partition_key="k")])
            assert ns.get_runtime_properties("q").active_message_count == 1  # nothing before the commit
    assert sorted(x.body for x in ns.browse("q")) == [b"invoice", b"receipt"]


def test_every_settlement_kind_in_a_transaction(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"{i}", partition_key="k") for i in range(4)])
    with ns.receiver("q") as r:
        a, b, c, d = r.receive(4, max_wait=1)
        with ns.transaction() as tx:
            tx.complete(r, a)
            tx.abandon(r, b)
            tx.defer(r, c)
            tx.dead_letter(r, d, "why", "because")
    props = ns.get_runtime_properties("q")
    assert (props.active_message_count, props.dead_letter_message_count) == (2, 1)  # b back, c deferred


def test_scheduling_in_a_transaction(open_ns, clock):
    from datetime import UTC, datetime

    ns = open_ns(clock=clock)
    ns.create_queue("q", enable_partitioning=True)
    with ns.transaction() as tx:
        tx.schedule("q", Message(b"later", partition_key="k"), datetime.fromtimestamp(clock() + 60, UTC))
        tx.send("q", Message(b"now", partition_key="k"))
    props = ns.get_runtime_properties("q")
    assert (props.active_message_count, props.scheduled_message_count) == (1, 1)


def test_rollback_discards_everything(ns):
    ns.create_queue("q")
    ns.send("q", Message(b"x", partition_key="k"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        with pytest.raises(RuntimeError), ns.transaction() as tx:
            tx.complete(r, m)
            tx.send("q", Message(b"y", partition_key="k"))
            raise RuntimeError("the application changed its mind")
        assert [x.body for x in ns.browse("q")] == [b"x"]
        r.complete(m)  # the lock is still held outside the transaction


def test_a_failed_write_applies_nothing(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"x", partition_key="k"))
    pid = partition_for_key("k", 16)
    r = ns.receiver("q")
    (m,) = r.receive(1, max_wait=1)
    tx = ns.transaction()
    tx.complete(r, m)
    tx.send("q", Message(b"y", partition_key="k"))
    Faults(ns).fail_next_write("q", pid)
    with pytest.raises(shardbus.PartitionUnavailable):
        tx.commit()
    ns.faults.restore_partition("q", pid)
    assert [x.body for x in ns.browse("q")] == [b"x"]  # neither the complete nor the send


def test_messages_in_a_transaction_need_a_partition_key(ns):
    ns.create_queue("q", enable_partitioning=True)
    with pytest.raises(shardbus.InvalidOperation, match="must have a partition key"):
        ns.transaction().send("q", Message(b"x"))
    ns.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    tx = ns.transaction()
    tx.send("dd", Message(b"x", message_id="id-1"))  # the message id is the key here
    tx.commit()


def test_one_partition_key_per_transaction(ns):
    ns.create_queue("q", enable_partitioning=True)
    tx = ns.transaction()
    tx.send("q", Message(b"a", partition_key="k1"))
    with pytest.raises(shardbus.InvalidOperation, match="share one partition key"):
        tx.send("q", Message(b"b", partition_key="k2"))


def test_one_session_per_transaction(ns):
    ns.create_queue("q", enable_partitioning=True, requires_session=True)
    tx = ns.transaction()
    tx.send("q", Message(b"a", session_id="s1"))
    with pytest.raises(shardbus.InvalidOperation, match="more than one session"):
        tx.send("q", Message(b"b", session_id="s2"))


def test_one_entity_per_transaction(ns):
    ns.create_queue("a")
    ns.create_queue("b")
    ns.send("a", Message(b"x", partition_key="k"))
    with ns.receiver("a") as r:
        (m,) = r.receive(1, max_wait=1)
        tx = ns.transaction()
        tx.complete(r, m)
        with pytest.raises(shardbus.InvalidOperation, match="another partition"):
            tx.send("b", Message(b"y", partition_key="k"))


def test_topic_send_and_subscription_complete_share_a_transaction(ns):
    ns.create_topic("t", enable_partitioning=True)
    ns.create_subscription("t", "s")
    ns.send("t", Message(b"in", partition_key="k"))
    with ns.receiver("t/Subscriptions/s") as r:
        (m,) = r.receive(1, max_wait=1)
        with ns.transaction() as tx:
            tx.complete(r, m)
            tx.send("t", Message(b"out", partition_key="k"))
    assert [x.body for x in ns.browse("t/Subscriptions/s")] == [b"out"]


def test_a_transaction_is_used_once(ns):
    ns.create_queue("q")
    tx = ns.transaction()
    tx.commit()
    with pytest.raises(shardbus.InvalidOperation, match="already"):
        tx.send("q", Message(b"x", partition_key="k"))


WORKER = textwrap.dedent(
    """
    import sys
    import shardbus
    ns = shardbus.Namespace.open(sys.argv[1])
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [shardbus.Message(f"in-{i}", partition_key="k") for i in range(300)])
    print("ready", flush=True)
    with ns.receiver("q") as r:
        while True:
            for m in r.receive(10, max_wait=1):
                if not m.body.startswith(b"in-"):
                    r.release(m)  # our own outputs stay (releasing writes nothing)
                    continue
                i = m.body[3:].decode()
                with ns.transaction() as tx:
                    tx.complete(r, m)
                    tx.send("q", [shardbus.Message(f"out-{i}-a", partition_key="k"),
                                  shardbus.Message(f"out-{i}-b", partition_key="k")])
    """
)


def test_kill_9_between_transactions_leaves_none_half_applied(tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(data)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.4)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with shardbus.Namespace.open(data) as ns:
        bodies = {m.body.decode() for m in ns.browse("q")}
    done = 0
    for i in range(300):
        a, b, src = f"out-{i}-a" in bodies, f"out-{i}-b" in bodies, f"in-{i}" in bodies
        assert a == b, f"transaction {i} half-applied"
        if not src:
            done += 1
        assert a != src, f"transaction {i}: its outputs and its completed input disagree"
    assert done > 0, "no transaction committed before the kill"
