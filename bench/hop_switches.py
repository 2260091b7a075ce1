"""Thread hand-offs of the hop: context switches (and, ``--syscalls``, system calls) per message of each process
of ``shardbus serve``, in bench/scale.py's "both" phase (or ``--phase receive|send``), modes and trees interleaved.

bench/hop_threads.py splits a phase's CPU by thread; this counts what makes threads sleep and wake: each thread's
voluntary context switches (it blocked: a futex such as the GIL or a pool's queue, epoll, an fsync) and
involuntary ones (preempted) from ``/proc/PID/task/TID/status``, the event loop (the thread whose id is the
process id) apart from the other threads. ``--syscalls`` also runs ``perf trace -s`` on every server process
during the measured phase and prints its calls per message by name (futex, epoll_pwait, read, writev, fdatasync,
pwrite64...): far less intrusive than ``strace -f -c``, whose stops multiply the GIL's hand-offs (a worker's futex
calls read about ten times what they are), but it still slows the processes: take CPU from a run without it.
Counts, not times: the machine's load moves them little.

    python bench/hop_switches.py [--count N] [--rounds R] [--modes workers0,workers1,workers4] [--base DIR]
                                 [--phase both|receive|send] [--syscalls]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import scale  # bench/scale.py, beside this file

SYSCALLS = ("futex", "epoll_pwait", "read", "write", "writev", "sendmsg", "recvfrom", "fdatasync", "pwrite64")


def switches(pid: int) -> dict[int, tuple[int, int]]:
    """(voluntary, involuntary) context switches so far of each live thread of ``pid``."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"]))
    return out


def perf_trace_counts(path: Path) -> dict[str, int]:
    """System calls by name, summed over the threads of a ``perf trace -s`` summary."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        match = re.match(r"\s+([a-z_0-9]+)\s+(\d+)\s+\d+\s+[\d.]+", line)
        if match:
            counts[match[1]] = counts.get(match[1], 0) + int(match[2])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="workers0,workers1")
    parser.add_argument("--base", type=Path, default=None, help="a checkout to serve the same modes from")
    parser.add_argument("--phase", choices=("both", "receive", "send"), default="both", help="the phase measured")
    parser.add_argument("--syscalls", action="store_true", help="count system calls with perf trace -s too")
    args = parser.parse_args()
    if args.syscalls and shutil.which("perf") is None:
        parser.error("--syscalls needs perf (linux-tools)")
    n = args.count
    scale.install_uvloop()
    kinds = [(m, scale.ROOT) for m in args.modes.split(",")]
    if args.base is not None:
        kinds += [(m, args.base.resolve()) for m, _ in list(kinds)]
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shardbus-switches-") as tmp:
        for run in range(args.rounds):
            # every other round in reverse order, as bench/scale.py does: a tree served first in every round read
            # about 5% more CPU than the same code served after it (identical --workers 0 in both trees)
            for i, (mode, tree) in enumerate(kinds if run % 2 == 0 else kinds[::-1]):
                name = mode + ("" if tree == scale.ROOT else "@base")
                flags = ["--workers", mode.removeprefix("workers")]
                serve = scale.ShardbusServe(Path(tmp) / f"{name}-{run}-{i}", flags, tree=tree)
                snd = rcv = None
                tracers: list[tuple[int, Path, subprocess.Popen[bytes]]] = []
                try:
                    snd = scale.Role("send", serve.url, scale.QUEUE, 100)
                    rcv = scale.Role("recv", serve.url, scale.QUEUE, 100)
                    for tag, count in (("w", 2000), ("b", n)):  # a warm-up, then the measured phase
                        if args.phase == "receive":  # the backlog, sent before the measured receive
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        roles = scale.process_roles(serve.proc.pid)
                        if args.syscalls and tag == "b":
                            for pid in roles:
                                out = Path(tmp) / f"trace-{name}-{run}-{pid}"
                                command = ["perf", "trace", "-s", "-o", str(out), "-p", str(pid)]
                                tracers.append((pid, out, subprocess.Popen(command, stderr=subprocess.DEVNULL)))
                            time.sleep(1.0)  # attached before the phase starts
                        before = {pid: switches(pid) for pid in roles}
                        cpu0 = scale.process_cpu(serve.proc.pid)
                        if args.phase != "send":
                            rcv.command(f"recv {count}")
                        if args.phase != "receive":
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        if args.phase != "send":
                            rcv.result()
                        after = {pid: switches(pid) for pid in roles}
                        cpu1 = scale.process_cpu(serve.proc.pid)
                    for _, _, proc in tracers:
                        proc.send_signal(2)  # perf trace writes its summary on SIGINT
                        proc.wait(30)
                    row = figures.setdefault(name, {})
                    text = []
                    for pid, role in sorted(roles.items(), key=lambda r: r[1]):
                        was = before[pid]
                        per = {
                            tid: (v - was.get(tid, (0, 0))[0], c - was.get(tid, (0, 0))[1])
                            for tid, (v, c) in after[pid].items()
                        }
                        loop = per.pop(pid, (0, 0))
                        others = (sum(v for v, _ in per.values()), sum(c for _, c in per.values()))
                        cpu = (cpu1.get(pid, 0.0) - cpu0.get(pid, 0.0)) / n * 1e6
                        values = {
                            "cpu us": cpu,
                            "loop vol": loop[0] / n,
                            "loop invol": loop[1] / n,
                            "others vol": others[0] / n,
                            "others invol": others[1] / n,
                        }
                        for key, value in values.items():
                            row.setdefault(f"{role} {key}", []).append(value)
                        text.append(
                            f"{role}: cpu {cpu:.1f} us, switches loop {loop[0] / n:.3f}+{loop[1] / n:.3f}, "
                            f"others {others[0] / n:.3f}+{others[1] / n:.3f}"
                        )
                    for pid, out, _ in tracers:
                        calls = perf_trace_counts(out)
                        for call in SYSCALLS:
                            if call in calls:
                                row.setdefault(f"{roles[pid]} {call}", []).append(calls[call] / n)
                    print(f"round {run + 1} {name:<14} " + "; ".join(text), flush=True)
                finally:
                    for _, _, proc in tracers:
                        if proc.poll() is None:
                            proc.kill()
                    for role_proc in (snd, rcv):
                        if role_proc is not None:
                            role_proc.stop()
                    serve.stop()
    print(f"\nmedians (min-max) over the rounds, per message in {args.phase}: CPU (us), context switches")
    print(
        "(voluntary, involuntary) of the event loop and of the other threads"
        + (", system calls" if args.syscalls else "")
    )
    for name, row in figures.items():
        print(f"  {name}")
        for key, values in row.items():
            print(f"    {key:<28} {statistics.median(values):8.3f} ({min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
