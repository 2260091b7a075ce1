"""Durable queue throughput through our own AMQP 1.0 client: shardbus as users start it, its other modes, RabbitMQ.

One workload, one client (``shardbus.client.ShardbusClient``), several brokers, all in the same run, interleaved:

    default     ``shardbus serve`` exactly as a user starts it (no mode flags: partitions in the serving process)
    workers0    ``shardbus serve --workers 0`` (the same, said explicitly)
    workers1/2/4  ``shardbus serve --workers N`` (partition brokers in N worker processes)
    frontends2  ``shardbus serve --frontends 2 --workers 2`` (two front-end processes on one port)
    rabbitmq    Debian's ``rabbitmq-server`` (a throwaway node, see bench/rabbitmq.py), a durable classic queue,
                AMQP 1.0 (3.x: the rabbitmq_amqp1_0 plugin; 4.x: built in), SASL PLAIN guest/guest

Every shardbus mode serves a 16-partition queue (Config.json ``"EnablePartitioning": true``). ``--brokers`` picks
the shardbus modes (default: all).

The workload, per broker (1 KB bodies, message header durable=true, a distinct message-id each):

    send       one connection sends N messages, at most ``--window`` unacknowledged transfers in flight; each
               transfer's ``accepted`` outcome means stored (shardbus: committed to SQLite; RabbitMQ: publisher
               confirm of a persistent message on a durable queue)
    receive    one connection receives and completes the N messages: a peek-lock (unsettled) receiver link
               asking for ``--credit`` messages at a time, each delivery settled with ``accepted`` and counted
               when the broker's settled echo arrives (completes of one batch overlap the next batch's receive)
    both       send and receive N messages concurrently (queue empty at the start); end-to-end msgs/s = N /
               (last complete - first send). This is the number the ratios use.

``--senders S`` / ``--receivers R`` run S sending and R receiving clients instead of one each (every one its own
process and connection): the senders split N, the receivers compete on the one queue and each stops once it has
its share; a phase runs from the first client's start to the last one's end. Same clients for every broker.

Sender and receiver are each a child process of this script (the same code for every broker), so neither
client's event loop competes with the other's for one interpreter's GIL; their connections are opened and warmed
up (a few hundred messages) before anything is timed. Besides msgs/s the table shows CPU per message of the
broker's whole process tree and of the clients, which tells whether the client or the broker was the limit.
On a machine with few cores all of them share those cores: read ratios, and repeat (``--repeat``) for a range.

For the shardbus modes the "both" phase is also split by process (front end, each worker, with ``--frontends``
each front end): CPU per message of each, and the capacity that implies with a core per process (a process
saturates at 1e6 / its us per message, so the busiest one bounds the whole). On 2 shared cores that is how
scale-out can be judged at all: adding workers takes their share off the front end, never off the machine.

Per process it also shows write system calls per message and the part of its CPU spent in the kernel (socket and
file I/O, wake-ups). ``--profile DIR`` runs each shardbus mode under cProfile (``bench/profiled.py``: a profile per
process and kind of thread, e.g. the front end's loop, its cluster client's loop, the worker's loop, the commit
threads) and prints the busiest functions of each; cProfile slows calls down, so read shares from it and CPU per
message from a run without it.

The last lines are the ratios the performance work is held to (issue 26): ``ratio default/RabbitMQ`` end to end,
send and receive (median and range over the rounds, each round's ratio from the same round), the broker CPU per
message of ``--workers 1`` over ``--workers 0`` (the cost of the hop to a worker) and the default's broker CPU
per message in "both".

``--base DIR`` serves each chosen mode a second time from another checkout (``DIR/src``, e.g. ``git archive`` of
the commit a change starts from), interleaved round by round with this tree's, and prints the ratios for both
trees and this tree over the base per mode: how a change is measured against its base in one run on a noisy
machine. The ``@base`` targets' clients run that checkout's ``shardbus.client`` too (the client is part of the
product); RabbitMQ's run this tree's.

    python bench/scale.py [--count N] [--quick] [--repeat R] [--window W] [--credit C] [--brokers K,...]
                          [--senders S] [--receivers R] [--no-rabbitmq] [--no-install] [--workers-only]
                          [--profile DIR] [--base DIR]

``--quick`` is 2000 messages. ``--no-rabbitmq`` skips RabbitMQ; otherwise it is installed with apt-get when missing
and we are root (``--no-install`` forbids that), and when it cannot be installed or started the run says why and
goes on without it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# A client child of an ``@base`` target runs the base's client (``CLIENT_TREE``, set by ``Role``): the client is
# part of what a change may change. The parent and every other child run this tree's.
sys.path.insert(0, str(Path(os.environ.get("SCALE_CLIENT_TREE") or Path(__file__).resolve().parents[1]) / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/rabbitmq.py

import rabbitmq
from shardbus.amqp.transport import install_uvloop
from shardbus.client import MessageReceiver, OutgoingMessage, ShardbusClient

ROOT = Path(__file__).resolve().parents[1]
CLIENT_TREE = "SCALE_CLIENT_TREE"  # see the sys.path line above
BODY = os.urandom(1024)
QUEUE = "scale"
KEY = "SAS_KEY_VALUE"
WARMUP = 200
IDLE = 0.05  # a receive call ends a partial batch after this long without a delivery
STALL = 120.0  # a phase fails when no message arrived for this long
WORKERS_TARGET = 1.6
RABBIT_RETRIES = 3  # rounds RabbitMQ may start again (new clients) before it is left out
RABBIT_E2E = 1.5  # issue 26: the default end to end vs RabbitMQ
RABBIT_PHASE = 1.2  # and send, receive each
HOP_TARGET = 1.3  # broker CPU per message, --workers 1 over --workers 0
CPU_TARGET = 35  # broker CPU us/msg of the default in "both"
POINT4_TARGET = 1.15  # all workers' CPU per message with 2 or 4 workers over one worker's, in "both"

# What bench/scale.py can start: kind -> mode flags of ``shardbus serve`` (the default has none, as users run it)
LINEUP: dict[str, list[str]] = {
    "default": [],
    "workers0": ["--workers", "0"],
    "workers1": ["--workers", "1"],
    "workers2": ["--workers", "2"],
    "workers4": ["--workers", "4"],
    "frontends2": ["--frontends", "2", "--workers", "2"],
}
KINDS = tuple(LINEUP)


# =================================================================================================================
# child roles: one sending and one receiving client, driven over stdin/stdout
# =================================================================================================================
#
# A child prints "READY" once connected and warmed up, then for each command line ("send N TAG" / "recv N")
# does the work and prints "DONE {json}" with perf_counter times (CLOCK_MONOTONIC, comparable across processes
# on Linux) and its own CPU seconds; "quit" ends it.


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the bench process dies however it died (even SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _payloads(tag: str, n: int) -> list[bytes]:
    return [OutgoingMessage(BODY, message_id=f"{tag}-{i}", durable=True).encode() for i in range(n)]


def role_send(url: str, entity: str, window: int) -> None:
    with ShardbusClient(url, timeout=STALL) as client:
        client.send(entity, _payloads(f"warmup{os.getpid()}", WARMUP), window=window)  # ids distinct per sender
        print("READY", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            n, tag = int(words[1]), words[2]
            payloads = _payloads(tag, n)  # encoded before the clock starts: we time the broker, not the encoder
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            client.send(entity, payloads, window=window)
            t1 = time.perf_counter()
            result = {"count": n, "start": t0, "end": t1, "cpu": time.process_time() - cpu0}
            print("DONE " + json.dumps(result), flush=True)


def consume(receiver: MessageReceiver, n: int, credit: int) -> dict[str, Any]:
    """Receive and complete ``n`` messages; completes run in a second thread so that the next batch's receive
    does not wait for the previous batch's settle echoes (at most two batches wait to be completed)."""
    pending: queue.Queue[list[Any] | None] = queue.Queue(maxsize=2)
    errors: list[BaseException] = []

    def completer() -> None:
        while (batch := pending.get()) is not None:
            if not errors:
                try:
                    receiver.complete(batch)
                except BaseException as exc:  # reported by the receiving thread
                    errors.append(exc)

    thread = threading.Thread(target=completer, name="completer", daemon=True)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    thread.start()
    got, first, seen, duplicates, batches = 0, None, set(), 0, 0
    last_progress = time.monotonic()
    try:
        while got < n and not errors:
            batch = receiver.receive(max_count=min(credit, n - got), max_wait=1.0, idle=IDLE)
            if not batch:
                if time.monotonic() - last_progress > STALL:
                    raise RuntimeError(f"only {got} of {n} messages arrived (none for {STALL:.0f} s)")
                continue
            if first is None:
                first = time.perf_counter()
            last_progress = time.monotonic()
            for m in batch:
                mid = m.message.properties.message_id if m.message.properties else None
                if mid in seen:
                    duplicates += 1
                seen.add(mid)
            got += len(batch)
            batches += 1
            pending.put(batch)
    finally:
        pending.put(None)
        thread.join()
    if errors:
        raise errors[0]
    t1 = time.perf_counter()
    return {
        "count": got,
        "start": t0,
        "first": first,
        "end": t1,
        "cpu": time.process_time() - cpu0,
        "duplicates": duplicates,
        "batches": batches,
    }


