"""The cluster's metadata store in PostgreSQL: which workers are alive, and which worker serves which partition.

Two tables in the ``shardbus`` schema, both timed by the database's clock (hosts' clocks need not agree):

- ``shardbus.workers``: the worker registry, one row per worker name with the address front ends reach it at and
  the time its registration expires. A worker registers when it starts, heartbeats every ``ttl / 3``, and
  deregisters when it stops cleanly; one that stops heartbeating is dead once its row expires.
- ``shardbus.leases`` (``store.postgres.PostgresLeases``): placement is the partition leases. A worker serves a
  partition only while it holds that partition's lease; it takes the lease when a front end opens the partition
  there, renews all its leases with its heartbeat, and gives them up when the partition closes. A lease left by a
  dead worker expires after ``ttl``, and only then may another worker take it (and load the partition's store).

``WorkerMembership`` is a worker's side of both: the heartbeat thread, and fencing. A lease the heartbeat could
not renew (it expired, or the database was unreachable for so long that it may have) is lost: the worker stops
that partition at once. The store fence (``PostgresStore(lease=...)``) refuses a lost lease's writes in any case,
so two brokers never both write one store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..model.errors import PartitionUnavailable
from ..store.base import StoreError
from ..store.postgres import LEASE_SCHEMA, PostgresLeases, SharedConnection, _create_ddl, psycopg, sql

log = logging.getLogger("shardbus.cluster")


class ClusterMetadata:
    """The worker registry and the partition placement (leases). Thread-safe; errors are StoreError."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.leases = PostgresLeases(dsn)
        self._db = SharedConnection(dsn, "cluster metadata")
        self._table = f"{sql.Identifier(LEASE_SCHEMA).as_string()}.workers"
        ddl = [
            f"CREATE TABLE IF NOT EXISTS {self._table} (name text PRIMARY KEY, address text NOT NULL, "
            "expires_at timestamptz NOT NULL)"
        ]
        self._run(lambda conn: _create_ddl(conn, ddl))

    def _run(self, action: Callable[[psycopg.Connection], object]) -> object:
        return self._db.run(action)

    # --- the worker registry ---------------------------------------------------------------------------
    def register(self, name: str, address: str, ttl_s: float) -> None:
        """Announce (or re-announce) worker ``name`` at ``address`` (host:port) for ``ttl_s`` seconds."""
        self._run(
            lambda conn: conn.execute(
                f"INSERT INTO {self._table} VALUES (%s, %s, now() + make_interval(secs => %s)) ON CONFLICT (name) "
                "DO UPDATE SET address = EXCLUDED.address, expires_at = EXCLUDED.expires_at",
                (name, address, float(ttl_s)),
            )
        )

    def heartbeat(self, name: str, ttl_s: float) -> bool:
        """Extend the registration; False if it had expired (or was removed): the caller registers again."""
        row = self._run(
            lambda conn: conn.execute(
                f"UPDATE {self._table} SET expires_at = now() + make_interval(secs => %s) "
                "WHERE name = %s AND expires_at > now() RETURNING name",
                (float(ttl_s), name),
            ).fetchone()
        )
        return row is not None

    def deregister(self, name: str) -> None:
        self._run(lambda conn: conn.execute(f"DELETE FROM {self._table} WHERE name = %s", (name,)))

    def live_workers(self) -> dict[str, tuple[str, int]]:
        """Workers whose registration has not expired: name -> (host, port)."""
        rows = self._run(
            lambda conn: conn.execute(f"SELECT name, address FROM {self._table} WHERE expires_at > now()").fetchall()
        )
        workers = {}
        for name, address in rows:  # type: ignore[union-attr]
            host, _, port = address.rpartition(":")
            workers[name] = (host, int(port))
        return workers

    # --- placement -------------------------------------------------------------------------------------
    def placement(self) -> dict[str, str]:
        """Which worker serves which partition now: partition key -> worker name (unexpired leases)."""
        return self.leases.holders()

    def holder(self, partition_key: str) -> str | None:
        return self.leases.holder(partition_key)

    def close(self) -> None:
        self.leases.close()
        self._db.close()


class WorkerMembership:
    """A worker's registration and its partition leases, kept alive by one heartbeat thread.

    ``acquire`` takes a partition's lease (when a front end opens it here); ``release`` gives it up. Every
    ``ttl / 3`` the thread renews the registration and every lease held; ``on_lost(key)`` is called (from that
    thread) for each lease that was not renewed, and for all of them when no renewal has succeeded for
    ``ttl`` minus one interval, measured from the start of the last successful renewal on this host's monotonic
    clock (so the worker stops before the database can consider the lease free).
    """

    def __init__(
        self, metadata: ClusterMetadata, name: str, address: str, ttl_s: float, on_lost: Callable[[str], None]
    ) -> None:
        self.metadata = metadata
        self.name = name
        self.address = address
        self.ttl = ttl_s
        self.interval = ttl_s / 3
        self.on_lost = on_lost
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at = time.monotonic()

    def start(self) -> None:
        self.metadata.register(self.name, self.address, self.ttl)
        self._renewed_at = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="shardbus-heartbeat", daemon=True)
        self._thread.start()

    def acquire(self, key: str) -> None:
        """Take the partition's lease, or raise PartitionUnavailable naming the worker that holds it."""
        if not self.metadata.leases.acquire(key, self.name, self.ttl):
            holder = self.metadata.holder(key) or "another worker"
            raise PartitionUnavailable(
                f"partition {key} is served by worker {holder}; it can move here when that lease expires"
            )
        with self._lock:
            self.held.add(key)

    def release(self, key: str) -> None:
        with self._lock:
            self.held.discard(key)
        try:
            self.metadata.leases.release(key, self.name)
        except StoreError as exc:  # it expires by itself
            log.warning("could not release the lease on %s: %s", key, exc)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        """One round: heartbeat, renew every lease held, fence the ones lost."""
        started = time.monotonic()
        with self._lock:
            held = list(self.held)
        try:
            if not self.metadata.heartbeat(self.name, self.ttl):
                self.metadata.register(self.name, self.address, self.ttl)
            renewed = self.metadata.leases.renew(self.name, held, self.ttl)
        except StoreError as exc:
            if time.monotonic() - self._renewed_at > self.ttl - self.interval:
                log.error("cannot renew partition leases for too long (%s): stopping all partitions", exc)
                self._lose(held)
            else:
                log.warning("cannot renew partition leases (%s); retrying", exc)
            return
        self._renewed_at = started
        self._lose([key for key in held if key not in renewed])

    def _lose(self, keys: list[str]) -> None:
        for key in keys:
            with self._lock:
                if key not in self.held:
                    continue  # released meanwhile
                self.held.discard(key)
            log.error("lost the lease on partition %s: stopping it", key)
            self.on_lost(key)

    def stop(self) -> None:
        """Stop heartbeating and leave the registry (leases are released by closing their partitions)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.metadata.deregister(self.name)
        except StoreError:
            pass  # the registration expires by itself
