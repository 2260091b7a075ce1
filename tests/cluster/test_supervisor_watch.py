"""The supervisor sleeps until a worker exits (``supervisor._ExitWatch``): no polling, woken at once by an exit or
by ``close``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from shardbus.cluster.supervisor import _ExitWatch


def _sleeper() -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)


def _wait_in_thread(watch: _ExitWatch, processes: list, timeout: float | None) -> tuple[threading.Thread, list]:
    returned: list[float] = []

    def run() -> None:
        watch.wait(processes, timeout)
        returned.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, returned


def test_wakes_when_a_child_exits_and_not_before() -> None:
    watch = _ExitWatch()
    children = [_sleeper(), _sleeper()]
    try:
        thread, returned = _wait_in_thread(watch, children, None)
        thread.join(0.5)
        assert not returned, "returned while every child was alive"
        killed = time.monotonic()
        children[1].kill()
        thread.join(5)
        assert returned and returned[0] - killed < 2
    finally:
        for child in children:
            child.kill()
            child.wait()
        watch.close()


def test_wake_ends_a_wait_without_children_and_close_is_idempotent() -> None:
    watch = _ExitWatch()
    thread, returned = _wait_in_thread(watch, [], None)
    thread.join(0.3)
    assert not returned
    watch.wake()
    thread.join(5)
    assert returned
    watch.close()
    watch.close()
    watch.wake()  # after close: nothing to write to, no error


def test_a_replaced_child_is_forgotten() -> None:
    watch = _ExitWatch()
    first, second = _sleeper(), _sleeper()
    try:
        watch.wait([first], 0.05)
        first.kill()
        first.wait()
        watch.wait([second], 0.05)  # the first one's pidfd is closed here, not kept for ever
        assert set(watch._fds) == {second.pid}
    finally:
        for child in (first, second):
            child.kill()
            child.wait()
        watch.close()


def _no_pidfds(monkeypatch) -> None:
    """As under valgrind, an old kernel or a seccomp profile that refuses the call."""

    def refused(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr("shardbus.cluster.supervisor.os.pidfd_open", refused, raising=False)


def test_without_pidfds_a_thread_per_child_wakes_the_watch_when_it_exits_and_not_before(monkeypatch) -> None:
    _no_pidfds(monkeypatch)
    watch = _ExitWatch()
    children = [_sleeper(), _sleeper()]
    try:
        thread, returned = _wait_in_thread(watch, children, None)
        thread.join(0.5)
        assert not returned, "returned while every child was alive (it looked again instead of sleeping)"
        assert set(watch._waiters) == {c.pid for c in children} and not watch._fds
        killed = time.monotonic()
        children[1].kill()
        thread.join(5)
        assert returned and returned[0] - killed < 2
        # the exited child is left to its Popen to reap (WNOWAIT): its exit status is still there
        assert children[1].wait(5) == -9
        # the live child's thread is reused, the exited one's forgotten
        watch.wait([children[0]], 0.05)
        assert set(watch._waiters) == {children[0].pid}
    finally:
        for child in children:
            child.kill()
            child.wait()
        watch.close()


def test_without_pidfds_a_dead_worker_is_restarted(tmp_path, monkeypatch) -> None:
    _no_pidfds(monkeypatch)
    from shardbus.cluster.supervisor import LocalCluster

    with LocalCluster(tmp_path / "data", 1, "k").start() as cluster:
        first = cluster.workers[0].process
        assert first is not None
        cluster.kill(0)
        deadline = time.monotonic() + 30
        while cluster.workers[0].process is first or not cluster.workers[0].alive():
            assert time.monotonic() < deadline, "the dead worker was not restarted"
            time.sleep(0.05)