def role_recv(url: str, entity: str, credit: int) -> None:
    with ShardbusClient(url, timeout=STALL) as client, client.receiver(entity) as receiver:
        print("READY", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            print("DONE " + json.dumps(consume(receiver, int(words[1]), credit)), flush=True)


class Role:
    """A sending or receiving child process of this script."""

    def __init__(
        self,
        role: str,
        url: str,
        entity: str,
        option: int,
        tree: Path | None = None,
        script: str = __file__,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.role = role
        env = dict(os.environ)
        env.pop(CLIENT_TREE, None)
        if tree is not None and tree != ROOT:
            env[CLIENT_TREE] = str(tree)  # the client of that checkout (see CLIENT_TREE)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [sys.executable, script, "--role", role, "--url", url, "--entity", entity, "--option", str(option)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_die_with_parent,
        )
        self._expect("READY")

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        return json.loads(self._expect("DONE"))

    def _expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(word):
            self.stop()
            raise RuntimeError(f"{self.role} client: expected {word}, got {line.strip()!r} (exit {self.proc.poll()})")
        return line[len(word) :].strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.command("quit")
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


# =================================================================================================================
# brokers
# =================================================================================================================


def _proc_table() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every live process's children and CPU seconds (user + system), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return children, cpu


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_time(pid: int) -> float | None:
    """CPU seconds of a process to the nanosecond: the sum of its threads' run times (``/proc/PID/task/TID/
    schedstat``), None where the kernel does not keep them. /proc/PID/stat counts clock ticks (10 ms): over a
    phase of 10,000 messages a tick is 1 us per message per process, and the sum of ``--workers 4``'s four
    workers (~25 us/msg together) carried up to 4 us/msg of it, so point 4's factor moved by up to 16% with where
    ticks fell (half that at the default 20,000). A thread that ended between two readings is not in the later
    one: every thread a shardbus process or RabbitMQ runs while measured lives as long as the process (pools, the
    loop, timers)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                continue  # the thread ended meanwhile
    except OSError:
        return None
    return total / 1e9 if total else None


def process_cpu(root: int) -> dict[int, float]:
    """CPU seconds of a process and each of its live descendants, by pid (``run_time``, or clock ticks where the
    kernel keeps no run times)."""
    children, cpu = _proc_table()
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        precise = run_time(pid)
        out[pid] = cpu.get(pid, 0.0) if precise is None else precise
        todo.extend(children.get(pid, []))
    return out


def write_calls(pids: list[int]) -> dict[int, int]:
    """Write system calls so far (``syscw`` of /proc/PID/io: socket writes and event-loop wake-ups) by pid."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                out[pid] = next(int(line.split()[1]) for line in f if line.startswith("syscw:"))
        except (OSError, StopIteration, ValueError):
            pass
    return out


def system_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds in the kernel so far (stime: socket and file I/O, wake-ups) by pid."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        out[pid] = int(stat[stat.rfind(")") + 2 :].split()[12]) / ticks
    return out


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of a process and all its live descendants."""
    return sum(process_cpu(root).values())


def process_roles(root: int) -> dict[int, str]:
    """What each process of a ``shardbus serve`` tree is: "front end", "worker N" (forked children), or with
    ``--frontends``, "supervisor" and "front end N" (``python -m shardbus.frontends`` children)."""
    kids = sorted(pid for pid in process_cpu(root) if pid != root)
    fronts = [pid for pid in kids if "shardbus.frontends" in _cmdline(pid)]
    workers = [pid for pid in kids if pid not in fronts]
    roles = {root: "supervisor" if fronts else "front end"}
    roles.update({pid: f"front end {i + 1}" for i, pid in enumerate(fronts)})
    roles.update({pid: f"worker {i + 1}" for i, pid in enumerate(workers)})
    return roles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE = [sys.executable, "-c", "import sys; from shardbus.cli import main; sys.exit(main())", "serve"]


def _child_env(tree: Path = ROOT) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(tree / "src") + (os.pathsep + path if path else "")}


BASE = "@base"  # a kind's suffix: the same mode served from the ``--base`` checkout (e.g. ``workers1@base``)


def _mode(kind: str) -> str:
    """The mode of a kind, without the ``@base`` suffix."""
    return kind.removesuffix(BASE)


class ShardbusServe:
    """``shardbus serve [mode flags]`` as a child process, with a Config.json holding one partitioned queue."""

    def __init__(
        self,
        folder: Path,
        flags: list[str],
        profile: Path | None = None,
        tree: Path = ROOT,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        """``wrapper``: a command the server runs under (bench/workers_instructions.py: valgrind)."""
        self.folder = folder
        folder.mkdir(parents=True)
        self.port = _free_port()
        config = {
            "UserConfig": {
                "Namespaces": [
                    {"Name": "sbemulatorns", "Queues": [{"Name": QUEUE, "Properties": {"EnablePartitioning": True}}]}
                ],
                "Logging": {"Type": "File"},
            }
        }
        (folder / "Config.json").write_text(json.dumps(config))
        args = [
            *SERVE,
            *("--host", "127.0.0.1", "--port", str(self.port), "--key", KEY),
            *("--data-dir", str(folder / "data"), "--config", str(folder / "Config.json")),
        ]
        args += flags
        self.command = " ".join(["shardbus serve", *flags]) + ("" if tree == ROOT else f" ({tree.name})")
        self.profile = profile
        if profile is not None:  # the same command under cProfile, every thread of every process
            args = [sys.executable, str(Path(__file__).with_name("profiled.py")), str(profile), *args[len(SERVE) - 1 :]]
        args = [*wrapper, *args]
        self.log_path = folder / "serve.log"
        log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 -- the child keeps writing to it
        self.proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(tree),
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.url = (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            f"SharedAccessKey={KEY};UseDevelopmentEmulator=true"
        )
        deadline = time.monotonic() + 90
        # Ready when it prints its connection string (with --workers: once every worker serves, we assume).
        while "connection string:" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"{self.command} did not start (exit {self.proc.returncode}): {tail}")
            time.sleep(0.05)
        # With --workers the connection string may come before every worker serves; /health (plain HTTP on the
        # same port) says ready once they all do.
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.command} never reported ready on /health (exit {self.proc.returncode})")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                return bool(json.loads(response.read()).get("ready"))
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a clean stop (and the profiles written)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Target:
    """One broker under test and what it measured (msgs/s and CPU us/msg per phase, one entry per repeat)."""

    label: str
    kind: str  # "default", "workers0", "workers1", ..., "frontends2", "rabbitmq"
    url: str
    entity: str
    pid: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    broker_us: dict[str, list[float]] = field(default_factory=dict)
    client_us: dict[str, list[float]] = field(default_factory=dict)
    batch: dict[str, list[float]] = field(default_factory=dict)  # messages per receive call
    process_us: dict[str, list[float]] = field(default_factory=dict)  # "both": CPU us/msg by process role
    process_writes: dict[str, list[float]] = field(default_factory=dict)  # "both": write syscalls per message
    process_sys: dict[str, list[float]] = field(default_factory=dict)  # "both": kernel CPU us/msg by role
    workers_us: dict[int, float] = field(default_factory=dict)  # "both": all workers' CPU us/msg, by round
    roles: dict[int, str] = field(default_factory=dict)  # pid -> role (shardbus only)
    senders: list[Role] = field(default_factory=list)
    receivers: list[Role] = field(default_factory=list)

    def record(self, phase: str, n: int, seconds: float, broker_cpu: float, client_cpu: float, calls: int = 0) -> None:
        if calls:
            self.batch.setdefault(phase, []).append(n / calls)
        self.rates.setdefault(phase, []).append(n / seconds)
        self.broker_us.setdefault(phase, []).append(broker_cpu / n * 1e6)
        self.client_us.setdefault(phase, []).append(client_cpu / n * 1e6)

    def rate(self, phase: str) -> float:
        return statistics.median(self.rates[phase])


# =================================================================================================================
# the measurement
# =================================================================================================================

PHASES = ("send", "receive", "both")


def _shares(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _send(senders: list[Role], n: int, tag: str) -> None:
    for i, (role, share) in enumerate(zip(senders, _shares(n, len(senders)), strict=True)):
        role.command(f"send {share} {tag}{i}")


def _recv(receivers: list[Role], n: int) -> None:
    for role, share in zip(receivers, _shares(n, len(receivers)), strict=True):
        role.command(f"recv {share}")  # competing consumers on one queue: each stops once it has its share


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several clients' results as one: first start to last end, CPU and counts summed."""
    return {
        "count": sum(r["count"] for r in results),
        "start": min(r["start"] for r in results),
        "end": max(r["end"] for r in results),
        "cpu": sum(r["cpu"] for r in results),
        "duplicates": sum(r.get("duplicates", 0) for r in results),
        "batches": sum(r.get("batches", 0) for r in results),
    }


