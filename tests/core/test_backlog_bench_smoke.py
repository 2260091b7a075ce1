"""bench/backlog.py --quick runs end to end (a broker child process, the SDK, a restart on a backlog) and reports
every figure issue 25 asks for."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "backlog.py"


def test_backlog_bench_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    sizes = re.findall(
        r"^queued=([\d,]+) rss=[\d,]+ MB restart: port=[\d.]+ s \(broker's own [\d.]+ s\) first_delivery=[\d.]+ s "
        r".* disk=[\d,]+ MB$",
        out,
        re.M,
    )
    assert sizes == ["0", "20,000"], out
    assert len(re.findall(r"^  rate empty=[\d,]+ msg/s .* full=[\d,]+ msg/s .* ratio=[\d.]+$", out, re.M)) == 2, out
