"""Group commit: many concurrent operations on one store share one transaction and one fsync.

Callers ``submit`` a list of store operations and get a ``concurrent.futures.Future``. While a batch is being
written, new submissions queue up; when the write finishes, everything queued goes out as the next batch. So a
lone caller pays one commit, and a hundred concurrent callers pay about two. Batches run on a small shared
thread pool (SQLite releases the GIL while it writes and syncs), and at most one batch per store is in flight,
which keeps operations in submission order.

Each submission may carry an ``on_commit`` callback; it runs after the batch is durable and before the futures
resolve, which is how a partition makes sent messages visible only once they are safely stored. What an
``on_commit`` hands to ``after_answers`` runs once every future of its batch has resolved: a partition wakes its
receivers there, so that the senders' answers reach the event loop's queue first (the loop runs them in the order
they came: behind a receiver's delivery of a hundred messages, an acknowledgement waited about 1.5 ms).

A submission may also ``linger``: wait up to that many seconds for company before its batch is written. Writes
nobody waits for (settlements, whose outcome the client already has) use it, so that a stream of one-at-a-time
completes shares a few transactions instead of paying one each. Any submission without it (a send, which is
acknowledged only once stored) ends the wait at once and takes the lingering ones along, in order. A store whose
writes linger holds no thread meanwhile: its drain starts at the deadline (``LINGERS``, one timer thread for all
stores, store/pools.py) or with the first write that must not wait, and a drain that finds only lingering writes
not yet due gives its pool thread back and sets that deadline. So sixteen lingering stores leave the commit pool
free for the sends, and a linger may be long (partition/broker.py's ``SETTLE_LINGER``). At its deadline a batch
of lingering writes alone (unsynced, below) is written on the timer thread itself, not handed to a pool thread:
a settlement commit wakes one thread, not two (``_drain``'s ``inline``). Only for a store whose unsynced write
stays on this host (``LOCAL_WRITES``: SQLite's is a write into the page cache, about 0.1 ms); PostgreSQL's is a
round trip to the server, which would hold every other store's deadline behind it on the one timer thread.
Consecutive lingering submissions without ``on_commit`` also share one future: they are written in the same
batch and so have the same outcome, and a future per settlement (a condition variable made on the event loop,
resolved on the store's thread) was work every complete paid for nothing. A batch of lingering submissions
alone is applied with ``sync=False`` (no fsync: it survives a crash of the process, and the next synced batch
makes it durable); a batch with anything else in it is synced as a whole. The fsync was half of a settlement
commit's CPU (SQLite, 7 deletes: 140 against 72 us) and a third of the store thread's under the SDK's stream of
completes, and a settlement taken back by a power loss means a delivery again, which lingering already accepts.

Lingering is for writes nobody waits for. A lingering submission's future is a ``LingeringWrite``: waiting on it
(``result()``, as the Python API's ``complete()`` does) ends the linger, and so does ``hurry(future)``, for callers
that wait through a callback (a ``$management`` reply). A callback alone (the AMQP endpoint logging a failed
write) lets it linger. A worker's partitions linger alike: a worker answers a settlement once applied and says
later when it is written (cluster/worker.py).

A full store (``StoreFull``: the write ran out of space and nothing of it was stored) is transient, and handled
here so that the partition keeps its state and keeps serving. Submissions marked ``refusable`` (sends: their
callers can be told to retry, and nothing of them is visible yet) fail with ``on_full``'s error. The others
(settlements, whose outcome the partition already applied in memory and answered; slot and session-state
changes) go back to the head of the queue, in order, and are written again after ``FULL_RETRY`` seconds (on the
next ``submit`` or ``retry_due`` after that, which the partition calls from its upkeep tick): nothing is dropped
and nothing is reordered, so once space returns the store catches up with memory. A lingering write's future is
resolved when it is kept (nobody waits for it, and a worker's front end must not wait for space to answer a
settlement); other kept writes' callers wait until it is written. While the committer is
``refusing`` (a full write less than ``FULL_RETRY`` ago), the partition refuses sends before they reach it; the
first send after that is the probe that finds out whether space has returned. Only when more than
``MAX_KEPT_OPS`` operations wait (a long outage under a stream of settlements: memory must stay bounded) or the
store is being closed is a full write treated like any other failure (``on_failure``: the partition becomes
unavailable and reloads what is durable, partition/broker.py); every write queued behind then fails too, so that
nothing written after the lost ones assumes they landed (a counts op would drift from the rows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import stalltrace
from .base import MessageStore, Op, StoreFull
from .pools import COMMITS, LINGERS

log = logging.getLogger(__name__)

FULL_RETRY = 1.0  # seconds between writes to a full store
MAX_KEPT_OPS = 20_000  # operations (about one per settlement, ~150 bytes) kept for a full store at most

Pending = tuple[list[Op], Callable[[], Any] | None, Future, bool]  # ops, on_commit, future, refusable
_DONE: Future = Future()  # what a lingering submission to a full store gets (see ``_keep``)
_DONE.set_result(None)


class LingeringWrite(Future):
    """The future of a lingering submission (see the module docstring): whoever waits for it ends the linger."""

    def __init__(self, committer: GroupCommitter) -> None:
        super().__init__()
        self._committer = committer

    def hurry(self) -> None:
        """Someone waits for this write: stop waiting for company."""
        if not self.done():
            self._committer.hurry()

    def result(self, timeout: float | None = None) -> Any:
        self.hurry()
        return super().result(timeout)


def hurry(future: Future) -> None:
    """A caller waits for ``future`` through a callback: if it is a lingering write, it stops waiting for company
    (any other future is written without lingering already)."""
    if isinstance(future, LingeringWrite):
        future.hurry()


class GroupCommitter:
    def __init__(
        self,
        store: MessageStore,
        on_failure: Callable[[BaseException], BaseException],
        executor: ThreadPoolExecutor | None = None,
        on_full: Callable[[BaseException], BaseException] | None = None,
        on_resumed: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self._on_failure = on_failure  # turns a store failure into the error callers see
        self._on_full = on_full or on_failure  # the error refused submissions get from a full store
        self._on_resumed = on_resumed  # called once a write succeeds after the store was full
        self._executor = executor or COMMITS.get()
        self._local = getattr(store, "LOCAL_WRITES", False)  # an unsynced batch may be written on the timer thread
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        self._running = False  # a drain is queued on the pool or writing
        self._timed = False  # a deadline in ``LINGERS`` will look at this committer (see ``_linger``)
        self._urgent = False  # something pending must not wait (a plain submission, or wait_idle)
        self._sync = False  # something pending is a plain submission: the batch must be synced
        self._write_by = 0.0  # monotonic deadline of the oldest pending lingering submission
        self._shared: Future | None = None  # the last pending submission's future, if later ones may join it
        self._idle = threading.Event()
        self._idle.set()
        self._retry_at: float | None = None  # the store was full: no write before this (monotonic)
        self._closing = False  # wait_idle was called: a full store is a failure like any other
        self._was_full = False  # a write found the store full, and none has succeeded since
        # Batches stored so far (counted before their callbacks run): a reader outside its owner's lock that
        # saw the same count before and after knows no write changed the store under it (the partition's upkeep).
        self.stored = 0
        self._queued_at = -1.0  # (``stalltrace.SENDS``) when the running drain was handed to the pool
        self._after: list[Callable[[], Any]] = []  # (the drain's thread) ``after_answers`` of the batch answered now

    @property
    def refusing(self) -> bool:
        """The store was found full less than ``FULL_RETRY`` seconds ago: sends should be refused at once."""
        retry_at = self._retry_at
        return retry_at is not None and time.monotonic() < retry_at

    def submit(
        self,
        ops: list[Op],
        on_commit: Callable[[], Any] | None = None,
        linger: float = 0.0,
        refusable: bool = False,
    ) -> Future:
        """Queue ``ops`` for the next batch; the future resolves (to ``on_commit``'s result) once it is durable.
        ``refusable``: if the store is full, fail instead of waiting for space (see the module docstring)."""
        with self._lock:
            shareable = linger > 0 and on_commit is None
            if shareable and self._retry_at is not None:  # the store is full: joins what waits (see ``_keep``)
                self._pending.append((list(ops), None, Future(), False))
                self._shared = None
                self._idle.clear()
                return _DONE
            if shareable and self._shared is not None:
                self._pending[-1][0].extend(ops)  # our own copy (below): the caller's list is never changed
                return self._shared
            future: Future
            if linger <= 0:
                future = Future()
                self._urgent = self._sync = True
            else:
                future = LingeringWrite(self)
                if not self._pending or self._urgent:
                    self._write_by = time.monotonic() + linger
            self._pending.append((list(ops) if shareable else ops, on_commit, future, refusable))
            self._shared = future if shareable else None
            self._idle.clear()
            if self._running:
                return future  # the drain takes it (and ends its linger at the deadline, or now if urgent)
            if not self._urgent:
                self._linger()
                return future
            if not self._start_if_due():
                return future
        self._start_drain()
        return future

    def _start_drain(self) -> None:
        """Hand a drain to the commit pool (the caller set ``_running``)."""
        if stalltrace.SENDS:
            self._queued_at = time.monotonic()
        self._executor.submit(self._drain)

    def _linger(self) -> None:
        """(Lock held, not running, pending not urgent.) Start a drain at ``_write_by``: a deadline in
        ``LINGERS`` (one at a time per committer), not a pool thread sleeping, so a lingering store holds no thread."""
        if not self._timed:
            self._timed = True
            LINGERS.at(self._write_by, self._linger_ended)

    def _linger_ended(self) -> None:
        """(``LINGERS``' thread.) The deadline passed: drain unless a drain runs already or the linger moved on.
        A batch of lingering writes alone is written here, unsynced (``_drain``'s ``inline``); one to be synced
        goes to the commit pool."""
        with self._lock:
            self._timed = False
            if self._running or not self._pending:
                return
            if not self._urgent and self._write_by > time.monotonic():  # the batch it was set for went early
                self._linger()
                return
            if not self._start_if_due():
                return
            inline = not self._sync and self._local
        if inline:
            self._drain(inline=True)
        else:
            self._start_drain()

    def _start_if_due(self) -> bool:
        """(Lock held, not running.) Whether to start a drain now: not while a full store's retry is not due."""
        if self._retry_at is not None:
            if time.monotonic() < self._retry_at and not self._closing:
                return False
            self._retry_at = None
            self._urgent = True  # what was kept waited long enough: no lingering on top
        self._running = True
        return True

    def retry_due(self) -> None:
        """Write what waits for a full store, if its retry is due (the partition's upkeep calls this)."""
        with self._lock:
            if self._running or self._retry_at is None:
                return
            if not self._pending:
                if time.monotonic() >= self._retry_at:
                    self._retry_at = None  # nothing kept: the next send is the probe
                return
            if not self._start_if_due():
                return
        self._start_drain()

    def _drain(self, inline: bool = False) -> None:
        """Write what is pending, batch after batch, until nothing is (or only lingering writes not yet due).
        ``inline``: on ``LINGERS``' thread, at a deadline (``_linger_ended``): one unsynced batch of lingering
        writes, written there and not handed to a pool thread (a wake-up of another thread and a task less per
        settlement commit, and the deadlines of several stores due together take one wake-up); whatever is to
        be written after it, or a sync that joined it meanwhile, goes to the pool, so the timer thread never
        waits for an fsync."""
        queued = -1.0 if inline else self._queued_at
        took = False  # (``inline``) a batch was taken here
        while True:
            with self._lock:
                batch = self._pending
                if not batch:
                    self._running = False
                    self._idle.set()
                    return
                if not self._urgent and self._write_by > time.monotonic():  # lingering: give the thread back
                    self._running = False
                    self._linger()
                    return
                if inline and (took or self._sync):  # a second batch, or one to be synced: the pool's
                    break
                took = True
                sync = self._sync
                self._pending = []
                self._shared = None
                self._urgent = self._sync = False
            ops: list[Op] = []
            for item in batch:
                ops.extend(item[0])
            started = time.monotonic() if stalltrace.ON else 0.0
            cpu = time.thread_time() if stalltrace.SENDS else 0.0
            try:
                if ops:
                    self.store.apply(ops, sync)
                    self.stored += 1
                if stalltrace.SENDS:
                    stalltrace.set_commit_times(queued, started, time.monotonic(), time.thread_time() - cpu)
                    queued = -1.0  # the next batch follows this one on this thread
            except StoreFull as exc:
                if self._keep(batch, exc):
                    return
                continue
            except BaseException as exc:  # every caller in the batch learns of the failure
                error = self._on_failure(exc)
                for _, _, future, _ in batch:
                    future.set_exception(error)
                continue
            if self._on_resumed is not None and self._was_full:
                self._was_full = False
                self._on_resumed()
            for _, on_commit, future, _ in batch:
                try:
                    result = on_commit() if on_commit is not None else None
                except BaseException as exc:  # a bug in a callback must not strand the other callers
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            if self._after:
                self._run_after()
            if stalltrace.ON:
                stalltrace.record(
                    "batch", started, time.monotonic() - started, f"{getattr(self.store, 'path', '')} ops={len(ops)}"
                )
        self._start_drain()  # (``inline`` only) still running: a pool thread takes over

    def after_answers(self, fn: Callable[[], Any]) -> None:
        """(An ``on_commit`` callback, on the drain's thread.) Run ``fn`` once every future of this batch has
        resolved (see the module docstring)."""
        self._after.append(fn)

    def _run_after(self) -> None:
        after, self._after = self._after, []
        for fn in after:
            try:
                fn()
            except Exception:  # a bug in one must not keep the others from running, nor stop the drain
                log.exception("a store's after-commit callback failed")

    def _keep(self, batch: list[Pending], exc: StoreFull) -> bool:
        """A batch found the store full (nothing of it was written): refuse its sends, put the rest back at the
        head of the queue for ``FULL_RETRY`` seconds. True when the drain stops here (it resumes on the next
        due ``submit`` or ``retry_due``); False when the kept writes fail instead (too many, or closing)."""
        refused_error: BaseException | None = None
        kept: list[Pending] = []
        for item in batch:
            if item[3]:
                if refused_error is None:
                    refused_error = self._on_full(exc)
                item[2].set_exception(refused_error)
            elif isinstance(item[2], LingeringWrite) and item[1] is None:
                # Nobody needs to wait for a lingering write (a settlement, applied in memory and answered): it
                # is done as far as its caller goes, and written when space returns, in order. Until then a
                # crash takes it back, as it may take back any unsynced lingering write: a delivery again.
                item[2].set_result(None)
                kept.append((item[0], None, Future(), False))
            else:
                kept.append(item)
        with self._lock:
            self._was_full = True
            waiting = sum(len(item[0]) for item in kept) + sum(len(item[0]) for item in self._pending)
            if not self._closing and waiting <= MAX_KEPT_OPS:
                if kept:
                    self._pending[:0] = kept
                    self._sync = True  # kept plain submissions want their sync; lingering ones do not mind it
                if not self._pending:
                    self._shared = None
                self._retry_at = time.monotonic() + FULL_RETRY
                self._running = False
                if not self._pending:
                    self._idle.set()
                return True
            # Giving up: what queued behind the kept writes fails with them. Written without them, it would land
            # on a store that lacks what it builds on (a counts op assumes the writes before it landed), and the
            # partition's reload (``on_failure``) must find the store as the last successful write left it.
            behind, self._pending, self._shared = self._pending, [], None
            self._urgent = self._sync = False
        failed = kept + behind
        if failed:
            error = self._on_failure(exc)
            for _, _, future, _ in failed:
                if not future.done():
                    future.set_exception(error)
        return False

    def hurry(self) -> None:
        """Write what is pending now instead of lingering (a batch of lingering writes alone stays unsynced)."""
        with self._lock:
            if not self._pending or self._urgent:
                return  # nothing waits, or it is on its way already
            self._urgent = True
            if self._running or not self._start_if_due():
                return
        self._start_drain()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written (used when closing): lingering ends now, and
        writes waiting for a full store are tried once more now (and fail if it still is)."""
        with self._lock:
            self._closing = True
            start = not self._running and bool(self._pending) and self._start_if_due()
        if start:
            self._start_drain()
        self.hurry()
        return self._idle.wait(timeout)