def measure(target: Target, n: int, run: int) -> None:
    """The three phases on one broker; the queue is empty before and after."""
    snd, rcv = target.senders, target.receivers

    cpu0 = tree_cpu(target.pid)
    _send(snd, n, f"r{run}s")
    s = _merge([role.result() for role in snd])
    target.record("send", n, s["end"] - s["start"], tree_cpu(target.pid) - cpu0, s["cpu"])

    cpu0 = tree_cpu(target.pid)
    _recv(rcv, n)
    r = _merge([role.result() for role in rcv])
    _check(target, r, n)
    target.record("receive", n, r["end"] - r["start"], tree_cpu(target.pid) - cpu0, r["cpu"], r["batches"])

    procs0 = process_cpu(target.pid)
    writes0 = write_calls(list(target.roles))
    sys0 = system_cpu(list(target.roles))
    _recv(rcv, n)  # the receivers wait (max_wait) for the first message
    _send(snd, n, f"r{run}b")
    s, r = _merge([role.result() for role in snd]), _merge([role.result() for role in rcv])
    _check(target, r, n)
    procs1 = process_cpu(target.pid)
    writes1 = write_calls(list(target.roles))
    sys1 = system_cpu(list(target.roles))
    # From the first send to the last complete: the receivers started earlier and only waited until then.
    broker = sum(procs1.values()) - sum(procs0.get(pid, 0.0) for pid in procs1)
    target.record("both", n, r["end"] - s["start"], broker, s["cpu"] + r["cpu"], r["batches"])
    workers = 0.0
    for pid, role in target.roles.items():
        if pid in procs1:  # a process that died (a worker restart) would be counted wrong: left out
            used = procs1[pid] - procs0.get(pid, 0.0)
            target.process_us.setdefault(role, []).append(used / n * 1e6)
            workers += used / n * 1e6 if role.startswith("worker") else 0.0
        elif role.startswith("worker"):
            workers = float("nan")  # the round's sum would lack a worker
        if pid in sys0 and pid in sys1:
            target.process_sys.setdefault(role, []).append((sys1[pid] - sys0[pid]) / n * 1e6)
        if pid in writes0 and pid in writes1:
            target.process_writes.setdefault(role, []).append((writes1[pid] - writes0[pid]) / n)
    if not math.isnan(workers) and any(role.startswith("worker") for role in target.roles.values()):
        target.workers_us[run] = workers


