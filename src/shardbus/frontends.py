"""Front-end processes: ``shardbus serve --frontends M`` serves one port from M processes over the same workers.

Theory of operation. The ``serve`` process is the supervisor and serves no client itself:

1. it creates the TLS files and removes orphan partition folders once (``serve_command.py``), starts the N workers
   (``LocalCluster(connect=False)``, forked), then binds the port without listening (``--port 0`` becomes a
   real port; nobody else can take it while front ends restart; a socket that does not listen gets none of the
   connections);
2. it starts the front ends (``python -m shardbus.frontends``) with the worker addresses and waits for
   each one's ``READY`` line: all at once, or front end 0 first when it must apply ``--config`` before the
   others open the namespaces (two front ends creating the config's entities at once would collide);
3. each front end is a whole ``server.Broker``: its own namespaces over the shared catalogs, its own receive
   caches, its own ``ClusterClient`` (``cluster/attached.AttachedCluster``), and a listener bound with
   SO_REUSEPORT, so the kernel spreads new connections over the front ends;
4. a child that dies is started again: a front end on the shared port, a worker on the port it first got, so
   the front ends' links simply reconnect;
5. SIGTERM or SIGINT: the front ends stop first (each closes its namespaces: everything acknowledged is in the
   workers' stores), then the workers (each flushes its stores).

The children run in sessions of their own, so a terminal's Ctrl-C reaches only the supervisor, which stops them in
that order; each child also stops by itself when the supervisor is gone (``--exit-with-parent``). The cluster key
(also the SAS key, as with ``--workers``) reaches children in the environment, never on a command line.

This module sits above ``server.py`` (a front end runs a whole broker); what a front end uses to reach the workers
is in ``cluster/``. In memory: one ``FrontendProcess`` per front end (M, fixed).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .cluster.attached import AttachedCluster
from .cluster.lifeline import end_with_parent
from .cluster.supervisor import READY_TIMEOUT, LocalCluster, _read_line, stop_child

KEY_VARIABLE = "SHARDBUS_CLUSTER_KEY"
METADATA_VARIABLE = "SHARDBUS_METADATA_DSN"
WATCH_INTERVAL = 0.1
RETRY_DELAY = 0.5


class FrontendProcess:
    """One front-end child of the supervisor."""

    def __init__(self, index: int, command: list[str], env: dict[str, str]) -> None:
        self.index = index
        self.command = command
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self.restarts = 0

    def spawn(self, port: int) -> None:
        command = [*self.command, "--port", str(port)]
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()  # the previous (dead) process's pipe
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=self.env, start_new_session=True
        )

    def wait_ready(self) -> None:
        """Return once it serves (RuntimeError if it does not come up)."""
        assert self.process is not None
        line = _read_line(self.process, READY_TIMEOUT)
        if not line.startswith("READY "):
            self.stop(5)
            raise RuntimeError(f"front end {self.index} did not start (exit code {self.process.poll()})")

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the front end closes its namespaces (queued writes finish), then exits."""
        if self.process is not None:
            stop_child(self.process, timeout)


