"""bench/scale.py --quick --no-rabbitmq runs end to end (shardbus serve and both clients as child processes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
SEVERAL = ("--senders", "2", "--receivers", "2")


def test_scale_bench_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-rabbitmq", "--brokers", "default,workers0,workers1,workers2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    # Every measured shardbus line has all three phases.
    runs = [line for line in out.splitlines() if line.startswith("run 1:")]
    assert runs, out
    for line in runs:
        assert re.search(r"send +[\d,]+ +receive +[\d,]+ +both +[\d,]+", line), line
    assert [line.split(":")[1].split("msgs/s")[0].strip() for line in runs] == [
        "shardbus serve",  # the default: exactly as a user starts it
        "shardbus serve --workers 0",
        "shardbus serve --workers 1",
        "shardbus serve --workers 2",
    ], out
    # Each process's CPU per message: the front end alone, then the front end and each worker.
    assert re.search(r"shardbus serve --workers 2 +front end \d+, worker 1 \d+, worker 2 \d+$", out, re.M), out
    assert "with a core per process at most" in out, out
    # The ratio lines are always printed: a number, or n/a with the reason (no RabbitMQ here).
    assert re.search(r"^ratio workers2/workers1: [\d.]+", out, re.M), out
    assert re.search(r"^ratio default/RabbitMQ: n/a \(--no-rabbitmq\)", out, re.M), out
    assert re.search(r"^broker CPU per message workers1/workers0: [\d.]+ in both", out, re.M), out
    assert re.search(r"^broker CPU per message, default, both: [\d,]+ us", out, re.M), out


def test_scale_bench_with_several_clients() -> None:
    """Two senders split each phase and two receivers compete for it; every message is counted once."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-rabbitmq", "--brokers", "default,workers2", *SEVERAL],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "2 sender(s), 2 receiver(s)" in done.stdout
    runs = [line for line in done.stdout.splitlines() if line.startswith("run 1:")]
    assert runs, done.stdout
    for line in runs:
        assert re.search(r"send +[\d,]+ +receive +[\d,]+ +both +[\d,]+", line), line