def _check(target: Target, r: dict[str, Any], n: int) -> None:
    # Each receiver counts duplicates among its own messages; messages-ids are distinct per run, and the shares
    # add up to n, so a duplicate across receivers would leave one receiver short and stall the phase.
    if r["count"] != n or r["duplicates"]:
        raise RuntimeError(f"{target.label}: received {r['count']} of {n}, {r['duplicates']} duplicates")


def fmt_range(values: list[float], digits: int = 0) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def print_table(targets: list[Target], n: int) -> None:
    print()
    print(
        f"msgs/s (median, min-max over runs), {n} messages of 1 KB per phase; both: CPU in us/msg (broker / "
        "clients) and messages per receive call"
    )
    head = (
        f"{'broker':<42}"
        + "".join(f"{p + ' msgs/s':>26}" for p in PHASES)
        + f"{'CPU broker/clients':>22}{'msgs/receive':>14}"
    )
    print(head)
    print("-" * len(head))
    for t in targets:
        if not t.rates:
            continue
        cells = "".join(f"{fmt_range(t.rates[p]):>26}" for p in PHASES)
        cpu = f"{statistics.median(t.broker_us['both']):.0f} / {statistics.median(t.client_us['both']):.0f}"
        print(f"{t.label:<42}{cells}{cpu:>22}{statistics.median(t.batch['both']):>14.1f}")
    print()
    # Where the CPU goes phase by phase: the clients' share differs by broker (frames, echoes, wake-ups).
    for t in targets:
        if t.rates:
            cells = ", ".join(
                f"{p} {statistics.median(t.broker_us[p]):.0f} / {statistics.median(t.client_us[p]):.0f}" for p in PHASES
            )
            print(f"CPU us/msg (broker / clients), {t.label}: {cells}")
    print()
    # Broker and clients share the machine's cores: their CPU per message bounds "both" whatever the workers do.
    cores = os.cpu_count() or 1
    for t in targets:
        if t.rates:
            per = statistics.median(t.broker_us["both"]) + statistics.median(t.client_us["both"])
            print(
                f"CPU ceiling of both, {t.label}: {per:.0f} us/msg (broker + clients) on {cores} cores "
                f"-> at most {cores * 1e6 / per:,.0f} msgs/s with the machine to itself"
            )
    print()


