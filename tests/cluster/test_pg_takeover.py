"""Workers in cluster mode over PostgreSQL (``shardbus worker --metadata DSN``), a front end placing partitions
from the metadata store (``Broker(metadata=DSN)``), and takeover: a worker SIGKILLed under traffic loses its
partitions to the survivor once their leases expire, and nothing acknowledged is lost (official SDK, real
processes, a real PostgreSQL server).

PostgreSQL comes from ``SHARDBUS_TEST_POSTGRES_DSN`` or a throwaway cluster (tests/pg_server.py); each test gets a
database of its own. Without a server the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusServerBusyError

import shardbus
from pg_server import ServerUnavailable, scratch_database
from pg_server import start as start_pg
from pg_server import stop as stop_pg
from serve_process import ServeProcess
from shardbus.model.errors import PartitionUnavailable
from shardbus.model.routing import partition_for_key
from shardbus.server import Broker

pytestmark = pytest.mark.timeout(120)

CLUSTER_KEY = "test-cluster-key"
LEASE_TTL = 2.0
READY_TIMEOUT = 30.0


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"{reason} (CI is set, so the cluster tests over PostgreSQL must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    dsn = os.environ.get("SHARDBUS_TEST_POSTGRES_DSN")
    if dsn:
        yield dsn
        return
    directory = tempfile.mkdtemp(prefix="shardbus-pg-")  # not under /tmp/pytest-of-*: the server runs as postgres
    try:
        dsn = start_pg(directory)
    except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
        stop_pg(directory)
        unavailable(f"no PostgreSQL: SHARDBUS_TEST_POSTGRES_DSN is unset and no throwaway cluster started ({exc})")
    try:
        yield dsn
    finally:
        stop_pg(directory)


@pytest.fixture
def db(pg_server: str) -> Iterator[str]:
    try:
        scratch = scratch_database(pg_server)
        dsn = scratch.__enter__()
    except psycopg.Error as exc:
        unavailable(f"PostgreSQL is unreachable: {exc}")
    try:
        yield dsn
    finally:
        scratch.__exit__(None, None, None)


class WorkerProc:
    """``python -m shardbus.cluster.worker`` in cluster mode, optionally inside a network namespace."""

    def __init__(self, name: str, dsn: str, listen: str = "127.0.0.1:0", netns: str | None = None) -> None:
        self.name = name
        command = [sys.executable, "-m", "shardbus.cluster.worker", "--listen", listen, "--metadata", dsn]
        command += ["--name", name, "--lease-ttl", str(LEASE_TTL)]
        if netns is not None:
            command = ["ip", "netns", "exec", netns, *command]
        env = dict(os.environ, SHARDBUS_CLUSTER_KEY=CLUSTER_KEY)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT)
        if not line or not line[0].startswith("READY "):
            self.process.kill()
            raise RuntimeError(f"worker {name} did not start (said {line!r})")
        self.address = line[0].split()[1]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def wait_until(check, timeout: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def key_on(worker: str, placement: dict[str, str], entity_id: int) -> str:
    """A partition key whose partition the worker serves now."""
    for i in range(10_000):
        key = f"k{i}"
        if placement.get(f"sbemulatorns/entities/{entity_id}/p{partition_for_key(key, 16):02d}.db") == worker:
            return key
    raise AssertionError(f"no partition key maps to worker {worker}")


def run_takeover(broker: Broker, victim: WorkerProc, survivor: WorkerProc) -> None:
    """Traffic through the SDK, ``victim`` SIGKILLed, its partitions taken over by ``survivor``; nothing
    acknowledged missing, nothing completed back, no duplicates."""
    ns = broker.namespace
    cluster = broker.cluster
    ns.create_queue("orders", enable_partitioning=True)
    entity_id = ns._queue("orders").entity_id
    placement = cluster.placement()
    assert len(placement) == 16 and set(placement.values()) == {victim.name, survivor.name}, placement
    victims = sorted(k for k, w in placement.items() if w == victim.name)
    dead_key = key_on(victim.name, placement, entity_id)
    acknowledged: set[str] = set()
    completed: set[str] = set()
    with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client:
        with client.get_queue_sender("orders") as sender:
            for n in range(0, 200, 10):  # keyless batches land on every partition
                ids = [f"before-{n + i}" for i in range(10)]
                sender.send_messages([ServiceBusMessage(b"x" * 100, message_id=i) for i in ids])
                acknowledged.update(ids)
            sender.send_messages(ServiceBusMessage(b"k", partition_key=dead_key, message_id="dead-key-before"))
            acknowledged.add("dead-key-before")
            with client.get_queue_receiver("orders") as receiver:
                got = receiver.receive_messages(max_message_count=30, max_wait_time=5)
                assert got
                for m in got:
                    receiver.complete_message(m)
                    completed.add(str(m.message_id))

            victim.kill()
            killed_at = time.monotonic()
            wait_until(lambda: ns.availability("orders") == "Limited", what="the entity to report Limited")
            # keyless sends fail over to the survivor's partitions; a key on the dead worker is ServerBusy
            for n in range(0, 50, 10):
                ids = [f"during-{n + i}" for i in range(10)]
                sender.send_messages([ServiceBusMessage(b"y", message_id=i) for i in ids])
                acknowledged.update(ids)
            with pytest.raises(ServiceBusServerBusyError):
                sender.send_messages(ServiceBusMessage(b"k", partition_key=dead_key, message_id="dead-key-refused"))

            # once the leases expire the survivor takes the partitions over from their PostgreSQL stores
            wait_until(lambda: ns.availability("orders") == "Available", what="the takeover")
            print(f"takeover: available {time.monotonic() - killed_at:.2f} s after the kill (lease {LEASE_TTL} s)")
            after = cluster.placement()
            assert {after[k] for k in victims} == {survivor.name}, after
            assert set(after.values()) == {survivor.name}
            sender.send_messages(ServiceBusMessage(b"k", partition_key=dead_key, message_id="dead-key-after"))
            acknowledged.add("dead-key-after")

        remaining: list[str] = []
        with client.get_queue_receiver("orders", max_wait_time=3) as receiver:
            while batch := receiver.receive_messages(max_message_count=100, max_wait_time=3):
                for m in batch:
                    remaining.append(str(m.message_id))
                    receiver.complete_message(m)
    assert completed.isdisjoint(remaining)  # nothing completed came back
    assert set(remaining) | completed == acknowledged  # nothing acknowledged is missing
    assert len(remaining) == len(set(remaining))  # no batch was in flight at the kill: no duplicates
    assert "dead-key-before" in remaining or "dead-key-before" in completed


def test_a_killed_workers_partitions_are_taken_over_from_postgres(db, tmp_path):
    workers = [WorkerProc("alpha", db), WorkerProc("beta", db)]
    # the front end signs in to its workers with its own key: the cluster key they were started with
    broker = Broker(data_dir=tmp_path / "data", port=0, key=CLUSTER_KEY, metadata=db).start()
    try:
        run_takeover(broker, workers[0], workers[1])
    finally:
        broker.stop()
        for w in workers:
            w.stop()


def test_a_partition_is_served_by_one_worker_at_a_time(db, tmp_path):
    """The lease refuses a second worker while the first holds it, and a fenced store refuses writes."""
    from shardbus.cluster.metadata import ClusterMetadata, WorkerMembership
    from shardbus.store.base import StoreError
    from shardbus.store.postgres import PostgresStore

    metadata = ClusterMetadata(db)
    try:
        one = WorkerMembership(metadata, "one", "127.0.0.1:1", 30, lambda key: None)
        two = WorkerMembership(metadata, "two", "127.0.0.1:2", 30, lambda key: None)
        one.acquire("ns/entities/1/p00.db")
        with pytest.raises(PartitionUnavailable, match="served by worker one"):
            two.acquire("ns/entities/1/p00.db")
        store = PostgresStore(db, "sb_fence_test", lease=("ns/entities/1/p00.db", "two"))
        try:
            with pytest.raises(StoreError, match="not held by two"):
                store.apply([("meta", "x", 1)])
        finally:
            store.close()
        owned = PostgresStore(db, "sb_fence_test", lease=("ns/entities/1/p00.db", "one"))
        try:
            owned.apply([("meta", "x", 1)])
            assert owned.load().meta["x"] == 1
        finally:
            owned.close()
        assert metadata.placement() == {"ns/entities/1/p00.db": "one"}
    finally:
        metadata.close()


def test_a_restarted_front_end_finds_its_partitions_and_delete_drops_their_stores(db, tmp_path):
    workers = [WorkerProc("alpha", db), WorkerProc("beta", db)]
    try:
        with Broker(data_dir=tmp_path / "data", port=0, key=CLUSTER_KEY, metadata=db) as broker:
            broker.namespace.create_queue("q", enable_partitioning=True)
            with ServiceBusClient.from_connection_string(broker.connection_string) as client:
                with client.get_queue_sender("q") as sender:
                    sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(40)])
            before = broker.cluster.placement()
        # closing the front end closed its partitions: their workers gave the leases up
        with psycopg.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM shardbus.leases WHERE expires_at > now()").fetchone()[0] == 0
        with Broker(data_dir=tmp_path / "data", port=0, key=CLUSTER_KEY, metadata=db) as broker:
            assert broker.cluster.placement() == before  # rendezvous placement: the same workers again
            with ServiceBusClient.from_connection_string(broker.connection_string) as client:
                with client.get_queue_receiver("q", max_wait_time=3) as receiver:
                    got = set()
                    while batch := receiver.receive_messages(max_message_count=40, max_wait_time=3):
                        for m in batch:
                            got.add(str(m.message_id))
                            receiver.complete_message(m)
            assert got == {f"m{i}" for i in range(40)}
            broker.namespace.delete_queue("q")
        with psycopg.connect(db) as conn:
            schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'sb\\_%'").fetchall()
            assert schemas == []
            assert conn.execute("SELECT count(*) FROM shardbus.leases").fetchone()[0] == 0
    finally:
        for w in workers:
            w.stop()


def test_a_worker_that_loses_its_leases_stops_those_partitions_and_they_are_placed_again(db, tmp_path):
    """As if the worker had stalled past its lease (or lost the database for that long): it fences itself,
    its store refuses writes meanwhile, and the front end opens the partitions again."""
    workers = [WorkerProc("alpha", db), WorkerProc("beta", db)]
    try:
        with Broker(data_dir=tmp_path / "data", port=0, key=CLUSTER_KEY, metadata=db) as broker:
            ns = broker.namespace
            ns.create_queue("q", enable_partitioning=True)
            ns.send("q", [shardbus.Message(b"x", message_id=f"m{i}") for i in range(32)])
            with psycopg.connect(db, autocommit=True) as conn:
                expired = conn.execute(
                    "UPDATE shardbus.leases SET expires_at = now() - interval '1 second' WHERE owner = 'alpha' "
                    "RETURNING partition_key"
                ).fetchall()
            assert expired
            # alpha cannot renew them, so it stops them (an expired lease is never renewed, only taken again); the
            # front end sees them unavailable and opens them again, which takes fresh leases
            expired_keys = [key for (key,) in expired]

            def leased_again() -> bool:
                with psycopg.connect(db) as conn:
                    live = conn.execute(
                        "SELECT count(*) FROM shardbus.leases WHERE partition_key = ANY(%s) AND expires_at > now()",
                        (expired_keys,),
                    ).fetchone()[0]
                return live == len(expired_keys)

            wait_until(leased_again, what="the partitions to be placed again")
            wait_until(lambda: ns.availability("q") == "Available", what="the partitions to be available")
            assert set(broker.cluster.placement()) == {
                f"sbemulatorns/entities/{ns._queue('q').entity_id}/p{p:02d}.db" for p in range(16)
            }
            ns.send("q", shardbus.Message(b"y", message_id="after"))
            got = set()
            with ns.receiver("q") as receiver:
                while batch := receiver.receive(max_count=50, max_wait=1):
                    for m in batch:
                        got.add(m.message_id)
                        receiver.complete(m)
            assert got == {f"m{i}" for i in range(32)} | {"after"}
    finally:
        for w in workers:
            w.stop()


def test_two_front_end_processes_place_partitions_from_the_metadata_store(db, tmp_path):
    """``shardbus serve --metadata DSN --frontends 2``: two front-end processes on one port, both over the workers
    registered in the metadata store; whichever front end a client lands on, it reaches every partition."""
    import json
    import urllib.request

    from azure.servicebus.management import ServiceBusAdministrationClient

    from shardbus.cluster.metadata import ClusterMetadata

    workers = [WorkerProc("alpha", db), WorkerProc("beta", db)]
    data = tmp_path / "data"
    args = ["--port", "0", "--data-dir", str(data), "--metadata", db, "--frontends", "2", "--key", CLUSTER_KEY]
    serve = ServeProcess(args, tmp_path / "serve.log", ready_prefix="health:")
    try:
        serve.wait_ready(60)
        connection_string, port = serve.connection_string, serve.port
        pids = set()
        for _ in range(200):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
                pids.add(json.load(response)["pid"])
            if len(pids) == 2:
                break
        assert len(pids) == 2, "both front ends serve the port"

        with ServiceBusAdministrationClient.from_connection_string(
            connection_string, connection_verify=str(data / "tls" / "ca.pem"), retry_total=0
        ) as admin:
            admin.create_queue("orders", enable_partitioning=True)
        sent = [f"m{i}" for i in range(60)]
        for n in range(0, len(sent), 10):  # a client each: new connections land on both front ends
            with (
                ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client,
                client.get_queue_sender("orders") as sender,
            ):
                sender.send_messages([ServiceBusMessage(b"x", message_id=m) for m in sent[n : n + 10]])
        metadata = ClusterMetadata(db)
        try:
            placed = {k: w for k, w in metadata.placement().items() if k.startswith("sbemulatorns/entities/")}
        finally:
            metadata.close()
        assert len(placed) == 16 and set(placed.values()) == {"alpha", "beta"}, placed
        got: list[str] = []
        for _ in range(4):  # receivers on either front end get every message, each once
            with (
                ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client,
                client.get_queue_receiver("orders", max_wait_time=3) as receiver,
            ):
                while batch := receiver.receive_messages(max_message_count=50, max_wait_time=3):
                    for m in batch:
                        got.append(str(m.message_id))
                        receiver.complete_message(m)
            if len(got) >= len(sent):
                break
        assert sorted(got) == sorted(sent)
        assert serve.stop(timeout=30) == 0
    finally:
        serve.kill()
        for w in workers:
            w.stop()
