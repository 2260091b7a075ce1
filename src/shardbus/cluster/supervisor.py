"""Worker processes on this host: start N, place partitions on them, restart any that dies.

``LocalCluster`` is what ``shardbus serve --workers N`` runs. Each worker is ``python -m shardbus.cluster.worker``
on a free loopback port over the same data directory; the first line it prints (``READY host:port``) says where
it listens. Placement spreads every entity's partitions over all workers: partition ``p`` of entity ``e`` lives on
worker ``(e + p) mod N``, so it does not depend on creation order and a restart with the same N finds every
partition where it was (with another N, partitions move; on one host their stores are in the same place anyway).

A worker that exits unexpectedly (a crash, SIGKILL) is started again at once, on the port it first got;
meanwhile its partitions are unavailable, and every front end's link (in this process, or in the front-end
processes of ``serve --frontends M``, ``frontends.py``) reconnects to the new process and restores them
(``remote.WorkerLink``).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..partition.handle import PartitionHandle, PartitionSpec
from .remote import HEALTH_INTERVAL, TICK_INTERVAL, ClusterClient, RemotePartition

log = logging.getLogger("shardbus.supervisor")

READY_TIMEOUT = 30.0
WATCH_INTERVAL = 0.05  # how often the supervisor looks for dead workers where it cannot sleep until one exits


class _ExitWatch:
    """Sleeps until one of the given child processes exits (a pidfd per child, Linux 5.3+) or ``wake`` is called.

    Keeps a pidfd (or, without pidfds, a thread) per live child it was last asked about and one pipe to be woken
    through: bounded by the number of workers. Where pidfds are not available (a kernel before 5.3, a seccomp
    profile that refuses the call, valgrind) a thread per child sleeps in ``waitid`` until it exits, leaving it to
    be reaped by its ``Popen`` (``WNOWAIT``), and wakes the watch: looking every ``WATCH_INTERVAL`` instead cost
    the front end twenty rounds of Python a second, idle or not (under callgrind, bench/workers_instructions.py,
    0.6-0.9 M instructions a second). Without ``waitid`` either it sleeps ``WATCH_INTERVAL`` (the caller then
    looks)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> its pidfd
        self._waiters: dict[int, threading.Thread] = {}  # pid -> the thread in ``waitid`` for it (no pidfds)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._closed = False

    def wake(self) -> None:
        if not self._closed:
            try:
                os.write(self._wake_write, b"x")
            except OSError:  # closed meanwhile (a waiter thread's child exited as the watch closed)
                pass

    def _wait_in_thread(self, pid: int) -> bool:
        """Wake the watch when child ``pid`` exits, from a thread asleep in ``waitid`` (False: no ``waitid``)."""
        waiter = self._waiters.get(pid)
        if waiter is not None and waiter.is_alive():
            return True
        if not hasattr(os, "waitid"):
            return False

        def wait() -> None:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except OSError:  # reaped already (ChildProcessError), or interrupted: the watch looks anyway
                pass
            self.wake()

        waiter = self._waiters[pid] = threading.Thread(target=wait, name=f"shardbus-exit-{pid}", daemon=True)
        waiter.start()
        return True

    def wait(self, processes: list[subprocess.Popen[str] | ForkedWorker], timeout: float | None) -> None:
        """Return when one of ``processes`` may have exited, when woken, or after ``timeout`` (None: no limit)."""
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        pids = {process.pid for process in processes}
        for pid in [pid for pid in self._fds if pid not in pids]:  # children gone (or replaced by a restart)
            os.close(self._fds.pop(pid))
        for pid in [pid for pid in self._waiters if pid not in pids]:  # their threads ended as they exited
            del self._waiters[pid]
        for pid in pids:
            fd = self._fds.get(pid)
            if fd is None:
                try:
                    fd = self._fds[pid] = os.pidfd_open(pid)
                except (AttributeError, OSError):  # no pidfd here, or the child is gone already
                    if self._wait_in_thread(pid):
                        continue
                    time.sleep(WATCH_INTERVAL)  # look again soon
                    return
            poller.register(fd, select.POLLIN)
        if poller.poll(None if timeout is None else int(timeout * 1000)):
            try:
                os.read(self._wake_read, 64)
            except BlockingIOError:
                pass  # a child exited: nothing to drain

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (*self._fds.values(), self._wake_read, self._wake_write):
            os.close(fd)
        self._fds.clear()


