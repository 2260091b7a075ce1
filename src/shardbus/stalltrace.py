"""Stall tracing, a debugging aid that is off unless ``SHARDBUS_STALL_TRACE`` names a file.

What can hold up a send for tens of milliseconds lives in several places: a store commit (its fsync), a SQLite
checkpoint beside it, a garbage collection (every thread waits for it), the upkeep holding a partition's lock, and
the event loop busy with something else. When tracing is on, each of those records one line per occurrence that
took at least ``SHARDBUS_STALL_TRACE_MS`` (default 1 ms; store commits and checkpoints all) into the file:

    <monotonic start, s> <duration, ms> <kind> <detail>

The start is ``time.monotonic()``, the system's CLOCK_MONOTONIC, which every process on the machine shares: a
client (bench/soak.py) matches its own slow requests against these lines without converting clocks.

Off, it costs callers one test of the module-level ``ON``. On, lines are written through one buffered file under a
lock (flushed about every second) and nothing is kept in memory but that buffer, the times of the batch whose
callbacks a commit thread runs now (``commit_times``) and the event loop's sends answered but not yet written
(``send_acknowledged``, emptied at the end of the same loop callback).

With ``SHARDBUS_STALL_TRACE_SENDS=1`` every group of sends (one socket read's sends bound for one partition) also
records its life in the broker, as offsets in ms from the moment the group was handed to its store
(bench/pace.py reads them):

    <start> <total ms> send n=<sends> arrived=<the socket read came, before> read=<its first transfer
        decoded, before> queued=<the commit pool was asked for a thread> picked=<a commit thread took the
        batch> stored=<written and synced> resolved=<the group's callback ran> loop=<the event loop ran the
        answer> acked=<the dispositions were made> written=<they went to the socket> cpu=<the commit thread's
        CPU from picked to stored, ms>

``queued`` is -1 when the batch formed while an earlier batch of the same store was being written (it follows
it on the same thread, not through the pool).
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

PATH = os.environ.get("SHARDBUS_STALL_TRACE") or None
ON = PATH is not None
SENDS = ON and os.environ.get("SHARDBUS_STALL_TRACE_SENDS") == "1"
THRESHOLD = float(os.environ.get("SHARDBUS_STALL_TRACE_MS", "1")) / 1000  # seconds
LOOP_PERIOD = 0.005  # the event-loop lag probe posts a callback this often (seconds)
GARBAGE = ON and os.environ.get("SHARDBUS_STALL_TRACE_GARBAGE") == "1"
SAMPLE_AFTER = 0.005  # a loop that has not answered the probe after this long: note where it is (seconds)

_lock = threading.Lock()
_file: Any = None
_flushed = 0.0


def record(kind: str, started: float, elapsed: float, detail: str = "", every: bool = False) -> None:
    """Note that ``kind`` ran from monotonic ``started`` for ``elapsed`` seconds (kept only above the threshold,
    unless ``every``: store commits and checkpoints, whose short ones are the baseline the long ones stand out of)."""
    global _file, _flushed
    if (elapsed < THRESHOLD and not every) or PATH is None:
        return
    line = f"{started:.6f} {elapsed * 1000:.3f} {kind} {detail}\n"
    with _lock:
        if _file is None:
            _file = open(PATH, "a", buffering=1 << 16)  # noqa: SIM115 (open for the process's life)
        _file.write(line)
        now = time.monotonic()
        if now - _flushed > 1.0:
            _flushed = now
            _file.flush()


_commit = threading.local()  # (a commit thread) .times: ``set_commit_times``' of the batch it answers now
_acknowledged: list[tuple[float, ...]] = []  # (the event loop) answered sends whose dispositions wait for the write


def set_commit_times(queued: float, picked: float, stored: float, cpu: float) -> None:
    """(A commit thread, ``SENDS``.) The batch whose callbacks run next was asked for at ``queued`` (-1: it
    followed the previous batch), taken at ``picked`` and stored at ``stored``, using ``cpu`` seconds of its
    thread's CPU between the two (the rest of that time it waited: for the disk, a core or the GIL)."""
    _commit.times = (queued, picked, stored, cpu)


