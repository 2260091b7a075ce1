"""bench/soak.py's statistics, pure: the p99's confidence interval, the machine's p99 drift weighed by the samples
behind each probe, the verdicts (a broker whose tail moves still reads MOVED), and the receive side of the stall
report."""

from __future__ import annotations

import importlib.util
import os
import random
import re
import sys
import time
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
pytest.importorskip("azure.servicebus")
_spec = importlib.util.spec_from_file_location("soak_bench", _PATH)
assert _spec is not None and _spec.loader is not None
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak_bench"] = soak
_spec.loader.exec_module(soak)


def test_the_p99_interval_narrows_with_samples_and_holds_the_truth() -> None:
    rng = random.Random(7)
    widths = []
    for n in (3_000, 30_000):
        covered = 0
        for _ in range(40):
            values = [rng.expovariate(1.0) for _ in range(n)]
            low, high = soak._pct_ci(values, 0.99)
            covered += low <= 4.60517 <= high  # the exponential's true p99: ln(100)
        widths.append(high / low)
        assert covered >= 34  # ~95% of 40
    assert widths[1] < widths[0]


def _row(send_p99: float, machine: float, rng: random.Random) -> dict:
    """An interval whose broker send p99 is ``send_p99`` and whose machine is ``machine`` times slower."""
    sqlite = [rng.expovariate(1.0) * machine for _ in range(3_000)]
    echo = [rng.expovariate(10.0) * machine for _ in range(30_000)]
    row = {"rss": 50.0, "fds": 40, "n_send": 5_000, "n_recv": 5_000, "n_settle": 5_000}
    for name, p50, p99 in (("send", 2.0, send_p99), ("recv", 3.0, 11.0), ("settle", 1.0, 1.7)):
        row[f"{name}_p50"], row[f"{name}_p99"] = p50 * machine, p99
        row[f"{name}_p99_ci"] = (p99 * 0.97, p99 * 1.03)
    for name, values in (("sqlite", sqlite), ("echo", echo)):
        row[name], row[f"{name}_p99"] = soak._pct(values, 0.5), soak._pct(values, 0.99)
        row[f"{name}_p99_ci"] = soak._pct_ci(values, 0.99)
    return row


def test_a_moved_tail_still_reads_moved_and_a_slower_machine_does_not() -> None:
    rng = random.Random(3)
    moved = dict(soak.flatness([_row(p99, 1.0, rng) for p99 in (5.5, 5.6, 6.6, 5.5)]))
    assert "MOVED" in moved["send_p99"]
    assert "95% intervals allow" in moved["send_p99"]
    assert "machine p99 drift" in moved
    followed = dict(soak.flatness([_row(5.5 * m, m, rng) for m in (1.0, 1.0, 1.25, 1.0)]))
    assert "follows the machine" in followed["send_p99"], followed["send_p99"]


def test_the_receive_report_splits_the_send_from_the_delivery() -> None:
    # (due, received, what, acked, asked): one waited behind a busy consumer, one was late with it waiting
    slow = [(0.0, 0.020, "soak-q x5", 0.004, 0.015), (1.0, 1.018, "soak-q x1", 1.003, 0.9)]
    sample = [(2.0, 2.006, "soak-q x1", 2.003, 1.9), (3.0, 3.002, "soak-q x1", 0.0, 2.9)]
    lines = soak._receive_report(slow, sample)
    assert "50% with the consumer busy" in lines[0] and "50% with it waiting" in lines[0]
    assert "50% received before their send returned" in lines[1]
    assert any("'soak-q x5'" in line for line in lines)


