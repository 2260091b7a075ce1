"""Receiving and settling: fan-out and the front-end cache, peek-lock outcomes, locks, dead-lettering."""

from __future__ import annotations

from datetime import timedelta

import pytest

import shardbus
from shardbus import Message, ReceiveMode, SubQueue
from shardbus.model.routing import partition_of_lock_token


@pytest.fixture
def cns(open_ns, clock):
    """A namespace on a clock the test moves."""
    return open_ns(clock=clock)


@pytest.mark.parametrize("partitioned", [False, True])
def test_peek_lock_then_complete(ns, partitioned):
    ns.create_queue("q", enable_partitioning=partitioned)
    ns.send("q", [Message(f"m{i}") for i in range(5)])
    with ns.receiver("q") as r:
        got = r.receive(5, max_wait=1)
        assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert all(m.delivery_count == 1 and m.lock_token and m.locked_until for m in got)
        r.complete(*got)
    assert ns.get_runtime_properties("q").active_message_count == 0


def test_receive_asks_every_partition_and_caches_the_rest(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(16):
        ns.send("q", Message(f"m{i}"))  # round-robin: one per partition
    r = ns.receiver("q")
    first = r.receive(1, max_wait=1)
    assert len(first) == 1
    assert r.cached == 15  # every partition answered; the others wait in this receiver's cache, locked
    second = ns.receiver("q").receive(1, max_wait=0)
    assert second == []  # a second front end sees nothing while they are locked here
    rest = r.receive(15, max_wait=0)
    assert len({m.partition_id for m in first + rest}) == 16
    r.complete(*first, *rest)


def test_lock_token_names_the_partition(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"x", partition_key="k"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        assert partition_of_lock_token(m.lock_token) == m.partition_id
        r.complete(m.lock_token)


def test_receive_and_delete(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"m{i}") for i in range(3)])
    with ns.receiver("q", mode=ReceiveMode.RECEIVE_AND_DELETE) as r:
        got = r.receive(3, max_wait=1)
        assert len(got) == 3 and all(m.lock_token is None for m in got)
        with pytest.raises(shardbus.InvalidOperation, match="peek-lock"):
            r.complete(got[0])
    assert ns.get_runtime_properties("q").active_message_count == 0


def test_receive_and_delete_cache_is_given_back_on_close(ns):
    ns.create_queue("q", enable_partitioning=True)
    for i in range(16):
        ns.send("q", Message(f"m{i}"))
    r = ns.receiver("q", mode="receive_and_delete")
    assert len(r.receive(1, max_wait=1)) == 1
    assert r.cached == 15
    r.close()
    assert ns.get_runtime_properties("q").active_message_count == 15
    with ns.receiver("q") as again:
        msgs = again.receive(15, max_wait=1)
        assert len(msgs) == 15 and all(m.delivery_count == 1 for m in msgs)