def _ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def print_ratios(targets: list[Target], rabbit_note: str | None) -> None:
    by = {t.kind: t for t in targets if t.rates}

    def ratio(a: Target, b: Target, phase: str) -> str:
        return fmt_range(_ratios(a.rates[phase], b.rates[phase]), 2)

    # End to end ("both") is the measure; send and receive alone show where a difference comes from.
    if "workers1" in by and "workers2" in by:
        w1, w2 = by["workers1"], by["workers2"]
        print(
            f"ratio workers2/workers1: {ratio(w2, w1, 'both')} end to end "
            f"(send {ratio(w2, w1, 'send')}, receive {ratio(w2, w1, 'receive')}; the {WORKERS_TARGET}x of a "
            "machine with a core per process cannot show on 2 shared cores: see the CPU per process above)"
        )
    else:
        print("ratio workers2/workers1: n/a (not measured)")
    rabbit = by.get("rabbitmq")
    default = by.get("default")
    if default is not None:
        if rabbit is None:
            print(f"ratio default/RabbitMQ: n/a ({rabbit_note or 'not measured'})")
        else:
            for phase, word, goal in (
                ("both", "end to end", RABBIT_E2E),
                ("send", "send", RABBIT_PHASE),
                ("receive", "receive", RABBIT_PHASE),
            ):
                values = _ratios(default.rates[phase], rabbit.rates[phase])
                verdict = "met" if statistics.median(values) >= goal else "MISSED"
                print(f"ratio default/RabbitMQ: {fmt_range(values, 2)} {word} (target >= {goal}: {verdict})")
    for s in (by[k] for k in KINDS if k in by and k != "default"):
        if rabbit is not None:
            print(
                f"ratio {s.kind}/RabbitMQ: {ratio(s, rabbit, 'both')} end to end "
                f"(send {ratio(s, rabbit, 'send')}, receive {ratio(s, rabbit, 'receive')})"
            )
    # The hop to a worker: broker CPU per message, the same round's workers1 over workers0.
    for suffix in ("", BASE):
        if "workers1" + suffix in by and "workers0" + suffix in by:
            values = _ratios(by["workers1" + suffix].broker_us["both"], by["workers0" + suffix].broker_us["both"])
            verdict = "met" if statistics.median(values) <= HOP_TARGET else "MISSED"
            print(
                f"broker CPU per message workers1/workers0{suffix}: {fmt_range(values, 2)} in both "
                f"(target <= {HOP_TARGET}: {verdict})"
            )
    for kind in [k for k in by if not k.endswith(BASE) and k + BASE in by]:
        values = _ratios(by[kind].broker_us["both"], by[kind + BASE].broker_us["both"])
        print(f"broker CPU per message {kind} / {kind}{BASE}: {fmt_range(values, 2)} in both (this tree over the base)")
    if default is not None:
        med = statistics.median(default.broker_us["both"])
        verdict = "met" if med <= CPU_TARGET else "MISSED"
        print(
            f"broker CPU per message, default, both: {fmt_range(default.broker_us['both'])} us "
            f"(target <= {CPU_TARGET}: {verdict})"
        )


