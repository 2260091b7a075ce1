"""Where the hop to a worker costs: the broker's CPU per message in bench/scale.py's "both" phase, by process and
thread, for ``--workers 0`` and ``--workers 1`` (and the same from a base checkout), interleaved round by round,
with each thread's context switches and, ``--syscalls``, each process's system calls.

bench/scale.py gives each process's CPU per message; this splits each process by thread (``/proc/PID/task``, user +
kernel): the serving loop (the thread whose id is the process id), and every other thread by its CPU, busiest
first (with ``--workers 1`` the front end's busiest other thread is its cluster client's loop, the worker's are its
store threads). Same clients, queue and messages as bench/scale.py (its ``ShardbusServe`` and ``Role``).

What makes threads sleep and wake is counted beside it: each thread's voluntary context switches (it blocked: a
futex such as the GIL or a pool's queue, epoll, an fsync) and involuntary ones (preempted), from
``/proc/PID/task/TID/status``, the loop apart from the other threads. ``--syscalls`` also runs ``perf trace -s`` on
every server process during the measured phase and prints its calls per message by name (futex, epoll_pwait, read,
writev, fdatasync, pwrite64...): far less intrusive than ``strace -f -c``, whose stops multiply the GIL's hand-offs
(a worker's futex calls read about ten times what they are), but it still slows the processes: take CPU from a
run without it. Counts, not times: the machine's load moves them little.

    python bench/hop_threads.py [--count N] [--rounds R] [--base DIR] [--modes workers0,workers1,workers4]
                                [--phase both|receive|send] [--kernel] [--syscalls]

``--phase receive`` measures bench/scale.py's "receive" phase instead (the N messages sent first, unmeasured, then
received and completed from that backlog); ``--phase send`` its "send" phase alone. ``--kernel`` counts only
the kernel's share of each thread's CPU (system time: sockets, futexes, the store's I/O) instead of user + kernel.
Every other round runs the modes in reverse order, as bench/scale.py does: a tree served first in every round read
about 5% more CPU than the same code served after it.

Read it as shares and as differences within one run: the machine's speed drifts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import scale  # bench/scale.py, beside this file

TICK = os.sysconf("SC_CLK_TCK")
SYSCALLS = ("futex", "epoll_pwait", "read", "write", "writev", "sendmsg", "recvfrom", "fdatasync", "pwrite64")

KERNEL_ONLY = False  # --kernel: system time alone


def threads(pid: int) -> dict[int, tuple[float, int, int]]:
    """Each live thread of ``pid`` so far: (CPU seconds, user + kernel or kernel alone with ``--kernel``;
    voluntary and involuntary context switches)."""
    out: dict[int, tuple[float, int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = ((0 if KERNEL_ONLY else int(fields[11])) + int(fields[12])) / TICK
        out[int(tid)] = (cpu, int(switches["voluntary_ctxt_switches"]), int(switches["nonvoluntary_ctxt_switches"]))
    return out


def snapshot(root: int) -> dict[int, dict[int, tuple[float, int, int]]]:
    return {pid: threads(pid) for pid in scale.process_cpu(root)}


def split(before: dict, after: dict, roles: dict[int, str], n: int) -> dict[str, tuple]:
    """Per message by process role: (loop µs, [other threads' µs, busiest first], loop switches (voluntary,
    involuntary), other threads' switches (voluntary, involuntary))."""
    out = {}
    for pid, now in after.items():
        was = before.get(pid, {})
        per = {tid: tuple(v - w for v, w in zip(now[tid], was.get(tid, (0.0, 0, 0)), strict=True)) for tid in now}
        loop = per.pop(pid, (0.0, 0, 0))
        others = sorted((cpu / n * 1e6 for cpu, _, _ in per.values()), reverse=True)
        out[roles.get(pid, str(pid))] = (
            loop[0] / n * 1e6,
            others,
            (loop[1] / n, loop[2] / n),
            (sum(v for _, v, _ in per.values()) / n, sum(c for _, _, c in per.values()) / n),
        )
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
    parser.add_argument("--kernel", action="store_true", help="the kernel's share of each thread (system time)")
    parser.add_argument("--syscalls", action="store_true", help="count system calls with perf trace -s too")
    args = parser.parse_args()
    if args.syscalls and shutil.which("perf") is None:
        parser.error("--syscalls needs perf (linux-tools)")
    global KERNEL_ONLY
    KERNEL_ONLY = args.kernel
    n = args.count
    scale.install_uvloop()
    kinds = [(m, scale.ROOT) for m in args.modes.split(",")]
    if args.base is not None:
        kinds += [(m, args.base.resolve()) for m, _ in list(kinds)]
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="shardbus-hop-") as tmp:
        for run in range(args.rounds):
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
                    for _, _, proc in tracers:
                        proc.send_signal(signal.SIGINT)  # perf trace writes its summary on it
                        proc.wait(30)
                    parts = split(before, after, roles, n)
                    calls = {pid: perf_trace_counts(out) for pid, out, _ in tracers}
                finally:
                    for _, _, proc in tracers:
                        if proc.poll() is None:
                            proc.kill()
                    for role in (snd, rcv):
                        if role is not None:
                            role.stop()
                    serve.stop()
                row = figures.setdefault(name, {})
                row.setdefault("broker", []).append(total)
                text = []
                for role, (loop, others, loop_sw, others_sw) in sorted(parts.items()):
                    row.setdefault(f"{role} loop", []).append(loop)
                    row.setdefault(f"{role} others", []).append(sum(others))
                    for k, v in enumerate(others[:2]):
                        row.setdefault(f"{role} thread{k + 1}", []).append(v)
                    row.setdefault(f"{role} loop switches", []).append(loop_sw[0])
                    row.setdefault(f"{role} loop preempted", []).append(loop_sw[1])
                    row.setdefault(f"{role} others switches", []).append(others_sw[0])
                    row.setdefault(f"{role} others preempted", []).append(others_sw[1])
                    busiest = ", ".join(f"{v:.1f}" for v in others[:4])
                    text.append(
                        f"{role}: loop {loop:.1f}, others {sum(others):.1f} ({busiest}); switches loop "
                        f"{loop_sw[0]:.3f}+{loop_sw[1]:.3f}, others {others_sw[0]:.3f}+{others_sw[1]:.3f}"
                    )
                for pid, counted in calls.items():
                    for call in SYSCALLS:
                        if call in counted:
                            row.setdefault(f"{roles[pid]} {call}", []).append(counted[call] / n)
                print(f"round {run + 1} {name:<14} broker {total:5.1f} us/msg  " + "; ".join(text), flush=True)
    what = "kernel (system) time" if args.kernel else "CPU"
    print(f"\nmedians (min-max) over the rounds, us/msg in {args.phase}; threads' {what}, broker's total CPU; per")
    print("message: context switches of the loop and of the other threads (voluntary: 'switches', involuntary:")
    print("'preempted')" + (", system calls" if args.syscalls else ""))
    for name, row in figures.items():
        print(f"  {name}")
        for key, values in row.items():
            print(f"    {key:<28} {statistics.median(values):8.3f} ({min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
