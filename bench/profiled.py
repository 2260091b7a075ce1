"""Run ``shardbus`` under cProfile in every thread of every process it starts (``bench/scale.py --profile``).

    python bench/profiled.py OUT_DIR serve [serve options...]

Each thread gets a profiler of its own (cProfile sees one thread); a process writes them by kind of thread (the
event loop, the cluster client's loop, a pool's threads summed) to ``OUT_DIR/<role>-<pid>-<thread>.prof`` when it
ends cleanly: the front end at exit, a worker forked by ``serve --workers N`` when its ``main`` returns (a fork ends
with ``os._exit``, which runs no exit handlers). ``print_profiles`` shows the busiest functions of each. cProfile
slows calls down several times: read shares within one thread, compare two runs of the same mode, and take the CPU
per message from a run without it.
"""

from __future__ import annotations

import atexit
import cProfile
import io
import os
import pstats
import re
import sys
import threading
from pathlib import Path

_profiles: list[tuple[str, cProfile.Profile]] = []  # (thread name, its profiler)
_role = "frontend"


def _start() -> None:
    profile = cProfile.Profile()
    _profiles.append((threading.current_thread().name, profile))
    profile.enable()


def _dump(out: Path) -> None:
    """One file per thread kind (the event loop, the cluster client's loop, the store threads summed)."""
    by_kind: dict[str, pstats.Stats] = {}
    for name, profile in _profiles:
        profile.create_stats()  # a thread still running is read as it is (the GIL makes the snapshot whole)
        kind = re.sub(r"[-_]?\d+$", "", name.split(" ")[0]) or "thread"  # pool threads: one kind
        if kind in by_kind:
            by_kind[kind].add(profile)
        else:
            by_kind[kind] = pstats.Stats(profile)
    for kind, stats in by_kind.items():
        stats.dump_stats(str(out / f"{_role}-{os.getpid()}-{kind}.prof"))
    _profiles.clear()


def _install(out: Path) -> None:
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        _start()
        original_run(self)

    threading.Thread.run = run  # type: ignore[method-assign]

    def in_child() -> None:  # a forked worker: its own profile from here on
        global _role
        _role = "worker"
        _profiles.clear()
        _start()

    os.register_at_fork(after_in_child=in_child)
    from shardbus.cluster import worker

    worker_main = worker.main

    def main(*args: object, **kwargs: object) -> int:
        try:
            return worker_main(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            _dump(out)

    worker.main = main  # type: ignore[assignment]
    atexit.register(_dump, out)
    _start()


def print_profiles(folder: Path, top: int = 30) -> None:
    """Each profile in ``folder``: the functions with the most own time, then the most time including calls."""
    for path in sorted(folder.glob("*.prof")):
        for key, title in (("tottime", "own time"), ("cumulative", "with callees")):
            text = io.StringIO()
            stats = pstats.Stats(str(path), stream=text)
            stats.strip_dirs().sort_stats(key).print_stats(top)
            body = text.getvalue()
            start = body.find("   ncalls")
            print(f"\n{path.name}: top {top} by {title}\n{body[start:].rstrip()}")


if __name__ == "__main__":
    out_dir = Path(sys.argv[1]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.argv = ["shardbus", *sys.argv[2:]]
    _install(out_dir)
    from shardbus.cli import main as cli_main

    sys.exit(cli_main())
