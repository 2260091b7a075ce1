"""What a synced SQLite commit costs on this disk, by how its WAL is written: the cause of the soak's send p99 tail.

Each writer thread owns one SQLite file with the store's settings (``store/sqlite.py``: 8 KB pages, WAL,
``synchronous=FULL``) and commits what a send commits there (a 1 KB row, its sub-queue's counts, the meta row: three
WAL frames, one fdatasync), open loop at ``--rate`` commits a second in all, spread over the files. The WAL is
written one of these ways:

    grow      a new WAL, appended to at every commit (each fdatasync also writes the file's new size and block
              map, not only its data)
    inplace   a WAL that was as long before and was checkpointed whole: SQLite starts it again from its beginning,
              so every commit overwrites blocks the file already has (an fdatasync writes data only)
    prealloc  a new WAL whose file was extended with zeros first (``extend_wal``): overwrites in place from the
              first commit
    normal    ``synchronous=NORMAL``, a new WAL: no fsync at a commit. A reference only: it would break
              "acknowledged = durable", so sends never use it
    store     the broker's own ``SqliteStore.apply`` (this tree's): a send's batch (a 1 KB row, ``next_seq``, its
              counts; synced), each followed by an unsynced settlement batch (that row deleted, the counts), as a
              soak's store alternates them; only the sends are timed
    store-base  the same through a base tree's ``SqliteStore`` (``--base DIR``: DIR/src), in the same process and
              rounds, so that both meet the same machine (with ``--busy``: how often each waits for the GIL)

Beside them the soak's probe runs (``bench/soak.py``'s ``Probe``: a 64-byte row into a bare SQLite file, default
settings, WAL, FULL, ten times a second), whose commit is what the soak calls the machine's own. Rounds interleave
the modes and file counts, so the machine's drift falls on all of them; each line gives the median over rounds of
the commit p50/p90/p99 (with their range) and the probe's p99 in the same runs.

With ``--busy 3,4`` a thread beside them does Python work in bursts (3 ms on average, then 4 ms of rest), as a
broker's event loop does: a commit's thread waits for the GIL after each statement that let it go (``--switch``
sets how long the holder keeps it at most, ``sys.setswitchinterval``).

With ``--disk-probe 0,50`` every mode and file count runs also with bench/disk_probe.py beside it at each of those
rates (syncs a second; 0: none), in the same rounds: what the soak's disk probe costs the commits it measures.

    python bench/sqlite_probe.py [--rounds 3] [--seconds 10] [--files 1,16] [--rate 70] [--modes grow,inplace,...]
        [--busy MS,MS] [--switch MS] [--base DIR] [--disk-probe RATES]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from shardbus.store.sqlite import PAGE_SIZE

ROW = b"m" * 1024
WAL_FRAME = 24 + PAGE_SIZE  # a WAL frame: its header and one page
_ZERO_BLOCK = bytes(64 << 10)


def extend_wal(path: Path, size: int) -> None:
    """Extend a WAL file to ``size`` bytes with written zeros (not ``fallocate``: ext4 would allocate unwritten
    blocks, and the first write into each would change metadata again), synced. SQLite reads a WAL's frames up to
    the first whose salt and checksum do not match its header, so the zeros are never taken for frames."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        end = os.fstat(fd).st_size
        while end < size:
            end += os.pwrite(fd, _ZERO_BLOCK[: size - end], end)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _open(path: Path, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA page_size={PAGE_SIZE}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA wal_autocheckpoint=0")  # the measured commits never checkpoint: only their own write counts
    db.execute("CREATE TABLE IF NOT EXISTS m (seq INTEGER PRIMARY KEY, data BLOB)")
    db.execute("CREATE TABLE IF NOT EXISTS counts (q INTEGER PRIMARY KEY, n INTEGER)")
    db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER)")
    return db


def _commit(db: sqlite3.Connection, seq: int) -> None:
    db.execute("BEGIN")
    db.execute("INSERT INTO m VALUES (?, ?)", (seq, ROW))
    db.execute("INSERT OR REPLACE INTO counts VALUES (0, ?)", (seq,))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('next', ?)", (seq + 1,))
    db.execute("COMMIT")


