"""Send routing: the partition-key rule, round-robin with failover, batches, durability, group commit."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter

import pytest

import shardbus
from shardbus import Message
from shardbus.model.routing import (
    decode_sequence_number,
    encode_sequence_number,
    partition_for_key,
    partition_key_of,
)
from support.faults import Faults


def partitions_holding(ns, path: str) -> Counter:
    return Counter(m.partition_id for m in ns.browse(path))


# --- the partition-key rule ----------------------------------------------------------------------------------
def test_key_rule_order():
    assert partition_key_of(Message(session_id="s", partition_key="s", message_id="m"), True) == "s"
    assert partition_key_of(Message(partition_key="p", message_id="m"), True) == "p"
    assert partition_key_of(Message(message_id="m"), True) == "m"
    assert partition_key_of(Message(message_id="m"), False) is None
    assert partition_key_of(Message(), True) is None


def test_session_and_partition_key_must_agree(ns):
    ns.create_queue("q", enable_partitioning=True, requires_session=True)
    with pytest.raises(shardbus.InvalidOperation, match="must be identical"):
        ns.send("q", Message(b"x", session_id="a", partition_key="b"))
    ns.send("q", Message(b"x", session_id="a", partition_key="a"))


def test_same_key_same_partition(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(20):
        ns.send("q", Message(f"{i}", partition_key="customer-7"))
    assert partitions_holding(ns, "q") == {partition_for_key("customer-7", 16): 20}


def test_session_id_routes_like_partition_key(ns):
    ns.create_queue("q", enable_partitioning=True, requires_session=True)
    ns.send("q", Message(b"x", session_id="customer-7"))
    assert set(partitions_holding(ns, "q")) == {partition_for_key("customer-7", 16)}


def test_message_id_is_the_key_only_with_duplicate_detection(ns):
    ns.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    ns.create_queue("plain", enable_partitioning=True)
    for _ in range(5):
        ns.send("plain", Message(b"x", message_id="same-id"))
    assert len(partitions_holding(ns, "plain")) == 5  # round-robin ignores the id
    ns.send("dd", Message(b"x", message_id="id-1"))
    assert set(partitions_holding(ns, "dd")) == {partition_for_key("id-1", 16)}


def test_key_hash_is_stable_across_processes():
    code = "from shardbus.model.routing import partition_for_key as f; print([f(k, 16) for k in ('a','b','key-1')])"
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(3)}
    assert len(outputs) == 1
    assert outputs.pop().strip() == str([partition_for_key(k, 16) for k in ("a", "b", "key-1")])


def test_keyless_sends_go_round_robin(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(32):
        ns.send("q", Message(f"{i}"))
    assert partitions_holding(ns, "q") == {p: 2 for p in range(16)}


def test_sequence_numbers_carry_the_partition_in_the_top_16_bits(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(3):
        ns.send("q", Message(f"{i}", partition_key="k"))
    pid = partition_for_key("k", 16)
    seqs = [m.sequence_number for m in ns.browse("q")]
    assert [decode_sequence_number(s) for s in seqs] == [(pid, 1), (pid, 2), (pid, 3)]
    assert seqs[0] == (pid << 48) | 1 == encode_sequence_number(pid, 1)


def test_unpartitioned_sequence_numbers_start_at_one(ns):
    ns.create_queue("q")
    ns.send("q", [Message(b"a"), Message(b"b")])
    assert [m.sequence_number for m in ns.browse("q")] == [1, 2]


# --- batches --------------------------------------------------------------------------------------------------
def test_batch_lands_in_one_partition_all_or_nothing(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"{i}") for i in range(10)])
    assert list(partitions_holding(ns, "q").values()) == [10]
    with pytest.raises(shardbus.MessageSizeExceeded):
        ns.send("q", [Message(b"ok"), Message(b"x" * 300_000)])
    assert ns.get_runtime_properties("q").active_message_count == 10


def test_a_value_the_store_cannot_keep_refuses_its_batch_and_leaves_nothing(ns):
    ns.create_queue("q", requires_duplicate_detection=True)
    bad = Message(b"bad", message_id="m2", application_properties={"k": object()})
    with pytest.raises(shardbus.ArgumentError, match="cannot be stored"):
        ns.send("q", [Message(b"ok", message_id="m1"), bad])
    with pytest.raises(shardbus.ArgumentError, match="cannot be stored"):
        ns.send("q", Message(b"x", application_properties={"surrogate": "\udb48"}))
    assert ns.get_runtime_properties("q").active_message_count == 0
    ns.send("q", [Message(b"ok", message_id="m1"), Message(b"again", message_id="m2")])  # not taken as duplicates
    assert [m.body for m in ns.browse("q")] == [b"ok", b"again"]


def test_batch_with_distinct_keys_is_refused_on_partitioned_entities(ns):
    ns.create_queue("q", enable_partitioning=True)
    with pytest.raises(shardbus.InvalidOperation, match="distinct"):
        ns.send("q", [Message(b"a", partition_key="1"), Message(b"b", partition_key="2")])
    ns.create_queue("plain")
    ns.send("plain", [Message(b"a", partition_key="1"), Message(b"b", partition_key="2")])


def test_session_entity_refuses_messages_without_session(ns):
    ns.create_queue("q", requires_session=True)
    with pytest.raises(shardbus.InvalidOperation, match="SessionId"):
        ns.send("q", Message(b"x"))


def test_sent_message_is_copied_not_kept(ns):
    ns.create_queue("q")
    m = Message(b"x", application_properties={"a": 1})
    ns.send("q", m)
    m.application_properties["a"] = 2
    assert next(ns.browse("q")).application_properties == {"a": 1}
    assert m.sequence_number is None


# --- health and failover --------------------------------------------------------------------------------------
def test_keyless_sends_fail_over_and_keyed_sends_get_server_busy(ns):
    ns.create_queue("q", enable_partitioning=True)
    down = partition_for_key("pinned", 16)
    ns.faults.stop_partition("q", down)
    for i in range(40):
        ns.send("q", Message(f"free-{i}"))
    with pytest.raises(shardbus.ServerBusy) as info:
        ns.send("q", Message(b"x", partition_key="pinned"))
    assert isinstance(info.value, shardbus.PartitionUnavailable) and info.value.retriable
    other = next(k for k in (f"k{i}" for i in range(100)) if partition_for_key(k, 16) != down)
    ns.send("q", Message(b"x", partition_key=other))
    counts = partitions_holding(ns, "q")
    assert down not in counts and sum(counts.values()) == 41
    ns.faults.restore_partition("q", down)
    ns.send("q", Message(b"x", partition_key="pinned"))


def test_store_failure_while_writing_fails_over_and_loses_nothing(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(16):
        ns.send("q", Message(f"before-{i}"))
    # The next keyless send goes to partition 0 (round-robin wrapped around): make its write fail.
    Faults(ns).fail_next_write("q", 0)
    ns.send("q", Message(b"rescued"))
    p0 = ns._queue("q").partitions[0]
    assert not p0.healthy and "store error" in p0.failure
    assert ns.get_runtime_properties("q").availability == "Limited"
    with pytest.raises(shardbus.PartitionUnavailable):
        ns.send(
            "q",
            Message(b"x", partition_key=next(k for k in map(str, range(999)) if partition_for_key(k, 16) == 0)),
        )
    ns.faults.restore_partition("q", 0)
    bodies = sorted(m.body for m in ns.browse("q"))
    assert bodies == sorted([f"before-{i}".encode() for i in range(16)] + [b"rescued"])


def test_all_partitions_down_is_server_busy(ns):
    ns.create_queue("q")
    ns.faults.stop_partition("q", 0)
    with pytest.raises(shardbus.ServerBusy):
        ns.send("q", Message(b"x"))


# --- durability and group commit -----------------------------------------------------------------------------
@pytest.mark.embedded_only
def test_concurrent_sends_share_commits(ns):
    ns.create_queue("q")
    partition = ns._queue("q").partitions[0]
    store = partition._committer.store
    commits = 0
    real_apply = store.apply

    def counting_apply(ops, sync=True):
        nonlocal commits
        commits += 1
        real_apply(ops, sync)

    store.apply = counting_apply
    per_thread, threads = 50, 8

    def worker(t: int) -> None:
        for i in range(per_thread):
            ns.send("q", Message(f"{t}-{i}"))

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert ns.get_runtime_properties("q").active_message_count == per_thread * threads
    assert commits < per_thread * threads * 0.8, commits


def test_acknowledged_sends_are_on_disk(ns, tmp_path):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(50):
        ns.send("q", Message(f"{i}"))
    # Read the stores directly, without the namespace: every acknowledged message is there.
    import sqlite3

    folder = ns.root / "entities" / str(ns._queue("q").entity_id)
    total = sum(sqlite3.connect(f).execute("SELECT count(*) FROM m0").fetchone()[0] for f in folder.glob("p*.db"))
    assert total == 50


# --- the front ends' message constructor ------------------------------------------------------------------------
def test_new_message_is_the_dataclass_constructor_without_its_checks():
    from dataclasses import fields

    from shardbus.model.message import new_message

    def values(m: Message) -> dict:
        return {f.name: getattr(m, f.name) for f in fields(Message)}

    assert values(new_message(b"x")) == values(Message(b"x"))
    given = dict(body=b"b", message_id="m", session_id="s", partition_key="s", correlation_id="c", subject="j")
    given |= dict(content_type="t", to="o", reply_to="r", reply_to_session_id="rs")
    assert values(new_message(*given.values())) == values(Message(**given))  # positional, in the fields' order
