"""bench/scale.py --quick --no-rabbitmq runs end to end (shardbus serve and both clients as child processes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"


def test_scale_bench_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-rabbitmq"],
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
    # Both ratio lines are always printed: a number, or n/a with the reason (no --workers yet, no RabbitMQ).
    assert re.search(r"^ratio workers2/workers1: (n/a \(|[\d.]+)", out, re.M), out
    assert re.search(r"^ratio shardbus\([^)]*\)/RabbitMQ: n/a \(--no-rabbitmq\)", out, re.M), out


def test_scale_bench_with_several_clients() -> None:
    """Two senders split each phase and two receivers compete for it; every message is counted once."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-rabbitmq", "--senders", "2", "--receivers", "2"],
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
