"""A traced soak's disk, read afterwards: the broker's commits and checkpoints (``stalls.trace``) against the disk
probe's syncs (``disk_probe.trace``), both from ``bench/soak.py --trace --keep --data-dir DIR``.

It answers three questions about the slow 1% (issue #28, point 6):

- **Do the broker's checkpoints slow the disk for everyone?** The disk probe's syncs due while a checkpoint ran
  against the others: their p50/p99 and the share of 3 ms or more. If the probe is as fast beside a checkpoint as
  without one, checkpoints add nothing to a stall the probe (and a send's commit) meets.
- **Are the broker's slow commits the disk's slow moments?** Synced commits that overlapped a slow probe sync
  (``--slow`` ms or more) against the others: if the slowest commits are those, a send's slow acknowledgement is
  the disk's, which it must wait for to be durable.
- **Did checkpoints run in the disk's bad moments?** Checkpoints that began within ``--near`` ms after a slow probe
  sync, and how long those took against the others: what deferring a checkpoint out of a stall could save.
- **Did the commit pool make batches wait?** The time the broker had 1, 2, ... group commits (``batch`` lines) in
  flight at once: with ``COMMITS``'s 8 threads busy, a ninth store's batch waits for a thread. (Batches under the
  trace's threshold, 1 ms, are not traced; at 8 at once they are long ones.)

    python bench/soak_disk.py DIR [DIR...] [--slow 10] [--near 200]
"""

from __future__ import annotations

import argparse
import bisect
import sys
from pathlib import Path

Span = tuple[float, float]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _read(
    path: Path,
) -> tuple[list[tuple[float, float, bool]], list[Span], list[tuple[float, float]], list[Span]]:
    """(synced and unsynced commits as (start, ms, synced), checkpoints as spans, probe syncs as (due, ms), group
    commits as spans)."""
    commits, checkpoints, probe, batches = [], [], [], []
    for line in (path / "stalls.trace").read_text().splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4:
            continue
        start, ms, kind = float(parts[0]), float(parts[1]), parts[2]
        if kind == "commit":
            commits.append((start, ms, parts[3].endswith("sync=True")))
        elif kind == "checkpoint":
            checkpoints.append((start, start + ms / 1000))
        elif kind == "batch":
            batches.append((start, start + ms / 1000))
    for line in (path / "disk_probe.trace").read_text().splitlines():
        due, ms, _ = line.split(" ")
        probe.append((float(due), float(ms)))
    commits.sort()
    checkpoints.sort()
    probe.sort()
    return commits, checkpoints, probe, batches


def _overlaps(spans: list[Span], starts: list[float], longest: float, a: float, b: float) -> bool:
    i = bisect.bisect_left(starts, a - longest)
    while i < len(spans) and spans[i][0] < b:
        if spans[i][1] > a:
            return True
        i += 1
    return False


def _line(name: str, ms: list[float], slow: float) -> str:
    if not ms:
        return f"  {name}: none"
    share = sum(1 for m in ms if m >= slow) / len(ms)
    return (
        f"  {name}: {len(ms)}, p50 {_pct(ms, 0.5):.2f} ms, p99 {_pct(ms, 0.99):.2f} ms, "
        f"{share:.2%} of {slow:g} ms or more"
    )


def report(path: Path, slow: float, near: float) -> list[str]:
    commits, checkpoints, probe, batches = _read(path)
    if not probe:
        return [f"{path}: no disk probe samples"]
    out = [f"{path}: {len(commits)} commits, {len(checkpoints)} checkpoints, {len(probe)} disk probe syncs"]
    # the probe's syncs (each from its due time to its end) beside a checkpoint or not
    c_starts = [c[0] for c in checkpoints]
    c_longest = max((c[1] - c[0] for c in checkpoints), default=0.0)
    beside, alone = [], []
    for due, ms in probe:
        (beside if _overlaps(checkpoints, c_starts, c_longest, due, due + ms / 1000) else alone).append(ms)
    out.append("the disk probe's syncs:")
    out.append(_line("beside a broker checkpoint", beside, 3.0))
    out.append(_line("alone", alone, 3.0))
    # the broker's synced commits beside a slow probe sync or not
    slow_spans = [(due, due + ms / 1000) for due, ms in probe if ms >= slow]
    s_starts = [s[0] for s in slow_spans]
    s_longest = max((s[1] - s[0] for s in slow_spans), default=0.0)
    hit, clear = [], []
    for start, ms, synced in commits:
        if synced:
            overlapped = _overlaps(slow_spans, s_starts, s_longest, start, start + ms / 1000)
            (hit if overlapped else clear).append(ms)
    out.append(f"the broker's synced commits (the disk probe slow: a sync of {slow:g} ms or more beside it):")
    out.append(_line("beside a slow probe sync", hit, slow))
    out.append(_line("beside none", clear, slow))
    every = sorted(m for _, m, s in commits if s)
    if every:
        cut = _pct(every, 0.99)
        top = [m for m in hit if m >= cut]
        out.append(
            f"  of the slowest 1% of synced commits ({cut:.2f} ms or more): "
            f"{len(top) / max(1, sum(1 for m in every if m >= cut)):.0%} beside a slow probe sync"
        )
    # checkpoints that began just after a slow probe sync ended (the disk in a bad moment) against the others
    ends = sorted(s[1] for s in slow_spans)
    in_bad, in_good = [], []
    for start, end in checkpoints:
        i = bisect.bisect_right(ends, start)
        recent = i > 0 and start - ends[i - 1] <= near / 1000
        during = _overlaps(slow_spans, s_starts, s_longest, start, start)
        (in_bad if recent or during else in_good).append((end - start) * 1000)
    out.append(f"checkpoints begun within {near:g} ms of a slow probe sync, against the others:")
    out.append(_line("in a bad moment", in_bad, slow))
    out.append(_line("otherwise", in_good, slow))
    # how many group commits were in flight at once, over the traced span
    edges = sorted([(a, 1) for a, _ in batches] + [(b, -1) for _, b in batches])
    held: dict[int, float] = {}
    level, last = 0, edges[0][0] if edges else 0.0
    for t, step in edges:
        held[level] = held.get(level, 0.0) + t - last
        level, last = level + step, t
    span = sum(held.values()) or 1.0
    shown = ", ".join(f"{n}: {held[n]:.2f} s ({held[n] / span:.2%})" for n in sorted(held) if n)
    out.append(f"group commits of 1 ms or more in flight at once (the pool has 8 threads): {shown}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="data directories of bench/soak.py --trace --keep runs")
    parser.add_argument("--slow", type=float, default=10.0, help="a probe sync this long (ms) is the disk stalling")
    parser.add_argument("--near", type=float, default=200.0, help="ms after a slow probe sync still counted as bad")
    args = parser.parse_args(argv)
    for path in args.dirs:
        for line in report(path, args.slow, args.near):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
