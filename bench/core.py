"""Core throughput through the Python API against a bare SQLite loop measured in the same run.

The bare loop is our store's ceiling: the same SQLite settings (WAL, synchronous=FULL), 1 KB blobs, 100 rows per
transaction, inserting (for sends) or selecting and deleting (for receives), with no broker logic at all.
Each line ends in ``ratio=<core cost per message / bare cost per message>``; the target is below 3.

    python bench/core.py [--messages N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import shardbus
from shardbus import Message

BATCH = 100
BODY = os.urandom(1024)


def bare_loop(folder: Path, n: int) -> tuple[float, float]:
    """Seconds per message for insert batches, and for select+delete batches."""
    db = sqlite3.connect(folder / "bare.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE m (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    start = time.perf_counter()
    for b in range(n // BATCH):
        db.execute("BEGIN")
        db.executemany("INSERT INTO m VALUES (?, ?)", [(b * BATCH + i, BODY) for i in range(BATCH)])
        db.execute("COMMIT")
    insert = (time.perf_counter() - start) / n
    start = time.perf_counter()
    while True:
        db.execute("BEGIN")
        rows = db.execute("SELECT seq, data FROM m ORDER BY seq LIMIT ?", (BATCH,)).fetchall()
        if not rows:
            db.execute("COMMIT")
            break
        db.executemany("DELETE FROM m WHERE seq=?", [(r[0],) for r in rows])
        db.execute("COMMIT")
    delete = (time.perf_counter() - start) / n
    db.close()
    return insert, delete


def send_all(ns: shardbus.Namespace, n: int, in_flight: int) -> float:
    start = time.perf_counter()
    pending: list[Future] = []
    for _ in range(n // BATCH):
        pending.append(ns.submit_send("q", [Message(BODY) for _ in range(BATCH)]))
        if len(pending) >= in_flight:
            pending.pop(0).result()
    for f in pending:
        f.result()
    return (time.perf_counter() - start) / n


def drain(ns: shardbus.Namespace, n: int, mode: str) -> float:
    start = time.perf_counter()
    got = 0
    with ns.receiver("q", mode=mode) as r:
        while got < n:
            msgs = r.receive(BATCH, max_wait=5)
            if not msgs:
                raise RuntimeError(f"only {got} of {n} messages came back")
            if mode == "peek_lock":
                r.complete(*msgs)
            got += len(msgs)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    n = args.messages - args.messages % BATCH
    folder = Path(tempfile.mkdtemp(prefix="shardbus-bench-"))
    try:
        bare_insert, bare_delete = bare_loop(folder, n)
        print(f"bare-sqlite insert batch={BATCH} {1 / bare_insert:,.0f} msg/s {bare_insert * 1e6:.1f} us/msg")
        print(f"bare-sqlite select+delete batch={BATCH} {1 / bare_delete:,.0f} msg/s {bare_delete * 1e6:.1f} us/msg")
        for partitions in (1, 16):
            for in_flight in (1, 8):
                data = folder / f"ns-{partitions}-{in_flight}"
                with shardbus.Namespace.open(data) as ns:
                    ns.create_queue("q", enable_partitioning=partitions == 16)
                    per = send_all(ns, n, in_flight)
                    print(
                        f"batch-send partitions={partitions} in_flight={in_flight} {1 / per:,.0f} msg/s "
                        f"{per * 1e6:.1f} us/msg ratio={per / bare_insert:.2f}"
                    )
                    if in_flight == 1:
                        per = drain(ns, n, "receive_and_delete")
                        print(
                            f"receive-and-delete partitions={partitions} {1 / per:,.0f} msg/s "
                            f"{per * 1e6:.1f} us/msg ratio={per / bare_delete:.2f}"
                        )
                    else:
                        per = drain(ns, n, "peek_lock")
                        print(
                            f"peek-lock+complete partitions={partitions} {1 / per:,.0f} msg/s "
                            f"{per * 1e6:.1f} us/msg ratio={per / bare_delete:.2f}"
                        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
