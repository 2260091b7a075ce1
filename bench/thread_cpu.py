"""Where the broker's CPU per message goes in bench/scale.py's phases: the event loop's thread against the rest.

bench/scale.py gives the CPU per message of each process; this splits the default ``shardbus serve``'s (partitions
in the serving process) by thread, user and kernel time apart, for its three phases (send, receive, both at
once; the same clients, queue and messages as bench/scale.py, whose ``ShardbusServe`` and ``Role`` it uses):

    loop     the event loop's thread: AMQP, the endpoint, the partitions' in-memory work
    others   every other thread: mostly the store's commit threads (SQLite's inserts and deletes, their WAL
             writes and fsyncs), the checkpoint thread and the upkeep

Python threads carry no names the kernel knows, so the loop is told apart as the thread whose id is the process id.

    python bench/thread_cpu.py [--count N] [--rounds R] [--credit C] [--window W]

Each round prints msgs/s, the broker's and the clients' CPU per message by phase, then the split (µs per message,
user + kernel), and each group's context switches per message (voluntary: a sleep on epoll, a lock or the GIL, so
a count of wake-ups; involuntary: preempted), with the single other thread that switched most (``top``): a thread
woken far more often than its work needs shows up there (the upkeep thread woken by every commit of sends read
0.24 voluntary switches per message in "both" against the commit threads' 0.015 each). Read it as shares: the
machine's speed drifts, so compare figures of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import scale  # bench/scale.py, beside this file

TICK = os.sysconf("SC_CLK_TCK")
PHASES = ("send", "receive", "both")


def thread_times(pid: int) -> dict[str, tuple[int, int]]:
    """(user, kernel) clock ticks so far: the loop's thread and all the others summed."""
    out = {"loop": (0, 0), "others": (0, 0)}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        key = "loop" if tid == str(pid) else "others"
        user, kernel = out[key]
        out[key] = (user + int(fields[11]), kernel + int(fields[12]))
    return out


def thread_switches(pid: int) -> dict[str, tuple[int, int]]:
    """(voluntary, involuntary) context switches so far of every thread, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[tid] = (int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
    return out


def switches(pid: int, before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], n: int) -> str:
    """Per message: the loop's and the others' (voluntary/involuntary) switches, and the other thread with most."""
    delta = {t: tuple(a - b for a, b in zip(v, before.get(t, (0, 0)), strict=True)) for t, v in after.items()}
    loop = delta.pop(str(pid), (0, 0))
    others = tuple(sum(v[i] for v in delta.values()) for i in range(2))
    top = max(delta.items(), key=lambda kv: kv[1][0], default=("-", (0, 0)))
    return (
        f"switches/msg loop {loop[0] / n:.3f}/{loop[1] / n:.3f}, others {others[0] / n:.3f}/{others[1] / n:.3f},"
        f" top {top[0]} {top[1][0] / n:.3f}/{top[1][1] / n:.3f}"
    )


def split(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], n: int) -> dict[str, tuple]:
    return {
        k: tuple((after[k][i] - before[k][i]) / TICK / n * 1e6 for i in range(2))  # type: ignore[misc]
        for k in after
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000, help="messages per phase (default 20000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--credit", type=int, default=100, help="receiver credit per batch (default 100)")
    parser.add_argument("--window", type=int, default=100, help="sends in flight (default 100)")
    args = parser.parse_args()
    n = args.count
    scale.install_uvloop()
    figures: dict[str, dict[str, list[float]]] = {p: {} for p in PHASES}
    with tempfile.TemporaryDirectory(prefix="shardbus-threads-") as tmp:
        serve = scale.ShardbusServe(Path(tmp) / "serve", [])
        senders: list[scale.Role] = []
        receivers: list[scale.Role] = []
        try:
            senders.append(scale.Role("send", serve.url, scale.QUEUE, args.window))
            receivers.append(scale.Role("recv", serve.url, scale.QUEUE, args.credit))
            snd, rcv = senders[0], receivers[0]
            pid = serve.proc.pid
            for run in range(args.rounds):
                marks = [(thread_times(pid), scale.tree_cpu(pid), thread_switches(pid))]
                snd.command(f"send {n} r{run}s")
                s = snd.result()
                marks.append((thread_times(pid), scale.tree_cpu(pid), thread_switches(pid)))
                rcv.command(f"recv {n}")
                r = rcv.result()
                marks.append((thread_times(pid), scale.tree_cpu(pid), thread_switches(pid)))
                rcv.command(f"recv {n}")  # the receiver waits for the first message
                snd.command(f"send {n} r{run}b")
                s2, r2 = snd.result(), rcv.result()
                marks.append((thread_times(pid), scale.tree_cpu(pid), thread_switches(pid)))
                rates = {
                    "send": n / (s["end"] - s["start"]),
                    "receive": n / (r["end"] - r["start"]),
                    "both": n / (r2["end"] - s2["start"]),
                }
                clients = {"send": s["cpu"], "receive": r["cpu"], "both": s2["cpu"] + r2["cpu"]}
                print(f"round {run + 1}")
                for i, phase in enumerate(PHASES):
                    (t0, c0, w0), (t1, c1, w1) = marks[i], marks[i + 1]
                    parts = split(t0, t1, n)
                    broker = (c1 - c0) / n * 1e6
                    row = figures[phase]
                    for key, value in (
                        ("broker", broker),
                        ("loop", sum(parts["loop"])),
                        ("others", sum(parts["others"])),
                    ):
                        row.setdefault(key, []).append(value)
                    print(
                        f"  {phase:<8} {rates[phase]:>8,.0f} msg/s  broker {broker:5.1f} us/msg"
                        f" (loop {parts['loop'][0]:4.1f} + {parts['loop'][1]:4.1f} kernel,"
                        f" others {parts['others'][0]:4.1f} + {parts['others'][1]:4.1f} kernel)"
                        f"  clients {clients[phase] / n * 1e6:5.1f} us/msg",
                        flush=True,
                    )
                    print(f"  {'':<8} {switches(pid, w0, w1, n)}", flush=True)
        finally:
            for role in senders + receivers:
                role.stop()
            serve.stop()
    print("\nmedians over the rounds, us/msg (broker: the whole process; loop and others: user + kernel)")
    for phase in PHASES:
        row = figures[phase]
        print(f"  {phase:<8} " + "  ".join(f"{k} {statistics.median(v):5.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
