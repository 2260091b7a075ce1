"""A throwaway RabbitMQ node for the benchmarks: installed from Debian if missing, run from a temporary directory.

``ensure_installed()`` looks for Debian's ``rabbitmq-server`` package and, when it is missing and we run as root,
installs it with ``apt-get`` (non-interactively; Docker-style images deny the package's own service start through
``policy-rc.d``, and we never rely on that service anyway). ``RabbitNode`` then starts a node of its own:

* everything the node writes (Mnesia database, logs, PID file, Erlang cookie via ``HOME``, enabled-plugins file) is
  under one temporary directory, removed by ``stop()``;
* a node name of its own (``shardbus-bench-<pid>@localhost``) and free ports for AMQP, Erlang distribution and a
  private ``epmd`` (``ERL_EPMD_PORT``), all on 127.0.0.1, so it neither collides with nor joins any other node
  on the machine, and ``stop()`` can end exactly the ``epmd`` it started;
* AMQP 1.0: RabbitMQ 3.x serves it through the ``rabbitmq_amqp1_0`` plugin on the AMQP port (enabled here with
  ``rabbitmq-plugins enable --offline``); 4.x has it built in. Durable queues are declared with
  ``rabbitmqctl import_definitions`` (no AMQP 0-9-1 client needed), and addressed as ``/amq/queue/<name>`` (3.x:
  an existing queue, never declared by the link) or ``/queues/<name>`` (4.x's address format v2).

The default user ``guest``/``guest`` may connect from loopback only, which is all we do (SASL PLAIN).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SBIN = Path("/usr/lib/rabbitmq/bin")  # Debian's real scripts; /usr/sbin/* are wrappers that su to "rabbitmq"
PACKAGE = "rabbitmq-server"


class RabbitUnavailable(Exception):
    """RabbitMQ cannot be installed or started here; the message says why."""


def installed_version() -> str | None:
    """The installed package's version (e.g. ``3.10.8-1.1+deb12u1``), or None."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}|${Version}", PACKAGE], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    status, _, version = out.stdout.partition("|")
    if out.returncode != 0 or "install ok installed" not in status or not (SBIN / "rabbitmq-server").exists():
        return None
    return version


