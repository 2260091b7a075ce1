"""The thread pools stores share, each started on first use: importing starts no thread, so ``shardbus serve``
can fork its workers while it has none (cluster/supervisor.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


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


COMMITS = LazyPool(8, "shardbus-commit")  # group commits (store/committer.py); SQLite lets go of the GIL as it writes
# Background SQLite checkpoints (store/sqlite.py), one at a time: each fsyncs a database file, and every store's
# commits wait behind the fsyncs on the same disk.
CHECKPOINTS = LazyPool(1, "shardbus-checkpoint")
