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
