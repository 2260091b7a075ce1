"""What crosses the hop to a worker per message in bench/scale.py's "both" phase (or, ``--phase receive``, its
receive phase: a filled queue peek-locked and completed): requests by operation, frames
back by kind, how many messages a lock request brings back and how many tokens a settle request carries.

The front end of ``shardbus serve --workers 1`` runs with counters around ``cluster/remote.py``'s
``WorkerLink.call`` (each request, by operation), ``WorkerLink._frame`` (each frame back: reply, applied,
written, event) and ``WorkerLink._flush`` (each write of a burst), and its forked workers with one around
``FrameStream.write`` (each write back and the frames in it); SIGUSR1 makes each process write its counts to a
file, read and summed before and after the measured phase. Same clients, queue and messages as bench/scale.py
(``ShardbusServe``, ``Role``). Counts, not times: the machine's speed does not move them (the clients' pace does, a
little).

    python bench/hop_counts.py [--count N] [--rounds R] [--base DIR] [--flags "--workers 1"] [--phase receive]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import scale


def _install_counters(out: Path) -> None:
    """In the serving process: count what the front end's links send and receive."""
    from shardbus.cluster import remote, stream, wire

    counts: collections.Counter[str] = collections.Counter()
    # a named record's length: five elements since SBW7 (wire._NAMED), the nine broker fields before (a --base tree)
    named_length = len(getattr(wire, "_NAMED", None) or wire._BROKER)
    lock = threading.Lock()

    def add(**kv: int) -> None:
        with lock:
            counts.update(kv)

    call, frame, flush = remote.WorkerLink.call, remote.WorkerLink._frame, remote.WorkerLink._flush

    def counted_call(
        self: Any, partition: Any, key: str, operation: str, args: list[Any], now: float, held: Any = None
    ) -> Any:
        future = call(self, partition, key, operation, args, now, held)
        add(**{f"request {operation}": 1})
        if operation == "lock_messages":
            add(**{"lock asked": args[2]})
            future.add_done_callback(
                lambda f: add(**{"lock got": 0 if f.cancelled() or f.exception() else len(f.result())})
            )
        elif operation in remote.SETTLEMENTS:
            add(**{f"{operation} tokens": len(args[1])})
        return future

    def counted_frame(self: Any, frame: list[Any]) -> None:
        rid = frame[0]
        applied = len(frame) == 5 and frame[4] == 1  # (a five-element frame may also be a lock reply's messages)
        kind = "event" if rid == 0 else "written" if rid < 0 else "applied" if applied else "reply"
        add(**{f"frame {kind}": 1})
        if len(frame) >= 5 and frame[4] == 3:  # a lock reply naming what this front end sent (wire.LOCKED, SBW6)
            named = sum(1 for r in frame[2] if len(r) == named_length)
            add(**{"locked named": named, "locked in full": len(frame[2]) - named})
        frame_fn(self, frame)

    frame_fn = frame

    def counted_flush(self: Any) -> None:
        add(**{"writes to worker": 1, "frames to worker": len(self._outbox)})
        flush(self)

    remote.WorkerLink.call = counted_call  # type: ignore[method-assign]
    remote.WorkerLink._frame = counted_frame  # type: ignore[method-assign]
    remote.WorkerLink._flush = counted_flush  # type: ignore[method-assign]

    # A worker's writes to its front ends (``serve --workers`` forks its workers from this process, so they count
    # too): how many frames go back in how many writes (each one system call and, at the front end, a read).
    stream_write = stream.FrameStream.write

    def counted_write(self: Any, frames: list[bytes]) -> None:
        if self.server and self.state == "open" and frames:
            add(**{"writes from worker": 1, "frames from worker": len(frames)})
        stream_write(self, frames)

    stream.FrameStream.write = counted_write  # type: ignore[method-assign]
    serving = os.getpid()

    def dump(*_: Any) -> None:
        with lock:
            data = dict(counts)
        target = out if os.getpid() == serving else out.with_name(f"{out.name}.{os.getpid()}")  # a forked worker
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, target)

    signal.signal(signal.SIGUSR1, dump)