def test_abandon_counts_a_delivery_and_release_does_not(ns):
    ns.create_queue("q")
    ns.send("q", Message(b"x"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        r.abandon(m)
        (m,) = r.receive(1, max_wait=1)
        assert m.delivery_count == 2
        r.release(m)
        (m,) = r.receive(1, max_wait=1)
        assert m.delivery_count == 2
        r.complete(m)


def test_max_delivery_count_dead_letters_with_the_services_reason(ns):
    ns.create_queue("q", max_delivery_count=3, enable_partitioning=True)
    ns.send("q", Message(b"poison", partition_key="k"))
    with ns.receiver("q") as r:
        for _ in range(3):
            (m,) = r.receive(1, max_wait=1)
            r.abandon(m)
        assert r.receive(1, max_wait=0) == []
    with ns.receiver("q/$DeadLetterQueue") as dlq:
        (dead,) = dlq.receive(1, max_wait=1)
        assert dead.body == b"poison"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.dead_letter_error_description == "Message could not be consumed after 3 delivery attempts."
        assert dead.partition_id == m.partition_id  # the dead-letter queue is partitioned the same way
        dlq.complete(dead)


def test_dead_letter_with_reason_and_dlq_count(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"bad", partition_key="k"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        r.dead_letter(m, reason="Invalid", error_description="no customer")
    props = ns.get_runtime_properties("q")
    assert (props.active_message_count, props.dead_letter_message_count) == (0, 1)
    (dead,) = ns.peek_messages("q/$deadletterqueue", 5)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("Invalid", "no customer")
    with ns.receiver("q", sub_queue=SubQueue.DEAD_LETTER) as dlq:
        (again,) = dlq.receive(1, max_wait=1)
        with pytest.raises(shardbus.InvalidOperation, match="dead-letter"):
            dlq.dead_letter(again)
        dlq.complete(again)


def test_defer_and_receive_by_sequence_number(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"later", partition_key="k"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        seq = m.sequence_number
        r.defer(m)
        assert r.receive(1, max_wait=0) == []
        assert ns.get_runtime_properties("q").active_message_count == 1
        (peeked,) = ns.peek_messages("q", 1, seq)
        assert peeked.state == shardbus.MessageState.DEFERRED
        (d,) = r.receive_deferred([seq])
        assert d.body == b"later" and d.lock_token
        with pytest.raises(shardbus.MessageNotFound):
            r.receive_deferred([seq])  # locked now
        r.abandon(d)  # stays deferred
        (d,) = r.receive_deferred([seq])
        r.complete(d)
        with pytest.raises(shardbus.MessageNotFound):
            r.receive_deferred([seq])


def test_receive_deferred_unknown_sequence_is_message_not_found(ns):
    ns.create_queue("q")
    ns.send("q", Message(b"active"))
    with ns.receiver("q") as r, pytest.raises(shardbus.MessageNotFound):
        r.receive_deferred([1])  # exists, but is not deferred


def test_receive_deferred_in_receive_and_delete_mode(ns):
    ns.create_queue("q")
    ns.send("q", Message(b"x"))
    with ns.receiver("q") as r:
        (m,) = r.receive(1, max_wait=1)
        r.defer(m)
    with ns.receiver("q", mode=ReceiveMode.RECEIVE_AND_DELETE) as rd:
        (d,) = rd.receive_deferred([m.sequence_number])
        assert d.body == b"x"
    assert ns.get_runtime_properties("q").total_message_count == 0


def test_lock_expiry_returns_the_message_and_counts_a_delivery(cns, clock):
    cns.create_queue("q", lock_duration=timedelta(seconds=30), enable_partitioning=True)
    cns.send("q", Message(b"x"))
    r = cns.receiver("q")
    (m,) = r.receive(1, max_wait=1)
    clock.advance(31)
    with pytest.raises(shardbus.MessageLockLost):
        r.complete(m)
    (again,) = cns.receiver("q").receive(1, max_wait=1)
    assert again.delivery_count == 2 and again.lock_token != m.lock_token


def test_renew_lock_extends_it(cns, clock):
    cns.create_queue("q", lock_duration=timedelta(seconds=30))
    cns.send("q", Message(b"x"))
    r = cns.receiver("q")
    (m,) = r.receive(1, max_wait=1)
    clock.advance(20)
    until = r.renew_lock(m)
    assert until == int(clock() * 1000) + 30_000 == m.locked_until_ms
    clock.advance(20)
    assert cns.receiver("q").receive(1, max_wait=0) == []
    r.complete(m)
    clock.advance(60)
    with pytest.raises(shardbus.MessageLockLost):
        r.renew_lock(m)


def test_lock_expiry_past_max_delivery_dead_letters(cns, clock):
    cns.create_queue("q", lock_duration=timedelta(seconds=5), max_delivery_count=2)
    cns.send("q", Message(b"x"))
    for _ in range(2):
        assert len(cns.receiver("q").receive(1, max_wait=0)) == 1
        clock.advance(6)
    assert cns.receiver("q").receive(1, max_wait=0) == []
    assert cns.get_runtime_properties("q").dead_letter_message_count == 1


def test_expired_locks_in_the_cache_are_not_handed_out(cns, clock):
    cns.create_queue("q", lock_duration=timedelta(seconds=10), enable_partitioning=True)
    for i in range(16):
        cns.send("q", Message(f"{i}"))
    r = cns.receiver("q")
    assert len(r.receive(1, max_wait=0)) == 1 and r.cached == 15
    clock.advance(11)
    got = r.receive(16, max_wait=0)
    # Nothing stale came from the cache: all 16 (the one handed out too) were locked afresh by partitions.
    assert len(got) == 16 and all(m.delivery_count == 2 for m in got)


def test_wrong_and_unknown_lock_tokens(ns):
    import uuid

    ns.create_queue("a")
    ns.create_queue("b")
    ns.send("a", Message(b"x"))
    ra, rb = ns.receiver("a"), ns.receiver("b")
    (m,) = ra.receive(1, max_wait=1)
    with pytest.raises(shardbus.MessageLockLost):
        rb.complete(m)  # a token from another entity
    with pytest.raises(shardbus.MessageLockLost):
        ra.complete(uuid.uuid4())
    ra.complete(m)
    with pytest.raises(shardbus.MessageLockLost):
        ra.complete(m)  # settled already


def test_receive_waits_for_a_send(ns):
    import threading
    import time

    ns.create_queue("q", enable_partitioning=True)
    r = ns.receiver("q")
    threading.Timer(0.2, lambda: ns.send("q", Message(b"late"))).start()
    start = time.monotonic()
    (m,) = r.receive(1, max_wait=5)
    assert m.body == b"late" and time.monotonic() - start < 3
    assert r.receive(1, max_wait=0.1) == []


def test_session_entities_need_session_receivers(ns):
    ns.create_queue("q", requires_session=True)
    with pytest.raises(shardbus.InvalidOperation, match="sessions"):
        ns.receiver("q")
    ns.receiver("q/$DeadLetterQueue").close()  # dead-letter queues have no sessions


def test_message_properties_round_trip(ns):
    import uuid
    from datetime import UTC, datetime

    ns.create_queue("q")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    uid = uuid.uuid4()
    sent = Message(
        b"body",
        message_id="mid",
        correlation_id="cid",
        subject="subj",
        content_type="application/json",
        to="someone",
        reply_to="rq",
        reply_to_session_id="rs",
        time_to_live=timedelta(hours=1),
        application_properties={
            "s": "x",
            "i": 5,
            "f": 1.5,
            "b": True,
            "n": None,
            "d": when,
            "u": uid,
            "raw": b"\x00",
        },
    )
    ns.send("q", sent)
    with ns.receiver("q", mode="receive_and_delete") as r:
        (m,) = r.receive(1, max_wait=1)
    for attr in (
        "body",
        "message_id",
        "correlation_id",
        "subject",
        "content_type",
        "to",
        "reply_to",
        "reply_to_session_id",
        "time_to_live",
        "application_properties",
    ):
        assert getattr(m, attr) == getattr(sent, attr), attr
    assert m.expires_at_ms == m.enqueued_time_ms + 3_600_000
    assert m.enqueued_time.tzinfo is not None
