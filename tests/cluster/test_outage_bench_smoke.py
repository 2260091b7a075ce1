"""bench/outage.py --quick runs end to end: four real worker processes, one SIGKILLed under load, every message
accounted for (the bench exits 1 when an acknowledged message is missing or one is stored twice)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "outage.py"

pytestmark = pytest.mark.timeout(180)


def test_outage_bench_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    sent = re.search(r"^keyless sends +(\d+)/(\d+) succeeded \(100\.00%\)", out, re.M)
    assert sent and int(sent.group(2)) > 0, out
    errors = re.search(r"^keyed sends +\d+ succeeded; errors by partition: (.*)$", out, re.M)
    assert errors, out
    # only the killed worker's partitions refuse keyed sends, and they say so as Service Bus does
    assert set(re.findall(r"p(\d+):", errors.group(1))) <= {"0", "4", "8", "12"}, out
    assert "server-busy" in errors.group(1), out
    assert re.search(r"^recovery +partitions healthy again [\d.]+ s after the kill", out, re.M), out
    assert re.search(r"^throughput +sends \d+/s before, \d+/s during: ratio [\d.]+", out, re.M), out
    assert re.search(r"^reconcile .*lost 0, stored twice 0, completed and seen again 0;", out, re.M), out
    assert re.search(r"^result +ok$", out, re.M), out
