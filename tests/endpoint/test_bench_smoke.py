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


def test_amqp_bench_base(tmp_path: Path) -> None:
    """``--base DIR`` serves a second broker from DIR/src (here a copy of this checkout's) beside this tree's, and
    prints both trees' lines, this tree over the base per round and, with ``--repeat``, their medians."""
    import shutil

    shutil.copytree(BENCH.parents[1] / "src" / "shardbus", tmp_path / "src" / "shardbus")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "own-produce-un", "--repeat", "2", "--base", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"base: shardbus from {tmp_path / 'src'}" in out
    assert len([line for line in out.splitlines() if line.startswith("own-produce-unsettled@base ")]) == 3  # 2, median
    assert len([line for line in out.splitlines() if line.startswith("own-produce-unsettled this/base rate")]) == 3
    bad = subprocess.run(
        [sys.executable, str(BENCH), "--base", str(tmp_path / "nothing")], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "is not a shardbus checkout" in bad.stderr
