"""A settlement on a worker is answered in two steps over real sockets (``remote.RemoteSettlement``): its verdict
once applied (what a front end echoes to its client, as one process does), and its future once the write is
durable, which lingers for company unless someone waits for it (``result()`` hurries it, as a local
``LingeringWrite`` does). A refused settlement fails both; a dropped connection fails a write not known durable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbus.cluster import wire
from shardbus.cluster.remote import ClusterClient, RemotePartition, RemoteSettlement
from shardbus.cluster.worker import Worker
from shardbus.model.errors import MessageLockLost, PartitionUnavailable
from shardbus.model.message import Message
from shardbus.partition.broker import SETTLE_LINGER
from shardbus.partition.handle import PartitionSpec
from shardbus.partition.values import PartitionConfig, SlotSettings
from shardbus.runtime import new_event_loop

KEY = "the-cluster-key"
STORE = "ns/entities/1/p00.db"


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[tuple[RemotePartition, Worker]]:
    worker = Worker(tmp_path, KEY)
    loop = new_event_loop()
    port: list[int] = []
    ready = threading.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(worker.serve("127.0.0.1", 0, lambda b: (port.append(b), ready.set()))),
        daemon=True,
    )
    thread.start()
    assert ready.wait(10)
    client = ClusterClient(KEY, time.time, tick_interval=1.0)
    link = client.link("w", ("127.0.0.1", port[0]))
    assert client.wait_connected(10)
    (tmp_path / STORE).parent.mkdir(parents=True)
    config = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    p = RemotePartition(link, STORE, PartitionSpec(1, config, tmp_path / STORE, time.time, lambda: None))
    p.configure_slot(0, SlotSettings("q"))
    p.start()
    p.create_slot(0, SlotSettings("q")).result(10)
    try:
        yield p, worker
    finally:
        try:
            p.close()
        finally:
            client.close()
            worker.call_soon(worker._stop_event.set)
            thread.join(10)


def _locked(p: RemotePartition, n: int) -> list[Message]:
    p.enqueue([(None, [(0, Message(b"x", message_id=f"m{i}"))]) for i in range(n)]).result(10)
    got = p.submit_lock_messages(0, 0, n).result(10)
    assert len(got) == n
    return got


def test_the_verdict_comes_before_the_write_which_lingers(partition) -> None:
    p, _ = partition
    got = _locked(p, 5)
    future = p.complete(0, [m.lock_token for m in got])
    assert isinstance(future, RemoteSettlement)
    assert future.verdict.result(5) is None  # applied
    verdict_at = time.monotonic()
    # nobody waits for the write: it lingers for company, then the worker says it is durable
    done = threading.Event()
    future.add_done_callback(lambda f: done.set())
    assert done.wait(5)
    assert future.exception() is None
    assert time.monotonic() - verdict_at <= SETTLE_LINGER + 2.0
    # the messages are gone for good: nothing more to lock
    assert p.submit_lock_messages(0, 0, 10).result(10) == []


def test_waiting_for_the_write_ends_its_linger(partition) -> None:
    p, worker = partition
    for broker in worker.host.partitions.values():  # a linger far longer than the test: only a hurry ends it
        broker.settle_linger = 30.0
    got = _locked(p, 3)
    future = p.complete(0, [m.lock_token for m in got])
    future.verdict.result(5)
    started = time.monotonic()
    assert future.result(10) is None  # result() asks the worker to end the linger
    assert time.monotonic() - started < 5.0


def test_a_refused_settlement_fails_its_verdict_and_its_future(partition) -> None:
    p, _ = partition
    got = _locked(p, 1)
    p.complete(0, [got[0].lock_token]).result(10)
    again = p.complete(0, [got[0].lock_token])  # the lock is gone now
    with pytest.raises(MessageLockLost):
        again.verdict.result(5)
    with pytest.raises(MessageLockLost):
        again.result(5)


def test_a_dropped_connection_fails_a_write_not_known_durable(partition) -> None:
    p, worker = partition
    for broker in worker.host.partitions.values():
        broker.settle_linger = 30.0
    got = _locked(p, 2)
    future = p.complete(0, [m.lock_token for m in got])
    assert future.verdict.result(5) is None
    p.link._abort("the test drops it")
    with pytest.raises(PartitionUnavailable):
        future.result(5)


def test_hurry_through_a_callback_ends_the_linger(partition) -> None:
    """A management request's reply waits for its settlement's write through a callback (``hurry``)."""
    from shardbus.namespace import hurry

    p, worker = partition
    for broker in worker.host.partitions.values():
        broker.settle_linger = 30.0
    got = _locked(p, 2)
    future = p.complete(0, [m.lock_token for m in got])
    written = threading.Event()
    future.add_done_callback(lambda f: written.set())
    hurry(future)
    assert written.wait(5)
    assert future.exception() is None


def test_a_hurry_is_one_way(partition) -> None:
    """``hurry`` gets no reply (wire ``ONE_WAY``): nothing waits for it at the front end, and the write it hurries
    is reported durable all the same."""
    p, worker = partition
    for broker in worker.host.partitions.values():
        broker.settle_linger = 30.0
    got = _locked(p, 2)
    future = p.complete(0, [m.lock_token for m in got])
    future.verdict.result(5)
    replies: list[list] = []
    stream = p.link._stream
    frame = stream.on_frame
    stream.on_frame = lambda f: (replies.append(f), frame(f))  # what the worker sends back from now on
    assert future.result(5) is None  # hurried: durable long before the 30 s linger
    assert p.submit_lock_messages(0, 0, 10).result(10) == []  # a request after it: a hurry's reply would precede
    assert not p.link._pending
    answered = [f for f in replies if f[0] > 0]  # replies, not written frames (-1) or events (0)
    assert len(answered) == 1 and answered[0][4] in (wire.MESSAGES, wire.LOCKED)  # the lock's reply only


def test_a_remote_verdict_is_a_future_in_every_way() -> None:
    """``RemoteVerdict`` (every request's future at a front end) keeps ``Future``'s behaviour on its cheaper
    condition: a blocked ``result`` wakes when another thread completes it, times out otherwise, a second
    completion is refused, callbacks run once, and asyncio can wait for it."""
    import asyncio
    from concurrent.futures import CancelledError, InvalidStateError

    from shardbus.partition.handle import RemoteVerdict

    f = RemoteVerdict()
    with pytest.raises(TimeoutError):
        f.result(0.05)
    threading.Timer(0.05, f.set_result, (7,)).start()
    assert f.result(5) == 7 and f.exception(0) is None and f.done()
    with pytest.raises(InvalidStateError):
        f.set_result(8)
    seen: list[int] = []
    f.add_done_callback(lambda g: seen.append(g.result()))  # done already: at once
    assert seen == [7]

    waiters = [RemoteVerdict() for _ in range(3)]
    results: list[object] = []
    threads = [threading.Thread(target=lambda w=w: results.append(w.exception(5))) for w in waiters for _ in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    for w in waiters:
        w.set_exception(PartitionUnavailable("down"))
    for t in threads:
        t.join(5)
    assert len(results) == 6 and all(isinstance(r, PartitionUnavailable) for r in results)

    c = RemoteVerdict()
    assert c.cancel() and c.cancelled()
    with pytest.raises(CancelledError):
        c.result(0)

    async def wrapped() -> object:
        g = RemoteVerdict()
        threading.Timer(0.05, g.set_result, ("async",)).start()
        return await asyncio.wrap_future(g)

    assert asyncio.run(wrapped()) == "async"
