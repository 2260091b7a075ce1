"""Child processes shared by the bench scripts: a script re-runs itself with its own arguments as a child (a
broker, a null endpoint) that prints ``READY <details>`` once it serves, and ends when the parent goes."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time


def watch_parent() -> None:
    """In a child: end this process when the bench process goes away, however it went (even SIGKILL)."""
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                os._exit(1)

    threading.Thread(target=run, name="watch-parent", daemon=True).start()


class ChildProcess:
    """``python <script> <args>`` started and waited for: ``ready`` holds the words after ``READY``."""

    def __init__(self, name: str, script: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, script, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"{name} did not start (got {line!r})")
        self.ready = line.split()[1:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
