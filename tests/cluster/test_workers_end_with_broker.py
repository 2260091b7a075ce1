"""Nothing outlives the serving process: ``kill -9`` of ``shardbus serve --workers 2`` takes its workers with it
at once (the kernel's parent-death signal, cluster/lifeline.py), and they stop cleanly, so a new broker on the same
data directory starts and finds what was acknowledged."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from serve_process import ServeProcess
from shardbus.cluster.lifeline import end_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie, reaped by init soon, has already ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# The kernel signals the workers the moment the serving process dies; what follows is each worker's clean stop,
# which flushes its stores: 7-16 ms here on a quiet machine, up to 205 ms with two busy loops beside the test run
# (in a 166 ms one its main thread waited ~11 ms for a CPU; the rest was not traced). Before the parent-death signal,
# workers noticed by polling and lived on ~0.5 s.
GONE_LIMIT = 0.3


def test_kill_9_of_serve_takes_its_workers_at_once(tmp_path):
    data = tmp_path / "data"
    serve = ServeProcess(
        ["--port", "0", "--data-dir", str(data), "--workers", "2"], tmp_path / "stderr.txt"
    ).wait_ready(60)
    workers = _children(serve.proc.pid)
    assert len(workers) == 2, workers
    os.kill(serve.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    serve.proc.wait(10)
    while any(_alive(w) for w in workers) and time.monotonic() - killed < 5:
        time.sleep(0.005)
    gone_after = time.monotonic() - killed
    assert not any(_alive(w) for w in workers), "workers outlived the serving process"
    assert gone_after < GONE_LIMIT, f"workers took {gone_after * 1000:.0f} ms to go"
    print(f"workers gone {gone_after * 1000:.0f} ms after kill -9")


def test_a_child_that_outlived_its_parent_before_asking_ends_at_once(tmp_path):
    """The parent may die between the child's start and its prctl call: the child checks and ends itself."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: pretend the parent we were started by was another process, long gone
        os.close(read)
        got = []
        end_with_parent(lambda: got.append("ended"), parent=1 if os.getppid() != 1 else 2)
        os.write(write, b"1" if got == ["ended"] else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
