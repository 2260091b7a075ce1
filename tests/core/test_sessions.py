"""Sessions on partitioned and non-partitioned entities, through the Python API."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

import shardbus
from shardbus import Message
from shardbus.model.routing import partition_for_key

PARTITIONED = pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])


@pytest.fixture
def cns(open_ns, clock):
    return open_ns(clock=clock)


@PARTITIONED
def test_one_session_is_delivered_in_send_order_while_others_interleave(ns, partitioned):
    ns.create_queue("q", requires_session=True, enable_partitioning=partitioned)
    sends = []
    for i in range(1000):  # concurrent sends, as many producers would do; order is the broker's to keep
        sends.append(ns.submit_send("q", Message(f"{i}", session_id="main")))
        sends.append(ns.submit_send("q", Message(f"x{i}", session_id=f"other-{i % 7}")))
        if len(sends) >= 64:
            for f in sends:
                f.result()
            sends = []
    for f in sends:
        f.result()
    got: list[bytes] = []
    with ns.session_receiver("q", "main") as r:
        while batch := r.receive(97, max_wait=0):
            got.extend(m.body for m in batch)
            r.complete(*batch)
    assert got == [str(i).encode() for i in range(1000)]


@PARTITIONED
def test_competing_receivers_get_different_sessions(ns, partitioned):
    ns.create_queue("q", requires_session=True, enable_partitioning=partitioned)
    for s in ("a", "b"):
        ns.send("q", Message(s, session_id=s))
    first = ns.session_receiver("q", max_wait=1)
    second = ns.session_receiver("q", max_wait=1)
    assert {first.session_id, second.session_id} == {"a", "b"}
    with pytest.raises(shardbus.SessionCannotBeLocked):
        ns.session_receiver("q", first.session_id)
    with pytest.raises(shardbus.OperationTimeout):
        ns.session_receiver("q", max_wait=0.2)  # nothing else is free
    first.close()
    again = ns.session_receiver("q", max_wait=1)
    assert again.session_id == first.session_id
    second.close()
    again.close()


def test_next_available_asks_every_partition(ns):
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    key = next(k for k in (f"s{i}" for i in range(999)) if partition_for_key(k, 16) == 15)
    ns.send("q", Message(b"x", session_id=key))
    for _ in range(3):  # whatever partition the search starts at
        with ns.session_receiver("q", max_wait=1) as r:
            assert r.session_id == key


def test_next_available_waits_for_a_send(ns):
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    threading.Timer(0.2, lambda: ns.send("q", Message(b"x", session_id="late"))).start()
    start = time.monotonic()
    with ns.session_receiver("q", max_wait=5) as r:
        assert r.session_id == "late" and time.monotonic() - start < 3


def test_session_lock_expiry_is_lost_and_messages_come_back(cns, clock):
    cns.create_queue("q", requires_session=True, lock_duration=timedelta(seconds=30), enable_partitioning=True)
    cns.send("q", [Message(f"{i}", session_id="s") for i in range(3)])
    r = cns.session_receiver("q", "s")
    msgs = r.receive(2, max_wait=0)
    clock.advance(31)
    with pytest.raises(shardbus.SessionLockLost):
        r.receive(1, max_wait=0)
    with pytest.raises(shardbus.SessionLockLost):
        r.complete(msgs[0])
    with cns.session_receiver("q", "s") as again:
        redelivered = again.receive(3, max_wait=0)
        assert [m.body for m in redelivered] == [b"0", b"1", b"2"]  # still in order
        assert [m.delivery_count for m in redelivered] == [2, 2, 1]
        again.complete(*redelivered)


def test_renewing_the_session_lock_keeps_its_messages(cns, clock):
    cns.create_queue("q", requires_session=True, lock_duration=timedelta(seconds=30))
    cns.send("q", Message(b"x", session_id="s"))
    r = cns.session_receiver("q", "s")
    (m,) = r.receive(1, max_wait=0)
    clock.advance(20)
    until = r.renew_session_lock()
    assert until == int(clock() * 1000) + 30_000
    clock.advance(20)
    r.complete(m)
    cns.send("q", Message(b"y", session_id="s"))
    (n,) = r.receive(1, max_wait=0)
    with pytest.raises(shardbus.InvalidOperation, match="session lock"):
        r.partition.renew_lock(r.slot, n.lock_token)  # a session message's lock is the session's
    r.close()


def test_session_state_survives_restart(open_ns):
    ns = open_ns()
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    with ns.session_receiver("q", "s") as r:
        assert r.get_state() is None
        r.set_state(b"checkpoint-7")
    ns.close()
    ns = open_ns()
    with ns.session_receiver("q", "s") as r:
        assert r.get_state() == b"checkpoint-7"
        r.set_state(None)
        assert r.get_state() is None
    assert "s" not in ns.list_sessions("q")


def test_list_sessions_with_messages_or_state(ns):
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    ns.send("q", [Message(b"1", session_id="a")])
    ns.send("q", [Message(b"2", session_id="b")])
    with ns.session_receiver("q", "c") as r:
        r.set_state("only state")
    assert ns.list_sessions("q") == ["a", "b", "c"]


def test_peek_within_a_session(ns):
    ns.create_queue("q", requires_session=True)
    for i in range(3):
        ns.send("q", [Message(f"a{i}", session_id="a"), Message(f"b{i}", session_id="b")])
    with ns.session_receiver("q", "b") as r:
        assert [m.body for m in r.peek(10)] == [b"b0", b"b1", b"b2"]


def test_deferred_messages_inside_a_session(ns):
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    ns.send("q", [Message(b"first", session_id="s"), Message(b"second", session_id="s")])
    with ns.session_receiver("q", "s") as r:
        first, second = r.receive(2, max_wait=0)
        r.defer(first)
        r.complete(second)
        (d,) = r.receive_deferred([first.sequence_number])
        assert d.body == b"first"
        r.complete(d)
    with ns.session_receiver("q", "other") as r, pytest.raises(shardbus.MessageNotFound):
        r.receive_deferred([first.sequence_number])


def test_closing_gives_unsettled_messages_back_without_a_delivery(ns):
    ns.create_queue("q", requires_session=True)
    ns.send("q", Message(b"x", session_id="s"))
    with ns.session_receiver("q", "s") as r:
        r.receive(1, max_wait=0)
    with ns.session_receiver("q", "s") as r:
        (m,) = r.receive(1, max_wait=0)
        assert m.delivery_count == 1
        r.complete(m)


def test_receive_and_delete_session(ns):
    ns.create_queue("q", requires_session=True, enable_partitioning=True)
    ns.send("q", [Message(f"{i}", session_id="s") for i in range(3)])
    with ns.session_receiver("q", "s", mode="receive_and_delete") as r:
        assert [m.body for m in r.receive(5, max_wait=0)] == [b"0", b"1", b"2"]
    assert ns.get_runtime_properties("q").active_message_count == 0


def test_session_receivers_need_a_session_entity_and_vice_versa(ns):
    ns.create_queue("plain")
    with pytest.raises(shardbus.InvalidOperation, match="does not require sessions"):
        ns.session_receiver("plain", "s")
    ns.create_topic("t")
    ns.create_subscription("t", "sessions", requires_session=True)
    ns.send("t", Message(b"x", session_id="s1"))
    with ns.session_receiver("t/Subscriptions/sessions", max_wait=1) as r:
        assert r.session_id == "s1"
        (m,) = r.receive(1, max_wait=0)
        r.complete(m)
