"""Does one store's stalled fsync hold up other stores' commits? (issue #28 point 6, candidate 3)

Every partition's store commits through a ``GroupCommitter`` on one shared pool of threads (``store/pools.py``'s
``COMMITS``, 8 threads; at most one batch per store in flight). A commit whose fsync stalls keeps its thread for
the stall. This bench asks what that does to the commits of the stores that did not stall.

``--stores`` real ``SqliteStore`` files (the soak has 64: 4 entities of 16 partitions) take a send's commit (a 1 KB
row, ``next_seq``, its counts; synced) open loop at ``--rate`` a second in all, at random stores, each through
its own ``GroupCommitter``. Every ``--every`` seconds a stall is injected for ``--stall`` ms, one of two shapes:

    stores:K  the next commit of K stores picked at random sleeps ``--stall`` ms after it is written, holding its
              thread as a stalled fdatasync of that file would (the others' files are not stalled)
    disk      every commit that is written during the stall window waits for the window's end, as every fsync
              on a device that stalls does

and the latency of each commit to a store that was *not* stalled (all of them for ``disk``; from its due time to its
future's result) is split into "during a stall" (due inside a window, from 50 ms before it to 50 ms after it),
"after" (due 50-250 ms after a window: the catch-up of what queued during it) and "quiet". Pools of different sizes
are run in rounds one after the other (``--pools 8,64``), each round's shapes interleaved.

    python bench/store_stall.py [--stores 64] [--rate 90] [--stall 280] [--every 2] [--seconds 20]
        [--shapes stores:1,stores:4,stores:8,stores:16,disk] [--pools 8,64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shardbus.store.base import Row
from shardbus.store.committer import GroupCommitter
from shardbus.store.sqlite import SqliteStore
from sqlite_probe import _pct  # this script's own folder is on the path; the commit probe's percentile

ROW = b"m" * 1024
AFTER = 0.05  # a commit due this long before or after a stall window still counts as "during"
CATCH_UP = 0.25  # commits due from AFTER to this long after a window count as "after" (the catch-up), not "quiet"


class StallableStore:
    """A ``SqliteStore`` whose next ``apply`` can be made to stall (see the module docstring)."""

    def __init__(self, path: Path, index: int, windows: list[tuple[float, float, set[int] | None]]) -> None:
        self.store = SqliteStore(path)
        self.store.apply([("create_slot", 0)])
        self.index = index
        # stall windows (monotonic start, end, the stores stalled or None for all), appended by the injector
        self.windows = windows

    def apply(self, ops: list, sync: bool = True) -> None:
        self.store.apply(ops, sync)
        if self.windows:  # written during a window that stalls this file: its "fsync" returns at the window's end
            start, end, stalled = self.windows[-1]
            now = time.monotonic()
            if start <= now < end and (stalled is None or self.index in stalled):
                time.sleep(end - now)

    def close(self) -> None:
        self.store.close()


def run(stores: int, rate: float, stall: float, every: float, seconds: float, shape: str, pool: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="shardbus-stall-"))
    windows: list[tuple[float, float, set[int] | None]] = []
    executor = ThreadPoolExecutor(max_workers=pool, thread_name_prefix="stall-commit")
    files = [StallableStore(root / f"p{i:02d}.db", i, windows) for i in range(stores)]
    committers = [GroupCommitter(s, on_failure=lambda exc: exc, executor=executor) for s in files]
    results: list[tuple[float, float, int]] = []  # (due, latency, store)
    lock = threading.Lock()
    stop = threading.Event()
    seqs = [0] * stores

    def inject() -> None:
        while not stop.wait(every):
            now = time.monotonic()
            picked = None if shape == "disk" else set(random.sample(range(stores), int(shape.split(":")[1])))
            windows.append((now, now + stall, picked))

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    pending: list[Future] = []
    due = time.monotonic()
    end = due + seconds
    while due < end:
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        i = random.randrange(stores)
        seqs[i] += 1
        seq = seqs[i]
        ops = [("put", 0, [Row(seq, 0, 0, 0, None, ROW, None)]), ("meta", "next_seq", seq + 1),
               ("counts", 0, 0, seq, seq * len(ROW))]  # fmt: skip

        def done(_f: Future, due: float = due, i: int = i) -> None:
            with lock:
                results.append((due, time.monotonic() - due, i))

        future = committers[i].submit(ops)
        future.add_done_callback(done)
        pending.append(future)
        due += 1 / rate
    stop.set()
    for f in pending:
        f.result(30)
    for c in committers:
        c.wait_idle(10)
    for s in files:
        s.close()
    executor.shutdown()
    shutil.rmtree(root, ignore_errors=True)
    during, after, quiet = [], [], []
    for t, latency, i in results:
        hit = [w for w in windows if w[0] - AFTER <= t < w[1] + AFTER]
        if any(w[2] is None or i in w[2] for w in hit) and shape != "disk":
            continue  # a stalled store's own commit (or one queued behind it in its store): not what is asked
        if hit:
            during.append(latency * 1000)
        elif any(w[1] + AFTER <= t < w[1] + CATCH_UP for w in windows):
            after.append(latency * 1000)
        else:
            quiet.append(latency * 1000)
    return {"during": during, "after": after, "quiet": quiet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=64)
    parser.add_argument("--rate", type=float, default=90.0)
    parser.add_argument("--stall", type=float, default=280.0, help="ms")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between stalls")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--shapes", default="stores:1,stores:4,stores:8,stores:16,disk")
    parser.add_argument("--pools", default="8,64")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    pools = [int(p) for p in args.pools.split(",")]
    got: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for shape in shapes:
            for pool in pools:
                got.setdefault((shape, pool), []).append(
                    run(args.stores, args.rate, args.stall / 1000, args.every, args.seconds, shape, pool)
                )
    print(f"{args.stores} stores, {args.rate:g} commits/s, stalls of {args.stall:g} ms every {args.every:g} s, "
          f"{args.seconds:g} s x {args.rounds} rounds; latency of commits to stores that did not stall "
          "(disk: of all) in ms")  # fmt: skip
    print(f"{'shape':>10} {'pool':>5} {'n during':>9} {'p50':>7} {'p99':>7} {'max':>7}   {'n after':>8} {'p50':>7} "
          f"{'p99':>7}   {'n quiet':>8} {'p50':>7} {'p99':>7}")  # fmt: skip
    for (shape, pool), runs in got.items():
        during = [x for r in runs for x in r["during"]]
        after = [x for r in runs for x in r["after"]]
        quiet = [x for r in runs for x in r["quiet"]]
        print(f"{shape:>10} {pool:5d} {len(during):9d} {_pct(during, 0.5):7.2f} {_pct(during, 0.99):7.1f} "
              f"{max(during, default=float('nan')):7.1f}   {len(after):8d} {_pct(after, 0.5):7.2f} "
              f"{_pct(after, 0.99):7.1f}   {len(quiet):8d} {_pct(quiet, 0.5):7.2f} "
              f"{_pct(quiet, 0.99):7.1f}")  # fmt: skip
        if len(runs) > 1:
            for name in ("during", "after", "quiet"):
                per_round = [_pct(r[name], 0.99) for r in runs]
                print(f"{'':>16} p99 {name} per round: {', '.join(f'{v:.1f}' for v in per_round)} "
                      f"(median {statistics.median(per_round):.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
