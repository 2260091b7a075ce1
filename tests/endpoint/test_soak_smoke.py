"""bench/soak.py runs for a minute against a real ``shardbus serve`` and reconciles every message id cleanly
(with SHARDBUS_TEST_WORKERS=N, the broker runs its partitions in N worker processes), with a young broker beside it
(``--control``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
WORKERS = os.environ.get("SHARDBUS_TEST_WORKERS", "0")


def test_soak_one_minute() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--minutes", "1", "--interval", "15", "--workers", WORKERS, "--control"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    assert "reconcile: clean (0 lost, 0 unexplained duplicates, 0 misrouted)" in out, out[-4000:]
    assert "PROBLEM" not in out
    intervals = [line for line in out.splitlines() if re.match(r"^\s+[\d.]+m\s+\d+\s+\d+\s+[\d.]+\s+\d+\s", line)]
    assert len(intervals) == 4, out  # one line per 15 s: sent, settled, RSS, descriptors, latencies
    acknowledged = int(next(line for line in out.splitlines() if "reconcile: acknowledged:" in line).split()[-1])
    assert acknowledged > 1000, out  # the load ran (40 msg/s to one queue, more elsewhere)
    for plan in ("abandon-always", "abandon-once", "dead-letter", "defer", "scheduled", "cancelled"):
        assert f"soak-q {plan}: as planned:" in out, plan
    for entity in ("soak-s session", "soak-t red", "soak-t blue", "soak-t green", "soak-ttl ttl"):
        assert f"{entity}: as planned:" in out, entity
    assert "ttl: expired into the dead-letter queue:" in out
    # --control: a young broker beside it, under the same load, restarted every interval
    assert "flatness against a young broker: send_p50: old/young" in out, out[-4000:]
