"""A worker for tests: ``shardbus worker`` that also answers ``faults`` requests (a fault plan for one of its
partitions, see ``faults.py``) and ``race_tick`` / ``race_tick_done`` (a threaded ``tick_all`` that overlaps a
partition's ``start``, below). Run as a script (``faults.FAULTY_WORKER``), with the worker's arguments."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: ``support`` as in the tests

from shardbus.cluster import worker
from support.faults import install

RACE_TIMEOUT = 10.0  # a bound on each wait below, so a broken race fails its test instead of hanging the worker
RACE_REPLY_LEAD = 0.3  # how long the held tick waits after the start for the start's reply to go out first


def _faults(conn: worker.WorkerConnection, key: str, changes: dict[str, Any]) -> None:
    install(conn.host.get(key), **changes)


class _TickRace:
    """The order of d839450's race, made certain: the next ``tick_all`` that runs in a thread while partition
    ``key`` is down takes its health snapshot, and only then does the partition's ``start`` (held until that) run;
    the tick returns once the start is done and its reply has had time to go out. A worker that answers the tick
    with that snapshot marks the partition down at the front end after its start said it is up."""

    def __init__(self, conn: worker.WorkerConnection, key: str) -> None:
        self.host = conn.host
        self.broker = conn.host.get(key)
        self.armed = True
        self.done = False
        self.snapshot_taken = threading.Event()
        self._lock = threading.Lock()
        self._tick, self._start = self.host.tick, self.broker.start
        self.host.tick = self.tick  # type: ignore[method-assign]
        self.broker.start = self.start  # type: ignore[method-assign]

    def _take(self) -> bool:
        with self._lock:
            taken, self.armed = self.armed and not self.broker.healthy, self.armed and self.broker.healthy
            return taken

    def tick(self, clocks: dict[str, float]) -> Any:
        if not self._take():
            return self._tick(clocks)
        try:
            snapshot = self._tick(clocks)  # the partition is down: this snapshot says so
            self.snapshot_taken.set()
            deadline = time.monotonic() + RACE_TIMEOUT
            while not self.broker.healthy and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(RACE_REPLY_LEAD)
            return snapshot
        finally:
            self.host.tick = self._tick  # type: ignore[method-assign]
            self.done = True

    def start(self) -> None:
        self.snapshot_taken.wait(RACE_TIMEOUT)
        self.broker.start = self._start  # type: ignore[method-assign]
        self._start()


_races: dict[str, _TickRace] = {}


def _race_tick(conn: worker.WorkerConnection, key: str) -> None:
    _races[key] = _TickRace(conn, key)


def _race_tick_done(conn: worker.WorkerConnection, key: str) -> bool:
    return _races[key].done


if __name__ == "__main__":
    sys.exit(worker.main(handlers={"faults": _faults, "race_tick": _race_tick, "race_tick_done": _race_tick_done}))
