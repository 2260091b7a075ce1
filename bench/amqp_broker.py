"""bench/amqp.py's broker child: a shardbus broker (premium namespace, durable SQLite stores, the bench's queues)
on a free port, printing ``READY <port> <the src folder its shardbus came from>``.

Its own script, importing nothing from shardbus but ``Broker`` (and only once it runs), so that ``--base DIR``
can serve it from another checkout's shardbus (``SHARDBUS_BENCH_SRC``) whose client-side modules, which
bench/amqp.py itself imports, may be named differently. Keeps nothing but the broker and, with
``--profile-dir``, one profile.

    python bench/amqp_broker.py DATA_DIR QUEUE[,QUEUE] [--profile-dir DIR [--wall]] [--gc-off] [--cpus N[,N]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from children import watch_parent  # this script's own folder is on the path

SRC_ENV = "SHARDBUS_BENCH_SRC"  # the src folder whose shardbus this child serves (--base); default this checkout's
BATCH_LIMIT = 100 * 1024 * 1024  # what a premium namespace advertises (com.microsoft:max-message-batch-size)


def run_broker(
    data_dir: str, queues: list[str], profile_dir: str | None, gc_off: bool = False, wall: bool = False
) -> None:
    """Child: a shardbus broker on a free port; prints ``READY <port> <src>``. With ``profile_dir``, its event-loop
    thread runs under cProfile and SIGUSR1 dumps (and restarts) the profile to ``profile_dir/<n>.prof``. ``gc_off``
    (diagnosis only) disables Python's cyclic garbage collector in the broker process. ``wall``: the profile
    counts wall time instead, so that what the loop waits for (a lock, a read, the GIL) shows."""
    from shardbus.server import Broker

    watch_parent()
    if gc_off:
        gc.disable()
    from shardbus.model.tiers import Quotas

    if "max_batch_size_bytes" in Quotas.__dataclass_fields__:
        broker = Broker(data_dir, port=0, tier="premium", quotas={"max_batch_size_bytes": BATCH_LIMIT})
        queue_options: dict[str, Any] = {"max_message_size_in_kilobytes": BATCH_LIMIT // 1024}
    else:  # a tree from before batches were bounded (7735009): its premium defaults took any batch
        broker = Broker(data_dir, port=0, tier="premium")
        queue_options = {}
    for q in queues:
        broker.namespace.create_queue(q, **queue_options)
    # Thread CPU time, not wall time: waits for the GIL (held by the store threads) would otherwise dominate.
    profiler = cProfile.Profile(time.perf_counter if wall else time.thread_time) if profile_dir else None
    dumps = iter(range(1_000_000))
    gc_runs = [0, 0, 0]
    gc_seconds = [0.0, 0.0, 0.0]
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            gen = info["generation"]
            gc_runs[gen] += 1
            gc_seconds[gen] += time.thread_time() - gc_started[0]

    def dump() -> None:
        assert profiler is not None and profile_dir is not None
        profiler.disable()
        path = Path(profile_dir) / f"{next(dumps)}.prof"
        gc_line = ", ".join(f"gen{g} {gc_runs[g]} runs {gc_seconds[g]:.3f} s" for g in range(3))
        (Path(profile_dir) / f"{path.stem}.gc").write_text(f"{gc_line}; {len(gc.get_objects())} tracked objects")
        gc_runs[:] = [0, 0, 0]
        gc_seconds[:] = [0.0, 0.0, 0.0]
        profiler.dump_stats(str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        profiler.clear()
        profiler.enable()

    def ready(b: Broker) -> None:
        if profiler is not None:
            gc.callbacks.append(on_gc)  # any thread; a collection holds the GIL from start to stop
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)
            profiler.enable()
        import shardbus

        print(f"READY {b.server.port} {Path(shardbus.__file__).parents[1]}", flush=True)

    broker.serve_forever(on_ready=ready)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("queues", help="comma-separated")
    parser.add_argument("--profile-dir")
    parser.add_argument("--gc-off", action="store_true")
    parser.add_argument("--wall", action="store_true", help="the profile counts wall time, not thread CPU time")
    parser.add_argument("--cpus", help="comma-separated CPUs this process (every thread) runs on")
    args = parser.parse_args()
    sys.path.insert(0, os.environ.get(SRC_ENV) or str(Path(__file__).resolve().parents[1] / "src"))
    if args.cpus:  # before the broker starts a thread: they all inherit it
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    run_broker(args.data_dir, args.queues.split(","), args.profile_dir, args.gc_off, args.wall)


if __name__ == "__main__":
    main()
