"""Do the broker's instructions explain its CPU time? Instructions per message (callgrind) against user CPU per
message of the very same replay run natively, next to a cache-resident Python loop's rate.

bench/amqp_instructions.py counts a path's instructions per message; this runs that path's replay (the same
recorded client bytes, the same in-process broker on a durable SQLite store) without valgrind, ``--rounds``
times with ``--batches`` batches and with none, and takes the user CPU time of the difference (``wait4``'s
rusage of the replay process: every thread, user space only, as callgrind counts). Instructions per microsecond
is then what the broker's code achieves on this machine. The same is measured for a small loop that makes
dataclass objects, dicts and 1 KB bytes and keeps almost nothing (its working set stays in the caches): the
ratio of the two rates says how much of the broker's time per instruction is waiting on memory rather than
executing (no hardware counters on this VM: ``perf stat -e instructions`` is not supported).

    python bench/loop_ipc.py [--path peek-lock-ranges] [--batches 60] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import amqp_instructions as ai  # bench/amqp_instructions.py, beside this file

CALIBRATION = """
import sys
from dataclasses import dataclass

@dataclass
class M:
    a: int
    b: bytes
    c: dict

out = []
for i in range(int(sys.argv[1])):
    m = M(i, b"x" * 1024, {"k": i})
    out.append((m.a, len(m.b), dict(m.c)))
    if len(out) > 1000:
        out.clear()
"""


def user_seconds(command: list[str]) -> float:
    """User CPU seconds of a child process (all its threads)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{command} failed: {status}")
    return usage.ru_utime


def count(command: list[str]) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    return int(out.split("Collected : ")[1].split()[0])


def rate(name: str, full: list[str], empty: list[str], units: int, rounds: int) -> float:
    instructions = (count(full) - count(empty)) / units
    times = []
    for _ in range(rounds):  # interleaved, so that drift hits both
        times.append((user_seconds(full) - user_seconds(empty)) / units * 1e6)
    us = statistics.median(times)
    per_us = instructions / us
    print(
        f"{name}: {instructions:,.0f} instructions per unit, user CPU {us:.2f} us per unit"
        f" ({min(times):.2f}-{max(times):.2f}) => {per_us:,.0f} instructions per us",
        flush=True,
    )
    return per_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=ai.PATHS, default="peek-lock-ranges")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    src = ai.HERE.parents[1] / "src"
    sys.path.insert(0, str(src))
    with tempfile.TemporaryDirectory(prefix="shardbus-ipc-") as tmp:
        calibration = Path(tmp) / "calibration.py"
        calibration.write_text(CALIBRATION)
        loop = [sys.executable, str(calibration)]
        small = rate("cache-resident loop", [*loop, "200000"], [*loop, "0"], 200000, args.rounds)
        recording = os.path.join(tmp, "client.bin")
        asyncio.run(ai.record(recording, args.path, args.batches))
        replay = [sys.executable, str(ai.HERE), "--replay", recording, "--src", str(src), "--batches"]
        size = ai.BATCH if args.path == "produce" else ai.CONSUME_BATCH
        broker = rate(
            f"broker {args.path}", [*replay, str(args.batches)], [*replay, "0"], args.batches * size, args.rounds
        )
    print(f"broker / cache-resident loop, instructions per us: {broker / small:.2f}")


if __name__ == "__main__":
    main()
