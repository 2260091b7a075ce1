"""bench/amqp.py --quick runs end to end (broker and null endpoint in child processes) and cleans up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "amqp.py"
NAMES = [
    "sdk-batch-send-100",
    "sdk-batch-send-1000",
    "sdk-receive-and-delete",
    "sdk-peek-lock-complete",
    "own-produce-unsettled",
    "own-produce-presettled",
    "own-consume-presettled",
    "own-consume-unsettled",
]


def test_amqp_bench_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "shardbus=" in line]
    assert [line.split()[0] for line in lines] == NAMES
    for line in lines:
        assert "null=" in line and "ratio=" in line and "broker_cpu=" in line


def test_amqp_bench_body_size() -> None:
    """``--body-size`` runs end to end (the null endpoint, a child process, takes it too) and is reported."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--body-size", "182", "--only", "own-produce-unsettled"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("182-byte bodies;")
    assert [line.split()[0] for line in done.stdout.splitlines() if "shardbus=" in line] == ["own-produce-unsettled"]