class FrontendSupervisor:
    """The ``serve`` process of ``--frontends M``: N workers and M front ends, restarted when they die."""

    def __init__(
        self,
        data_dir: Path | str,
        host: str,
        port: int,
        key: str,
        workers: int,
        frontends: int,
        frontend_args: list[str] | None = None,
        first_alone: bool = False,
        metadata: str | None = None,
    ) -> None:
        """``frontend_args``: more options for every front end (``--namespace``, ``--config``, TLS, logging);
        ``first_alone``: start front end 0 before the others (it applies a config); ``metadata``: the front ends
        place partitions on the workers registered in this metadata store (any host) instead of on ``workers``
        local ones (then 0)."""
        if frontends < 1 or (workers < 1 and metadata is None):
            raise ValueError("front-end processes share worker processes: give at least one of each")
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.cluster: LocalCluster | None = None  # with ``metadata`` the workers are not ours
        if metadata is None:
            self.cluster = LocalCluster(self.data_dir, workers, key, connect=False, fork=True)
        self._metadata = metadata
        self._key = key
        self._count = frontends
        self._extra = list(frontend_args or [])
        self._first_alone = first_alone
        self._reserved: socket.socket | None = None
        self.frontends: list[FrontendProcess] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> FrontendSupervisor:
        """Workers, then the front ends (see the module's docstring); returns once all serve."""
        if self.cluster is not None:
            self.cluster.start()  # first: forked workers must not inherit the reserved port
        try:
            self._reserved = _reserve_port(self.host, self.port)
            self.port = self._reserved.getsockname()[1]
            command = [sys.executable, "-m", "shardbus.frontends", "--host", self.host]
            command += ["--data-dir", str(self.data_dir), "--exit-with-parent", *self._extra]
            env = dict(os.environ, **{KEY_VARIABLE: self._key})
            if self.cluster is not None:
                for address in self.cluster.addresses:
                    command += ["--worker", f"{address[0]}:{address[1]}"]
            if self._metadata is not None:  # like the key: in the environment (a DSN may hold a password)
                env[METADATA_VARIABLE] = self._metadata
            self.frontends = [FrontendProcess(i, command, env) for i in range(self._count)]
            if self._closing.is_set():
                raise RuntimeError("stopped by a signal while starting")
            waves = [self.frontends[:1], self.frontends[1:]] if self._first_alone else [self.frontends]
            for wave in waves:
                for fe in wave:
                    fe.spawn(self.port)
                for fe in wave:
                    fe.wait_ready()
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="shardbus-frontends", daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_INTERVAL):
            for fe in self.frontends:
                if fe.alive() or self._closing.is_set():
                    continue
                try:
                    fe.restarts += 1
                    fe.spawn(self.port)
                    fe.wait_ready()
                except Exception:  # it stays dead: try again on a later round
                    time.sleep(RETRY_DELAY)

    def stop_on_signals(self) -> FrontendSupervisor:
        """SIGTERM and SIGINT stop everything (main thread only; before ``start``, so none is missed)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._closing.set())
        return self

    def serve_until_signal(self) -> None:
        """Block until ``stop_on_signals``'s signals (or ``close``)."""
        while not self._closing.wait(0.5):
            pass

    def close(self) -> None:
        """Front ends first (their namespaces close against live workers), then the workers."""
        self._closing.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(READY_TIMEOUT + 5)
        for fe in self.frontends:
            fe.terminate()
        for fe in self.frontends:
            fe.stop()
        if self.cluster is not None:
            self.cluster.close()
        if self._reserved is not None:
            self._reserved.close()


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT that never listens: it holds the port for the front
    ends, which bind it the same way, and takes no connections itself."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _exit_with_parent() -> None:
    """A front end stops cleanly (as on SIGTERM) when the supervisor is gone, however it went (lifeline.py)."""
    end_with_parent()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _limit_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--max-connections`` and ``--idle-timeout``, when the supervisor passed them on (per front end)."""
    options: dict[str, Any] = {}
    if args.max_connections is not None:
        options["max_connections"] = args.max_connections
    if args.idle_timeout is not None:
        options["idle_timeout"] = args.idle_timeout or None
    return options


def main(argv: list[str] | None = None) -> int:
    """One front end: a ``Broker`` on a shared port over workers at the given addresses."""
    parser = argparse.ArgumentParser(prog="python -m shardbus.frontends", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--worker", action="append", type=_address, default=[], metavar="HOST:PORT")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--config", default=None)
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
    parser.add_argument("--tls-host", action="append", default=None)
    parser.add_argument("--max-connections", type=int, default=None)
    parser.add_argument("--idle-timeout", type=float, default=None)
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--log-format", choices=("auto", "json", "text"), default="auto")
    args = parser.parse_args(argv)

    from .logs import configure as configure_logs
    from .model.errors import ShardbusError
    from .server import DEFAULT_KEY, Broker

    configure_logs(args.log_level, None if args.log_format == "auto" else args.log_format == "json")
    key = os.environ.get(KEY_VARIABLE, DEFAULT_KEY)
    if args.exit_with_parent:
        _exit_with_parent()
    metadata = os.environ.get(METADATA_VARIABLE)
    options: dict[str, Any] = {} if args.namespace is None else {"namespace": args.namespace}
    cluster: AttachedCluster | None = None
    if metadata:  # partitions on the workers registered in the metadata store (placement.MetadataCluster)
        options["metadata"] = metadata
    elif args.worker:
        cluster = options["cluster"] = AttachedCluster(args.data_dir, args.worker, key)
        if not cluster.wait_connected():
            cluster.close()
            print("shardbus front end: cannot reach the workers", file=sys.stderr)
            return 2
    else:
        print(f"shardbus front end: give --worker addresses or {METADATA_VARIABLE}", file=sys.stderr)
        return 2
    try:
        broker = Broker(
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            key=key,
            config=args.config,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_hosts=args.tls_host or (),
            **_limit_options(args),
            reuse_port=True,
            remove_orphans=False,  # the supervisor did, before any front end could be creating entities
            **options,
        )
    except (ShardbusError, OSError, ValueError) as exc:
        if cluster is not None:
            cluster.close()
        print(f"shardbus: cannot start: {exc}", file=sys.stderr)
        return 2
    try:
        # the supervisor waits for this line
        broker.serve_forever(on_ready=lambda b: print(f"READY {b.server.port}", flush=True))
    except OSError as exc:
        print(f"shardbus: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
