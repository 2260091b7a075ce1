"""Sends whose outcome is unknown: a write that failed but reached the disk all the same (the injected
"after the write" store failure, as a commit whose fsync fails, or a worker killed after committing) is taken
back before its partition is healthy again, so a keyless batch that failed over exists exactly once, and a keyed
one the client saw fail is not there either. In process, and in worker processes (real ones, over AMQP)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import shardbus
from shardbus.cluster.supervisor import LocalCluster
from shardbus.model.routing import partition_for_key
from shardbus.namespace import Namespace
from shardbus.partition.broker import (
    BATCH_ID_PREFIX,
    BATCH_ID_RETENTION_MS,
    PartitionBroker,
    PartitionConfig,
    SlotSettings,
)
from shardbus.store.base import MessageStore
from shardbus.store.postgres import drop_partition_schema, partition_schema, postgres_store_factory
from shardbus.store.sqlite import SqliteStore
from support.faults import FAULTY_WORKER, inject

pytestmark = pytest.mark.timeout(120)


def _wait_until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _drain(ns: Namespace, path: str) -> list[str]:
    receiver = ns.receiver(path)
    ids: list[str] = []
    while batch := receiver.receive(100, max_wait=1):
        ids += [str(m.message_id) for m in batch]
        receiver.complete(*batch)
    return ids


def _keyless_over_a_failing_partition(ns: Namespace, pid: int) -> list[str]:
    """One keyless send per partition: round-robin brings one to ``pid``, whose write lands and then 'fails';
    the send fails over to the next partition and succeeds."""
    ns.create_queue("q", enable_partitioning=True)
    inject(ns._queue("q").partitions[pid], fail_write="after")
    sent = [f"m{i}" for i in range(16)]
    for message_id in sent:
        ns.send("q", shardbus.Message(b"x", message_id=message_id))
    assert not ns._queue("q").partitions[pid].healthy
    return sent


def test_in_process_a_landed_failed_keyless_write_is_gone_after_restore(tmp_path):
    with Namespace.open(tmp_path / "data") as ns:
        sent = _keyless_over_a_failing_partition(ns, 3)
        ns.faults.restore_partition("q", 3)
        assert ns.availability("q") == "Available"
        assert sorted(_drain(ns, "q")) == sorted(sent)


def test_in_process_a_keyed_send_that_failed_is_not_stored_and_its_id_is_not_remembered(tmp_path):
    """With duplicate detection the failed send's MessageId must be forgotten too, or the client's retry would
    be dropped as a duplicate of a message that is gone."""
    with Namespace.open(tmp_path / "data") as ns:
        ns.create_queue("d", enable_partitioning=True, requires_duplicate_detection=True)
        pid = partition_for_key("order-1", 16)  # duplicate detection routes by MessageId
        inject(ns._queue("d").partitions[pid], fail_write="after")
        with pytest.raises(shardbus.ServerBusy):
            ns.send("d", shardbus.Message(b"first try", message_id="order-1"))
        ns.faults.restore_partition("d", pid)
        assert _drain(ns, "d") == []  # the landed write was taken back
        ns.send("d", shardbus.Message(b"retry", message_id="order-1"))
        got = ns.receiver("d").receive(10, max_wait=1)
        assert [bytes(m.body) for m in got] == [b"retry"]


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """A throwaway PostgreSQL server (tests/pg_server.py), or skip."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import pg_server

    directory = tempfile.mkdtemp(prefix="shardbus-pg-")
    try:
        dsn = pg_server.start(directory)
    except (pg_server.ServerUnavailable, subprocess.TimeoutExpired) as exc:
        pg_server.stop(directory)
        pytest.skip(f"no PostgreSQL: {exc}")
    try:
        yield dsn
    finally:
        pg_server.stop(directory)


@pytest.fixture(params=["sqlite", "postgres"])
def store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[Callable[[], MessageStore]]:
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "p.db")
        return
    dsn = request.getfixturevalue("pg_dsn")
    namespace = f"test-{uuid.uuid4().hex}"
    yield postgres_store_factory(dsn, namespace=namespace)(1, "q", 0)
    drop_partition_schema(dsn, partition_schema(1, "q", 0, namespace=namespace))


