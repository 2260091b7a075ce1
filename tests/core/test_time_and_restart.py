"""TTL, scheduled messages, duplicate detection, peek/browse, topics, and everything across restarts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import shardbus
from shardbus import CorrelationFilter, Message, Rule, SqlFilter, SqlRuleAction
from shardbus.model.routing import decode_sequence_number, partition_for_key


@pytest.fixture
def cns(open_ns, clock):
    return open_ns(clock=clock)


def at(clock, seconds: float) -> datetime:
    return datetime.fromtimestamp(clock() + seconds, UTC)


# --- TTL ------------------------------------------------------------------------------------------------------
def test_expired_messages_are_dropped(cns, clock):
    cns.create_queue("q")
    cns.send("q", [Message(b"short", time_to_live=timedelta(seconds=10)), Message(b"long")])
    clock.advance(11)
    with cns.receiver("q") as r:
        assert [m.body for m in r.receive(5, max_wait=0)] == [b"long"]
    assert cns.get_runtime_properties("q").dead_letter_message_count == 0


def test_expired_messages_are_dead_lettered_when_the_entity_says_so(cns, clock):
    cns.create_queue("q", dead_lettering_on_message_expiration=True, default_message_time_to_live=timedelta(minutes=1))
    cns.send("q", Message(b"x"))
    clock.advance(61)
    assert cns.receiver("q").receive(1, max_wait=0) == []
    (dead,) = cns.receiver("q/$DeadLetterQueue").receive(1, max_wait=0)
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_entity_default_ttl_caps_the_message_ttl(cns, clock):
    cns.create_queue("q", default_message_time_to_live=timedelta(seconds=30))
    cns.send("q", Message(b"x", time_to_live=timedelta(hours=1)))
    (m,) = cns.peek_messages("q")
    assert m.expires_at_ms - m.enqueued_time_ms == 30_000


# --- scheduled messages --------------------------------------------------------------------------------------
@pytest.mark.parametrize("partitioned", [False, True])
def test_scheduled_messages_appear_on_time_and_can_be_cancelled(cns, clock, partitioned):
    cns.create_queue("q", enable_partitioning=partitioned)
    seqs = cns.schedule_messages("q", [Message(b"a"), Message(b"b")], at(clock, 60))
    assert len(seqs) == 2 and all(isinstance(s, int) for s in seqs)
    assert cns.get_runtime_properties("q").scheduled_message_count == 2
    (peeked, *_) = cns.peek_messages("q", 1, seqs[0])
    assert peeked.state == shardbus.MessageState.SCHEDULED
    cns.cancel_scheduled_messages("q", seqs[1])
    with pytest.raises(shardbus.MessageNotFound):
        cns.cancel_scheduled_messages("q", seqs[1])
    assert cns.receiver("q").receive(1, max_wait=0) == []
    clock.advance(61)
    (m,) = cns.receiver("q").receive(5, max_wait=0)
    assert m.body == b"a" and m.sequence_number == seqs[0]
    assert cns.get_runtime_properties("q").scheduled_message_count == 0


def test_scheduled_messages_survive_restart(open_ns, clock):
    ns = open_ns(clock=clock)
    ns.create_queue("q", enable_partitioning=True)
    (seq,) = ns.schedule_messages("q", Message(b"s"), at(clock, 30))
    ns.close()
    ns = open_ns(clock=clock)
    assert ns.get_runtime_properties("q").scheduled_message_count == 1
    clock.advance(31)
    (m,) = ns.receiver("q").receive(1, max_wait=0)
    assert m.sequence_number == seq


def test_scheduled_topic_message_reaches_subscriptions(cns, clock):
    cns.create_topic("t")
    cns.create_subscription("t", "s")
    cns.schedule_messages("t", Message(b"x"), at(clock, 10))
    assert cns.get_runtime_properties("t").scheduled_message_count == 1
    clock.advance(11)
    assert len(cns.receiver("t/Subscriptions/s").receive(1, max_wait=0)) == 1


# --- duplicate detection ------------------------------------------------------------------------------------
@pytest.mark.parametrize("partitioned", [False, True])
def test_duplicates_inside_the_window_are_accepted_and_dropped(cns, clock, partitioned):
    cns.create_queue(
        "q",
        requires_duplicate_detection=True,
        enable_partitioning=partitioned,
        duplicate_detection_history_time_window=timedelta(minutes=1),
    )
    cns.send("q", Message(b"first", message_id="order-1"))
    cns.send("q", Message(b"again", message_id="order-1"))  # no error: accepted and dropped
    assert [m.body for m in cns.browse("q")] == [b"first"]
    clock.advance(61)
    cns.send("q", Message(b"later", message_id="order-1"))
    assert [m.body for m in cns.browse("q")] == [b"first", b"later"]


def test_duplicate_history_survives_restart(open_ns, clock):
    ns = open_ns(clock=clock)
    ns.create_queue("q", requires_duplicate_detection=True, enable_partitioning=True)
    ns.send("q", Message(b"x", message_id="m1"))
    ns.close()
    ns = open_ns(clock=clock)
    ns.send("q", Message(b"y", message_id="m1"))
    assert ns.get_runtime_properties("q").active_message_count == 1


def test_refused_batch_leaves_no_duplicate_history(ns):
    ns.create_queue("q", requires_duplicate_detection=True)
    with pytest.raises(shardbus.MessageSizeExceeded):
        ns.send("q", [Message(b"x", message_id="a"), Message(b"x" * 300_000, message_id="b")])
    ns.send("q", Message(b"ok", message_id="a"))
    assert ns.get_runtime_properties("q").active_message_count == 1


# --- peek and browse ----------------------------------------------------------------------------------------
def test_peek_unpartitioned_returns_the_oldest(ns):
    ns.create_queue("q")
    ns.send("q", [Message(f"{i}") for i in range(5)])
    assert [m.body for m in ns.peek_messages("q", 3)] == [b"0", b"1", b"2"]
    assert [m.body for m in ns.peek_messages("q", 3, 4)] == [b"3", b"4"]


def test_peek_partitioned_is_partition_relative_and_may_return_fewer(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"a{i}", partition_key="a") for i in range(3)])
    ns.send("q", [Message(f"b{i}", partition_key="b") for i in range(3)])
    first = ns.peek_messages("q", 10)
    assert len(first) == 3  # fewer than asked: the oldest of one partition only
    assert len({m.partition_id for m in first}) == 1
    assert [decode_sequence_number(m.sequence_number)[1] for m in first] == [1, 2, 3]
    # Paging as the SDK does (last sequence number + 1) walks on through the other partitions.
    seen, start = list(first), first[-1].sequence_number + 1
    while page := ns.peek_messages("q", 10, start):
        seen.extend(page)
        start = page[-1].sequence_number + 1
    assert sorted(m.body for m in seen) == sorted(
        [f"a{i}".encode() for i in range(3)] + [f"b{i}".encode() for i in range(3)]
    )


def test_peek_skips_an_unavailable_partition(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"x", partition_key="a"))
    ns.faults.stop_partition("q", partition_for_key("a", 16))
    assert ns.peek_messages("q", 5) == []


def test_browse_walks_every_partition_with_ranges(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(40):
        ns.send("q", Message(f"{i}"))
    everything = list(ns.browse("q"))
    assert len(everything) == 40
    assert [m.partition_id for m in everything] == sorted(m.partition_id for m in everything)
    part = list(ns.browse("q", partitions=[3], from_local={3: 2}, to_local={3: 3}))
    assert [decode_sequence_number(m.sequence_number) for m in part] == [(3, 2)]


# --- topics ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("partitioned", [False, True])
def test_topic_copies_to_matching_subscriptions(ns, partitioned):
    ns.create_topic("t", enable_partitioning=partitioned)
    ns.create_subscription("t", "all")
    ns.create_subscription("t", "red", default_rule=Rule("red", SqlFilter("color = 'red'")))
    ns.create_subscription("t", "corr", default_rule=Rule("c", CorrelationFilter(subject="urgent")))
    ns.create_subscription("t", "none", default_rule=Rule("f", shardbus.FalseFilter()))
    ns.send("t", Message(b"1", application_properties={"color": "red"}, partition_key="k"))
    ns.send("t", Message(b"2", application_properties={"color": "blue"}, subject="urgent"))
    counts = {
        s: ns.get_runtime_properties(f"t/Subscriptions/{s}").active_message_count
        for s in ("all", "red", "corr", "none")
    }
    assert counts == {"all": 2, "red": 1, "corr": 1, "none": 0}
    (copy,) = ns.peek_messages("t/Subscriptions/red", 1)
    assert copy.partition_id == (partition_for_key("k", 16) if partitioned else 0)  # the copy keeps its key's partition


def test_subscription_actions_change_the_copy_only(ns):
    ns.create_topic("t")
    ns.create_subscription("t", "plain")
    ns.create_subscription(
        "t", "tagged", default_rule=Rule("tag", SqlFilter("1=1"), SqlRuleAction("SET tagged = 'yes'"))
    )
    ns.send("t", Message(b"x", application_properties={"a": 1}))
    (tagged,) = ns.peek_messages("t/Subscriptions/tagged")
    (plain,) = ns.peek_messages("t/Subscriptions/plain")
    assert tagged.application_properties["tagged"] == "yes"
    assert plain.application_properties == {"a": 1}


def test_subscriptions_receive_and_settle_independently(ns):
    ns.create_topic("t", enable_partitioning=True)
    ns.create_subscription("t", "a")
    ns.create_subscription("t", "b")
    ns.send("t", [Message(f"{i}") for i in range(4)])
    with ns.receiver("t/Subscriptions/a") as ra:
        ra.complete(*ra.receive(4, max_wait=1))
    assert ns.get_runtime_properties("t/Subscriptions/a").active_message_count == 0
    assert ns.get_runtime_properties("t/Subscriptions/b").active_message_count == 4
    with ns.receiver("t/Subscriptions/b") as rb:
        (m, *_) = rb.receive(4, max_wait=1)
        rb.dead_letter(m, "r", "d")
    assert ns.get_runtime_properties("t/subscriptions/B").dead_letter_message_count == 1


def test_topic_without_subscriptions_accepts_and_drops(ns):
    ns.create_topic("t")
    ns.send("t", Message(b"x"))
    ns.create_subscription("t", "s")
    assert ns.get_runtime_properties("t/Subscriptions/s").active_message_count == 0


# --- restarts -------------------------------------------------------------------------------------------------
def test_everything_survives_a_restart(open_ns, clock):
    ns = open_ns(clock=clock)
    ns.create_queue("q", enable_partitioning=True, max_delivery_count=5, lock_duration=timedelta(seconds=20))
    ns.create_topic("t", enable_partitioning=True)
    ns.create_subscription("t", "s", default_rule=Rule("r", SqlFilter("n > 1")))
    for i in range(48):
        ns.send("q", Message(f"m{i}", application_properties={"i": i}, partition_key=None if i % 2 else f"k{i}"))
        ns.send("t", Message(f"t{i}", application_properties={"n": i}))
    r = ns.receiver("q")
    got = r.receive(10, max_wait=1)
    r.complete(*got[:4])
    r.defer(got[4])
    r.dead_letter(got[5], "why", "because")
    r.abandon(got[6])
    (sched,) = ns.schedule_messages("q", Message(b"sched"), at(clock, 3600))
    before = sorted((m.sequence_number, m.body, m.state, m.delivery_count) for m in ns.browse("q"))
    dlq_before = [(m.sequence_number, m.dead_letter_reason) for m in ns.browse("q/$DeadLetterQueue")]
    last_seqs = [p.last_sequence() for p in ns._queue("q").partitions]
    locked = {m.sequence_number for m in got[7:]}
    ns.close()

    ns = open_ns(clock=clock)
    assert ns.get_queue("q").max_delivery_count == 5
    assert [r.name for r in ns.list_rules("t", "s")] == ["r"]
    after = sorted((m.sequence_number, m.body, m.state, m.delivery_count) for m in ns.browse("q"))
    abandoned = next(m for m in ns.browse("q") if m.sequence_number == got[6].sequence_number)
    assert abandoned.delivery_count == 1  # written when the lock ended in abandon
    assert [(s, b, st) for s, b, st, _ in after] == [(s, b, st) for s, b, st, _ in before]
    assert [(m.sequence_number, m.dead_letter_reason) for m in ns.browse("q/$DeadLetterQueue")] == dlq_before
    assert ns.get_runtime_properties("q").scheduled_message_count == 1
    assert ns.get_runtime_properties("t/Subscriptions/s").active_message_count == 46
    # Locks do not survive: messages that were locked are available again.
    r2 = ns.receiver("q")
    available = {m.sequence_number for m in r2.receive(100, max_wait=0)}
    assert locked <= available
    # Sequence numbers continue; they never go back.
    ns.send("q", Message(b"new", partition_key="k0"))
    pid = partition_for_key("k0", 16)
    newest = max(m.sequence_number for m in ns.browse("q") if m.partition_id == pid)
    assert decode_sequence_number(newest)[1] == last_seqs[pid] + 1
    (d,) = r2.receive_deferred([got[4].sequence_number])
    assert d.body == got[4].body
    assert sched in {m.sequence_number for m in ns.browse("q")}


def test_sequence_numbers_never_reuse_after_everything_was_completed(open_ns):
    ns = open_ns()
    ns.create_queue("q")
    ns.send("q", [Message(b"a"), Message(b"b")])
    with ns.receiver("q", mode="receive_and_delete") as r:
        r.receive(2, max_wait=1)
    ns.close()
    ns = open_ns()
    ns.send("q", Message(b"c"))
    assert [m.sequence_number for m in ns.browse("q")] == [3]


def test_partition_comes_back_with_everything_it_held(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"{i}", partition_key="a") for i in range(5)])
    pid = partition_for_key("a", 16)
    r = ns.receiver("q")
    locked = r.receive(2, max_wait=1)
    ns.faults.stop_partition("q", pid)
    with pytest.raises(shardbus.PartitionUnavailable):
        r.complete(*locked)
    with pytest.raises(shardbus.PartitionUnavailable):
        ns.send("q", Message(b"x", partition_key="a"))
    ns.faults.restore_partition("q", pid)
    with pytest.raises(shardbus.MessageLockLost):  # locks did not survive the partition's restart
        r.complete(*locked)
    assert sorted(m.body for m in ns.browse("q")) == [b"0", b"1", b"2", b"3", b"4"]
