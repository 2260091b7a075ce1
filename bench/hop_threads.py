"""Where the hop to a worker costs: the broker's CPU per message in bench/scale.py's "both" phase, by process and
thread, for ``--workers 0`` and ``--workers 1`` (and the same from a base checkout), interleaved round by round.

bench/scale.py gives each process's CPU per message; this splits each process by thread (``/proc/PID/task``, user +
kernel): the serving loop (the thread whose id is the process id), and every other thread by its CPU, busiest
first (with ``--workers 1`` the front end's busiest other thread is its cluster client's loop, the worker's are its
store threads). Same clients, queue and messages as bench/scale.py (its ``ShardbusServe`` and ``Role``).

    python bench/hop_threads.py [--count N] [--rounds R] [--base DIR] [--modes workers0,workers1]
                                [--phase both|receive|send] [--kernel]

``--phase receive`` measures bench/scale.py's "receive" phase instead (the N messages sent first, unmeasured, then
received and completed from that backlog); ``--phase send`` its "send" phase alone. ``--kernel`` counts only
the kernel's share of each thread's CPU (system time: sockets, futexes, the store's I/O) instead of user + kernel.

Read it as shares and as differences within one run: the machine's speed drifts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import scale  # bench/scale.py, beside this file

TICK = os.sysconf("SC_CLK_TCK")


KERNEL_ONLY = False  # --kernel: system time alone


def threads(pid: int) -> dict[int, float]:
    """CPU seconds (user + kernel, or kernel alone with ``--kernel``) of each thread of ``pid`` so far."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = ((0 if KERNEL_ONLY else int(fields[11])) + int(fields[12])) / TICK
    return out


def snapshot(root: int) -> dict[int, dict[int, float]]:
    return {pid: threads(pid) for pid in scale.process_cpu(root)}


def split(before: dict[int, dict[int, float]], after: dict[int, dict[int, float]], roles: dict[int, str], n: int):
    """µs per message by process role: (loop, [other threads, busiest first])."""
    out = {}
    for pid, now in after.items():
        was = before.get(pid, {})
        per = {tid: (cpu - was.get(tid, 0.0)) / n * 1e6 for tid, cpu in now.items()}
        loop = per.pop(pid, 0.0)
        out[roles.get(pid, str(pid))] = (loop, sorted(per.values(), reverse=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="workers0,workers1")
    parser.add_argument("--base", type=Path, default=None, help="a checkout to serve the same modes from")
    parser.add_argument("--phase", choices=("both", "receive", "send"), default="both", help="the phase measured")
    parser.add_argument("--kernel", action="store_true", help="the kernel's share of each thread (system time)")
    args = parser.parse_args()
    global KERNEL_ONLY
    KERNEL_ONLY = args.kernel
    n = args.count
    scale.install_uvloop()
    flags = {"workers0": ["--workers", "0"], "workers1": ["--workers", "1"], "workers2": ["--workers", "2"]}
    kinds = [(m, scale.ROOT) for m in args.modes.split(",")]
    if args.base is not None:
        kinds += [(m, args.base.resolve()) for m, _ in list(kinds)]
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shardbus-hop-") as tmp:
        for run in range(args.rounds):
            for i, (mode, tree) in enumerate(kinds):
                name = mode + ("" if tree == scale.ROOT else "@base")
                serve = scale.ShardbusServe(Path(tmp) / f"{name}-{run}-{i}", flags[mode], tree=tree)
                snd = rcv = None
                try:
                    snd = scale.Role("send", serve.url, scale.QUEUE, 100)
                    rcv = scale.Role("recv", serve.url, scale.QUEUE, 100)
                    for tag, count in (("w", 2000), ("b", n)):  # a warm-up, then the measured phase
                        if args.phase == "receive":  # the backlog, sent before the measured receive
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        roles = scale.process_roles(serve.proc.pid)
                        before = snapshot(serve.proc.pid)
                        total0 = scale.tree_cpu(serve.proc.pid)
                        if args.phase != "send":
                            rcv.command(f"recv {count}")
                        if args.phase != "receive":
                            snd.command(f"send {count} r{run}{tag}")
                            snd.result()
                        if args.phase != "send":
                            rcv.result()
                        after = snapshot(serve.proc.pid)
                        total = (scale.tree_cpu(serve.proc.pid) - total0) / count * 1e6
                    parts = split(before, after, roles, n)
                finally:
                    for role in (snd, rcv):
                        if role is not None:
                            role.stop()
                    serve.stop()
                row = figures.setdefault(name, {})
                row.setdefault("broker", []).append(total)
                text = []
                for role, (loop, others) in sorted(parts.items()):
                    row.setdefault(f"{role} loop", []).append(loop)
                    row.setdefault(f"{role} others", []).append(sum(others))
                    for k, v in enumerate(others[:2]):
                        row.setdefault(f"{role} thread{k + 1}", []).append(v)
                    busiest = ", ".join(f"{v:.1f}" for v in others[:4])
                    text.append(f"{role}: loop {loop:.1f}, others {sum(others):.1f} ({busiest})")
                print(f"round {run + 1} {name:<14} broker {total:5.1f} us/msg  " + "; ".join(text), flush=True)
    what = "kernel (system) time" if args.kernel else "CPU"
    print(f"\nmedians (min-max) over the rounds, us/msg in {args.phase}; threads' {what}, broker's total CPU")
    for name, row in figures.items():
        print(f"  {name}")
        for key, values in row.items():
            print(f"    {key:<24} {statistics.median(values):6.1f} ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
