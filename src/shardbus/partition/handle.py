"""The partition interface, written once: the table of operations every partition answers, wherever it runs.

``PartitionHandle`` below *is* the table: one stub per operation, its argument and result types in its
signature, and its row of the table in its ``@operation`` mark:

    kind      QUERY        answers at once with a value (a remote call waits for its worker's reply)
              WRITE        returns the ``Future`` of its store write, done when the write is durable
              QUERY_WRITE  returns ``(value, Future | None)``: a value now, a store write behind it
              LIFECYCLE    loads or flushes the store (a worker runs it on a thread of its own)
              LOCAL        never crosses the wire (each kind of partition does it its own way)
    reads     it returns messages: a remote partition with sends in doubt refuses it (``cluster/remote.py``)
    compact   batching hint: arguments that travel as one compact wire value (``"items"``: an enqueue's messages
              as records; ``"tokens"``: lock tokens, 16 bytes each; see ``cluster/wire.py``)
    result    the type a result that crossed the wire is turned back into (MessagePack has lists only)

From it: ``PartitionBroker`` (``broker.py``) is the in-process implementation, called directly; the worker
(``cluster/worker.py``) serves every operation that is not LOCAL by name; ``cluster/remote.py`` derives every
method of ``RemotePartition`` it does not write by hand (those with behaviour of their own: health, in-doubt
sends, remembered slots). Adding an operation is one stub here and one method on the broker. ``entity/`` and the
namespace type their partitions as ``PartitionHandle``, so they never depend on ``broker.py``.

``OPERATIONS`` is the table as data (``Operation`` rows, by name), built once at import; nothing else is kept.
"""

from __future__ import annotations

import _thread
import enum
import inspect
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures._base import PENDING
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..model.entities import RuntimeProperties
from ..model.message import Message, SubQueue
from .values import PartitionConfig, Settle, SlotSettings, SlotStats

Items = list[tuple[str | None, list[tuple[int, Message]]]]  # an enqueue's: (dedup id, [(slot, copy), ...])


class Kind(enum.Enum):
    QUERY = "query"
    WRITE = "write"
    QUERY_WRITE = "query+write"
    LIFECYCLE = "lifecycle"
    LOCAL = "local"


QUERY, WRITE, QUERY_WRITE, LIFECYCLE, LOCAL = Kind


@dataclass(frozen=True, slots=True)
class Operation:
    """One row of the table (see the module's docstring)."""

    name: str
    kind: Kind
    signature: inspect.Signature
    reads: bool = False
    compact: tuple[tuple[str, str], ...] = ()  # (argument, wire encoding)
    result: type | None = None


_F = TypeVar("_F", bound=Callable[..., Any])


def operation(
    kind: Kind, *, reads: bool = False, compact: dict[str, str] | None = None, result: type | None = None
) -> Callable[[_F], _F]:
    """Marks a stub of ``PartitionHandle`` as an operation: its row of the table."""

    def mark(stub: _F) -> _F:
        stub.__partition_operation__ = (kind, reads, tuple((compact or {}).items()), result)  # type: ignore[attr-defined]
        return stub

    return mark


class _Condition(_thread.RLock):
    """What a ``Future`` uses of its ``threading.Condition`` (``with``, ``wait``, ``notify_all``), on the C lock
    itself: a front end makes a future per request to a worker (two per settlement), and ``Condition()`` is Python
    code that builds a lock and binds five of its methods, about a fifth of a future's life (made, a callback
    added, completed, read) with nobody waiting, as nearly always (bench/hop_micro.py). Waiters are kept only
    while someone waits (a synchronous call: ``RemotePartition._wait``)."""

    __slots__ = ("_waiters",)

    def wait(self, timeout: float | None = None) -> bool:
        """As ``Condition.wait``: called holding the lock; released while waiting, held again on return."""
        waiter = _thread.allocate_lock()
        waiter.acquire()
        try:
            self._waiters.append(waiter)
        except AttributeError:
            self._waiters = [waiter]
        saved = self._release_save()  # type: ignore[attr-defined]
        got = False
        try:
            got = waiter.acquire(True, -1 if timeout is None else timeout)
            return got
        finally:
            self._acquire_restore(saved)  # type: ignore[attr-defined]
            if not got:
                try:
                    self._waiters.remove(waiter)
                except ValueError:  # notified just as the wait timed out
                    pass

    def notify_all(self) -> None:
        """As ``Condition.notify_all``: called holding the lock."""
        try:
            waiters = self._waiters
        except AttributeError:  # nobody ever waited
            return
        self._waiters = []
        for waiter in waiters:
            waiter.release()