def _snapshot(serve: scale.ShardbusServe, out: Path) -> dict[str, int]:
    """The serving process's counts and its forked workers' (their writes back), summed."""
    import scale

    pids = {
        pid: out if pid == serve.proc.pid else out.with_name(f"{out.name}.{pid}")
        for pid in scale.process_roles(serve.proc.pid)
    }
    before = {pid: path.stat().st_mtime_ns if path.exists() else 0 for pid, path in pids.items()}
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    total: collections.Counter[str] = collections.Counter()
    for pid, path in pids.items():
        while not path.exists() or path.stat().st_mtime_ns == before[pid]:
            if time.monotonic() > deadline:
                if pid != serve.proc.pid:  # a worker started again (not forked): nothing counted there
                    break
                raise RuntimeError("the serving process wrote no counts")
            time.sleep(0.02)
        else:
            total.update(json.loads(path.read_text()))
    return dict(total)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":  # the serving process (see SERVE below)
        _install_counters(Path(os.environ["SHARDBUS_HOP_COUNTS"]))
        from shardbus.cli import main as cli_main

        sys.argv = ["shardbus", *sys.argv[2:]]
        sys.exit(cli_main())
    # Not in the serving process: importing scale puts this tree's src first on sys.path (and imports shardbus from
    # it), so a --base server counted would have served this tree's code, not the base's.
    import scale  # bench/scale.py, beside this file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flags", default="--workers 1")
    parser.add_argument("--phase", choices=("both", "receive"), default="both", help="the phase counted")
    parser.add_argument("--base", type=Path, default=None, help="a checkout to serve from as well")
    args = parser.parse_args()
    n = args.count
    scale.SERVE = [sys.executable, str(Path(__file__).resolve()), "--serve", "serve"]
    trees = [scale.ROOT] + ([args.base.resolve()] if args.base is not None else [])
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shardbus-hopcounts-") as tmp:
        out = Path(tmp) / "counts.json"
        os.environ["SHARDBUS_HOP_COUNTS"] = str(out)
        for run in range(args.rounds):
            for i, tree in enumerate(trees):
                name = "branch" if tree == scale.ROOT else "base"
                serve = scale.ShardbusServe(Path(tmp) / f"{name}-{run}-{i}", args.flags.split(), tree=tree)
                snd = rcv = None
                try:
                    snd = scale.Role("send", serve.url, scale.QUEUE, 100)
                    rcv = scale.Role("recv", serve.url, scale.QUEUE, 100)
                    for tag, count in (("w", 2000), ("b", n)):  # a warm-up, then the measured phase
                        if args.phase == "receive":  # the queue filled first, then only the receive counted
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        c0 = _snapshot(serve, out)
                        rcv.command(f"recv {count}")
                        if args.phase == "both":
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        rcv.result()
                        time.sleep(0.2)  # the last written frames
                        c1 = _snapshot(serve, out)
                finally:
                    for role in (snd, rcv):
                        if role is not None:
                            role.stop()
                    serve.stop()
                delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
                row = figures.setdefault(name, {})
                for k, v in sorted(delta.items()):
                    if k.startswith(("request", "frame", "writes", "frames")):
                        row.setdefault(f"{k} /msg", []).append(v / n)
                locks = delta.get("request lock_messages", 0)
                if locks:
                    row.setdefault("lock: asked /request", []).append(delta.get("lock asked", 0) / locks)
                    row.setdefault("lock: got /request", []).append(delta.get("lock got", 0) / locks)
                for op in ("complete", "settle"):
                    reqs = delta.get(f"request {op}", 0)
                    if reqs:
                        row.setdefault(f"{op}: tokens /request", []).append(delta.get(f"{op} tokens", 0) / reqs)
                print(f"round {run + 1} {name}: " + json.dumps(delta, sort_keys=True), flush=True)
    print(f"\nmedians (min-max) over the rounds, '{args.phase}' phase of {n} messages, {args.flags}")
    for name, row in figures.items():
        print(f"  {name}")
        for key, values in row.items():
            print(f"    {key:<34} {statistics.median(values):8.3f} ({min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
