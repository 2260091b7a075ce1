"""The threads stores share, each started on first use: importing starts no thread, so ``shardbus serve`` can fork
its workers while it has none (cluster/supervisor.py).

Held in memory: the commit pool's queue of batches (one task per store at most, store/committer.py) and the
``LINGERS`` timer's heap of deadlines (one per lingering store at most), so both are bounded by the open stores.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class LazyPool:
    def __init__(self, workers: int, thread_name_prefix: str) -> None:
        self._workers = workers
        self._prefix = thread_name_prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._prefix)
            return self._pool


class Deadlines:
    """One thread that calls each callback given to ``at`` once its monotonic deadline has passed, in deadline
    order. A store's lingering writes wait for company here (store/committer.py), not on a sleeping commit thread:
    while sixteen stores linger, the commit pool stays free for the writes someone waits for, so a linger can be
    long enough for a stream of settlements to share a few transactions. Callbacks must be short and must not
    raise: they hand work to the commit pool, or write one unsynced batch of lingering writes (no fsync: about
    0.1 ms of a settlement commit, store/committer.py), which spares a pool thread's wake-up per settlement
    commit. Started on first use, and again in a forked child, which has no thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties keep their order; callbacks are never compared
        self._pid = 0  # the process whose thread serves the heap (0: none started)

    def at(self, deadline: float, callback: Callable[[], None]) -> None:
        with self._cond:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
            heap = self._heap
            heapq.heappush(heap, (deadline, next(self._order), callback))
            if heap[0][2] is callback:  # the earliest now: the thread sleeps until a later one, or for ever
                self._cond.notify()

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while True:
                    if heap:
                        remaining = heap[0][0] - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    else:
                        self._cond.wait()
                due = []
                now = time.monotonic()
                while heap and heap[0][0] <= now:
                    due.append(heapq.heappop(heap)[2])
            for callback in due:
                try:
                    callback()
                except Exception:  # a bug in one must not stop every later store's linger from ending
                    log.exception("a lingering write's deadline failed")


COMMITS = LazyPool(8, "shardbus-commit")  # group commits (store/committer.py); SQLite lets go of the GIL as it writes
LINGERS = Deadlines("shardbus-linger")  # the ends of lingering writes' waits for company (store/committer.py)
# Background SQLite checkpoints (store/sqlite.py), one at a time: each fsyncs a database file, and every store's
# commits wait behind the fsyncs on the same disk.
CHECKPOINTS = LazyPool(1, "shardbus-checkpoint")
