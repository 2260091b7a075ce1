"""The store commits of a stall trace (``SHARDBUS_STALL_TRACE``, e.g. ``bench/soak.py --trace --keep``'s
``stalls.trace``), read for what makes a synced commit slow and what a send waits for beside its own commit.

For each trace: synced commits' p50/p90/p99 per time window (the first window is warm-up: every store's WAL is new),
the share of synced commits that began within ``--gap`` ms of the end of the same store's previous commit (a batch
that queued behind the commit in flight: its sends paid for two), and checkpoints; and
synced commits that overlapped a lag of the broker's event loop (``loop`` lines: the loop's thread busy, holding the
GIL a commit's thread takes back after each statement) against the others. Several traces (base and branch of a
side-by-side run) print side by side.

    python bench/sqlite_probe_trace.py TRACE [TRACE...] [--window 120] [--gap 0.3]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import sys
from pathlib import Path

LOOP_MS = 3.0  # an event-loop lag this long: the loop's thread held the GIL (or waited for a CPU) that long


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(trace: Path, window: float, gap: float) -> list[str]:
    commits: list[tuple[float, float, str, bool]] = []  # (start, ms, store, synced)
    kinds: dict[str, list[float]] = collections.defaultdict(list)
    loops: list[tuple[float, float]] = []  # the event loop's lags of LOOP_MS or more: (start, end)
    for line in trace.read_text().splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4:
            continue
        start, ms, kind, detail = float(parts[0]), float(parts[1]), parts[2], parts[3]
        if kind == "commit":
            store, _, sync = detail.rpartition(" ")
            commits.append((start, ms, store, sync == "sync=True"))
        elif kind == "checkpoint":
            kinds[kind].append(ms)
        elif kind == "loop" and ms >= LOOP_MS:
            loops.append((start, start + ms / 1000))
    if not commits:
        return [f"{trace}: no commits traced"]
    commits.sort()
    first = commits[0][0]
    out = [f"{trace}: {len(commits)} commits, {sum(1 for c in commits if c[3])} synced"]
    by_window: dict[int, list[float]] = collections.defaultdict(list)
    last_end: dict[str, float] = {}
    queued = synced = 0
    for start, ms, store, sync in commits:
        if sync:
            synced += 1
            by_window[int((start - first) // window)].append(ms)
            if store in last_end and start - last_end[store] < gap / 1000:
                queued += 1
        last_end[store] = start + ms / 1000
    for w in sorted(by_window):
        ms = by_window[w]
        out.append(
            f"  {w * window / 60:5.1f}-{(w + 1) * window / 60:4.1f} min: {len(ms):6d} synced commits, p50 "
            f"{_pct(ms, 0.5):5.2f} p90 {_pct(ms, 0.9):5.2f} p99 {_pct(ms, 0.99):6.2f} ms"
        )
    every = [ms for ws in by_window.values() for ms in ws]
    after = [ms for w, ws in by_window.items() if w > 0 for ms in ws]
    out.append(
        f"  all: p50 {_pct(every, 0.5):.2f} p90 {_pct(every, 0.9):.2f} p99 {_pct(every, 0.99):.2f} ms; after the first"
        f" window: p50 {_pct(after, 0.5):.2f} p90 {_pct(after, 0.9):.2f} p99 {_pct(after, 0.99):.2f} ms"
    )
    out.append(
        f"  synced commits that began within {gap:g} ms of their store's previous commit: {queued} "
        f"({queued / max(1, synced):.1%})"
    )
    loops.sort()
    starts = [lag[0] for lag in loops]
    longest = max((e - s for s, e in loops), default=0.0)
    beside: list[float] = []
    alone: list[float] = []
    for start, ms, _, sync in commits:
        if not sync:
            continue
        end = start + ms / 1000
        i = bisect.bisect_left(starts, start - longest)
        hit = any(loops[j][1] > start for j in range(i, bisect.bisect_left(starts, end)))
        (beside if hit else alone).append(ms)
    for name, ms in ((f"beside a loop lag of {LOOP_MS:g} ms or more", beside), ("not", alone)):
        if ms:
            out.append(
                f"  synced commits {name}: {len(ms)} ({len(ms) / max(1, synced):.1%}), p50 {_pct(ms, 0.5):.2f} "
                f"p90 {_pct(ms, 0.9):.2f} p99 {_pct(ms, 0.99):.2f} ms"
            )
    for kind, ms in sorted(kinds.items()):
        out.append(f"  {kind}: {len(ms)}, {sum(ms) / 1000:.2f} s in all, p50 {_pct(ms, 0.5):.2f} max {max(ms):.1f} ms")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--window", type=float, default=120.0, help="seconds per line")
    parser.add_argument("--gap", type=float, default=0.3, help="ms: a commit this soon after the last one queued")
    args = parser.parse_args(argv)
    for trace in args.traces:
        print("\n".join(report(trace, args.window, args.gap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