def print_processes(targets: list[Target]) -> None:
    """Point 4 of the scale-out work, honestly on few cores: each process's CPU per message in "both", and the
    capacity that implies with a core per process (each process saturates at 1e6 / its us/msg messages/s)."""
    rows = [t for t in targets if t.process_us and _mode(t.kind) != "default"]
    if not rows:
        return
    print('CPU per message in "both" by process (us/msg, median over runs; one message = one send + one complete)')
    bases: dict[str, tuple[float, int, Target]] = {}  # workers1 by tree: capacity, processes, the target
    for t in rows:
        tree = t.kind[len(_mode(t.kind)) :]  # "" or "@base"
        base = bases.get(tree)
        med = {role: statistics.median(v) for role, v in t.process_us.items()}
        fronts = {r: v for r, v in med.items() if r.startswith("front end")}
        workers = {r: v for r, v in med.items() if r.startswith("worker")}
        total = sum(med.values())
        cells = ", ".join(f"{r} {v:.0f}" for r, v in sorted(med.items()))
        writes = {role: statistics.median(v) for role, v in t.process_writes.items()}
        calls = ", ".join(f"{r} {v:.2f}" for r, v in sorted(writes.items()) if r != "supervisor")
        kernel = {role: statistics.median(v) for role, v in t.process_sys.items()}
        in_kernel = ", ".join(f"{r} {v:.0f}" for r, v in sorted(kernel.items()) if r != "supervisor")
        busy = {r: v for r, v in med.items() if r != "supervisor"}
        capacity = 1e6 / max(busy.values()) if busy else 0.0
        share = sum(fronts.values()) / total if total else 0.0
        # all workers' CPU per message: the median of each round's sum (not the sum of each worker's median)
        wsum = statistics.median(t.workers_us.values()) if t.workers_us else sum(workers.values())
        line = (
            f"  {t.label:<40} {cells}\n"
            f"  {'':<40} front-end share {share:.0%}; workers together {wsum:.0f} us/msg; with a core per process "
            f"at most {capacity:,.0f} msgs/s ({len(busy)} processes)\n"
            f"  {'':<40} write system calls per message: {calls or 'n/a'}\n"
            f"  {'':<40} of which in the kernel (us/msg): {in_kernel or 'n/a'}"
        )
        if _mode(t.kind) == "workers1" and workers:
            bases[tree] = (capacity, len(busy), t)
        elif base is not None and workers and len(busy) > base[1]:
            per_core = (capacity - base[0]) / (len(busy) - base[1])
            line += (
                f"\n  {'':<40} vs --workers 1: {per_core:+,.0f} msgs/s per added core; workers' CPU per message "
                f"{_point4(t, base[2])} (must stay <= {POINT4_TARGET})"
            )
        print(line)
    print()


