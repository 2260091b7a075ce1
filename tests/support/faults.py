"""Fault injection for tests: partitions that fail the ways real ones do, without hooks in production code.

A *fault plan* (``FaultPlan``) says what goes wrong next on one partition: its next store write fails (before or
after it reaches the disk, as a disk error or a commit whose fsync failed), its next writes find the store full,
its next sends are refused as busy, its next range reads fail. ``install`` gives a live in-process
``PartitionBroker`` its plan by wrapping, on that one instance, what the plan touches: the committer's store
(``FaultyStore``, again after every start), ``enqueue``/``transact`` and ``browse_range``. A broker without a plan
is untouched, so the production path is what every other test runs.

Partitions in worker processes get theirs the same way inside the worker: tests start their workers through
``faulty_worker.py`` (``FAULTY_WORKER`` is its command line, for ``LocalCluster(worker_command=...)``), a worker
that also answers a ``faults`` request with a plan, which ``inject`` sends to a ``RemotePartition``. A production
worker refuses that request as an unknown operation.

``Faults(namespace)`` names partitions as the namespace does: ``Faults(ns).fill_store("q", 0, writes=3)``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from shardbus.model.errors import PartitionUnavailable, ServerBusy
from shardbus.partition.broker import PartitionBroker
from shardbus.partition.handle import PartitionHandle
from shardbus.store.base import MessageStore, Op, StoreError, StoreFull

FAULTY_WORKER = [sys.executable, str(Path(__file__).with_name("faulty_worker.py"))]
CALL_TIMEOUT = 30.0


@dataclass
class FaultPlan:
    """What goes wrong next on one partition; each count is used up one fault at a time."""

    fail_write: str | None = None  # the next store write fails: "before" it lands, or "after" (it landed)
    full_writes: int = 0  # the next this many store writes find the store full (nothing written)
    busy_sends: int = 0  # the next this many sends are refused with ServerBusy (the partition stays healthy)
    failing_reads: int = 0  # the next this many range reads (``browse_range``) fail as if it were briefly down
    settle_linger: float | None = None  # how long settlements' writes linger (a worker answers them before)


class FaultyStore:
    """A store whose writes fail as the plan says; everything else is the real store's."""

    def __init__(self, store: MessageStore, plan: FaultPlan) -> None:
        self._store = store
        self._plan = plan

    def apply(self, ops: list[Op], sync: bool = True) -> None:
        plan = self._plan
        if plan.full_writes > 0:
            plan.full_writes -= 1
            raise StoreFull("store is full (injected)")
        when, plan.fail_write = plan.fail_write, None
        if when == "before":
            raise StoreError("injected store failure")
        self._store.apply(ops, sync)
        if when == "after":
            raise StoreError("injected store failure (after the write landed)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def install(broker: PartitionBroker, **changes: Any) -> FaultPlan:
    """Set faults of ``broker``'s plan (``FaultPlan`` fields), wrapping the broker for it the first time."""
    plan: FaultPlan | None = broker.__dict__.get("_fault_plan")
    if plan is None:
        plan = broker._fault_plan = FaultPlan()  # type: ignore[attr-defined]
        _wrap(broker, plan)
    names = {f.name for f in fields(FaultPlan)}
    for name, value in changes.items():
        if name not in names:
            raise TypeError(f"no such fault: {name}")
        setattr(plan, name, value)
    if plan.settle_linger is not None:
        broker.settle_linger = plan.settle_linger
    return plan


def _wrap(broker: PartitionBroker, plan: FaultPlan) -> None:
    where = f"Partition {broker.id} of '{broker.config.path}'"

    def wrap_store() -> None:
        committer = broker._committer
        if committer is not None and not isinstance(committer.store, FaultyStore):
            committer.store = FaultyStore(committer.store, plan)

    start, enqueue, transact, browse_range = broker.start, broker.enqueue, broker.transact, broker.browse_range

    def faulty_start() -> None:  # a (re)start makes a new committer (``_recover`` starts through here too)
        start()
        wrap_store()

    def busy() -> bool:
        if plan.busy_sends > 0 and broker.healthy:
            plan.busy_sends -= 1
            return True
        return False

    def faulty_enqueue(items: Any, batch_id: str | None = None) -> Any:
        if busy():
            raise ServerBusy(f"{where} is busy (injected); retry later.")
        return enqueue(items, batch_id)

    def faulty_transact(items: Any, settles: Any) -> Any:
        if items and busy():
            raise ServerBusy(f"{where} is busy (injected); retry later.")
        return transact(items, settles)

    def faulty_browse_range(slot: int, queue: int, start: int, end: int, max_count: int) -> Any:
        if plan.failing_reads > 0 and broker.healthy:
            plan.failing_reads -= 1
            raise PartitionUnavailable(f"{where} failed a read (injected).")
        return browse_range(slot, queue, start, end, max_count)

    broker.start = faulty_start  # type: ignore[method-assign]
    broker.enqueue = faulty_enqueue  # type: ignore[method-assign]
    broker.transact = faulty_transact  # type: ignore[method-assign]
    broker.browse_range = faulty_browse_range  # type: ignore[method-assign]
    wrap_store()


def inject(partition: PartitionHandle, **changes: Any) -> None:
    """Set faults of a partition's plan, in this process or (a ``RemotePartition``) in its faulty worker."""
    if isinstance(partition, PartitionBroker):
        install(partition, **changes)
        return
    from shardbus.cluster.remote import RemotePartition

    assert isinstance(partition, RemotePartition), f"cannot inject faults into {partition!r}"
    partition.link.call(partition, partition.key, "faults", [changes], partition.clock()).result(CALL_TIMEOUT)


class Faults:
    """Fault injection by entity name and partition id, for a namespace's partitions wherever they run."""

    def __init__(self, namespace: Any) -> None:
        self._ns = namespace

    def _partition(self, entity: str, partition: int) -> PartitionHandle:
        return self._ns._sender_entity(entity).partitions[partition]

    def fail_next_write(self, entity: str, partition: int, after_write: bool = False) -> None:
        """The partition's next store write fails like a disk error, making the partition unavailable;
        ``after_write``: it reaches the disk first (a commit whose outcome is unknown)."""
        inject(self._partition(entity, partition), fail_write="after" if after_write else "before")

    def fill_store(self, entity: str, partition: int, writes: int) -> None:
        """The partition's next ``writes`` store writes find its store full (as SQLITE_FULL: nothing written)."""
        inject(self._partition(entity, partition), full_writes=writes)

    def busy_sends(self, entity: str, partition: int, count: int = 1) -> None:
        """The partition's next ``count`` sends are refused with ServerBusy; it stays healthy."""
        inject(self._partition(entity, partition), busy_sends=count)

    def fail_reads(self, entity: str, partition: int, count: int = 1) -> None:
        """The partition's next ``count`` range reads (``browse_range``) fail as if it were briefly down."""
        inject(self._partition(entity, partition), failing_reads=count)
