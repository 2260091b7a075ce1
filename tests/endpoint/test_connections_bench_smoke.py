"""bench/connections.py at CI size: 500 idle AMQP connections (a session and a sender link each) from two holder
processes against a ``shardbus serve`` child, a probe client's send + receive round trips beside them, and the
broker's memory per idle connection printed. Timing is the bench's to judge (never asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "connections.py"


def test_connections_bench_at_ci_size() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--connections", "500", "--processes", "2", "--probes", "100", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "opened     500/500 idle connections" in out, out
    assert re.search(r"^baseline   p50=[\d.]+ ms  p99=[\d.]+ ms", out, re.M), out
    assert re.search(r"^loaded     p99 median=[\d.]+ ms", out, re.M), out
    assert re.search(r"^memory     broker_rss=[\d.]+ MiB with 500 idle connections: -?[\d.]+ KiB per idle", out, re.M)
