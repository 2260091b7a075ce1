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
WAIT_CAP = 6  # ``wait_ready`` gives up after this many times its timeout however busy the machine is
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
        # of those, how long its main thread was ready to run but waited for a CPU that other processes held
        # (Linux's schedstat; 0 where there is none): the machine's load, not the start-up's own time
        self.ready_cpu_wait = 0.0
        self._ready = threading.Event()
        with open(stderr_path, "w") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [*SERVE, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                cwd=cwd,
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
            self.ready_cpu_wait = _runqueue_wait(self.proc.pid)
            self._ready.set()

    def wait_ready(self, timeout: float = 10) -> ServeProcess:
        """Wait until ready; fail once the process has had ``timeout`` s of its own (``ready_own``'s measure:
        the time it waited for a CPU that others held does not count, as a loaded CI machine gives a start many
        seconds of that), or ``WAIT_CAP`` times that in all."""
        while not self._ready.wait(0.1):
            elapsed = time.monotonic() - self.started
            if elapsed - _runqueue_wait(self.proc.pid) > timeout or elapsed > WAIT_CAP * timeout:
                break
        if self.ready_after is None:
            self.kill()
            raise AssertionError(
                f"not ready after {time.monotonic() - self.started:.1f} s: stdout={self.lines!r} stderr={self.stderr!r}"
            )
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
    def ready_own(self) -> float:
        """Seconds to ready less the time the process waited for a CPU (``ready_cpu_wait``): what the start-up
        takes on a machine that nothing else keeps busy."""
        assert self.ready_after is not None
        return self.ready_after - self.ready_cpu_wait

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


def _runqueue_wait(pid: int) -> float:
    """Seconds the process's main thread has spent runnable but not running (the second field of
    ``/proc/PID/schedstat``, in ns); 0 where the kernel does not tell."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