class WorkerProcess:
    """One worker child process."""

    def __init__(
        self,
        index: int,
        data_dir: Path,
        key: str,
        follow_caller_clock: bool,
        fork: bool = False,
        command: list[str] | None = None,
    ) -> None:
        """``fork``: the first start forks this process (see ``ForkedWorker``) when it can. ``command``: how to
        start a worker, before its arguments (tests start one with fault injection, tests/support/faults.py)."""
        self.index = index
        self.command = command or [sys.executable, "-m", "shardbus.cluster.worker"]
        self.data_dir = data_dir
        self.key = key
        self.follow_caller_clock = follow_caller_clock
        self.fork = fork and command is None  # a fork runs this package's worker
        self.process: subprocess.Popen[str] | ForkedWorker | None = None
        self.address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start the process (``wait_ready`` then learns its address). A restart listens on the port the first
        start got, so every front end's link, wherever it runs, reconnects to it unchanged."""
        listen = "127.0.0.1:0" if self.address is None else f"{self.address[0]}:{self.address[1]}"
        args = ["--listen", listen, "--exit-with-parent", "--data-dir", str(self.data_dir)]
        if self.follow_caller_clock:
            args.append("--follow-caller-clock")
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()  # the previous (dead) process's pipe
        if self.fork and self.address is None and threading.active_count() == 1:
            self.process = ForkedWorker(args, self.key)
            return
        env = dict(os.environ, SHARDBUS_CLUSTER_KEY=self.key)
        # a session of its own: a terminal's Ctrl-C reaches only the supervisor, which stops it after the front ends
        self.process = subprocess.Popen(
            [*self.command, *args],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )

    def wait_ready(self) -> tuple[str, int]:
        assert self.process is not None
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
        if self.process is not None:
            stop_child(self.process, timeout)


def stop_child(process: subprocess.Popen[str] | ForkedWorker, timeout: float) -> None:
    """SIGTERM (the child finishes what it must, then exits), SIGKILL after ``timeout``; closes its stdout pipe."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


class ForkedWorker:
    """A worker forked from this process: no interpreter to start, nothing to import (about 50 ms instead of
    400), with the part of ``subprocess.Popen`` the supervisor uses. Only for a process with a single thread and
    nothing open that a child must not keep (a listening socket, say): ``shardbus serve`` at start-up. Restarts
    start a fresh interpreter, since by then the process has threads."""

    def __init__(self, args: list[str], key: str) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: runs the worker, never returns here
            code = 1
            try:
                os.close(read)
                for sig in (signal.SIGINT, signal.SIGTERM):  # not the supervisor's handlers: the worker sets its own
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()  # as start_new_session: a terminal's Ctrl-C reaches only the supervisor
                os.dup2(write, 1)  # the READY line goes to the supervisor
                os.close(write)
                os.environ["SHARDBUS_CLUSTER_KEY"] = key
                from .worker import main

                code = main(args)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        self.pid = pid
        self.stdout: TextIO | None = os.fdopen(read)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _read_line(process: subprocess.Popen[str] | ForkedWorker, timeout: float) -> str:
    """The child's first line, without hanging forever on a child that never prints it."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline() if process.stdout else ""))
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    return result[0].strip() if result else ""


def place(spec: PartitionSpec, workers: int) -> int:
    """Which of ``workers`` workers (by index) serves a partition (see the module's docstring)."""
    return (spec.entity_id + spec.config.partition_id) % workers


