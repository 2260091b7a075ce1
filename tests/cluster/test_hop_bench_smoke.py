"""The hop to a worker's benches (bench/hop_micro.py, hop_threads.py, hop_counts.py) run end to end on a few
messages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_hop_micro_compares_a_local_and_a_remote_partition() -> None:
    out = _run(str(BENCH / "hop_micro.py"), "--messages", "400", "--rounds", "1")
    for line in ("this local", "this remote", "this remote/local"):
        assert re.search(rf"^  {line} +[\d.]+ \(", out, re.M), out


def test_hop_threads_splits_both_by_process_and_thread() -> None:
    out = _run(str(BENCH / "hop_threads.py"), "--count", "300", "--rounds", "1")
    assert re.search(
        r"^round 1 workers1 +broker +[\d.]+ us/msg +front end: loop [\d.]+, others .*worker 1: loop", out, re.M
    ), out
    for key in (
        "front end loop",
        "worker 1 loop",
        "worker 1 others",
        "worker 1 loop switches",
        "front end others preempted",
    ):
        assert re.search(rf"^    {key} +[\d.]+", out, re.M), out


def test_hop_threads_splits_the_receive_phase() -> None:
    out = _run(
        str(BENCH / "hop_threads.py"), "--count", "300", "--rounds", "1", "--modes", "workers1", "--phase", "receive"
    )
    assert "us/msg in receive" in out, out
    assert re.search(r"^    worker 1 others +[\d.]+", out, re.M), out


def test_hop_threads_kernel_share() -> None:
    out = _run(str(BENCH / "hop_threads.py"), "--count", "300", "--rounds", "1", "--modes", "workers1", "--kernel")
    assert "threads' kernel (system) time" in out, out
    assert re.search(r"^    worker 1 loop +[\d.]+", out, re.M), out


def test_hop_counts_counts_requests_by_operation() -> None:
    out = _run(str(BENCH / "hop_counts.py"), "--count", "500", "--rounds", "1")
    # every message sent crosses in some enqueue and comes back from some lock request
    for key in ("request enqueue /msg", "request lock_messages /msg", "request complete /msg", "frame reply /msg"):
        assert re.search(rf"^    {key} +0\.\d+ \(", out, re.M), out
    got = re.search(r"^    lock: got /request +([\d.]+)", out, re.M)
    assert got is not None and float(got.group(1)) >= 1, out
    tokens = re.search(r"^    complete: tokens /request +([\d.]+)", out, re.M)
    assert tokens is not None and float(tokens.group(1)) >= 1, out