def _point4(t: Target, one: Target) -> str:
    """Issue 26 point 4: all workers' CPU per message over one worker's, each round's sum over the same round's
    (interleaved, so both saw the same machine): median, range and verdict."""
    runs = sorted(set(t.workers_us) & set(one.workers_us))
    if not runs:
        return "n/a (no round measured every worker of both)"
    values = [t.workers_us[run] / one.workers_us[run] for run in runs]
    verdict = "met" if statistics.median(values) <= POINT4_TARGET else "MISSED"
    return f"x{fmt_range(values, 2)} ({verdict}, same-round ratios)"


def _forget_round(t: Target, run: int) -> None:
    """Drop what a failed round recorded, so every list keeps one entry per finished round."""
    t.workers_us.pop(run, None)
    for values in (t.rates, t.broker_us, t.client_us, t.batch, t.process_us, t.process_writes, t.process_sys):
        for kept in values.values():
            del kept[run:]


def _fresh_clients(t: Target, node: rabbitmq.RabbitNode) -> bool:
    """Stop a target's clients and empty its queue (what a failed round left there); False if that fails."""
    for role in (*t.senders, *t.receivers):
        role.stop()
    t.senders, t.receivers = [], []
    try:
        # unacknowledged deliveries of the closed connections come back to the queue a moment later
        for _ in range(20):
            node.purge_queue(QUEUE)
            time.sleep(0.5)
            if node.queue_depth(QUEUE) == 0:
                return True
    except rabbitmq.RabbitUnavailable as exc:
        print(f"RabbitMQ: {exc}", flush=True)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages per phase (default 20000)")
    parser.add_argument("--quick", action="store_true", help="2000 messages (smoke test)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each broker this many times (interleaved)")
    parser.add_argument("--window", type=int, default=100, help="sends in flight (default 100)")
    parser.add_argument("--credit", type=int, default=100, help="receiver credit per batch (default 100)")
    parser.add_argument("--senders", type=int, default=1, help="sending clients (processes) per phase (default 1)")
    parser.add_argument(
        "--receivers", type=int, default=1, help="receiving clients (processes) per phase, competing (default 1)"
    )
    parser.add_argument(
        "--brokers",
        default=",".join(KINDS),
        help=f"which shardbus modes, comma-separated (default: all of {','.join(KINDS)})",
    )
    parser.add_argument("--no-rabbitmq", action="store_true", help="skip RabbitMQ")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install rabbitmq-server")
    parser.add_argument("--workers-only", action="store_true", help="shardbus only (same as --no-rabbitmq)")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each shardbus mode under cProfile (bench/profiled.py), its profiles in DIR/<mode>/, and print "
        "the busiest functions of each process (slow: take CPU per message from a run without it)",
    )
    parser.add_argument(
        "--base",
        metavar="DIR",
        help="also serve each mode from this checkout of another commit (its src/), interleaved with this one's, "
        "and print every ratio for both: a change measured against its base in the same run",
    )
    parser.add_argument("--role", choices=("send", "recv"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--entity", help=argparse.SUPPRESS)
    parser.add_argument("--option", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    install_uvloop()  # the client's own loop is made after this, so every broker gets the faster client
    if args.role == "send":
        role_send(args.url, args.entity, args.option)
        return
    if args.role == "recv":
        role_recv(args.url, args.entity, args.option)
        return

    n = 2000 if args.quick else args.count
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in LINEUP]
    if unknown:
        parser.error(f"--brokers: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})")
    base_tree: Path | None = None
    if args.base:
        base_tree = Path(args.base).resolve()
        if not (base_tree / "src" / "shardbus").is_dir():
            parser.error(f"--base: {base_tree} is not a shardbus checkout (no src/shardbus)")
        kinds = [k for kind in kinds for k in (kind, kind + BASE)]  # each mode next to its base: interleaved
    # SIGTERM (e.g. a test runner's timeout) unwinds through the finally below, which stops every child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = Path(tempfile.mkdtemp(prefix="shardbus-bench-scale-"))
    brokers: list[Any] = []
    targets: list[Target] = []
    rabbit_note: str | None = "--no-rabbitmq" if args.no_rabbitmq or args.workers_only else None
    try:
        print(
            f"{os.cpu_count()} CPUs; {n} messages per phase, window {args.window}, credit {args.credit}, "
            f"{args.senders} sender(s), {args.receivers} receiver(s)",
            flush=True,
        )
        for kind in kinds:
            profile = None
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                profile = Path(args.profile).resolve() / kind
            tree = base_tree if kind.endswith(BASE) and base_tree is not None else ROOT
            serve = ShardbusServe(folder / kind, LINEUP[_mode(kind)], profile, tree)
            brokers.append(serve)
            target = Target(serve.command, kind, serve.url, QUEUE, serve.proc.pid)
            target.roles = process_roles(serve.proc.pid)
            targets.append(target)

        node: rabbitmq.RabbitNode | None = None
        if rabbit_note is None:
            try:
                if args.no_install and rabbitmq.installed_version() is None:
                    raise rabbitmq.RabbitUnavailable("rabbitmq-server is not installed (--no-install)")
                version = rabbitmq.ensure_installed(folder / "apt-get.log")
                node = rabbitmq.RabbitNode(version)
                brokers.append(node)
                started = time.monotonic()
                node.start()
                node.declare_queue(QUEUE)
                print(
                    f"RabbitMQ {version} started in {time.monotonic() - started:.1f} s on 127.0.0.1:{node.port} "
                    f"(AMQP 1.0 {node.amqp10}; durable classic queue at {node.address(QUEUE)})",
                    flush=True,
                )
                assert node.proc is not None
                targets.append(
                    Target(
                        f"RabbitMQ {version.split('-')[0]}", "rabbitmq", node.url, node.address(QUEUE), node.proc.pid
                    )
                )
            except (rabbitmq.RabbitUnavailable, OSError, subprocess.SubprocessError) as exc:
                rabbit_note = f"RabbitMQ unavailable: {exc}"
                print(f"RabbitMQ NOT measured: {exc}", flush=True)

        live = list(targets)
        retries = RABBIT_RETRIES
        for run in range(args.repeat):
            # Interleaved, so that a busy moment of the machine does not hit one broker only, and in reverse order
            # every other round: the broker measured second in a round read 5-10% less CPU per message in "both"
            # than when measured first (one branch against its base: 1.05-1.06 first, 0.90 second; 2026-11-26).
            order = live if run % 2 == 0 else live[::-1]
            for t in list(order):
                while True:
                    try:
                        if not t.senders:
                            tree = base_tree if t.kind.endswith(BASE) else None
                            t.senders = [Role("send", t.url, t.entity, args.window, tree) for _ in range(args.senders)]
                            t.receivers = [
                                Role("recv", t.url, t.entity, args.credit, tree) for _ in range(args.receivers)
                            ]
                        measure(t, n, run)
                        break
                    except Exception as exc:
                        if t.kind != "rabbitmq":
                            raise
                        failure = f"RabbitMQ failed: {type(exc).__name__}: {exc}"
                        for line in node.problems() if node is not None else ():
                            print(f"  RabbitMQ log: {line}", flush=True)
                        _forget_round(t, run)
                        if retries > 0 and node is not None and _fresh_clients(t, node):
                            # RabbitMQ 3.10's AMQP 1.0 plugin now and then crashes a session under load (in
                            # outgoing_link:flow) and detaches the receiver: new clients on an emptied queue, the
                            # round again.
                            retries -= 1
                            print(f"RabbitMQ round {run + 1} again with new clients ({failure})", flush=True)
                            continue
                        # The comparison broker failing must not cost the shardbus numbers: report and go on.
                        rabbit_note = failure
                        print(f"RabbitMQ NOT measured: {rabbit_note}", flush=True)
                        t.rates.clear()
                        live.remove(t)
                        break
                if t not in live:
                    continue
                line = "  ".join(f"{p} {t.rates[p][-1]:>8,.0f}" for p in PHASES)
                print(f"run {run + 1}: {t.label:<42} msgs/s  {line}", flush=True)
        print_table(targets, n)
        print_processes(targets)
        print_ratios(targets, rabbit_note)
    finally:
        for t in targets:
            for role in (*t.senders, *t.receivers):
                role.stop()
        for b in reversed(brokers):
            b.stop()
        shutil.rmtree(folder, ignore_errors=True)
        if args.profile:
            from profiled import print_profiles

            for kind in kinds:
                print(f"\n===== profiles of {kind} =====")
                print_profiles(Path(args.profile) / kind)


if __name__ == "__main__":
    main()