def candidate_version() -> str | None:
    """What ``apt-cache policy rabbitmq-server`` would install, or None."""
    try:
        out = subprocess.run(["apt-cache", "policy", PACKAGE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        name, _, value = line.strip().partition(":")
        if name == "Candidate" and value.strip() not in ("", "(none)"):
            return value.strip()
    return None


def ensure_installed(log: Path | None = None) -> str:
    """The installed version, installing the Debian package first if needed; raises RabbitUnavailable."""
    version = installed_version()
    if version is not None:
        return version
    if shutil.which("apt-get") is None:
        raise RabbitUnavailable("rabbitmq-server is not installed and there is no apt-get")
    candidate = candidate_version()
    if candidate is None:
        raise RabbitUnavailable("rabbitmq-server is not installed and apt-cache knows no candidate for it")
    if os.geteuid() != 0:
        raise RabbitUnavailable(f"rabbitmq-server is not installed (candidate {candidate}) and we are not root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", PACKAGE]
    print(f"installing {PACKAGE} {candidate}: {' '.join(command)}", flush=True)
    with open(log or os.devnull, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    version = installed_version()
    if done.returncode != 0 or version is None:
        raise RabbitUnavailable(f"apt-get install {PACKAGE} failed (exit {done.returncode}; log: {log})")
    return version


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the bench process dies, so no node outlives a killed run (the
    server script traps SIGTERM and stops the node cleanly)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class RabbitNode:
    """One throwaway RabbitMQ node on 127.0.0.1 (see the module docstring). Use as a context manager."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.major = int(version.split(":")[-1].split(".")[0])
        self.dir = Path(tempfile.mkdtemp(prefix="shardbus-bench-rabbitmq-"))
        self.port = _free_port()
        self.epmd_port = _free_port()
        self.dist_port = _free_port()
        self.nodename = f"shardbus-bench-{os.getpid()}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        for sub in ("mnesia", "log", "home"):
            (self.dir / sub).mkdir()
        (self.dir / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's: it may name other ports
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            # The bench machine may be short of disk; the default 50 MB free-space alarm would block publishers.
            "disk_free_limit.absolute = 10MB\n"
        )
        self.env = {
            **os.environ,
            "HOME": str(self.dir / "home"),  # the Erlang cookie lives here, shared by server and rabbitmqctl
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}"

    def address(self, queue: str) -> str:
        """The AMQP 1.0 address of an existing durable queue (sender target and receiver source alike)."""
        return f"/queues/{queue}" if self.major >= 4 else f"/amq/queue/{queue}"

    @property
    def amqp10(self) -> str:
        return "built in (4.x)" if self.major >= 4 else "plugin rabbitmq_amqp1_0"

    def _tool(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SBIN / name), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def start(self, timeout: float = 120) -> None:
        """Enable AMQP 1.0, start the node and wait until it serves; raises RabbitUnavailable."""
        if self.major < 4:
            done = self._tool("rabbitmq-plugins", "enable", "--offline", "rabbitmq_amqp1_0")
            if done.returncode != 0:
                raise RabbitUnavailable(f"rabbitmq-plugins enable rabbitmq_amqp1_0 failed: {done.stderr.strip()}")
        log = open(self.dir / "log" / "console.log", "wb")  # noqa: SIM115 -- the child keeps writing to it
        self.proc = subprocess.Popen(
            [str(SBIN / "rabbitmq-server")],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RabbitUnavailable(f"rabbitmq-server exited with {self.proc.returncode}: {self._log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RabbitUnavailable(f"rabbitmq-server did not start within {timeout:.0f} s: {self._log_tail()}")
            try:
                done = self._tool("rabbitmqctl", "await_startup", "--timeout", str(int(max(1, left))), timeout=left)
            except subprocess.TimeoutExpired:
                continue
            if done.returncode == 0:
                return
            time.sleep(0.5)  # the node has not registered with epmd yet

    def declare_queue(self, name: str) -> None:
        """Declare a durable classic queue (idempotent)."""
        definitions = {"queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}
        path = self.dir / f"definitions-{name}.json"
        path.write_text(json.dumps(definitions))
        done = self._tool("rabbitmqctl", "import_definitions", str(path))
        if done.returncode != 0:
            raise RabbitUnavailable(f"declaring queue {name!r} failed: {done.stderr.strip() or done.stdout.strip()}")

    def purge_queue(self, name: str) -> None:
        """Remove every ready message of a queue; raises RabbitUnavailable."""
        done = self._tool("rabbitmqctl", "purge_queue", name)
        if done.returncode != 0:
            raise RabbitUnavailable(f"purging queue {name!r} failed: {done.stderr.strip() or done.stdout.strip()}")

    def queue_depth(self, name: str) -> int | None:
        """Messages in the queue (ready + unacknowledged), or None when rabbitmqctl cannot say."""
        done = self._tool("rabbitmqctl", "-q", "list_queues", "name", "messages")
        if done.returncode != 0:
            return None
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name and parts[1].isdigit():
                return int(parts[1])
        return None

    def stop(self) -> None:
        """Stop the node and its private epmd, then remove the directory. Never raises."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._tool("rabbitmqctl", "stop", timeout=60)
                self.proc.wait(30)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.terminate()  # the server script traps SIGTERM and stops the node
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        # epmd is started by the node as a daemon and outlives it; ours listens on a port nobody else uses.
        try:
            subprocess.run(
                ["epmd", "-port", str(self.epmd_port), "-kill"],
                env=self.env,
                capture_output=True,
                timeout=15,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def problems(self, most: int = 10) -> list[str]:
        """The node's last warning and error lines (why it closed a connection or detached a link, say)."""
        found: list[str] = []
        for path in sorted((self.dir / "log").glob("*.log")):
            with open(path, errors="replace") as f:
                found += [line.strip()[:500] for line in f if "[error]" in line or "[warning]" in line]
        return found[-most:]

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = (self.dir / "log" / "console.log").read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return " | ".join(line for line in text.splitlines()[-lines:] if line.strip())

    def __enter__(self) -> RabbitNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
