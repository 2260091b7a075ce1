"""What the default broker's event loop does per message in bench/scale.py's phases, counted, not timed.

bench/thread_cpu.py says how much CPU the loop's thread uses per message; this counts what that CPU is made of,
for the same clients, queue and messages (bench/scale.py's ``ShardbusServe`` and ``Role``):

    syscalls   ``strace -c`` attached to the loop's thread only (the thread whose id is the process id) for one
               phase: reads, writes, epoll_wait, futex (thread hand-offs), per message. strace slows the loop
               down a lot, so its rates mean nothing; the counts per message are what to read.
    io         the loop thread's read and write system calls per message (/proc/PID/task/PID/io, no tracer):
               socket reads and writes, eventfd wake-ups.
    switches   the loop thread's voluntary and involuntary context switches per message (/proc, no tracer):
               a voluntary one is a sleep in epoll_wait or on a lock, so it counts wake-ups.
    calls      with ``--count-calls module:Class.method,...``: how often the broker calls those functions per
               message, and how many items the lists they return hold (wrapped by the same ``sitecustomize``).
    gc         the broker's garbage collections per message by generation (``gc.get_stats()``, read through a
               ``sitecustomize`` put on the broker's PYTHONPATH that writes them to a file every 100 ms).

    python bench/loop_counts.py [--count N] [--rounds R] [--no-strace] [--base DIR]

``--base DIR`` runs a second broker from another checkout's ``src`` (e.g. ``git archive 7f1b7dc | tar -x -C
/tmp/base_loop``), its rounds interleaved with this tree's.
"""

from __future__ import annotations

import argparse
import ast
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import scale  # bench/scale.py, beside this file

PHASES = ("send", "receive", "both")

SITECUSTOMIZE = """
import gc, importlib, os, threading, time
_path = os.environ.get("SHARDBUS_GC_STATS")
_calls = {}
for _spec in filter(None, os.environ.get("SHARDBUS_COUNT_CALLS", "").split(",")):
    _module, _, _name = _spec.partition(":")
    _owner = importlib.import_module(_module)
    _attr = _name.split(".")
    for _part in _attr[:-1]:
        _owner = getattr(_owner, _part)
    def _wrap(fn, key):
        _calls[key] = [0, 0]
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            row = _calls[key]
            row[0] += 1
            if isinstance(out, list):
                row[1] += len(out)
            return out
        return counted
    setattr(_owner, _attr[-1], _wrap(getattr(_owner, _attr[-1]), _name))
if _path:
    def _dump():
        while True:
            stats = [(s["collections"], s["collected"]) for s in gc.get_stats()]
            stats += [tuple(_calls[k]) for k in sorted(_calls)]
            tmp = _path + ".tmp"
            with open(tmp, "w") as f:
                f.write(repr(stats))
            os.replace(tmp, _path)
            time.sleep(0.1)
    threading.Thread(target=_dump, daemon=True, name="gc-stats").start()
"""


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the loop's thread so far."""
    v = n = 0
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                v = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                n = int(line.split()[1])
    return v, n


