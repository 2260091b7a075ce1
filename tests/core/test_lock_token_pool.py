"""Lock tokens come from a pool of OS randomness (one ``os.urandom`` per 1,024 tokens): they stay distinct across
refills, carry their partition, and a forked child does not repeat its parent's tokens."""

from __future__ import annotations

import os

from shardbus.model import routing
from shardbus.model.routing import new_lock_token, new_lock_tokens, partition_of_lock_token


def test_tokens_are_distinct_across_pool_refills() -> None:
    tokens = []
    for i in range(5000):  # several refills, single and batched draws crossing the pool's end
        tokens.append(new_lock_token(i % 7))
        tokens.extend(new_lock_tokens(3, i % 13))
    assert len({t.int for t in tokens}) == len(tokens)


def test_tokens_name_their_partition() -> None:
    assert all(partition_of_lock_token(t) == 42 for t in new_lock_tokens(42, 2000))
    assert partition_of_lock_token(new_lock_token(65535)) == 65535


def test_a_batch_larger_than_the_pool_is_drawn_whole() -> None:
    count = routing._POOL_TOKENS * 2 + 5
    tokens = new_lock_tokens(1, count)
    assert len({t.int for t in tokens}) == count


def test_draws_from_the_os_once_per_pool(monkeypatch) -> None:
    calls = []
    real = os.urandom
    monkeypatch.setattr(routing.os, "urandom", lambda n: calls.append(n) or real(n))
    routing._forget_pool()
    for _ in range(routing._POOL_TOKENS):
        new_lock_token(0)
    assert calls == [routing._TOKEN_BYTES * routing._POOL_TOKENS]


def test_a_forked_child_does_not_repeat_the_parents_tokens() -> None:
    new_lock_token(0)  # the parent's pool is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next tokens' ints to the parent
        try:
            os.write(write, b",".join(str(t.int).encode() for t in new_lock_tokens(0, 50)))
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        child = {int(x) for x in f.read().split(b",")}
    parent = {t.int for t in new_lock_tokens(0, 50)}
    assert len(child) == 50
    assert not child & parent
