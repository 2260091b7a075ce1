"""A worker for tests: ``shardbus worker`` that also answers ``faults`` requests (a fault plan for one of its
partitions, see ``faults.py``). Run as a script (``faults.FAULTY_WORKER``), with the worker's arguments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder: ``support`` as in the tests

from shardbus.cluster import worker
from support.faults import install


def _faults(conn: worker.WorkerConnection, key: str, changes: dict[str, Any]) -> None:
    install(conn.host.get(key), **changes)


if __name__ == "__main__":
    sys.exit(worker.main(handlers={"faults": _faults}))