def _prepare(path: Path, mode: str, commits: int) -> sqlite3.Connection:
    db = _open(path, "NORMAL" if mode == "normal" else "FULL")
    if mode == "inplace":  # as many commits as will be measured, then a whole checkpoint: the WAL starts again
        db.execute("PRAGMA synchronous=OFF")  # quick to set up; one sync of everything at the end
        for seq in range(commits + 8):
            _commit(db, seq)
        db.execute("DELETE FROM m")  # back to the same table shape, so the measured commits write what grow's do
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")  # syncs the WAL, copies it all: the next write starts it again
    elif mode == "prealloc":
        extend_wal(Path(f"{path}-wal"), (commits + 8) * 4 * WAL_FRAME)
    return db


_STORE_CLASSES: dict[str, type] = {}


def _load_base(base: Path) -> None:
    """A base tree's ``shardbus`` package, as ``shardbus_base`` (its relative imports stay inside it)."""
    import importlib
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "shardbus_base", base / "src/shardbus/__init__.py", submodule_search_locations=[str(base / "src/shardbus")]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["shardbus_base"] = module
    spec.loader.exec_module(module)
    _STORE_CLASSES["store-base"] = importlib.import_module("shardbus_base.store.sqlite").SqliteStore


class _StoreWriter:
    """A ``SqliteStore`` written as a soak's partition writes it: a send (timed), then its settlement (not)."""

    def __init__(self, path: Path, mode: str) -> None:
        from shardbus.store.base import Row
        from shardbus.store.sqlite import SqliteStore

        self.row = Row
        self.store = (_STORE_CLASSES.get(mode) or SqliteStore)(path)
        self.store.apply([("create_slot", 0)])

    def commit(self, seq: int) -> None:
        self.store.apply([("put", 0, [self.row(seq, 0, 0, 0, None, ROW, None)]), ("meta", "next_seq", seq + 1),
                          ("counts", 0, 0, 1, len(ROW))])  # fmt: skip

    def settle(self, seq: int) -> None:
        self.store.apply([("delete", 0, [seq]), ("counts", 0, 0, 0, 0)], sync=False)

    def close(self) -> None:
        self.store.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(
    root: Path,
    mode: str,
    files: int,
    seconds: float,
    rate: float,
    busy: tuple[float, float] | None = None,
    disk_rate: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Commit times (ms) of ``files`` writers at ``rate`` commits a second in all, and the probe's, for ``seconds``;
    with ``busy`` (mean seconds of work, of rest), a thread of Python work beside them, as a broker's event loop."""
    per_file = rate / files
    commits = int(seconds * per_file) + 2
    if mode.startswith("store"):
        dbs = [_StoreWriter(root / f"p{i:02d}.db", mode) for i in range(files)]
    else:
        dbs = [_prepare(root / f"p{i:02d}.db", mode, commits) for i in range(files)]
    times: list[float] = []
    probe_ms: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def writer(db: sqlite3.Connection | _StoreWriter, phase: float) -> None:
        due = time.monotonic() + phase
        seq = 1_000_000
        while (now := time.monotonic()) < stop:
            if due > now:
                time.sleep(due - now)
            started = time.perf_counter()
            if isinstance(db, _StoreWriter):
                db.commit(seq)
            else:
                _commit(db, seq)
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                times.append(elapsed)
            if isinstance(db, _StoreWriter):
                db.settle(seq)
            seq += 1
            due += random.expovariate(per_file)  # Poisson arrivals: commits of different files meet as in the soak

    def probe() -> None:
        db = sqlite3.connect(root / "probe.sqlite", isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
        k = 0
        while time.monotonic() < stop:
            time.sleep(0.1)
            k += 1
            started = time.perf_counter()
            db.execute("BEGIN")
            db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (k % 1000, b"p" * 64))
            db.execute("COMMIT")
            probe_ms.append((time.perf_counter() - started) * 1000)
        db.close()

    def loop() -> None:  # an event loop's Python work: bursts that hold the GIL, and waits that let it go
        while time.monotonic() < stop:
            until = time.perf_counter() + random.expovariate(1 / busy[0])
            while time.perf_counter() < until:
                sum(range(200))
            time.sleep(random.expovariate(1 / busy[1]))

    threads = [threading.Thread(target=writer, args=(db, random.random() / per_file)) for db in dbs]
    threads.append(threading.Thread(target=probe))
    if busy:
        threads.append(threading.Thread(target=loop))
    disk_probe = None
    if disk_rate:
        script = Path(__file__).resolve().with_name("disk_probe.py")
        disk_probe = subprocess.Popen(
            [sys.executable, str(script), str(root / "disk_probe.bin"), "--rate", str(disk_rate)],
            stdout=subprocess.DEVNULL,
        )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if disk_probe is not None:
        disk_probe.terminate()
        disk_probe.wait(5)
    for db in dbs:
        db.close()
    return times, probe_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per mode, file count and round")
    parser.add_argument("--files", default="1,16", help="file counts, comma-separated")
    parser.add_argument("--rate", type=float, default=70.0, help="synced commits a second in all (the soak: ~70)")
    parser.add_argument("--modes", default="grow,inplace,prealloc,normal")
    parser.add_argument(
        "--busy", help="ms of Python work, ms of rest (means): a thread holding the GIL as an event loop, e.g. 3,4"
    )
    parser.add_argument("--switch", type=float, help="sys.setswitchinterval, in ms (Python's default: 5)")
    parser.add_argument("--base", type=Path, help="a base tree (for the store-base mode)")
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temporary folder beside /tmp)")
    parser.add_argument("--disk-probe", default="0", help="bench/disk_probe.py rates beside the commits (0: none)")
    args = parser.parse_args(argv)
    if args.switch:
        sys.setswitchinterval(args.switch / 1000)
    modes = args.modes.split(",")
    if "store-base" in modes:
        if args.base is None:
            parser.error("the store-base mode needs --base DIR")
        _load_base(args.base)
    busy = tuple(float(x) / 1000 for x in args.busy.split(",")) if args.busy else None
    counts = [int(f) for f in args.files.split(",")]
    rates = [float(x) for x in args.disk_probe.split(",")]
    results: dict[tuple[str, int, float], list[tuple[float, float, float, float, int]]] = {}
    base = args.dir or Path(tempfile.mkdtemp(prefix="sqlite-probe-", dir="/var/tmp"))
    for r in range(args.rounds):
        order = [(m, f, d) for m in modes for f in counts for d in rates]
        random.shuffle(order)  # no mode always right after another's checkpoint or page cache
        for mode, files, disk_rate in order:
            root = base / f"{r}-{mode}-{files}-{disk_rate:g}"
            root.mkdir(parents=True)
            times, probe_ms = run(root, mode, files, args.seconds, args.rate, busy, disk_rate)
            shutil.rmtree(root)
            row = (_pct(times, 0.5), _pct(times, 0.9), _pct(times, 0.99), _pct(probe_ms, 0.99), len(times))
            results.setdefault((mode, files, disk_rate), []).append(row)
            print(f"round {r + 1} {mode:>8} files={files:<3} dsync/s={disk_rate:<3g} commits {row[4]:5d} "
                  f"p50 {row[0]:6.2f} p90 {row[1]:6.2f} "
                  f"p99 {row[2]:6.2f} ms; probe p99 {row[3]:6.2f} ms", flush=True)  # fmt: skip
    print(f"\nmedian over {args.rounds} rounds (range), {args.rate:g} commits/s in all, {args.seconds:g} s each:")
    for (mode, files, disk_rate), rows in sorted(
        results.items(), key=lambda kv: (kv[0][1], modes.index(kv[0][0]), kv[0][2])
    ):
        cols = []
        for i, name in enumerate(("p50", "p90", "p99", "probe p99")):
            vals = [row[i] for row in rows]
            cols.append(f"{name} {statistics.median(vals):6.2f} ({min(vals):.2f}-{max(vals):.2f})")
        print(f"{mode:>8} files={files:<3} dsync/s={disk_rate:<3g} " + ", ".join(cols) + " ms")
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
