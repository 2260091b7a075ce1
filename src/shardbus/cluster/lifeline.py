"""A child process's tie to its parent: the workers and front ends of ``shardbus serve`` end with it.

On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, sig)`` has it send ``sig`` to the child the moment the
parent dies, however it died (``kill -9`` included), so nothing outlives the serving process even briefly. The
signal is SIGTERM, which the child already handles as a clean stop (a worker flushes its stores; what it
acknowledged is durable anyway). Two caveats of the call are covered: the parent may die before the child makes
it (checked right after, against the pid the child was started by), and the signal follows the death of the
*thread* that started the child, which for us is the main thread or the supervisor's watcher, both living as long
as the process (the watcher ends only when the cluster closes, which stops its workers anyway).

Elsewhere (or if the call fails) a thread polls ``getppid()`` every 0.1 s: the child notices within that time.
Memory: one thread at most, nothing else.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["PR_SET_PDEATHSIG", "end_with_parent"]

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
POLL_SECONDS = 0.1


def _kernel_signal_on_parent_death(sig: int) -> bool:
    """Ask the kernel to send ``sig`` when the parent dies; False where it cannot (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def end_with_parent(on_parent_death: Callable[[], None] | None = None, parent: int | None = None) -> None:
    """End this process when ``parent`` (default: the current parent) dies: SIGTERM from the kernel on Linux,
    which the caller handles as a stop; elsewhere ``on_parent_death`` (default: SIGTERM to ourselves) runs from a
    polling thread."""
    parent = os.getppid() if parent is None else parent

    def terminate() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    act = on_parent_death or terminate
    if _kernel_signal_on_parent_death(signal.SIGTERM):
        if os.getppid() != parent:  # it died before the call took effect: nobody will signal us
            act()
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        act()

    threading.Thread(target=watch, name="shardbus-watch-parent", daemon=True).start()
