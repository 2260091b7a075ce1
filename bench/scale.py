"""Durable queue throughput through our own AMQP 1.0 client: shardbus with 1 and 2 workers, and RabbitMQ.

One workload, one client (``shardbus.client.ShardbusClient``), three brokers, all in the same run:

    workers=1   ``shardbus serve --workers 1``, a 16-partition queue (Config.json ``"EnablePartitioning": true``)
    workers=2   ``shardbus serve --workers 2``, the same queue (partition brokers spread over 2 worker processes)
    rabbitmq    Debian's ``rabbitmq-server`` (a throwaway node, see bench/rabbitmq.py), a durable classic queue,
                AMQP 1.0 (3.x: the rabbitmq_amqp1_0 plugin; 4.x: built in), SASL PLAIN guest/guest

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

    python bench/scale.py [--count N] [--quick] [--repeat R] [--window W] [--credit C]
                          [--senders S] [--receivers R] [--no-rabbitmq] [--no-install] [--workers-only]

``--quick`` is 2000 messages. ``--no-rabbitmq`` skips RabbitMQ; otherwise it is installed with apt-get when missing
and we are root (``--no-install`` forbids that), and when it cannot be installed or started the run says why and
goes on without it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/rabbitmq.py

import rabbitmq
from shardbus.amqp.transport import install_uvloop
from shardbus.client import MessageReceiver, OutgoingMessage, ShardbusClient

ROOT = Path(__file__).resolve().parents[1]
BODY = os.urandom(1024)
QUEUE = "scale"
KEY = "SAS_KEY_VALUE"
WARMUP = 200
IDLE = 0.05  # a receive call ends a partial batch after this long without a delivery
STALL = 120.0  # a phase fails when no message arrived for this long
WORKERS_TARGET = 1.6
RABBIT_TARGET = 1.0


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

    def __init__(self, role: str, url: str, entity: str, option: int) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--role", role, "--url", url, "--entity", entity, "--option", str(option)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
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


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of a process and all its live descendants, from /proc."""
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
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE = [sys.executable, "-c", "import sys; from shardbus.cli import main; sys.exit(main())", "serve"]


def _child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + (os.pathsep + path if path else "")}


class ShardbusServe:
    """``shardbus serve [--workers N]`` as a child process, with a Config.json holding one partitioned queue."""

    def __init__(self, folder: Path, workers: int | None) -> None:
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
        if workers is not None:
            args += ["--workers", str(workers)]
        self.command = "shardbus serve" + ("" if workers is None else f" --workers {workers}")
        self.log_path = folder / "serve.log"
        log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 -- the child keeps writing to it
        self.proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
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
            self.proc.terminate()  # SIGTERM: a clean stop
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Target:
    """One broker under test and what it measured (msgs/s and CPU us/msg per phase, one entry per repeat)."""

    label: str
    kind: str  # "workers1", "workers2", "embedded", "rabbitmq"
    url: str
    entity: str
    pid: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    broker_us: dict[str, list[float]] = field(default_factory=dict)
    client_us: dict[str, list[float]] = field(default_factory=dict)
    batch: dict[str, list[float]] = field(default_factory=dict)  # messages per receive call
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

    cpu0 = tree_cpu(target.pid)
    _recv(rcv, n)  # the receivers wait (max_wait) for the first message
    _send(snd, n, f"r{run}b")
    s, r = _merge([role.result() for role in snd]), _merge([role.result() for role in rcv])
    _check(target, r, n)
    # From the first send to the last complete: the receivers started earlier and only waited until then.
    target.record("both", n, r["end"] - s["start"], tree_cpu(target.pid) - cpu0, s["cpu"] + r["cpu"], r["batches"])


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
        f"{'broker':<38}"
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
        print(f"{t.label:<38}{cells}{cpu:>22}{statistics.median(t.batch['both']):>14.1f}")
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


def print_ratios(targets: list[Target], rabbit_note: str | None) -> None:
    by = {t.kind: t for t in targets if t.rates}

    def ratio(a: Target, b: Target, phase: str) -> str:
        values = [x / y for x, y in zip(a.rates[phase], b.rates[phase], strict=True)]
        return fmt_range(values, 2)

    def verdict(a: Target, b: Target, target: float) -> str:
        return "target met" if a.rate("both") / b.rate("both") >= target else "MISSED"

    # End to end ("both") is the measure; send and receive alone are shown for where the difference comes from.
    if "workers1" in by and "workers2" in by:
        w1, w2 = by["workers1"], by["workers2"]
        print(
            f"ratio workers2/workers1: {ratio(w2, w1, 'both')} end to end "
            f"(send {ratio(w2, w1, 'send')}, receive {ratio(w2, w1, 'receive')}; "
            f"target >= {WORKERS_TARGET}: {verdict(w2, w1, WORKERS_TARGET)})"
        )
    else:
        print("ratio workers2/workers1: n/a (not measured)")
    shardbus = [by[k] for k in ("workers1", "workers2", "embedded") if k in by]
    rabbit = by.get("rabbitmq")
    for s in shardbus:
        name = {"workers1": "shardbus(workers=1)", "workers2": "shardbus(workers=2)"}.get(s.kind, "shardbus(embedded)")
        if rabbit is None:
            print(f"ratio {name}/RabbitMQ: n/a ({rabbit_note or 'not measured'})")
        else:
            print(
                f"ratio {name}/RabbitMQ: {ratio(s, rabbit, 'both')} end to end "
                f"(send {ratio(s, rabbit, 'send')}, receive {ratio(s, rabbit, 'receive')}; "
                f"goal >= {RABBIT_TARGET}: {verdict(s, rabbit, RABBIT_TARGET)})"
            )


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
    parser.add_argument("--no-rabbitmq", action="store_true", help="skip RabbitMQ")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install rabbitmq-server")
    parser.add_argument("--workers-only", action="store_true", help="shardbus only (same as --no-rabbitmq)")
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
        plan: list[tuple[str, str, int | None]] = [
            ("shardbus serve --workers 1", "workers1", 1),
            ("shardbus serve --workers 2", "workers2", 2),
        ]
        for label, kind, workers in plan:
            serve = ShardbusServe(folder / kind, workers)
            brokers.append(serve)
            targets.append(Target(label, kind, serve.url, QUEUE, serve.proc.pid))

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
        for run in range(args.repeat):
            for t in list(live):  # interleaved, so that a busy moment of the machine does not hit one broker only
                try:
                    if not t.senders:
                        t.senders = [Role("send", t.url, t.entity, args.window) for _ in range(args.senders)]
                        t.receivers = [Role("recv", t.url, t.entity, args.credit) for _ in range(args.receivers)]
                    measure(t, n, run)
                except Exception as exc:
                    if t.kind != "rabbitmq":
                        raise
                    # The comparison broker failing must not cost the shardbus numbers: report and go on.
                    rabbit_note = f"RabbitMQ failed: {type(exc).__name__}: {exc}"
                    print(f"RabbitMQ NOT measured: {rabbit_note}", flush=True)
                    t.rates.clear()
                    live.remove(t)
                    continue
                line = "  ".join(f"{p} {t.rates[p][-1]:>8,.0f}" for p in PHASES)
                print(f"run {run + 1}: {t.label:<38} msgs/s  {line}", flush=True)
        print_table(targets, n)
        print_ratios(targets, rabbit_note)
    finally:
        for t in targets:
            for role in (*t.senders, *t.receivers):
                role.stop()
        for b in reversed(brokers):
            b.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
