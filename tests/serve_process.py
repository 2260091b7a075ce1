"""``shardbus serve`` as a child process, for the tests that run the real command (imported like pg_server).

stdout is read on a thread, line by line, so a test can wait for the line that means ready (and time it) while
the process keeps printing. The connection string and port come from the ``connection string:`` line.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVE = [sys.executable, "-m", "shardbus.cli", "serve"]
CONNECTION_STRING = re.compile(r"^connection string: (Endpoint=sb://[^;]+:(\d+);.*)$")


class ServeProcess:
    """``shardbus serve *args`` with stderr in ``stderr_path``. Ready once a line starts with ``ready_prefix``
    (after the connection string), or at the connection-string line when there is none."""

    def __init__(
        self,
        args: list[str],
        stderr_path: Path,
        cwd: Path | None = None,
        ready_prefix: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.stderr_path = stderr_path
        self.ready_prefix = ready_prefix
        self.lines: list[str] = []
        self.connection_string: str | None = None
        self.port: int | None = None
        self.ready_after: float | None = None  # seconds from Popen to the line that means ready
        self._ready = threading.Event()
        with open(stderr_path, "w") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [*SERVE, *args], stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, cwd=cwd,
                env=env,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.connection_string is None and (m := CONNECTION_STRING.match(line)):
                self.connection_string, self.port = m.group(1), int(m.group(2))
                if self.ready_prefix is None:
                    self._set_ready()
            elif self.ready_prefix is not None and self.connection_string and line.startswith(self.ready_prefix):
                self._set_ready()
        self._ready.set()  # the process ended (or closed stdout) without becoming ready

    def _set_ready(self) -> None:
        if not self._ready.is_set():
            self.ready_after = time.monotonic() - self.started
            self._ready.set()

    def wait_ready(self, timeout: float = 10) -> ServeProcess:
        self._ready.wait(timeout)
        if self.ready_after is None:
            self.kill()
            raise AssertionError(f"not ready after {timeout} s: stdout={self.lines!r} stderr={self.stderr!r}")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        """Send ``sig`` and wait for the exit code (killed, and the test failed, when it does not come)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"did not stop within {timeout} s after {signal.Signals(sig).name}") from None
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        """End the process at once if it still runs (test clean-up)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()