def test_batch_records_survive_a_restart_and_revoke_is_idempotent(store_factory):
    """The broker-level contract a front end relies on: ``enqueue(..., batch_id)`` stores a record with the
    batch, ``revoke_batches`` removes what is there (after a restart too) and ignores what is not; on both
    stores (the record is a duplicate-detection entry, which both keep)."""
    config = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, store_factory, time.time)
    broker.configure_slot(0, SlotSettings("q"))
    broker.start()
    try:
        broker.create_slot(0, SlotSettings("q")).result()
        kept, revoked = uuid.uuid4().hex, uuid.uuid4().hex
        broker.enqueue([(None, [(0, shardbus.Message(b"a", message_id="a"))])], kept).result()
        broker.enqueue([(None, [(0, shardbus.Message(b"b", message_id="b"))])] * 3, revoked).result()
        broker.stop()
        broker.start()  # a new process would load the same
        assert broker.revoke_batches([revoked, "unknown"]).result() == 3
        assert broker.revoke_batches([revoked]).result() == 0
        broker.stop()
        broker.start()
        assert [m.message_id for m in broker.peek(0, 0, 1, 10)] == ["a"]
        assert list(broker._batches) == [kept]
    finally:
        broker.stop()
    store = store_factory()
    try:
        assert [k for k in store.load().dedup if k.startswith(BATCH_ID_PREFIX)] == [f"{BATCH_ID_PREFIX}{kept}:1:2"]
    finally:
        store.close()


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path / "data", 2, "k", worker_command=FAULTY_WORKER).start() as c:
        yield c


def _worker_of(cluster: LocalCluster, ns: Namespace, pid: int) -> int:
    return (ns._queue("q").entity_id + pid) % len(cluster.workers)


def test_worker_killed_after_a_landed_failed_write_revokes_it_when_it_returns(cluster, tmp_path):
    """The worker forgets everything; the front end's in-doubt batch ids take the copy back."""
    ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
    try:
        sent = _keyless_over_a_failing_partition(ns, 5)
        p = ns._queue("q").partitions[5]
        assert p.in_doubt  # the front end knows which batch is in doubt
        cluster.kill(_worker_of(cluster, ns, 5))
        _wait_until(lambda: ns.availability("q") == "Available")
        assert not p.in_doubt
        assert sorted(_drain(ns, "q")) == sorted(sent)
    finally:
        ns.close()


def test_restoring_a_failed_remote_partition_takes_its_landed_write_back(cluster, tmp_path):
    ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
    try:
        sent = _keyless_over_a_failing_partition(ns, 2)
        ns.faults.restore_partition("q", 2)
        assert ns.availability("q") == "Available"
        assert sorted(_drain(ns, "q")) == sorted(sent)
    finally:
        ns.close()


class _GatedStore(SqliteStore):
    """A real SQLite store whose writes wait for a gate: a commit still on its way to the disk."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()

    def apply(self, ops, sync=True) -> None:
        self.gate.wait(10)
        super().apply(ops, sync)


def _broker(path: Path, clock=time.time, store=SqliteStore) -> PartitionBroker:
    config = PartitionConfig("q", 0, max_size_bytes=1 << 30, max_message_size_bytes=1 << 20)
    broker = PartitionBroker(config, lambda: store(path), clock)
    broker.configure_slot(0, SlotSettings("q"))
    broker.start()
    broker.create_slot(0, SlotSettings("q")).result()
    return broker


def test_a_batch_revoked_before_its_commit_never_becomes_visible(tmp_path):
    """The connection to a live worker dropped while its write was queued: the front end's revoke arrives first."""
    broker = _broker(tmp_path / "p.db", store=_GatedStore)
    try:
        store = broker._store
        store.gate.clear()
        batch = uuid.uuid4().hex
        sent = broker.enqueue([(None, [(0, shardbus.Message(b"late", message_id="late"))])], batch)
        revoked = broker.revoke_batches([batch])
        store.gate.set()
        sent.result(5)
        assert revoked.result(5) == 1
        assert broker.peek(0, 0, 1, 10) == []
        assert broker.lock_messages(0, 0, 10) == []
        broker.stop()
        broker.start()
        assert broker.peek(0, 0, 1, 10) == []
    finally:
        broker.stop()


def test_batch_records_are_pruned_after_their_retention_of_running_time(tmp_path):
    now = [1_000_000.0]
    broker = _broker(tmp_path / "p.db", clock=lambda: now[0])
    try:
        broker.enqueue([(None, [(0, shardbus.Message(b"a", message_id="a"))])], uuid.uuid4().hex).result()
        broker.prune_dedup()
        assert len(broker._batches) == 1
        now[0] += BATCH_ID_RETENTION_MS / 1000 + 1
        broker.prune_dedup()
        broker.stop()
        assert not [k for k in SqliteStore(tmp_path / "p.db").load().dedup if k.startswith(BATCH_ID_PREFIX)]
        broker.start()
        assert [m.message_id for m in broker.peek(0, 0, 1, 10)] == ["a"]  # the message itself stays
    finally:
        broker.stop()


def test_batch_ids_are_unique_in_a_process_and_a_forked_child_draws_its_own() -> None:
    """A remote send's batch id (what ``revoke_in_doubt`` names) is a per-process random prefix and a counter: a
    forked front end (``serve --frontends``) must not reuse its parent's, or revoking its own sends in doubt could
    take back another front end's on the same worker."""
    import os

    from shardbus.cluster.remote import _batch_ids

    ids = [_batch_ids.next() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    prefix = ids[0].split("-")[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out without running the parent's atexit hooks
        os.write(write, _batch_ids.next().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child.split("-")[0] != prefix and child not in ids
    assert _batch_ids.next().split("-")[0] == prefix