def loop_io(pid: int) -> tuple[int, int]:
    """(read, write) system calls of the loop's thread so far (/proc/PID/task/PID/io, no tracer)."""
    out = {}
    with open(f"/proc/{pid}/task/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = int(value)
    return out["syscr"], out["syscw"]


def gc_stats(path: Path) -> list[tuple[int, int]]:
    time.sleep(0.25)  # the dumper writes every 100 ms
    return ast.literal_eval(path.read_text())


def parse_strace(text: str) -> dict[str, int]:
    """``strace -c``'s table: calls by syscall name."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] not in ("total",):
            try:
                out[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return out


def run_phase(phase: str, snd: scale.Role, rcv: scale.Role, n: int, tag: str) -> None:
    if phase == "send":
        snd.command(f"send {n} {tag}s")
        snd.result()
    elif phase == "receive":
        rcv.command(f"recv {n}")
        rcv.result()
    else:
        rcv.command(f"recv {n}")
        snd.command(f"send {n} {tag}b")
        snd.result()
        rcv.result()


def measure(
    tree: Path,
    tmp: Path,
    label: str,
    n: int,
    rounds: int,
    use_strace: bool,
    out: dict,
    pyspy: str | None = None,
    pyspy_out: str = "",
    count_calls: tuple[str, ...] = (),
) -> None:
    site = tmp / f"site-{label}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    stats_file = tmp / f"gc-{label}"
    os.environ["PYTHONPATH"] = str(site)
    os.environ["SHARDBUS_GC_STATS"] = str(stats_file)
    os.environ["SHARDBUS_COUNT_CALLS"] = ",".join(count_calls)
    counted = [spec.partition(":")[2] for spec in count_calls]
    serve = scale.ShardbusServe(tmp / f"serve-{label}", [], tree=tree)
    del os.environ["PYTHONPATH"], os.environ["SHARDBUS_GC_STATS"], os.environ["SHARDBUS_COUNT_CALLS"]
    roles: list[scale.Role] = []
    try:
        snd = scale.Role("send", serve.url, scale.QUEUE, 100)
        rcv = scale.Role("recv", serve.url, scale.QUEUE, 100)
        roles += [snd, rcv]
        pid = serve.proc.pid
        for r in range(rounds):
            for phase in PHASES:
                row = out.setdefault(label, {}).setdefault(phase, {})
                g0, s0, io0 = gc_stats(stats_file), switches(pid), loop_io(pid)
                tracer = None
                if pyspy and phase == "both":
                    tracer = subprocess.Popen(
                        [
                            pyspy,
                            "record",
                            "-p",
                            str(pid),
                            "-r",
                            "500",
                            "-f",
                            "raw",
                            "--threads",
                            "--native",
                            "--idle",
                            "-o",
                            f"{pyspy_out}-{label}-{r}.txt",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)
                elif use_strace:
                    trace_out = tmp / f"strace-{label}-{phase}-{r}"
                    tracer = subprocess.Popen(
                        ["strace", "-c", "-p", str(pid), "-o", str(trace_out)],
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(0.5)
                run_phase(phase, snd, rcv, n, f"{label}{r}")
                if tracer is not None:
                    tracer.send_signal(signal.SIGINT)
                    tracer.wait()
                s1, io1, g1 = switches(pid), loop_io(pid), gc_stats(stats_file)
                row.setdefault("vol switches", []).append((s1[0] - s0[0]) / n)
                row.setdefault("invol switches", []).append((s1[1] - s0[1]) / n)
                row.setdefault("loop reads", []).append((io1[0] - io0[0]) / n)
                row.setdefault("loop writes", []).append((io1[1] - io0[1]) / n)
                for gen in range(3):
                    row.setdefault(f"gc gen{gen}", []).append((g1[gen][0] - g0[gen][0]) / n)
                for i, name in enumerate(sorted(counted), 3):  # --count-calls: calls and listed items returned
                    row.setdefault(f"{name} calls", []).append((g1[i][0] - g0[i][0]) / n)
                    row.setdefault(f"{name} items", []).append((g1[i][1] - g0[i][1]) / n)
                if tracer is not None and not (pyspy and phase == "both"):
                    calls = parse_strace(trace_out.read_text())
                    for name, count in calls.items():
                        row.setdefault(name, []).append(count / n)
                    row.setdefault("syscalls", []).append(sum(calls.values()) / n)
                print(f"{label} {phase}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in row.items()), flush=True)
    finally:
        for role in roles:
            role.stop()
        serve.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-strace", action="store_true")
    parser.add_argument("--base", type=Path, help="another checkout, measured interleaved")
    parser.add_argument("--pyspy", help="py-spy's binary: sample the broker's threads in 'both' (then no strace)")
    parser.add_argument(
        "--count-calls",
        default="",
        help="module:Class.method,... to count in the broker (calls, and items of the lists they return)",
    )
    parser.add_argument("--pyspy-out", default="/tmp/loop-pyspy", help="prefix of py-spy's raw stack files")
    args = parser.parse_args()
    scale.install_uvloop()
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="shardbus-loopcounts-") as tmpname:
        tmp = Path(tmpname)
        trees = [("branch", scale.ROOT)] + ([("base", args.base)] if args.base else [])
        for r in range(args.rounds):
            for label, tree in trees if r % 2 == 0 else trees[::-1]:
                (tmp / f"r{r}").mkdir(exist_ok=True)
                measure(
                    tree,
                    tmp / f"r{r}",
                    label,
                    args.count,
                    1,
                    not args.no_strace,
                    out,
                    args.pyspy,
                    args.pyspy_out,
                    tuple(filter(None, args.count_calls.split(","))),
                )
    print("\nper message, medians over the rounds")
    for label, phases in out.items():
        for phase, row in phases.items():
            keys = sorted(row, key=lambda k: -statistics.median(row[k]))
            print(f"  {label:<6} {phase:<8} " + ", ".join(f"{k} {statistics.median(row[k]):.3f}" for k in keys))


if __name__ == "__main__":
    main()