class RemoteVerdict(Future):
    """The future of a write on a partition elsewhere. A local partition refuses a settlement (a lost lock, say)
    by raising at once and its future only waits for the disk; a remote one can only say either through its
    reply, so whoever echoes an outcome to a client waits for its ``verdict`` first. The verdict may come before
    the write is durable (a settlement's write lingers for company, as in one process: ``cluster/remote.py``), so
    ``verdict`` is a future of its own then, done once the outcome is applied or refused; the future itself is done
    when the write is durable, as a local partition's is. A ``Future`` in every way, made cheaper (``_Condition``).
    """

    def __init__(self) -> None:  # ``Future.__init__`` with a ``_Condition``
        self._condition = _Condition()  # type: ignore[assignment]
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[Future], object]] = []

    @property
    def verdict(self) -> Future:
        """Done with the outcome: applied (None) or refused (the error). The future itself unless said apart."""
        return self


def hurry(future: Future) -> None:
    """A caller waits for a partition write's ``future`` through a callback: a write that lingers for company (a
    local ``LingeringWrite``, a worker's ``RemoteSettlement``) stops waiting; any other is written at once anyway."""
    hurry = getattr(future, "hurry", None)
    if hurry is not None:
        hurry()


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """What it takes to run one partition anywhere: its settings and where its store lives.

    ``store`` is where an embedded broker keeps the partition's store; a cluster serves it from the same path
    relative to its data directory (which also names the partition cluster-wide). ``precheck`` raises when the
    partition may not start (a store the namespace's fault controls blocked).
    """

    entity_id: int
    config: PartitionConfig
    store: Path
    clock: Callable[[], float]
    precheck: Callable[[], None]