def test_the_disk_yardstick_keeps_each_intervals_worst_second(tmp_path: Path) -> None:
    disk = soak.Disk(tmp_path, period=0.05)
    if disk._read() == (None, None):
        pytest.skip("neither /proc/diskstats for this device nor /proc/pressure/io here")
    disk.start()
    try:
        for _ in range(10):  # writes and flushes of our own, so the device has requests to time
            fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            os.close(fd)
            time.sleep(0.03)
    finally:
        disk.close()
    awaited, stalled = disk.take()
    assert awaited >= 0 or stalled >= 0  # at least one measured (nan compares false)
    assert all(v != v for v in disk.take())  # a new interval starts with nothing measured


def _disk_row(send_p99: float, disk: float, io: float, rng: random.Random) -> dict:
    """An interval as ``_row`` on a steady machine, with the disk probe's syncs ``disk`` times slower and the
    broker's own I/O ``io`` times its usual."""
    row = _row(send_p99, 1.0, rng)
    syncs = [0.4 + rng.expovariate(2.0) * disk for _ in range(15_000)]
    row["dsync"], row["dsync_p99"] = soak._pct(syncs, 0.5), soak._pct(syncs, 0.99)
    row["dsync_p99_ci"] = soak._pct_ci(syncs, 0.99)
    row["io_write"], row["io_syscw"], row["io_fsyncs"] = 4e6 * io, 1_600.0 * io, 70.0 * io
    return row


def test_a_tail_that_rose_with_the_disk_follows_the_machine_while_the_broker_wrote_the_same() -> None:
    rng = random.Random(11)
    verdicts = dict(soak.flatness([_disk_row(p99, d, 1.0, rng) for p99, d in ((5.5, 1.0), (5.6, 1.0), (6.2, 1.15),
                                                                              (5.5, 1.0))]))  # fmt: skip
    assert "broker io" in verdicts and "(flat)" in verdicts["broker io"], verdicts["broker io"]
    assert "in the drift of send and receive p99" in verdicts["disk drift"], verdicts["disk drift"]
    assert "follows the machine" in verdicts["send_p99"], verdicts["send_p99"]
    assert "and the disk's" in verdicts["send_p99"]
    # a complete does not wait for the disk: its p99 is judged against the probes alone
    assert "and the disk's" not in verdicts["settle_p99"]


def test_the_disk_does_not_excuse_a_tail_while_the_brokers_own_io_moved() -> None:
    # the same disk and send p99s, but the broker wrote 30% more in the slow interval: its writes may be what
    # slowed the disk, so the disk is not let into the drift
    rng = random.Random(11)
    rows = [_disk_row(p99, d, io, rng) for p99, d, io in ((5.5, 1.0, 1.0), (5.6, 1.0, 1.0), (6.2, 1.15, 1.3),
                                                           (5.5, 1.0, 1.0))]  # fmt: skip
    verdicts = dict(soak.flatness(rows))
    assert "MOVED" in verdicts["broker io"], verdicts["broker io"]
    assert "not in the drift" in verdicts["disk drift"]
    assert "MOVED" in verdicts["send_p99"], verdicts["send_p99"]


def test_a_tail_that_moved_with_the_disk_flat_still_reads_moved() -> None:
    # the broker's own degradation: its send p99 rises 1.2x in one interval while the disk and its I/O stay put
    rng = random.Random(5)
    rows = [_disk_row(p99, 1.0, 1.0, rng) for p99 in (5.5, 5.6, 6.6, 5.5)]
    verdicts = dict(soak.flatness(rows))
    assert verdicts["disk drift"].startswith("1.00, 1.00, 1.00, 1.00 "), verdicts["disk drift"]
    assert "MOVED" in verdicts["send_p99"], verdicts["send_p99"]
    # a disk within its noise changes nothing: the same net spread as without the probe
    bare = dict(soak.flatness([{k: v for k, v in r.items() if not k.startswith(("dsync", "io_"))} for r in rows]))
    net = [re.search(r"([\d.]+)x net", v["send_p99"]).group(1) for v in (verdicts, bare)]  # type: ignore[union-attr]
    assert net[0] == net[1], net