def commit_times() -> tuple[float, float, float, float]:
    """(The callbacks of a batch, on its commit thread.) What ``set_commit_times`` said last on this thread (a
    batch that failed leaves the times of the one before it)."""
    return getattr(_commit, "times", (0.0, 0.0, 0.0, 0.0))


def send_acknowledged(times: tuple[float, ...]) -> None:
    """(The event loop, ``SENDS``.) A group of sends is answered: ``times`` are (count, arrived, read, flushed,
    queued, picked, stored, the commit's CPU, resolved, loop, acknowledged); ``sends_written`` writes its line."""
    _acknowledged.append(times)


def sends_written() -> None:
    """(The event loop, ``SENDS``.) The answers of the groups ``send_acknowledged`` noted went to the socket."""
    if not _acknowledged:
        return
    now = time.monotonic()
    for n, arrived, read, flushed, queued, picked, stored, cpu, resolved, loop, acked in _acknowledged:
        stages = (arrived, read, queued, picked, stored, resolved, loop, acked, now)
        ms = [f"{(t - flushed) * 1000:.3f}" for t in stages]
        if queued < 0:
            ms[2] = "-1"
        detail = (
            "n={:.0f} arrived={} read={} queued={} picked={} stored={} resolved={} loop={} acked={} written={} "
            "cpu={:.3f}"
        )
        record("send", flushed, now - flushed, detail.format(n, *ms, cpu * 1000), True)
    _acknowledged.clear()


def flush() -> None:
    with _lock:
        if _file is not None:
            _file.flush()


_gc_started: dict[int, float] = {}


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[threading.get_ident()] = time.monotonic()
        return
    started = _gc_started.pop(threading.get_ident(), None)
    if started is not None:
        detail = f"gen={info.get('generation')} collected={info.get('collected')}"
        if GARBAGE:  # what the collection found: the commonest types of its garbage
            kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
            gc.garbage.clear()
            detail += " " + ",".join(f"{k}:{n}" for k, n in kinds.most_common(12))
        record("gc", started, time.monotonic() - started, detail)


def watch_gc() -> None:
    """Record every garbage collection's pause (``gc.callbacks``); once per process. With
    ``SHARDBUS_STALL_TRACE_GARBAGE=1`` also the types of what each collection found (kept a moment for that)."""
    if ON and _gc_callback not in gc.callbacks:
        gc.callbacks.append(_gc_callback)
        if GARBAGE:
            gc.set_debug(gc.DEBUG_SAVEALL)


def _where(thread_id: int | None, depth: int = 6) -> str:
    """The innermost frames of a thread, innermost last, as ``file:line:function`` (what it is doing now)."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    out = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}:{code.co_name}")
        frame = frame.f_back
    return " < ".join(out)


def _state(native_id: int) -> str:
    """The kernel's view of a thread of this process: its state (R running or runnable, S sleeping) and what it
    sleeps in (``futex_wait_queue``: a lock, such as the GIL; ``ep_poll``: waiting for I/O)."""
    try:
        state = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/self/task/{native_id}/wchan").read_text().strip() or "-"
    except OSError:
        return "?"
    return f"{state}:{wchan}"


def watch_loop(loop: Any) -> None:
    """Record the event loop's lag: a thread posts a callback every ``LOOP_PERIOD`` and notes how long the loop
    took to run it (what every request on that loop waited at least). When the loop has not answered after
    ``SAMPLE_AFTER``, what the loop's thread is doing then is noted too (a ``loopstack`` line)."""
    if not ON:
        return
    owner: list[tuple[int, int]] = []  # the loop thread's (ident, native id)

    def probe() -> None:
        done = threading.Event()
        while not loop.is_closed():
            done.clear()
            posted = time.monotonic()
            try:
                loop.call_soon_threadsafe(done.set)
                if not owner:
                    loop.call_soon_threadsafe(lambda: owner.append((threading.get_ident(), threading.get_native_id())))
            except RuntimeError:  # closed meanwhile
                return
            if not done.wait(SAMPLE_AFTER):
                where = f"{_state(owner[0][1])} {_where(owner[0][0])}" if owner else ""
                sampled = time.monotonic()
                done.wait(5)
                record("loopstack", posted, sampled - posted, where)
            record("loop", posted, time.monotonic() - posted)
            time.sleep(LOOP_PERIOD)

    threading.Thread(target=probe, name="shardbus-stalltrace-loop", daemon=True).start()
