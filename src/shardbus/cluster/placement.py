"""A front end over workers on any host: placement of partitions from the cluster's metadata store, and takeover.

``MetadataCluster`` is what ``shardbus serve --metadata DSN`` runs. Workers (``shardbus worker --metadata DSN``)
register in the metadata store (``metadata.py``); the front end links to every live one. A partition is placed on
the worker that holds its lease if that worker is live, else on a live worker chosen by rendezvous hashing of the
partition key (deterministic, so front ends agree and few partitions move when workers come and go); the chosen
worker takes the lease when the partition is opened there, and the lease table is the recorded placement.

Takeover, one round every ``PLACEMENT_INTERVAL`` on the ``shardbus-placement`` thread (a round reads the
registry, and the leases only when some partition is unavailable). A partition the front end started that
is unavailable and not being moved is re-placed when

- its worker's link is down (the worker died, or is unreachable) and no live worker holds its lease: once the
  dead worker's lease expires, the partition moves to the rendezvous choice among the live workers;
- its worker is connected but no longer holds the lease (it fenced the partition): it is opened again where the
  rules above say, possibly on the same worker;
- its lease is held by another live worker: it moves there.

Moving is ``RemotePartition.move_to``: the new worker opens it (taking the lease and loading the store from
PostgreSQL), configures its slots and starts it, the same steps as after a reconnect; until then it is unavailable
(keyless sends go to other partitions, keyed ones get ServerBusy, the entity reports Limited).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from ..model.errors import PartitionUnavailable, ServerBusy
from ..partition.handle import PartitionHandle, PartitionSpec
from ..store.base import StoreError
from .metadata import ClusterMetadata
from .remote import ClusterClient, RemotePartition, WorkerLink

log = logging.getLogger("shardbus.cluster")

# Independent of the workers' lease TTL (which the front end does not know): a takeover waits for the lease to
# expire, then at most one interval.
PLACEMENT_INTERVAL = 0.25
UNPLACED = "(no live worker)"  # the link of partitions created while no worker was live: it never connects


def rendezvous(key: str, workers: list[str]) -> str:
    """The worker with the highest hash of (worker, key): stable while that worker lives, whoever asks."""
    return max(workers, key=lambda w: hashlib.sha256(f"{w}\0{key}".encode()).digest())


class MetadataCluster:
    """The front end's partition factory over the workers registered in a metadata store."""

    def __init__(
        self,
        dsn: str,
        data_dir: Path | str,
        key: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.data_dir = Path(data_dir)
        try:
            self.metadata = ClusterMetadata(dsn)
        except StoreError as exc:
            raise ServerBusy(f"the cluster's metadata store is unreachable: {exc}") from exc
        self.client = ClusterClient(key, clock)
        self.interval = PLACEMENT_INTERVAL
        self.partitions: dict[str, RemotePartition] = {}
        self.live: dict[str, tuple[str, int]] = {}
        self._moving: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, wait_for_workers: float = 30.0) -> MetadataCluster:
        """Link to the live workers (waiting up to ``wait_for_workers`` seconds for the first), then keep
        placement current on a thread of its own."""
        deadline = time.monotonic() + wait_for_workers
        while True:
            self._refresh_workers()
            if self.live or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if self.live and not self.client.wait_connected(wait_for_workers):
            log.warning("not every live worker is reachable yet: %s", list(self.live))
        self._thread = threading.Thread(target=self._run, name="shardbus-placement", daemon=True)
        self._thread.start()
        return self

    # --- the namespace's partition factory -----------------------------------------------------------------
    def partition(self, spec: PartitionSpec) -> PartitionHandle:
        try:
            key = spec.store.resolve().relative_to(self.data_dir.resolve()).as_posix()
        except ValueError:
            raise ValueError(f"{spec.store} is outside the front end's data directory {self.data_dir}") from None
        try:
            holder = self.metadata.holder(key)
        except StoreError as exc:
            raise PartitionUnavailable(f"the cluster's metadata store is unreachable: {exc}") from exc
        # A holder that is not live keeps the partition until its lease expires: bind it to that (dead) link,
        # which leaves it unavailable and lets the placement round move it then.
        name = holder or (rendezvous(key, sorted(self.live)) if self.live else UNPLACED)
        partition = RemotePartition(self._link(name), key, spec)
        with self._lock:
            self.partitions[key] = partition
        return partition

    def placement(self) -> dict[str, str]:
        """Where this front end's partitions are served now, by the metadata store: key -> worker name."""
        placed = self.metadata.placement()
        return {key: placed[key] for key in self.partitions if key in placed}

    # --- placement rounds ------------------------------------------------------------------------------
    def _link(self, name: str) -> WorkerLink:
        return self.client.link(name, self.live.get(name))

    def _refresh_workers(self) -> None:
        self.live = self.metadata.live_workers()
        for name, address in self.live.items():
            self.client.link(name, address)
        for name, link in list(self.client.links.items()):
            if name not in self.live and not link.connected:
                link.address = None  # gone: stop reconnecting until it registers again

    def _run(self) -> None:
        while not self._closing.wait(self.interval):
            try:
                self.place_once()
            except StoreError as exc:
                log.warning("placement round failed (metadata store): %s", exc)
            except Exception:
                log.exception("placement round failed")

    def place_once(self) -> None:
        """One round: re-place every started partition that is unavailable (see the module docstring)."""
        self._refresh_workers()
        with self._lock:
            for key, p in list(self.partitions.items()):
                if p.link.partitions.get(key) is not p:  # closed or deleted
                    del self.partitions[key]
            candidates = [p for p in self.partitions.values() if p.wanted and not p.healthy]
            for key, f in list(self._moving.items()):
                if f.done():
                    del self._moving[key]
        if not candidates:
            return
        placed = self.metadata.placement()
        live = sorted(self.live)
        for p in candidates:
            if p.key in self._moving:
                continue
            holder = placed.get(p.key)
            if holder is not None and holder == p.link.name and p.link.connected:
                continue  # its worker holds the lease: it is starting, or reports its own failure
            if holder is not None:
                target = holder if holder in self.live else None  # a dead holder: wait for its lease to expire
            else:
                target = rendezvous(p.key, live) if live else None
            if target is None:
                continue
            link = self._link(target)
            if not link.connected:
                continue
            log.info("partition %s moves from worker %s to worker %s", p.key, p.link.name, target)
            with self._lock:
                self._moving[p.key] = p.move_to(link)

    def __enter__(self) -> MetadataCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop placing and disconnect (the workers keep running; closed partitions gave their leases up)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(5)
        self.client.close()
        self.metadata.close()
