"""Issue 26 point 4 counted in instructions: the workers' work per message of ``serve --workers N``, N = 1, 2, 4.

bench/scale.py measures point 4 (all workers' CPU per message must not rise with their count by more than 15%)
in CPU time. On a machine with fewer cores than processes, CPU time also counts what sharing the cores costs:
with four workers, a front end and two clients on 2 cores, each process's work finds its caches taken by the
others, so the same instructions take more cycles (2026-11-27, four workers over one: instructions x1.02-1.06,
context switches x1.05, CPU time x1.2-1.35). This script counts what the code does instead: it serves the
16-partition queue of bench/scale.py with ``shardbus serve --workers N`` under valgrind's callgrind (the forked
workers are counted with it), warms up with our client (bench/scale.py's sending and receiving children, not
counted), zeroes the counters of the server's processes, runs bench/scale.py's "both" phase (``--count`` messages
sent and completed at once) and dumps them: each process's instructions per message, the workers summed.

callgrind runs the server about fifty times slower, so the pace differs from a real run (settlements gather more
per commit within their 20 ms linger): compare counts of this script with each other, not with bench/scale.py's
times. Counts move by about 1-2% from run to run (commits and linger deadlines fall differently); repeat for a
range. Only the server's processes are zeroed and dumped (``callgrind_control`` with their pids): without pids it
acts on every callgrind run of the machine.

What a process does by the clock, not per message (its partitions' ticks ten times a second, a front end's health
round once a second, anything polling) runs at its real rate while callgrind slows the messages some fifty-fold:
in a counted phase of 2 s for 2,000 messages (a quiet machine; 4-5 s beside other work), 1 M instructions a second
of such work reads as 1 k (2-2.5 k) instructions per message, many times its share in a real run. The phase's
length (printed) moves with the machine's load, and the counts with it: much of their spread between runs.

    python bench/workers_instructions.py [--count 2000] [--workers 1,2,4] [--base DIR]

``--base DIR``: the same for another checkout (its ``src/``), so a change is compared with its base.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scale.py

import scale

WARMUP = 2000  # messages sent and completed before the counters are zeroed: connections, links, statements


def count(workers: int, n: int, tree: Path, out: Path) -> tuple[dict[str, float], float]:
    """Instructions per message of each process of ``serve --workers workers`` (from ``tree``) over one "both",
    and the counted phase's seconds."""
    wrapper = ("valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}/cg.%p")
    serve = scale.ShardbusServe(out / "serve", ["--workers", str(workers)], tree=tree, wrapper=wrapper)
    roles: dict[int, str] = {}
    clients: list[scale.Role] = []
    try:
        sender = scale.Role("send", serve.url, scale.QUEUE, 100, tree=tree)
        receiver = scale.Role("recv", serve.url, scale.QUEUE, 100, tree=tree)
        clients = [sender, receiver]
        receiver.command(f"recv {WARMUP}")
        sender.command(f"send {WARMUP} warm")
        sender.result()
        receiver.result()
        roles = scale.process_roles(serve.proc.pid)  # the valgrind'ed server is the root: same pids
        pids = [str(pid) for pid in roles]
        subprocess.run(["callgrind_control", "--zero", *pids], check=True, capture_output=True)
        started = time.monotonic()
        receiver.command(f"recv {n}")
        sender.command(f"send {n} counted")
        sender.result()
        receiver.result()
        subprocess.run(["callgrind_control", "--dump=counted", *pids], check=True, capture_output=True)
        seconds = time.monotonic() - started
    finally:
        for client in clients:
            client.stop()
        serve.stop()
    per: dict[str, float] = {}
    for pid, role in roles.items():
        dumps = sorted(out.glob(f"cg.{pid}.*"))  # cg.PID.1: the first (only) dump, the counted phase
        if not dumps:
            raise SystemExit(f"no callgrind dump of {role} (pid {pid}) in {out}")
        totals = re.search(r"^(?:summary|totals): (\d+)", dumps[0].read_text(errors="replace"), re.MULTILINE)
        if totals is None:
            raise SystemExit(f"no totals in {dumps[0]}")
        per[role] = int(totals[1]) / n
    return per, seconds


def line(label: str, per: dict[str, float], one: float | None, seconds: float) -> str:
    workers = sum(v for r, v in per.items() if r.startswith("worker"))
    cells = ", ".join(f"{r} {v:,.0f}" for r, v in sorted(per.items()))
    factor = f"; x{workers / one:.3f} of one worker's" if one else ""
    return (
        f"  {label:<28} workers together {workers:,.0f} instructions/msg{factor}\n  {'':<28} {cells}\n"
        f"  {'':<28} counted phase {seconds:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="messages of the counted phase (default 2000)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, the first the reference (default 1,2,4)")
    parser.add_argument("--base", help="a checkout of another commit (a directory with src/)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    counts = [int(w) for w in args.workers.split(",")]
    trees = [("this", scale.ROOT)] + ([("base", Path(args.base).resolve())] if args.base else [])
    print(f'"both" of {args.count} messages, serve --workers {args.workers}, callgrind (user-space instructions)')
    for name, tree in trees:
        one: float | None = None
        for workers in counts:
            with tempfile.TemporaryDirectory(prefix="shardbus-workers-instr-") as tmp:
                per, seconds = count(workers, args.count, tree, Path(tmp))
            print(line(f"{name}: --workers {workers}", per, one, seconds), flush=True)
            if one is None:
                one = sum(v for r, v in per.items() if r.startswith("worker"))


if __name__ == "__main__":
    main()