def _cpu_row(recv_p50: float, cpu: float, rng: random.Random) -> dict:
    """An interval as ``_row`` on a steady machine (commit and echo probes as usual), with the CPU probe's work
    ``cpu`` times slower and the receive p50 ``recv_p50``."""
    row = _row(5.5, 1.0, rng)
    work = [0.15 * cpu * (1 + 0.1 * rng.random()) for _ in range(15_000)]
    row["cpu"], row["cpu_p99"] = soak._pct(work, 0.5), soak._pct(work, 0.99)
    row["cpu_p99_ci"] = soak._pct_ci(work, 0.99)
    row["recv_p50"] = recv_p50
    return row


def test_a_p50_that_rose_with_the_cpu_probe_follows_the_machine_and_says_what_the_other_probes_said() -> None:
    rng = random.Random(13)
    verdicts = dict(soak.flatness([_cpu_row(p50, c, rng) for p50, c in ((2.5, 1.0), (2.5, 1.0), (2.9, 1.3),
                                                                         (2.5, 1.0))]))  # fmt: skip
    assert "follows the machine" in verdicts["recv_p50"], verdicts["recv_p50"]
    assert "net of the SQLite and echo probes' alone" in verdicts["recv_p50"], verdicts["recv_p50"]
    assert "machine's probe" in verdicts["cpu"]


def test_a_p50_that_moved_with_every_probe_flat_still_reads_moved() -> None:
    rng = random.Random(17)
    verdicts = dict(soak.flatness([_cpu_row(p50, 1.0, rng) for p50 in (2.5, 2.5, 2.9, 2.5)]))
    assert "MOVED" in verdicts["recv_p50"], verdicts["recv_p50"]


def test_runs_are_judged_together_by_their_median_and_a_growth_with_uptime_shows_in_the_trend() -> None:
    rng = random.Random(13)
    runs = []
    for p99s in ((5.5, 5.6, 5.5, 5.7), (5.5, 5.5, 7.0, 5.6), (5.5, 5.6, 5.6, 5.5)):  # one slow interval in one run
        figures: dict[str, float] = {}
        soak.flatness([_row(p99, 1.0, rng) for p99 in p99s], figures)
        runs.append((f"run{len(runs)}", figures))
    lines = soak.runs_summary(runs)
    assert "worst latency 1.27x (send_p99)" in lines[1], lines[1]
    assert "over 3 runs" in lines[-1] and "met" in lines[-1] and "MISSED" not in lines[-1], lines[-1]
    assert soak._trend([5.5, 5.5, 7.0, 5.6]) < 1.10  # one slow interval is not a growth
    assert soak._trend([5.0, 5.5, 6.0, 6.5]) > 1.25  # a steady rise is


def test_a_young_broker_beside_the_soak_takes_the_weather_out() -> None:
    # the machine slows both brokers by 1.4x in the third interval; the old one's p50 also grows 1.2x by the end
    def row(t: float, send: float) -> dict:
        return {"t": t, "n_send": 5_000, "n_recv": 5_000, "n_settle": 5_000, **{n: send for n in soak.LATENCIES}}

    weather = (1.0, 1.0, 1.4, 1.0)
    young = [row(300.0 * (k + 2), 2.0 * w) for k, w in enumerate(weather)]
    steady = dict(soak.against_young([row(300.0 * (k + 2) + 1, 2.2 * w) for k, w in enumerate(weather)], young, 300))
    assert "spread 1.00x (flat)" in steady["send_p50"], steady["send_p50"]
    growth = (1.0, 1.05, 1.1, 1.2)
    growing = [row(300.0 * (k + 2) + 1, 2.2 * w * g) for k, (w, g) in enumerate(zip(weather, growth, strict=True))]
    moved = dict(soak.against_young(growing, young, 300))
    assert "spread 1.20x (MOVED)" in moved["send_p99"], moved["send_p99"]
    assert "too few" in dict(soak.against_young(growing[:1], young, 300))["send_p50"]
