"""``Receiver.submit_complete(tokens, partition)``: completes a front end already grouped by partition go to that
partition as they are, with the same outcomes as the regrouping path (all of a group or none, lost locks refused)."""

from __future__ import annotations

import uuid

import pytest

import shardbus
from shardbus import Message
from shardbus.model.routing import partition_of_lock_token


def _by_partition(messages: list[Message]) -> dict[int, list[uuid.UUID]]:
    groups: dict[int, list[uuid.UUID]] = {}
    for m in messages:
        assert m.lock_token is not None
        groups.setdefault(partition_of_lock_token(m.lock_token), []).append(m.lock_token)
    return groups


def test_grouped_completes_settle_their_partitions(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", [Message(f"m{i}") for i in range(8)])  # a keyless batch: one partition
    for i in range(8):
        ns.send("q", Message(f"s{i}"))  # round-robin: several partitions
    r = ns.receiver("q")
    got = r.receive(16, max_wait=1)
    assert len(got) == 16
    groups = _by_partition(got)
    assert len(groups) > 1
    for pid, tokens in groups.items():
        for future in r.submit_complete(tokens, pid):
            future.result()
    assert ns.get_runtime_properties("q").active_message_count == 0
    with pytest.raises(shardbus.MessageLockLost):  # settled already: the whole group is refused
        pid, tokens = next(iter(groups.items()))
        r.submit_complete(tokens, pid)[0].result()


def test_a_partition_the_entity_does_not_have_is_a_lost_lock(ns):
    ns.create_queue("q", enable_partitioning=True)
    ns.send("q", Message(b"x"))
    r = ns.receiver("q")
    (m,) = r.receive(1, max_wait=1)
    with pytest.raises(shardbus.MessageLockLost):
        r.submit_complete([m.lock_token], len(ns.resolve("q")[0].partitions))
    r.complete(m)


@pytest.mark.parametrize("by_keys", [False, True])
def test_completes_by_token_ints_match_completes_by_tokens(ns, by_keys):
    """``submit_complete_keys`` (a front end's completes read from delivery tags as the tokens' ints, no UUIDs)
    gives what ``submit_complete`` of the tokens gives: the group settled, a settled one refused whole, a bad
    partition a lost lock; a session receiver (no keyed path of its own) likewise."""
    ns.create_queue("q", enable_partitioning=True)
    for i in range(8):
        ns.send("q", Message(f"s{i}"))
    r = ns.receiver("q")
    got = r.receive(8, max_wait=1)
    assert len(got) == 8
    groups = _by_partition(got)

    def complete(tokens: list[uuid.UUID], pid: int) -> list:
        return r.submit_complete_keys([t.int for t in tokens], pid) if by_keys else r.submit_complete(tokens, pid)

    first_pid, first_tokens = next(iter(groups.items()))
    for pid, tokens in groups.items():
        for future in complete(tokens, pid):
            future.result()
    assert ns.get_runtime_properties("q").active_message_count == 0
    with pytest.raises(shardbus.MessageLockLost):
        complete(first_tokens, first_pid)[0].result()
    with pytest.raises(shardbus.MessageLockLost):
        complete(first_tokens, len(ns.resolve("q")[0].partitions))

    ns.create_queue("s", requires_session=True)
    ns.send("s", [Message(f"m{i}", session_id="a") for i in range(3)])
    with ns.session_receiver("s", "a") as sr:
        messages = sr.receive(3, max_wait=1)
        tokens = [m.lock_token for m in messages]
        pid = partition_of_lock_token(tokens[0])
        futures = sr.submit_complete_keys([t.int for t in tokens], pid) if by_keys else sr.submit_complete(tokens, pid)
        for future in futures:
            future.result()
    assert ns.get_runtime_properties("s").active_message_count == 0