class PartitionHandle(Protocol):
    id: int
    config: PartitionConfig
    listeners: list[Callable[[int], None]]  # called with a slot that gained receivable messages
    # ``submit_lock_messages`` answers before it returns (in this process); a remote partition answers later
    answers_at_once: bool

    @property
    def healthy(self) -> bool: ...
    @property
    def failure(self) -> str | None: ...

    # --- life cycle ------------------------------------------------------------------------------------------
    @operation(LIFECYCLE)
    def start(self) -> None: ...
    @operation(LIFECYCLE)
    def stop(self, reason: str = "the partition broker is stopped") -> None: ...
    @operation(LIFECYCLE)
    def delete(self) -> None: ...
    @operation(LIFECYCLE)
    def close(self) -> None: ...
    @operation(LOCAL)  # a cluster client ticks each worker's partitions at once (``tick_all``)
    def tick(self) -> None: ...

    # --- slots -----------------------------------------------------------------------------------------------
    @operation(QUERY)
    def configure_slot(self, slot: int, settings: SlotSettings) -> None: ...
    @operation(WRITE)
    def create_slot(self, slot: int, settings: SlotSettings) -> Future: ...
    @operation(WRITE)
    def drop_slot(self, slot: int) -> Future: ...

    # --- sending ---------------------------------------------------------------------------------------------
    @operation(WRITE, compact={"items": "items"})
    def enqueue(self, items: Items, batch_id: str | None = None) -> Future: ...
    @operation(WRITE)
    def revoke_batches(self, batch_ids: list[str]) -> Future: ...
    @operation(WRITE)
    def cancel_scheduled(self, local_seqs: list[int]) -> Future: ...
    @operation(WRITE, compact={"items": "items"})
    def transact(self, items: Items, settles: list[tuple[int, Settle]]) -> Future: ...

    # --- receiving and settling ------------------------------------------------------------------------------
    @operation(QUERY, reads=True)
    def lock_messages(self, slot: int, queue: int, max_count: int) -> list[Message]: ...
    # ``lock_messages`` without waiting for the answer (a remote one sends ``lock_messages``); ``lend``: the caller
    # only reads what it gets, so a local partition may hand out its own locked messages instead of copies
    @operation(LOCAL)
    def submit_lock_messages(self, slot: int, queue: int, max_count: int, lend: bool = False) -> Future: ...
    @operation(QUERY)
    def next_due_ms(self, slot: int, queue: int) -> int | None: ...
    @operation(WRITE)
    def settle(self, slot: int, settles: list[Settle]) -> Future: ...
    @operation(WRITE, compact={"tokens": "tokens"})
    def complete(self, slot: int, tokens: list[uuid.UUID]) -> Future: ...
    # ``complete`` of lock tokens given as their ``int`` (``uuid.UUID.int``: all a lock is found by), as a front end
    # reads them from settled deliveries' tags; a remote one sends ``complete`` with them, no UUID made per token
    @operation(LOCAL)
    def complete_keys(self, slot: int, keys: list[int]) -> Future: ...
    @operation(WRITE)
    def abandon(self, slot: int, token: uuid.UUID) -> Future: ...
    @operation(QUERY)
    def release(self, slot: int, token: uuid.UUID) -> None: ...
    @operation(WRITE)
    def defer(self, slot: int, token: uuid.UUID) -> Future: ...
    @operation(WRITE)
    def dead_letter(
        self,
        slot: int,
        token: uuid.UUID,
        reason: str | None,
        description: str | None,
        sub_queue: SubQueue = SubQueue.DEAD_LETTER,
    ) -> Future: ...
    @operation(WRITE)  # settlements a front end echoed but may not be stored (``cluster/remote.py``), again
    def settle_by_sequence(self, settles: list[tuple[int, str, list[int], str | None, str | None, int]]) -> Future: ...
    @operation(QUERY)
    def renew_lock(self, slot: int, token: uuid.UUID) -> int: ...
    @operation(QUERY_WRITE)
    def receive_deferred(
        self, slot: int, queue: int, local_seqs: list[int], lock: bool, session: tuple[str, uuid.UUID] | None = None
    ) -> tuple[list[Message], Future | None]: ...

    # --- sessions --------------------------------------------------------------------------------------------
    @operation(QUERY, result=tuple)
    def accept_session(self, slot: int, session_id: str | None) -> tuple[str, uuid.UUID, int] | None: ...
    @operation(QUERY)
    def lock_session_messages(self, slot: int, session_id: str, token: uuid.UUID, max_count: int) -> list[Message]: ...
    @operation(QUERY)
    def renew_session_lock(self, slot: int, session_id: str, token: uuid.UUID) -> int: ...
    @operation(QUERY)
    def release_session(self, slot: int, session_id: str, token: uuid.UUID) -> None: ...
    @operation(QUERY, result=tuple)
    def session_lock_holder(self, slot: int, session_id: str) -> tuple[uuid.UUID, int] | None: ...
    @operation(QUERY)
    def get_session_state(self, slot: int, session_id: str) -> bytes | None: ...
    @operation(WRITE)
    def set_session_state(self, slot: int, session_id: str, token: uuid.UUID, state: bytes | None) -> Future: ...
    @operation(QUERY)
    def list_sessions(self, slot: int, updated_after_ms: int | None = None) -> list[str]: ...

    # --- browsing, range reads and counts --------------------------------------------------------------------
    @operation(QUERY, reads=True)
    def peek(
        self, slot: int, queue: int, from_local_seq: int, max_count: int, session_id: str | None = None
    ) -> list[Message]: ...
    @operation(QUERY)
    def last_sequence(self) -> int: ...
    @operation(QUERY, result=tuple)
    def range_offsets(self, slot: int, queue: int, count_from: int = 0) -> tuple[int, int, int, int]: ...
    @operation(QUERY)
    def completed_mark(self, slot: int, queue: int) -> int: ...
    @operation(QUERY, reads=True)
    def browse_range(self, slot: int, queue: int, start: int, end: int, max_count: int) -> list[Message]: ...
    @operation(WRITE)
    def complete_below(self, slot: int, queue: int, mark: int) -> Future: ...
    @operation(QUERY)
    def stats(self, slot: int) -> SlotStats: ...
    @operation(QUERY)
    def runtime(self, slot: int) -> RuntimeProperties: ...
    @operation(QUERY)
    def scheduled_count(self) -> int: ...
    @operation(QUERY)
    def size_bytes(self) -> int: ...
    @operation(QUERY)
    def prune_dedup(self) -> None: ...


PartitionFactory = Callable[[PartitionSpec], PartitionHandle]


def _table() -> dict[str, Operation]:
    rows = {}
    for name, stub in vars(PartitionHandle).items():
        mark = getattr(stub, "__partition_operation__", None)
        if mark is not None:
            kind, reads, compact, result = mark
            rows[name] = Operation(name, kind, inspect.signature(stub), reads, compact, result)
    return rows


OPERATIONS: dict[str, Operation] = _table()
