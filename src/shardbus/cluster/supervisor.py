"""Worker processes on this host: start N, place partitions on them, restart any that dies.

``LocalCluster`` is what ``shardbus serve --workers N`` runs. Each worker is ``python -m shardbus.cluster.worker``
on a free loopback port over the same data directory; the first line it prints (``READY host:port``) says where
it listens. Placement spreads every entity's partitions over all workers: partition ``p`` of entity ``e`` lives on
worker ``(e + p) mod N``, so it does not depend on creation order and a restart with the same N finds every
partition where it was (with another N, partitions move; on one host their stores are in the same place anyway).

A worker that exits unexpectedly (a crash, SIGKILL) is started again at once; meanwhile its partitions are
unavailable, and its link reconnects to the new process and restores them (``remote.WorkerLink``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..partition.handle import PartitionHandle, PartitionSpec
from .remote import ClusterClient, RemotePartition

READY_TIMEOUT = 30.0


class WorkerProcess:
    """One worker child process."""

    def __init__(self, index: int, data_dir: Path, key: str, follow_caller_clock: bool) -> None:
        self.index = index
        self.data_dir = data_dir
        self.key = key
        self.follow_caller_clock = follow_caller_clock
        self.process: subprocess.Popen[str] | None = None
        self.address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        command = [sys.executable, "-m", "shardbus.cluster.worker", "--listen", "127.0.0.1:0", "--exit-with-parent"]
        command += ["--data-dir", str(self.data_dir)]
        if self.follow_caller_clock:
            command.append("--follow-caller-clock")
        env = dict(os.environ, SHARDBUS_CLUSTER_KEY=self.key)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()  # the previous (dead) process's pipe
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        line = _read_line(self.process, READY_TIMEOUT)
        if not line.startswith("READY "):
            self.process.kill()
            raise RuntimeError(f"worker {self.index} did not start (said {line!r})")
        host, _, port = line.split()[1].rpartition(":")
        self.address = (host, int(port))
        return self.address

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the worker flushes every partition's store, then exits."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line, without hanging forever on a child that never prints it."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline() if process.stdout else ""))
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    return result[0].strip() if result else ""


class LocalCluster:
    """N worker processes on this host and the front end's client for them."""

    def __init__(
        self,
        data_dir: Path | str,
        workers: int,
        key: str,
        *,
        clock: Callable[[], float] = time.time,
        follow_caller_clock: bool = False,
        restart: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.data_dir = Path(data_dir)
        self.key = key
        self.restart = restart
        self.workers = [WorkerProcess(i, self.data_dir, key, follow_caller_clock) for i in range(workers)]
        self.client = ClusterClient(key, clock)
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> LocalCluster:
        for w in self.workers:
            self.client.link(str(w.index), w.start())
        if not self.client.wait_connected(READY_TIMEOUT):
            self.close()
            raise RuntimeError("the front end could not connect to its workers")
        self._watcher = threading.Thread(target=self._watch, name="shardbus-supervisor", daemon=True)
        self._watcher.start()
        return self

    def place(self, spec: PartitionSpec) -> int:
        """Which worker serves a partition (see the module's docstring)."""
        return (spec.entity_id + spec.config.partition_id) % len(self.workers)

    def partition(self, spec: PartitionSpec) -> PartitionHandle:
        """The namespace's partition factory: the partition's store path, relative to the data directory both
        share, names it on its worker."""
        try:
            key = spec.store.resolve().relative_to(self.data_dir.resolve()).as_posix()
        except ValueError:
            raise ValueError(f"{spec.store} is outside the cluster's data directory {self.data_dir}") from None
        worker = self.workers[self.place(spec)]
        return RemotePartition(self.client.link(str(worker.index), None), key, spec)

    def kill(self, index: int) -> None:
        """For tests and benches: SIGKILL a worker, as a crash would (the supervisor restarts it)."""
        process = self.workers[index].process
        if process is not None:
            process.kill()

    def _watch(self) -> None:
        while not self._closing.wait(0.05):
            for w in self.workers:
                if w.process is None or w.alive() or not self.restart or self._closing.is_set():
                    continue
                try:
                    self.client.link(str(w.index), w.start())
                except Exception:  # it stays dead: try again on a later round
                    time.sleep(0.5)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect the front end, then stop every worker (each flushes its stores)."""
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(5)
        self.client.close()
        for w in self.workers:
            w.stop()
