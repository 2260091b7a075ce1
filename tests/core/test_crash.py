"""Nothing acknowledged is lost: kill -9 a process in the middle of sending (or completing), then count what
survived."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import shardbus

WRITER = textwrap.dedent(
    """
    import sys, threading
    import shardbus
    ns = shardbus.Namespace.open(sys.argv[1])
    ns.create_queue("q", enable_partitioning=True)
    lock = threading.Lock()
    print("ready", flush=True)

    def work(t):
        i = 0
        while True:
            key = None if i % 3 else f"k{t}-{i}"
            ns.send("q", shardbus.Message(f"{t}-{i}", partition_key=key))
            with lock:  # acknowledged: report it
                print(f"{t}-{i}", flush=True)
            i += 1

    for t in range(4):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


def _kill_after(script: str, data: Path, count: int) -> tuple[list[str], set[str]]:
    """Run ``script`` on ``data``, read ``count`` lines it prints after its first (which says it is ready), kill -9
    it, and return those lines and the bodies the queue holds after the crash."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(data)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while len(lines) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(lines) >= count, "the child did not get going"
    with shardbus.Namespace.open(data) as ns:
        return lines, {m.body.decode() for m in ns.browse("q")}


def test_kill_9_during_sends_loses_no_acknowledged_message(tmp_path):
    acked, stored = _kill_after(WRITER, tmp_path / "data", 400)
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged messages lost"


SETTLER = textwrap.dedent(
    """
    import sys
    import shardbus
    ns = shardbus.Namespace.open(sys.argv[1])
    ns.create_queue("q", enable_partitioning=True)
    for b in range(40):  # keyless batches: spread over the partitions round-robin
        ns.send("q", [shardbus.Message(str(i)) for i in range(b * 100, b * 100 + 100)])
    print("ready", flush=True)
    with ns.receiver("q") as r:
        while True:
            for m in r.receive(10, max_wait=1):
                r.complete(m)  # returns once committed (unsynced: settlements skip the fsync)
                print(m.body.decode(), flush=True)
    """
)


def test_kill_9_during_completes_keeps_every_completed_message_gone(tmp_path):
    completed, stored = _kill_after(SETTLER, tmp_path / "data", 300)
    back = set(completed) & stored
    assert not back, f"{len(back)} completed messages are back after the crash"
    assert len(stored) + len(set(completed)) <= 4000