def remote_partition(client: ClusterClient, data_dir: Path, workers: int, spec: PartitionSpec) -> PartitionHandle:
    """A partition on worker ``place(spec, workers)`` (``client``'s link named by that index); its store path,
    relative to the data directory front ends and workers share, names it on its worker."""
    try:
        key = spec.store.resolve().relative_to(data_dir.resolve()).as_posix()
    except ValueError:
        raise ValueError(f"{spec.store} is outside the cluster's data directory {data_dir}") from None
    return RemotePartition(client.link(str(place(spec, workers)), None), key, spec)


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
        connect: bool = True,
        fork: bool = False,
        worker_command: list[str] | None = None,
    ) -> None:
        """``connect=False``: only run the workers (``serve --frontends M``: front-end processes connect to
        ``addresses``); there is no client here then. ``fork``: first start the workers by forking this process
        (``ForkedWorker``; ``shardbus serve`` does, where nothing else is open yet). ``worker_command``: see
        ``WorkerProcess``."""
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.data_dir = Path(data_dir)
        self.key = key
        self.restart = restart
        self.workers = [
            WorkerProcess(i, self.data_dir, key, follow_caller_clock, fork, worker_command) for i in range(workers)
        ]
        self.client: ClusterClient | None = None  # created by start, after the workers (its thread would stop a fork)
        self._connect = connect
        self._clock = clock
        # workers on their own clock tick themselves (worker.Worker): the front end's ticks only bring health
        self._tick_interval = TICK_INTERVAL if follow_caller_clock else HEALTH_INTERVAL
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._exits = _ExitWatch()

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Where the workers listen, in placement order (a restarted worker keeps its address)."""
        return [w.address for w in self.workers if w.address is not None]

    def start(self) -> LocalCluster:
        try:
            for w in self.workers:  # all at once: start-up costs one worker's, not N
                w.spawn()
            if self._connect:
                self.client = ClusterClient(self.key, self._clock, self._tick_interval)
            for w in self.workers:
                address = w.wait_ready()
                if self.client is not None:
                    self.client.link(str(w.index), address)
        except BaseException:
            self.close()
            raise
        if self.client is not None and not self.client.wait_connected(READY_TIMEOUT):
            self.close()
            raise RuntimeError("the front end could not connect to its workers")
        self._watcher = threading.Thread(target=self._watch, name="shardbus-supervisor", daemon=True)
        self._watcher.start()
        return self

    def place(self, spec: PartitionSpec) -> int:
        """Which worker serves a partition (see the module's docstring)."""
        return place(spec, len(self.workers))

    def partition(self, spec: PartitionSpec) -> PartitionHandle:
        """The namespace's partition factory (see ``remote_partition``)."""
        assert self.client is not None, "a cluster started with connect=False has no client"
        return remote_partition(self.client, self.data_dir, len(self.workers), spec)

    def kill(self, index: int) -> None:
        """For tests and benches: SIGKILL a worker, as a crash would (the supervisor restarts it)."""
        process = self.workers[index].process
        if process is not None:
            process.kill()

    def _watch(self) -> None:
        """Restart workers that die. Asleep until one exits (or ``close``): polling every 50 ms cost a front end
        about 1 ms of CPU per second, idle or not."""
        while not self._closing.is_set():
            started = [w for w in self.workers if w.process is not None]
            live = [w.process for w in started if w.alive()]
            # one that is dead yet (its restart failed) is looked at again every WATCH_INTERVAL
            retry = len(live) < len(started) and self.restart
            self._exits.wait(live, WATCH_INTERVAL if retry else None)  # type: ignore[arg-type]
            if self._closing.is_set():
                return
            self._restart_dead()

    def _restart_dead(self) -> None:
        for w in self.workers:
            if w.process is None or w.alive() or not self.restart or self._closing.is_set():
                continue
            # an operator (and a failing test's captured log) learns that a worker died, and how
            code = w.process.poll()
            log.warning("worker %s (pid %s) exited with %s: starting it again", w.index, w.process.pid, code)
            try:
                address = w.start()
                if self.client is not None:
                    self.client.link(str(w.index), address)
            except Exception:  # it stays dead: try again on a later round
                time.sleep(0.5)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect the front end, then stop every worker (each flushes its stores)."""
        self._closing.set()
        self._exits.wake()
        if self._watcher is not None:
            self._watcher.join(5)
        if self._watcher is None or not self._watcher.is_alive():
            self._exits.close()
        if self.client is not None:
            self.client.close()
        for w in self.workers:
            w.stop()
