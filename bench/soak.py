"""Soak: a mixed load against a real ``shardbus serve`` process for a long time, then every message accounted for.

The broker is a child process (``python -m shardbus.cli serve``) over a fresh data directory, its entities from a
Config.json written here (all partitioned, 16 partitions on Standard):

    soak-q      peek-lock queue (lock 10 s, 3 deliveries): the consumer acts on each message's plan, which the
                producer chose and put in the message: complete; abandon once, then complete; dead-letter;
                defer, then receive it by sequence number and complete; abandon always (the broker dead-letters
                it with MaxDeliveryCountExceeded). Sent singly and in batches of 5, with a partition key and without,
                and scheduled 1-4 s ahead (a quarter of those cancelled again)
    soak-ttl    messages with a 1 s time to live, read rarely: they expire into the dead-letter queue
                (DeadLetteringOnMessageExpiration); the few received first are completed
    soak-s      sessions: 8 session ids, each session's messages received in order, its state set as it goes
    soak-t      a topic: "all" (no rules), "red" (SQL filter color = 'red'), "blue" (correlation filter color=blue)

The load is the official ``azure-servicebus`` SDK (sync), one client per thread, paced at ``--rate`` messages a
second to soak-q (the others in proportion). Every message id is unique and recorded when its send returns. The
timed consumers compete as a scaled-out application's do: ``2 * --consumers`` on soak-q, ``--consumers`` on each
subscription, each prefetching ``--prefetch`` (1) message, so a message goes to a consumer that is free for it.

Every ``--interval`` seconds one line: messages sent and settled in the interval, the broker's RSS at its end and
open file descriptors (the median of samples through the interval; its worker processes included), and p50/p99
latency of sends, first deliveries and completes, the machine's own (``Probe``), the disk's worst second
(``Disk``), the disk's own pace (``DiskProbe``) and the broker's own I/O per second. At the end the producers stop,
the consumers drain until every acknowledged message has its final outcome (or ``--drain`` s pass), and each
message id is reconciled:

    lost          acknowledged and never reached its outcome (fails the run)
    duplicated    settled twice where it should be once, without an explanation (fails the run); explained ones
                  (an earlier lock of the same message ended without a settlement: a lock lost, a failed
                  complete) are counted as at-least-once redeliveries
    misrouted     a topic message on a subscription whose filter does not match it, a cancelled scheduled
                  message delivered, an unknown id, a session out of order (fails the run)

and flatness: RSS, file descriptors and latencies of each interval after the first (warm-up) against the
second interval's; the run fails (exit status 2) when RSS or descriptors grow by more than 10% (judged with at least
three intervals after warm-up). Latencies are printed with their ratios, raw and net of the machine's drift (the disk's
too while the broker's own I/O was flat, ``flatness``), but do not decide (the machine is shared). With ``--control``
a second process runs the same load against a young broker, started afresh every interval, and each latency is
also judged as the soak's broker's over the young one's in the same interval (``against_young``): the machine's
weather is in both, so the ratio's spread over the intervals is what uptime did.

    python bench/soak.py [--minutes 30] [--interval 300] [--rate 40] [--workers 0] [--consumers 2] [--prefetch 1]
        [--disk-rate 50] [--data-dir DIR] [--keep] [--trace] [--control]
    python bench/soak.py --verdicts DIR/rows.json [...]   # --trace runs' intervals judged again (several: together)
    python bench/soak.py --young-of T --data-dir DIR      # only the young yardstick (twice with one T: two alike)
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

Q, TTL_Q, S_Q, TOPIC = "soak-q", "soak-ttl", "soak-s", "soak-t"
SUBS = ("all", "red", "blue")
PLANS = (("complete", 60), ("abandon-once", 15), ("dead-letter", 10), ("defer", 10), ("abandon-always", 5))
COLORS = ("red", "blue", "green")
SESSIONS = 8
KEYS = 32
FLAT = 1.10  # RSS, descriptors and latencies may move by this much after warm-up
SENDERS = 2  # threads sending to soak-q, each at its share of the rate
# Messages a second to soak-q by default: about 30% of what this machine (2 shared cores) sustains, so that the
# latencies measure the broker rather than a saturated machine (docs/operations.md, "Rate").
DEFAULT_RATE = 40.0
# No SDK keep-alive thread on the senders' connections: every 30 s it reads its connection's socket for up to
# 0.2 s (``listen(wait=socket_timeout)``) holding the transport's socket lock, and a send on that connection waits
# for it. With every sender started together that made a burst of ~200 ms sends every 30.2 s, about 0.5% of all
# sends, right at the p99: it measured the SDK, not the broker. A sender's connection is never idle for the
# broker's idle time-out (120 s) anyway. (Only the handler's own option counts: the client's is not passed on.)
SENDER_OPTIONS = {"keep_alive": None}
# The same thread on the timed receivers (soak-q, sessions, the topic), every 5 s: a receiver without prefetch gets
# a keep-alive of 5 s whatever it asks for (``keep_alive_interval=... if prefetch_count != 0 else 5``), and each
# round holds the socket 0.2 s, so a complete on that connection took 100-200 ms about every 5 s (the completes'
# p99 read ~99 ms), and the 20 messages the consumer had in hand waited behind it (the receive p99). Any prefetch
# lets the keep-alive be switched off; a message prefetched is locked as one received (lock 10 s). The session
# consumers prefetch 20; the timed ones ``TIMED_PREFETCH`` (below).
RECEIVER_OPTIONS = {"prefetch_count": 20, "keep_alive": None}
# The consumers whose receive latency is measured (soak-q, the topic) take one message per call: the prefetch buffer
# hands it over at once. Asked for 20, the SDK waits up to 0.2 s after the first message for the batch to fill
# (``_further_pull_receive_timeout``), and the receive latency was mostly that wait (p50 ~118 ms at this rate).
TAKE = 1
# Competing consumers per timed entity, as a Service Bus application scales out: soak-q gets ``2 * CONSUMERS``
# receivers, each subscription ``CONSUMERS`` (each its own client and connection, as separate processes would),
# and each of them prefetches ``TIMED_PREFETCH`` message, so that the broker hands a message to a consumer that is
# free for it. With one receiver per subscription and two on soak-q prefetching 20 (``--consumers 1 --prefetch
# 20``, the load before issue #28's point 6), 79-89% of the slowest 1% of first deliveries found their consumer
# still busy settling the messages ahead of them (a send of 5 filled one consumer's prefetch buffer, which it
# settles one by one, a round trip each): the receive p99 measured the load's own backlog, not the broker's
# delivery. More consumers alone did not change that (a link with credit for 20 takes all five); credit for one
# each spreads a batch over the free consumers (docs/operations.md, "The soak"). The SDK asks for the next credit
# when it next works its connection with none left, that is, inside the complete that follows each receive: a
# complete then carries the broker's answer to that flow as well (``cmpl_*`` ~0.5 ms more at p50).
CONSUMERS = 2
TIMED_PREFETCH = 1
CONNECTION_STRING = re.compile(r"^connection string: (Endpoint=sb://\S+)$")


def _config() -> dict:
    common = {"EnablePartitioning": True, "MaxSizeInMegabytes": 1024}
    queue = {"LockDuration": "PT10S", "MaxDeliveryCount": 3}
    sub = {"LockDuration": "PT10S", "MaxDeliveryCount": 3}
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [
                        {"Name": Q, "Properties": {**common, **queue}},
                        {"Name": TTL_Q, "Properties": {**common, **queue, "DeadLetteringOnMessageExpiration": True}},
                        {"Name": S_Q, "Properties": {**common, **queue, "RequiresSession": True}},
                    ],
                    "Topics": [
                        {
                            "Name": TOPIC,
                            "Properties": common,
                            "Subscriptions": [
                                {"Name": "all", "Properties": sub},
                                {
                                    "Name": "red",
                                    "Properties": sub,
                                    "Rules": [
                                        {
                                            "Name": "red",
                                            "Properties": {
                                                "FilterType": "Sql",
                                                "SqlFilter": {"SqlExpression": "color = 'red'"},
                                            },
                                        }
                                    ],
                                },
                                {
                                    "Name": "blue",
                                    "Properties": sub,
                                    "Rules": [
                                        {
                                            "Name": "blue",
                                            "Properties": {
                                                "FilterType": "Correlation",
                                                "CorrelationFilter": {"Properties": {"color": "blue"}},
                                            },
                                        }
                                    ],
                                },
                            ],
                        }
                    ],
                }
            ],
            "Logging": {"Type": "File"},
        }
    }


# --------------------------------------------------------------------------------------------------------------
# the broker process and what it holds
# --------------------------------------------------------------------------------------------------------------
class Broker:
    def __init__(self, data_dir: Path, workers: int, trace: Path | None = None, tree: Path | None = None) -> None:
        """``tree``: a checkout whose ``src/`` is served instead of the installed package (bench/disk_stall.py)."""
        config = data_dir / "Config.json"
        config.write_text(json.dumps(_config()))
        self.stderr = open(data_dir / "serve.stderr", "w")  # noqa: SIM115 (open for the process's life)
        env = dict(os.environ)
        if trace is not None:  # the broker notes its slow commits, checkpoints, collections, ticks (stalltrace.py)
            env["SHARDBUS_STALL_TRACE"] = str(trace)
        if tree is not None:
            env["PYTHONPATH"] = str(tree / "src")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardbus.cli", "serve", "--port", "0", "--data-dir", str(data_dir / "data"),
             "--config", str(config), "--workers", str(workers)],
            stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        self.connection_string = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := CONNECTION_STRING.match(line.strip()):
                self.connection_string = m.group(1)
                break
        if not self.connection_string:
            raise SystemExit(f"soak: the broker did not start:\n{(data_dir / 'serve.stderr').read_text()}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep its pipe drained

    def pids(self) -> list[int]:
        """The broker and its descendants (worker processes)."""
        children: dict[int, list[int]] = collections.defaultdict(list)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children[ppid].append(int(entry))
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += children.get(pid, [])
        return out

    def usage(self) -> tuple[float, int]:
        """(RSS in MB, open file descriptors), summed over the broker's processes."""
        rss_kb, fds = 0, 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss_kb += int(line.split()[1])
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
        return rss_kb / 1024, fds

    def io(self) -> tuple[int, int]:
        """(bytes written, write system calls), summed over the broker's processes so far (``/proc/PID/io``:
        ``write_bytes`` is what it sent towards the disk, its WAL frames and checkpoints; ``syscw`` its writes)."""
        written, calls = 0, 0
        for pid in self.pids():
            try:
                fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
                written += int(fields["write_bytes"])
                calls += int(fields["syscw"])
            except (OSError, ValueError, KeyError):
                continue
        return written, calls

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
        finally:
            self.stderr.close()


# --------------------------------------------------------------------------------------------------------------
# what was sent and what happened to it
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Sent:
    entity: str  # Q, TTL_Q, S_Q or TOPIC
    plan: str  # soak-q: one of PLANS; "scheduled"/"cancelled"; TTL_Q: "ttl"; S_Q: "session"; TOPIC: the color
    acked: bool = False
    session: str | None = None
    order: int = 0  # position in its session
    due: float = 0.0  # monotonic time the open-loop schedule meant it to be sent (receive latency counts from it)
    acked_at: float = 0.0  # monotonic time its send returned (0: not yet)
    batch: int = 1  # messages in its send


Span = tuple[float, float, str]  # a send: due and returned (monotonic), what it was
# A first delivery: the send's due time and the receive (monotonic), what it was, when its send returned (0: not yet
# when it was received), when the consumer asked for it (its ``receive_messages`` call began)
RecvSpan = tuple[float, float, str, float, float]


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[str, Sent] = field(default_factory=dict)
    events: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: collections.defaultdict(list))
    send_errors: collections.Counter = field(default_factory=collections.Counter)
    other_errors: collections.Counter = field(default_factory=collections.Counter)
    send_ms: list[float] = field(default_factory=list)
    send_spans: list[Span] = field(default_factory=list)  # this interval's sends
    slow_sends: list[Span] = field(default_factory=list)  # each interval's sends above its p99
    sample_sends: list[Span] = field(default_factory=list)  # 1% of all sends, picked at random
    receive_ms: list[float] = field(default_factory=list)  # from the send's due time to the first receive
    recv_spans: list[RecvSpan] = field(default_factory=list)  # this interval's timed first deliveries
    slow_recvs: list[RecvSpan] = field(default_factory=list)  # each interval's receives above its p99
    sample_recvs: list[RecvSpan] = field(default_factory=list)  # 1% of all timed receives, picked at random
    settle_ms: list[float] = field(default_factory=list)
    settled = 0
    misordered: list[str] = field(default_factory=list)

    def record_sent(self, mid: str, sent: Sent) -> None:
        with self.lock:
            self.sent[mid] = sent

    def event(self, mid: str, where: str, what: str, asked: float = 0.0) -> None:
        """``asked``: for a receive, when the consumer's ``receive_messages`` call that brought it began."""
        with self.lock:
            events = self.events[mid]
            if what == "received" and not events:  # first delivery: how long after it was due to be sent
                sent = self.sent.get(mid)
                # soak-q and the topic: sessions wait for their turn at a session receiver, ttl for its sweep
                if sent is not None and sent.due and sent.entity in (Q, TOPIC) and sent.plan != "scheduled":
                    now = time.monotonic()
                    self.receive_ms.append((now - sent.due) * 1000)
                    self.recv_spans.append((sent.due, now, f"{where} x{sent.batch}", sent.acked_at, asked))
            events.append((where, what))
            if what in ("completed", "dlq-completed"):
                self.settled += 1

    def send_done(self, due: float, what: str) -> float:
        """(Lock held.) A send (``what``: entity and kind) due at ``due`` returned now (returned)."""
        now = time.monotonic()
        self.send_ms.append((now - due) * 1000)
        self.send_spans.append((due, now, what))
        return now

    def take_latencies(self) -> tuple[list[float], list[float], list[float], int]:
        with self.lock:
            sends, receives, settles, settled = self.send_ms, self.receive_ms, self.settle_ms, self.settled
            spans, recv_spans = self.send_spans, self.recv_spans
            self.send_ms, self.receive_ms, self.settle_ms, self.settled, self.send_spans = [], [], [], 0, []
            self.recv_spans = []
        # what the stall trace is matched against (``stall_report``): this interval's slowest 1% and a sample
        for got, slow, sample in ((spans, self.slow_sends, self.sample_sends),
                                  (recv_spans, self.slow_recvs, self.sample_recvs)):  # fmt: skip
            if got:
                cut = _pct([span[1] - span[0] for span in got], 0.99)
                slow += [span for span in got if span[1] - span[0] >= cut]
                sample += random.sample(got, max(1, len(got) // 100))
        return sends, receives, settles, settled


_CPU_RECORD = struct.Struct("<qd16s")


def _cpu_work() -> int:
    """The CPU probe's fixed work (``Probe``): what a client call is made of, in small pieces, the same every time."""
    fields: dict[str, tuple[int, str]] = {}
    packed = 0
    for i in range(480):
        key = f"k{i & 15}"
        fields[key] = (i, key.upper())
        packed += len(_CPU_RECORD.pack(i, i * 0.5, fields[key][1].encode()))
    return packed


class Probe:
    """The machine's own drift, measured beside the broker: a tiny fixed operation on a bare SQLite file every
    ``period`` seconds (an insert and a synced commit, what a send costs the store at least) and a 64-byte loopback
    TCP echo every ``echo_period`` (what every request costs the network stack). Its medians and p99s per interval
    tell a slower machine (both move) from a slower broker (only the broker's latencies move). It runs in this
    process, beside the SDK's threads, so it waits for this process's GIL as the measured requests do: what it
    shows is everything but the broker.

    A p99 is only as steady as the samples above it. The commit is sampled ten times a second (each one an fsync
    on the disk the broker writes: more would load what it measures), 3,000 samples in a 5-minute interval, 30 of
    them above its p99; the echo costs nothing worth counting (~50 us of one core), so it is sampled a hundred
    times a second: 30,000 an interval, 300 above its p99. ``flatness`` prints each p99 with its confidence
    interval (``_pct_ci``), so a drift within the noise reads as such.

    Neither of those two is much CPU: the commit waits for the disk and the echo (~60 us) for the kernel's
    wake-ups. The latencies' p50s are mostly Python's work (the SDK's encode and decode, on both sides of the
    socket: a complete's 0.5 ms, a first delivery's 2.5 ms on tmpfs), which moves with the VM's CPU speed (steal,
    the host's clock), and that speed drifts by a third on these machines. So a third probe times a fixed piece of
    pure-Python work (``_cpu_work``, ~0.1-0.2 ms: dict and tuple churn, string formatting, a struct pack, what an
    SDK call is made of) every ``cpu_period`` (15,000 samples an interval), in this process like the others."""

    def __init__(self, root: Path, period: float = 0.1, echo_period: float = 0.01, cpu_period: float = 0.02) -> None:
        import socket
        import sqlite3

        self.period = period
        self.echo_period = echo_period
        self.sqlite_ms: list[float] = []
        self.echo_ms: list[float] = []
        self.cpu_period = cpu_period
        self.cpu_ms: list[float] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.db = sqlite3.connect(root / "probe.sqlite", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
        self.server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._echo_server, daemon=True).start()
        self.client = socket.create_connection(self.server.getsockname(), timeout=5)
        self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.threads = [
            threading.Thread(target=self._run_sqlite, name="probe-sqlite", daemon=True),
            threading.Thread(target=self._run_echo, name="probe-echo", daemon=True),
            threading.Thread(target=self._run_cpu, name="probe-cpu", daemon=True),
        ]

    def _echo_server(self) -> None:
        import socket

        conn, _ = self.server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def _run_sqlite(self) -> None:
        payload, k = b"p" * 64, 0
        while not self.stop.wait(self.period):
            k += 1
            started = time.perf_counter()
            self.db.execute("BEGIN")
            self.db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (k % 1000, payload))
            self.db.execute("COMMIT")
            elapsed = (time.perf_counter() - started) * 1000
            with self.lock:
                self.sqlite_ms.append(elapsed)

    def _run_echo(self) -> None:
        payload = b"e" * 64
        while not self.stop.wait(self.echo_period):
            started = time.perf_counter()
            self.client.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(self.client.recv(4096))
            elapsed = (time.perf_counter() - started) * 1000
            with self.lock:
                self.echo_ms.append(elapsed)

    def _run_cpu(self) -> None:
        while not self.stop.wait(self.cpu_period):
            started = time.perf_counter()
            _cpu_work()
            elapsed = (time.perf_counter() - started) * 1000
            with self.lock:
                self.cpu_ms.append(elapsed)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def take(self) -> tuple[list[float], list[float], list[float]]:
        with self.lock:
            out = self.sqlite_ms, self.echo_ms, self.cpu_ms
            self.sqlite_ms, self.echo_ms, self.cpu_ms = [], [], []
            return out

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.client.close()
        self.server.close()
        self.db.close()


class Disk:
    """The disk's own stalls, per interval, read from the kernel once a second (``/proc/diskstats`` for the device
    under the data directory, ``/proc/pressure/io``): what the commit probe (``Probe``), which syncs ten times a
    second, meets only by luck. A stall of 100-280 ms a few times an hour is invisible in a per-interval average,
    so each figure is the worst second of the interval:

        disk_ms   the device's time per completed write and flush request in the worst second (ms): the
                  kernel's own await, what an fdatasync waits for once its request is queued
        io_stall  in the worst second, the time some task on the machine was stalled waiting for I/O (PSI
                  ``some``, ms of that second), anyone's: the broker's, the other tenants', the probe's

    Both are printed beside the latencies and neither enters the "net" drift: the broker issues most of the
    requests on its own data disk (its checkpoints write megabytes at once, and its own fsyncs are PSI stall
    time), so its own work moves them too; they say when the disk stalled, not how much of a tail is the
    machine's (docs/operations.md, "The soak"); that is ``DiskProbe``'s, under ``flatness``'s rule. Absent files
    (no PSI, no such device) read as not measured."""

    def __init__(self, root: Path, period: float = 1.0) -> None:
        self.period = period
        dev = os.stat(root).st_dev
        self.device = f"{os.major(dev)} {os.minor(dev)}"
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.worst_await: float = float("nan")
        self.worst_stall: float = float("nan")
        self.thread = threading.Thread(target=self._run, name="probe-disk", daemon=True)

    def _read(self) -> tuple[tuple[int, int] | None, int | None]:
        """((write + flush requests completed, ms spent on them), PSI io some total in us)."""
        requests = None
        try:
            for line in Path("/proc/diskstats").read_text().splitlines():
                f = line.split()
                if f"{f[0]} {f[1]}" == self.device:
                    # writes completed, ms writing (fields 5 and 8 after the name); flushes and ms flushing (18, 19)
                    done = int(f[7]) + (int(f[18]) if len(f) > 19 else 0)
                    spent = int(f[10]) + (int(f[19]) if len(f) > 19 else 0)
                    requests = (done, spent)
                    break
        except (OSError, ValueError, IndexError):
            pass
        stall = None
        try:
            for line in Path("/proc/pressure/io").read_text().splitlines():
                if line.startswith("some "):
                    stall = int(line.rsplit("total=", 1)[1])
        except (OSError, ValueError, IndexError):
            pass
        return requests, stall

    def _run(self) -> None:
        before = self._read()
        while not self.stop.wait(self.period):
            now = self._read()
            (req0, stall0), (req1, stall1) = before, now
            before = now
            with self.lock:
                if req0 and req1 and req1[0] > req0[0]:
                    wait = (req1[1] - req0[1]) / (req1[0] - req0[0])
                    if not wait <= self.worst_await:  # (nan: the first of the interval)
                        self.worst_await = wait
                if stall0 is not None and stall1 is not None:
                    stalled = (stall1 - stall0) / 1000
                    if not stalled <= self.worst_stall:
                        self.worst_stall = stalled

    def start(self) -> None:
        self.thread.start()

    def take(self) -> tuple[float, float]:
        """The interval's worst second: (ms per write/flush request, ms of I/O stall)."""
        with self.lock:
            out = self.worst_await, self.worst_stall
            self.worst_await = self.worst_stall = float("nan")
            return out

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


class DiskProbe:
    """The disk's pace, dense and out of everyone's way: bench/disk_probe.py in a process of its own syncs a 4 KB
    overwrite of its own file next to the broker's data (the same filesystem) ``rate`` times a second, open loop,
    each latency counted from when it was due (as the soak's sends are). A disk stall of a few hundred ms then
    spoils the same share of its samples as of the sends due inside it, so its p99 moves with the disk as theirs
    does; at 50 a second a 5-minute interval has 15,000 samples, 150 above the p99, and a bad second is 50 of
    them (the commit probe's ten a second meet one with a sample or two). Being another process it waits for no
    one's GIL: it is the disk (the device, its queue and the kernel), what ``Probe`` is for the CPU.

    The broker's own I/O shares that device and so moves it too; ``flatness`` lets it into the machine's drift only
    over intervals in which the broker's own I/O was flat (``broker_io_flat``). Syncs of 3 ms or more are kept as
    ``disk-probe`` events for the stall report (``--trace``): the slow sends that overlapped one met a slow disk.
    With ``--trace`` every sample is also written to ``disk_probe.trace`` beside the broker's trace, in its format
    (``<due> <ms> disk-probe``), for reading against the broker's commits and checkpoints afterwards. A ``rate``
    of 0 runs no probe (``--disk-rate 0``: its columns read nan and the disk stays out of the drift)."""

    SCRIPT = Path(__file__).resolve().with_name("disk_probe.py")

    def __init__(self, root: Path, rate: float = 50.0, trace: Path | None = None) -> None:
        import struct

        self.trace = trace.open("w") if trace is not None else None
        self.record = struct.Struct("<dd")
        self.lock = threading.Lock()
        self.ms: list[float] = []
        self.events: list[tuple[float, float, str, str]] = []  # (start, end, "disk-probe", detail): the slow ones
        self.proc = subprocess.Popen(
            [sys.executable, str(self.SCRIPT), str(root / "disk_probe.bin"), "--rate", str(rate)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        ) if rate > 0 else None  # fmt: skip
        self.thread = threading.Thread(target=self._read, name="probe-disk-sync", daemon=True)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        size = self.record.size
        while len(data := self.proc.stdout.read(size)) == size:
            due, ms = self.record.unpack(data)
            if self.trace is not None:
                self.trace.write(f"{due:.6f} {ms:.3f} disk-probe\n")
            with self.lock:
                self.ms.append(ms)
                if ms >= STALL_MS:
                    self.events.append((due, due + ms / 1000, "disk-probe", f"{ms:.1f} ms"))

    def start(self) -> None:
        if self.proc is not None:
            self.thread.start()

    def take(self) -> list[float]:
        with self.lock:
            out, self.ms = self.ms, []
            return out

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.thread.join(5)
        if self.trace is not None:
            self.trace.close()


STALL_MS = 3.0  # a traced event at least this long is a stall that may explain a slow send


class ClientStalls:
    """What stalls the load itself, in this process (``--trace``): its garbage collections (every SDK thread and
    the probe wait for one) and the ledger's long holds of its lock (every send records itself under it). Matched
    against the slow sends with the broker's trace, as kinds ``client-gc`` and ``client-ledger``: a slow send that
    only a client stall overlapped was slow on this side of the socket."""

    def __init__(self) -> None:
        self.events: list[tuple[float, float, str, str]] = []  # (start, end, kind, detail)
        self._gc_started = 0.0

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
        elif self._gc_started:
            self.note("client-gc", self._gc_started, f"gen={info.get('generation')} collected={info.get('collected')}")

    def note(self, kind: str, started: float, detail: str = "") -> None:
        ended = time.monotonic()
        if (ended - started) * 1000 >= STALL_MS:
            self.events.append((started, ended, kind, detail))  # list.append: atomic, from any thread

    def start(self) -> None:
        gc.callbacks.append(self._gc)


def _commit_report(commits: list[tuple[float, float, str]], checkpoints: list[tuple[float, float, str]]) -> list[str]:
    """Synced commits that overlapped a checkpoint (of any store: they share the disk) against the others."""
    import bisect

    checkpoints.sort()
    starts = [c[0] for c in checkpoints]
    longest = max((c[1] - c[0] for c in checkpoints), default=0.0)
    beside: list[float] = []
    alone: list[float] = []
    for start, end, _ in commits:
        i = bisect.bisect_left(starts, start - longest)
        hit = False
        while i < len(checkpoints) and checkpoints[i][0] < end:
            if checkpoints[i][1] > start:
                hit = True
                break
            i += 1
        (beside if hit else alone).append((end - start) * 1000)
    out = [f"stalls: {len(checkpoints)} checkpoints, {sum(c[1] - c[0] for c in checkpoints):.2f} s in all"]
    for name, ms in (("beside a checkpoint", beside), ("alone", alone)):
        if ms:
            out.append(
                f"stalls: synced commits {name}: {len(ms)} ({len(ms) / len(commits):.1%}), p50 {_pct(ms, 0.5):.2f} ms,"
                f" p90 {_pct(ms, 0.9):.2f} ms, p99 {_pct(ms, 0.99):.2f} ms"
            )
    return out


def stall_report(
    trace: Path,
    slow: list[Span],
    sample: list[Span],
    client: list[tuple[float, float, str, str]] = (),
    slow_recvs: list[RecvSpan] = (),
    sample_recvs: list[RecvSpan] = (),
) -> list[str]:
    """Match the slowest sends against what the broker traced (``SHARDBUS_STALL_TRACE``): for each kind of event
    (commit, batch, checkpoint, gc, tick, upkeep, loop), how many lasted ``STALL_MS`` or more, and what share of
    the slow sends overlapped one, against the share of a random sample of all sends. A kind that overlaps the
    slow sends far more often than the sample is where their time went. The same for the slowest first deliveries
    (``slow_recvs``, each interval's above its p99, against ``sample_recvs``), matched over what came after their
    send returned, with where their time went (``_receive_report``)."""
    import bisect

    events: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
    commits: list[tuple[float, float, str]] = []  # every synced commit: (start, end, store)
    checkpoints: list[tuple[float, float, str]] = []  # every checkpoint
    try:
        lines = trace.read_text().splitlines()
    except OSError as exc:
        return [f"stalls: no trace ({exc})"]
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        start, ms, kind, detail = float(parts[0]), float(parts[1]), parts[2], parts[3] if len(parts) > 3 else ""
        span = (start, start + ms / 1000, detail.split(" ")[0])
        if kind == "commit" and detail.endswith("sync=True"):
            commits.append(span)
        elif kind == "checkpoint":
            checkpoints.append(span)
        if ms >= STALL_MS:
            events[kind].append((start, start + ms / 1000, detail))
    for start, end, kind, detail in client:
        events[kind].append((start, end, detail))
    out = _commit_report(commits, checkpoints)

    def overlapping(kind: str, due: float, end: float) -> list[tuple[float, float, str]]:
        evs, starts, longest = indexed[kind]
        i = bisect.bisect_left(starts, due - longest)
        found = []
        while i < len(evs) and evs[i][0] < end:
            if evs[i][1] > due:
                found.append(evs[i])
            i += 1
        return found

    indexed = {}
    for kind, evs in events.items():
        evs.sort()
        indexed[kind] = (evs, [e[0] for e in evs], max(e[1] - e[0] for e in evs))

    def overlap_table(label: str, slow: list[Span], sample: list[Span]) -> list[str]:
        lines = []
        for kind in sorted(indexed):
            evs = indexed[kind][0]
            total = sum(e[1] - e[0] for e in evs)
            hit_slow = sum(1 for d, e, _ in slow if overlapping(kind, d, e))
            hit_sample = sum(1 for d, e, _ in sample if overlapping(kind, d, e))
            longest = max(e[1] - e[0] for e in evs) * 1000
            lines.append(
                f"stalls: {kind:>10} >= {STALL_MS:g} ms: {len(evs):6d} events, {total:7.2f} s in all, longest "
                f"{longest:7.1f} ms; overlap {100 * hit_slow / max(1, len(slow)):5.1f}% of the {len(slow)} slowest "
                f"{label}, {100 * hit_sample / max(1, len(sample)):5.1f}% of {len(sample)} sampled"
            )
        return lines

    out += overlap_table("sends", slow, sample)
    for what, n in collections.Counter(s[2] for s in slow).most_common():
        share = sum(1 for s in sample if s[2] == what) / max(1, len(sample))
        out.append(f"stalls: {n / max(1, len(slow)):6.1%} of the slowest: '{what}' ({share:.1%} of the sample)")
    for due, end, what in sorted(slow, key=lambda s: s[0] - s[1])[:10]:
        seen = []
        for kind in sorted(indexed):
            evs = overlapping(kind, due, end)
            if evs:
                seen.append(f"{kind} x{len(evs)} (max {max(e[1] - e[0] for e in evs) * 1000:.0f} ms)")
        traced = ", ".join(seen) or "nothing traced"
        out.append(f"stalls: send ({what}) at {due:.3f} took {(end - due) * 1000:.1f} ms: {traced}")
    if slow_recvs:
        # a receive is matched over what came after its send returned (the delivery), or all of it if it came first
        windows = [(max(due, acked), end, what) for due, end, what, acked, _ in slow_recvs]
        sampled = [(max(due, acked), end, what) for due, end, what, acked, _ in sample_recvs]
        out += _receive_report(slow_recvs, sample_recvs)
        out += overlap_table("receives (after their send returned)", windows, sampled)
    return out


def _receive_report(slow: list[RecvSpan], sample: list[RecvSpan]) -> list[str]:
    """Where the slowest first deliveries' time went, against a sample of all: the send's own part (due to its
    return), what came after (the commit making it deliverable, the delivery, the consumer), and whether the
    consumer was busy with earlier messages (it asked for this one only after its send returned: the message
    waited on the client's side) or waiting (asked before: the broker or the wire had it late)."""
    out = []
    for name, spans in (("slowest", slow), ("sampled", sample)):
        acked = [s for s in spans if s[3]]
        early = len(spans) - len(acked)
        busy = [s for s in acked if s[4] > s[3]]
        waiting = [s for s in acked if s[4] <= s[3]]
        parts = [
            f"{len(spans)} {name} receives: p50 {_pct([(s[1] - s[0]) * 1000 for s in spans], 0.5):.1f} ms",
            f"send part p50 {_pct([(s[3] - s[0]) * 1000 for s in acked], 0.5):.1f} ms",
            f"after the send p50 {_pct([(s[1] - s[3]) * 1000 for s in acked], 0.5):.1f} ms",
            f"{early / max(1, len(spans)):.0%} received before their send returned",
            f"{len(busy) / max(1, len(spans)):.0%} with the consumer busy (after-send p50 "
            f"{_pct([(s[1] - s[3]) * 1000 for s in busy], 0.5):.1f} ms)",
            f"{len(waiting) / max(1, len(spans)):.0%} with it waiting (p50 "
            f"{_pct([(s[1] - s[3]) * 1000 for s in waiting], 0.5):.1f} ms)",
        ]
        out.append("stalls: " + ", ".join(parts))
    for what, n in collections.Counter(s[2] for s in slow).most_common():
        share = sum(1 for s in sample if s[2] == what) / max(1, len(sample))
        out.append(
            f"stalls: {n / max(1, len(slow)):6.1%} of the slowest receives: '{what}' ({share:.1%} of the sample)"
        )
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _pct_ci(values: list[float], q: float, z: float = 1.96) -> tuple[float, float]:
    """A 95% confidence interval of the ``q`` quantile, distribution-free: the order statistics ``z`` binomial
    standard deviations either side of its rank (the count of samples below the true quantile is binomial(n, q)).
    At q = 0.99 that is +-6 ranks of 3,000 samples and +-19 of 30,000: a p99 from few samples is a wide interval."""
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n * q * (1 - q))
    low = max(0, math.floor(n * q - half))
    high = min(n - 1, math.ceil(n * q + half))
    return ordered[low], ordered[high]


# --------------------------------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------------------------------
class Load:
    def __init__(
        self, conn: str, ledger: Ledger, rate: float, consumers: int = CONSUMERS, prefetch: int | None = None
    ) -> None:
        self.conn = conn
        self.ledger = ledger
        self.rate = rate
        self.consumers = consumers
        # the timed consumers' (soak-q, the subscriptions); the session consumers keep RECEIVER_OPTIONS
        self.receiver_options = {**RECEIVER_OPTIONS, "prefetch_count": TIMED_PREFETCH if prefetch is None else prefetch}
        # soak-q's "abandon once" messages the consumers have abandoned: shared, since the redelivery may reach
        # another consumer (which must complete it, not abandon it again towards MaxDeliveryCount)
        self.abandoned: set[str] = set()
        self.abandoned_lock = threading.Lock()
        self.producing = threading.Event()
        self.producing.set()
        self.consuming = threading.Event()
        self.consuming.set()
        self.threads: list[threading.Thread] = []
        self._ids = iter(range(1, 1 << 62))
        self._id_lock = threading.Lock()
        self.last_scheduled = time.time()

    def _mid(self, prefix: str) -> str:
        with self._id_lock:
            return f"{prefix}-{next(self._ids)}"

    def client(self) -> ServiceBusClient:
        return ServiceBusClient.from_connection_string(self.conn, retry_total=5)

    def start(self) -> None:
        # soak-q's sends come from SENDERS threads, each at its share of the rate and out of phase with the others,
        # so that one slow send does not hold up the schedule of every other
        producers = [partial(self._produce_q, i) for i in range(SENDERS)]
        producers += [self._produce_ttl, self._produce_sessions, self._produce_topic]
        consumers = [self._consume_q] * (2 * self.consumers) + [self._consume_dlq, self._consume_ttl]
        consumers += [self._consume_sessions, self._consume_sessions]
        consumers += [partial(self._consume_sub, s) for s in SUBS for _ in range(self.consumers)]
        for target in producers + consumers:
            name = getattr(target, "__name__", None) or f"{target.func.__name__}:{target.args[0]}"
            t = threading.Thread(target=self._guard, args=(target,), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def _guard(self, target) -> None:
        while self.consuming.is_set():
            try:
                target()
                return
            except Exception as exc:  # a broken connection: note it and start the loop again with a new client
                name = getattr(target, "__name__", None) or target.func.__name__
                with self.ledger.lock:
                    self.ledger.other_errors[f"{name}:{type(exc).__name__}"] += 1
                time.sleep(1)

    def _paced(self, per_second: float, phase: float = 0.0):
        """Open loop: yield the time each send is due, at a fixed ``per_second`` from the start, whatever the
        sends before took. A send that starts late is late by the broker's doing (or the machine's), so its
        latency counts from when it was due (no coordinated omission); nothing is skipped, so a stall is followed
        by a catch-up at full speed, which shows in the latencies too."""
        interval = 1 / per_second
        due = time.monotonic() + phase * interval
        while self.producing.is_set():
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            yield due
            due += interval

    def _send(self, sender, messages: list[ServiceBusMessage], records: list[tuple[str, Sent]], due: float) -> bool:
        for mid, sent in records:
            sent.due = due
            sent.batch = len(records)
            self.ledger.record_sent(mid, sent)
        try:
            sender.send_messages(messages if len(messages) > 1 else messages[0])
        except ServiceBusError as exc:
            with self.ledger.lock:
                self.ledger.send_errors[type(exc).__name__] += 1
            return False
        with self.ledger.lock:
            now = self.ledger.send_done(due, f"{records[0][1].entity} x{len(records)}")
            for _, sent in records:
                sent.acked = True
                sent.acked_at = now
        return True

    # --- soak-q -------------------------------------------------------------------------------------------------
    def _produce_q(self, index: int) -> None:
        plans = [p for p, w in PLANS for _ in range(w)]
        with self.client() as client, client.get_queue_sender(Q, **SENDER_OPTIONS) as sender:
            for due in self._paced(self.rate / SENDERS, index / SENDERS):
                roll = random.random()
                key = f"k{random.randrange(KEYS)}" if random.random() < 0.5 else None
                if roll < 0.1:  # scheduled (a quarter cancelled)
                    mid = self._mid("q")
                    when = datetime.now(UTC) + timedelta(seconds=random.uniform(1, 4))
                    msg = ServiceBusMessage(b"scheduled", message_id=mid, partition_key=key,
                                            application_properties={"plan": "complete"})  # fmt: skip
                    sent = Sent(Q, "scheduled", due=due)
                    self.ledger.record_sent(mid, sent)
                    try:
                        seqs = sender.schedule_messages(msg, when)
                    except ServiceBusError as exc:
                        with self.ledger.lock:
                            self.ledger.send_errors[type(exc).__name__] += 1
                        continue
                    with self.ledger.lock:
                        self.ledger.send_done(due, f"{Q} schedule")
                        sent.acked = True
                    self.last_scheduled = when.timestamp()
                    if random.random() < 0.25:
                        try:
                            sender.cancel_scheduled_messages(seqs)
                            sent.plan = "cancelled"
                        except ServiceBusError as exc:  # stays scheduled: it is delivered later
                            with self.ledger.lock:
                                self.ledger.other_errors[f"cancel:{type(exc).__name__}"] += 1
                    continue
                count = 5 if roll < 0.3 else 1
                messages, records = [], []
                for _ in range(count):
                    mid, plan = self._mid("q"), random.choice(plans)
                    messages.append(ServiceBusMessage(os.urandom(200), message_id=mid, partition_key=key,
                                                      application_properties={"plan": plan}))  # fmt: skip
                    records.append((mid, Sent(Q, plan)))
                self._send(sender, messages, records, due)

    def _consume_q(self) -> None:
        abandoned, abandoned_lock = self.abandoned, self.abandoned_lock
        deferred: list[int] = []
        deferred_since = 0.0
        options = self.receiver_options
        with self.client() as client, client.get_queue_receiver(Q, max_wait_time=1, **options) as receiver:
            while self.consuming.is_set():
                asked = time.monotonic()
                got = receiver.receive_messages(max_message_count=TAKE, max_wait_time=1)
                for msg in got:
                    mid = str(msg.message_id)
                    plan = (msg.application_properties or {}).get(b"plan", b"complete").decode()
                    self.ledger.event(mid, Q, "received", asked)
                    with abandoned_lock:
                        abandon = plan == "abandon-always" or (plan == "abandon-once" and mid not in abandoned)
                        if abandon:
                            abandoned.add(mid)
                        else:
                            abandoned.discard(mid)
                    if abandon:
                        self._settle(receiver.abandon_message, msg, Q, "abandoned")
                    elif plan == "dead-letter":
                        self._settle(
                            lambda m: receiver.dead_letter_message(m, reason="soak", error_description="planned"),
                            msg, Q, "dead-lettered",
                        )  # fmt: skip
                    elif plan == "defer":
                        if self._settle(receiver.defer_message, msg, Q, "deferred"):
                            deferred_since = deferred_since if deferred else time.monotonic()
                            deferred.append(msg.sequence_number)
                    else:
                        self._settle(receiver.complete_message, msg, Q, "completed", timed=True)
                if deferred and (len(deferred) >= 20 or not got or time.monotonic() - deferred_since > 0.5):
                    try:
                        for msg in receiver.receive_deferred_messages(deferred):
                            self.ledger.event(str(msg.message_id), Q, "received-deferred")
                            self._settle(receiver.complete_message, msg, Q, "completed", timed=True)
                        deferred = []
                    except ServiceBusError as exc:
                        with self.ledger.lock:
                            self.ledger.other_errors[f"deferred:{type(exc).__name__}"] += 1

    def _settle(self, action, msg, where: str, what: str, timed: bool = False) -> bool:
        mid = str(msg.message_id)
        started = time.monotonic()
        try:
            action(msg)
        except ServiceBusError as exc:  # the lock ended without this settlement: the message comes again
            self.ledger.event(mid, where, f"settle-failed:{type(exc).__name__}")
            return False
        if timed:
            with self.ledger.lock:
                self.ledger.settle_ms.append((time.monotonic() - started) * 1000)
        self.ledger.event(mid, where, what)
        return True

    def _consume_dlq(self) -> None:
        with self.client() as client:
            receivers = {
                name: client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=1)
                for name in (Q, TTL_Q)
            }
            try:
                while self.consuming.is_set():
                    for name, receiver in receivers.items():
                        for msg in receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
                            mid = str(msg.message_id)
                            self.ledger.event(mid, f"{name}/$dlq", f"dlq:{msg.dead_letter_reason}")
                            self._settle(receiver.complete_message, msg, f"{name}/$dlq", "dlq-completed")
            finally:
                for receiver in receivers.values():
                    receiver.close()

    # --- soak-ttl -----------------------------------------------------------------------------------------------
    def _produce_ttl(self) -> None:
        with self.client() as client, client.get_queue_sender(TTL_Q, **SENDER_OPTIONS) as sender:
            for due in self._paced(max(1.0, self.rate / 20)):
                mid = self._mid("ttl")
                msg = ServiceBusMessage(b"short-lived", message_id=mid, time_to_live=timedelta(seconds=1))
                self._send(sender, [msg], [(mid, Sent(TTL_Q, "ttl"))], due)

    def _consume_ttl(self) -> None:
        """Receives rarely: what it meets has mostly expired, which moves it to the dead-letter queue."""
        with self.client() as client, client.get_queue_receiver(TTL_Q, max_wait_time=1) as receiver:
            while self.consuming.is_set():
                time.sleep(5)
                for msg in receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
                    self.ledger.event(str(msg.message_id), TTL_Q, "received")
                    self._settle(receiver.complete_message, msg, TTL_Q, "completed")

    # --- soak-s -------------------------------------------------------------------------------------------------
    def _produce_sessions(self) -> None:
        order = collections.Counter()
        with self.client() as client, client.get_queue_sender(S_Q, **SENDER_OPTIONS) as sender:
            for due in self._paced(max(1.0, self.rate / 4)):
                session = f"s{random.randrange(SESSIONS)}"
                order[session] += 1
                mid = self._mid("s")
                msg = ServiceBusMessage(b"in-session", message_id=mid, session_id=session,
                                        application_properties={"order": order[session]})  # fmt: skip
                sent = Sent(S_Q, "session", session=session, order=order[session])
                if not self._send(sender, [msg], [(mid, sent)], due):
                    order[session] -= 1  # the next one takes its place in the order check

    def _consume_sessions(self) -> None:
        last: dict[str, int] = {}
        # No retries: the SDK retries "no session available" (OperationTimeoutError) with backoff, half a minute
        # in all, while this loop wants to look again at once (and to notice the end of the run).
        with ServiceBusClient.from_connection_string(self.conn, retry_total=0) as client:
            while self.consuming.is_set():
                receiver = client.get_queue_receiver(
                    S_Q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1, **RECEIVER_OPTIONS
                )
                try:
                    receiver.__enter__()
                except OperationTimeoutError:  # no session has messages now
                    receiver.close()
                    continue
                try:
                    session = receiver.session.session_id
                    while self.consuming.is_set():
                        got = receiver.receive_messages(max_message_count=20, max_wait_time=1)
                        if not got:
                            break
                        for msg in got:
                            mid = str(msg.message_id)
                            order = int((msg.application_properties or {}).get(b"order", 0))
                            self.ledger.event(mid, S_Q, "received")
                            if order <= last.get(session, 0) and msg.delivery_count == 0:
                                with self.ledger.lock:
                                    self.ledger.misordered.append(f"{session}: {order} after {last[session]}")
                            last[session] = max(order, last.get(session, 0))
                            self._settle(receiver.complete_message, msg, S_Q, "completed", timed=True)
                        receiver.session.set_state(str(last[session]).encode())
                        if len(got) < 20:  # the session is (about) empty: on to the next one
                            break
                except ServiceBusError as exc:
                    with self.ledger.lock:
                        self.ledger.other_errors[f"session:{type(exc).__name__}"] += 1
                finally:
                    receiver.close()

    # --- soak-t -------------------------------------------------------------------------------------------------
    def _produce_topic(self) -> None:
        with self.client() as client, client.get_topic_sender(TOPIC, **SENDER_OPTIONS) as sender:
            for due in self._paced(max(1.0, self.rate / 4)):
                mid, color = self._mid("t"), random.choice(COLORS)
                key = f"k{random.randrange(KEYS)}" if random.random() < 0.5 else None
                msg = ServiceBusMessage(b"fan-out", message_id=mid, partition_key=key,
                                        application_properties={"color": color})  # fmt: skip
                self._send(sender, [msg], [(mid, Sent(TOPIC, color))], due)

    def _consume_sub(self, sub: str) -> None:
        where = f"{TOPIC}/{sub}"
        with (
            self.client() as client,
            client.get_subscription_receiver(TOPIC, sub, max_wait_time=1, **self.receiver_options) as receiver,
        ):
            while self.consuming.is_set():
                asked = time.monotonic()
                for msg in receiver.receive_messages(max_message_count=TAKE, max_wait_time=1):
                    self.ledger.event(str(msg.message_id), where, "received", asked)
                    self._settle(receiver.complete_message, msg, where, "completed", timed=True)


# --------------------------------------------------------------------------------------------------------------
# reconciliation
# --------------------------------------------------------------------------------------------------------------
def _expected(sent: Sent) -> dict[str, str]:
    """Where a message must end, and how: destination -> the final event there."""
    if sent.entity == Q:
        if sent.plan == "cancelled":
            return {}
        if sent.plan == "dead-letter":
            return {f"{Q}/$dlq": "dlq:soak"}
        if sent.plan == "abandon-always":
            return {f"{Q}/$dlq": "dlq:MaxDeliveryCountExceeded"}
        return {Q: "completed"}
    if sent.entity == TTL_Q:
        return {f"{TTL_Q}/$dlq": "dlq:TTLExpiredException"}  # or completed from the queue before it expired
    if sent.entity == S_Q:
        return {S_Q: "completed"}
    out = {f"{TOPIC}/all": "completed"}
    if sent.plan in ("red", "blue"):
        out[f"{TOPIC}/{sent.plan}"] = "completed"
    return out


def _finished(sent: Sent, events: list[tuple[str, str]]) -> bool:
    seen = set(events)
    if sent.entity == TTL_Q and (TTL_Q, "completed") in seen:
        return True
    for where, final in _expected(sent).items():
        if final.startswith("dlq:"):
            if (where, "dlq-completed") not in seen:
                return False
        elif (where, final) not in seen:
            return False
    return True


def reconcile(ledger: Ledger) -> dict[str, int | list[str]]:
    out: dict[str, int | list[str]] = collections.Counter()  # type: ignore[assignment]
    problems: list[str] = []
    with ledger.lock:
        sent_items = list(ledger.sent.items())
        events = {k: list(v) for k, v in ledger.events.items()}
    for mid, sent in sent_items:
        evs = events.get(mid, [])
        expected = _expected(sent)
        if not sent.acked:
            out["send failed"] += 1
            if evs:
                out["send failed, stored all the same (explained: the SDK retried, or the outcome was unknown)"] += 1
            continue
        out["acknowledged"] += 1
        allowed = set(expected) | ({sent.entity} if sent.entity in (Q, TTL_Q) else set())
        for where, _ in evs:
            if where not in allowed:
                problems.append(f"misrouted: {mid} ({sent.entity} {sent.plan}) seen on {where}")
        if sent.entity == Q and sent.plan == "cancelled" and evs:
            problems.append(f"misrouted: {mid} was cancelled while scheduled and was delivered")
            continue
        if not _finished(sent, evs):
            problems.append(f"lost: {mid} ({sent.entity} {sent.plan}) events={evs}")
            continue
        if sent.entity == TTL_Q:
            dlq = any(w == f"{TTL_Q}/$dlq" and e == "dlq:TTLExpiredException" for w, e in evs)
            out["ttl: expired into the dead-letter queue" if dlq else "ttl: received before it expired"] += 1
        # Exactly once per destination, unless an earlier lock ended without a settlement (a redelivery).
        for where in {w for w, _ in evs}:
            here = [e for w, e in evs if w == where]
            finals = sum(1 for e in here if e in ("completed", "dlq-completed", "dead-lettered"))
            explained = sum(1 for e in here if e.startswith("settle-failed"))
            if finals > 1 and finals - 1 > explained:
                problems.append(f"duplicated: {mid} settled {finals} times on {where}: {here}")
            elif finals > 1:
                out["redelivered after a lost lock (explained, at-least-once)"] += 1
        out[f"{sent.entity} {sent.plan}: as planned"] += 1
    unknown = set(events) - {mid for mid, _ in sent_items}
    problems += [f"unknown message id {mid}: {events[mid]}" for mid in sorted(unknown)]
    problems += [f"session out of order: {m}" for m in ledger.misordered]
    out["problems"] = problems  # type: ignore[index]
    return out


# --------------------------------------------------------------------------------------------------------------
LATENCIES = ("send_p50", "send_p99", "recv_p50", "recv_p99", "settle_p50", "settle_p99")


MIN_P99_SAMPLES = 1000  # a p99 from fewer samples is a handful of outliers (at 1,000: the 10 slowest)
_COUNTS = {"send": "n_send", "recv": "n_recv", "settle": "n_settle"}


def _judged(row: dict[str, float], name: str) -> bool:
    """Whether ``row``'s ``name`` may be judged: a p99 of the broker's only from ``MIN_P99_SAMPLES`` samples (a row
    without the count, from before it was kept, is judged)."""
    kind = name.split("_")[0]
    return not name.endswith("p99") or kind not in _COUNTS or row.get(_COUNTS[kind], MIN_P99_SAMPLES) >= MIN_P99_SAMPLES


def _ci_weight(ci: tuple[float, float]) -> float:
    """1 / the variance of a p99's log, read from its 95% interval (``_pct_ci``); a zero-width one counts as a
    1% interval (a probe whose slowest samples tie)."""
    low, high = ci
    if not (low > 0 and high > 0):
        return 0.0
    sigma = max(math.log(high / low), 0.01) / (2 * 1.96)
    return 1 / sigma**2


def _weighted_geomean(values: list[float], weights: list[float]) -> float:
    if sum(weights) <= 0:
        return statistics.geometric_mean(values)
    return math.exp(sum(w * math.log(v) for v, w in zip(values, weights, strict=True)) / sum(weights))


# The latencies that wait for a synced commit (a send; a first delivery, which holds its send): the disk's drift
# may explain them. A complete is answered at once and written later without an fsync (docs/behaviour.md).
DISK_BOUND = ("send_p99", "recv_p99")
# The broker's own I/O per second, each interval (``Broker.io``; synced commits from the stall trace, if any)
BROKER_IO = (("io_write", "bytes written"), ("io_syscw", "write calls"), ("io_fsyncs", "synced commits"))


def broker_io_flat(after: list[dict[str, float]]) -> tuple[bool, str]:
    """Whether the broker's own I/O was the same in every interval: each measure of it in ``BROKER_IO`` (per
    second) measured in all of them spreads by ``FLAT`` at most. At a paced, steady load that is what it should
    do; then its share of the disk's pace is the same in every interval, and an interval whose disk is slower is
    the machine's doing. (False when none was measured.)"""
    parts, flat = [], True
    for name, what in BROKER_IO:
        values = [r.get(name, float("nan")) for r in after]
        if not all(v > 0 for v in values):  # (nan compares false: not measured)
            continue
        spread = max(values) / min(values)
        flat = flat and spread <= FLAT
        parts.append(f"{what} {spread:.2f}x")
    if not parts:
        return False, "not measured"
    return flat, ", ".join(parts)


def disk_drift(after: list[dict[str, float]]) -> list[float] | None:
    """Per interval, the disk probe's p99 (``DiskProbe``) against its median over the intervals, only as far as
    that interval's 95% confidence interval is sure of: the edge of the interval nearer the median, and 1.0 when
    the interval holds the median. A disk that moved within its noise so counts as not moved, and the broker's
    verdicts are then exactly what they are without it. None when the probe did not run in every interval."""
    values = [r.get("dsync_p99", float("nan")) for r in after]
    if not all(v > 0 for v in values):
        return None
    middle = statistics.median(values)
    out = []
    for r in after:
        low, high = r.get("dsync_p99_ci", (r["dsync_p99"], r["dsync_p99"]))
        out.append(low / middle if low > middle else high / middle if high < middle else 1.0)
    return out


def _trend(values: list[float]) -> float:
    """How much ``values`` (one per interval, in order) grew from the first interval to the last along their
    Theil-Sen line (the median of every pair's slope of the log): a growth with uptime shows here, one slow
    interval does not move it."""
    slopes = [
        (math.log(values[j]) - math.log(values[i])) / (j - i)
        for i in range(len(values))
        for j in range(i + 1, len(values))
    ]
    return math.exp(statistics.median(slopes) * (len(values) - 1))


def runs_summary(runs: list[tuple[str, dict[str, float]]]) -> list[str]:
    """Several runs' figures (``flatness``'s) judged together: each run's worst latency figure, their median and
    range, and each run's largest growth along the intervals (``_trend``). On a shared machine one bad five
    minutes can make one run miss (docs/operations.md, "The soak"); the median over quiet runs of the same code
    is the figure held to ``FLAT``."""
    worst = []
    lines = []
    for label, figures in runs:
        latencies = {n: figures[n] for n in LATENCIES if n in figures}
        trends = {n: figures[f"{n} trend"] for n in latencies if not math.isnan(figures[f"{n} trend"])}
        if not latencies:
            lines.append(f"runs: {label}: no latency judged")
            continue
        name = max(latencies, key=latencies.__getitem__)
        grows = max(trends, key=trends.__getitem__) if trends else None
        worst.append(latencies[name])
        trend = f"; largest growth along the intervals {trends[grows]:.2f}x ({grows})" if grows else ""
        lines.append(f"runs: {label}: worst latency {latencies[name]:.2f}x ({name}){trend}")
    if worst:
        middle = statistics.median(worst)
        lines.append(
            f"runs: worst latency per run {', '.join(f'{w:.2f}' for w in worst)}: median {middle:.2f}x "
            f"({min(worst):.2f}-{max(worst):.2f}) over {len(worst)} runs "
            f"(target <= {FLAT:.2f}: {'met' if middle <= FLAT else 'MISSED'})"
        )
    return lines


def flatness(after: list[dict[str, float]], figures: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """One verdict per metric over the intervals after warm-up (``figures``, if given, gets each latency's figure:
    the smaller of its spread and its spread net of the machine, so that it is within ``FLAT`` when the verdict
    passes).

    RSS and descriptors: each interval against the first of them (interval 2); ``GREW`` past ``FLAT`` fails the
    run (a leak only grows). Latencies: their spread, the slowest interval's over the fastest's; ``flat`` within
    ``FLAT``. A latency that is not flat is divided, interval by interval, by the machine's own drift in the same
    interval, measured at the same percentile (the geometric mean of the SQLite, echo and CPU probes' p50s, or p99s,
    as ratios to their medians over the intervals; the p99s weighed by how many samples stand behind each, see
    ``Probe``; rows without the CPU probe, from before it, use the other two): ``follows the machine`` when what is
    left is within ``FLAT``
    (the machine slowed down, not the broker), ``MOVED`` otherwise. A p99 is judged only over intervals with at
    least ``MIN_P99_SAMPLES`` samples (``too few samples`` otherwise).

    The disk (``DiskProbe``) enters that drift under one rule, and only for the p99s that wait for a synced commit
    (``DISK_BOUND``: send and receive): when the broker's own I/O was flat across the intervals
    (``broker_io_flat``: bytes written, write calls and, traced, synced commits per second, each within ``FLAT``),
    an interval's drift is the disk's (``disk_drift``: the probe's p99 against its median, as far as its 95%
    interval is sure) where that moved further from 1 than the probes' drift, and the probes' drift otherwise.
    So a send p99 that rose with the disk while the broker wrote what it always writes follows the machine; one
    that rose with the disk flat, or while the broker's own I/O moved (its writes may have slowed the disk), is
    judged as before. ``FLAT`` is the same everywhere."""
    base = after[0]
    cpu = all("cpu" in r for r in after)
    drift: dict[str, list[float]] = {}
    for pct, probes in (
        ("p50", ("sqlite", "echo", "cpu") if cpu else ("sqlite", "echo")),
        ("p99", ("sqlite_p99", "echo_p99", "cpu_p99") if cpu else ("sqlite_p99", "echo_p99")),
        ("p50 without cpu", ("sqlite", "echo")),
        ("p99 without cpu", ("sqlite_p99", "echo_p99")),
    ):
        drift[pct] = []
        for row in after:
            parts = [row[p] / statistics.median([r[p] for r in after]) for p in probes if row[p] == row[p]]
            if not parts or not all(parts):
                drift[pct].append(float("nan"))
            elif pct.startswith("p99") and all(f"{p}_ci" in row for p in probes):
                # each probe weighed by how sure its p99 is (inverse variance of its log, from its 95% interval):
                # the echo's 30,000 samples an interval count for more than the commit's 3,000
                weights = [_ci_weight(row[f"{p}_ci"]) for p in probes]
                drift[pct].append(_weighted_geomean(parts, weights))
            else:
                drift[pct].append(statistics.geometric_mean(parts))
    out = []
    shown = ", ".join(f"{d:.2f}" for d in drift["p99"])
    out.append(("machine p99 drift", f"{shown} per interval (the probes' p99s against their medians, weighed)"))
    io_flat, io_text = broker_io_flat(after)
    disk = disk_drift(after)
    if disk is not None:
        admitted = io_flat
        for pct in ("p99", "p99 without cpu"):
            drift[pct.replace("p99", "disk")] = [
                d if not (abs(math.log(c)) >= abs(math.log(d))) else c  # (nan: the disk's)
                for c, d in zip(drift[pct], disk, strict=True)
            ] if admitted else drift[pct]  # fmt: skip
        shown = ", ".join(f"{d:.2f}" for d in disk)
        use = "in the drift of send and receive p99" if admitted else "not in the drift"
        out.append(("disk drift", f"{shown} per interval (the disk probe's p99 against its median, as far as its "
                                  f"95% interval is sure; {use})"))  # fmt: skip
    out.append(("broker io", f"{io_text} per second across intervals ({'flat' if io_flat else 'MOVED'})"))
    for name in ("rss", "fds"):
        ratios = [r[name] / base[name] for r in after if base[name]]
        worst = max(ratios) if ratios else float("nan")
        out.append((name, f"max {worst:.2f}x of interval 2 ({'flat' if worst <= FLAT else 'GREW'})"))
    probes = ["sqlite", "sqlite_p99", "echo", "echo_p99"] + (["cpu", "cpu_p99"] if cpu else [])
    probes += ["dsync", "dsync_p99"] if disk is not None else []
    for name in (*LATENCIES, *probes):
        pct = "p99" if name.endswith("p99") else "p50"
        machine = drift["disk"] if name in DISK_BOUND and "disk" in drift else drift[pct]
        rows = [(r, d) for r, d in zip(after, machine, strict=True) if _judged(r, name) and r[name] == r[name]]
        values = [r[name] for r, _ in rows if r[name] > 0]
        if len(values) < 2:
            out.append((name, f"too few samples (p99s need {MIN_P99_SAMPLES} an interval)"))
            continue
        spread = max(values) / min(values)
        text = f"{min(values):.2f}-{max(values):.2f} ms, spread {spread:.2f}x"
        cis = [r.get(f"{name}_ci") for r, _ in rows]
        if pct == "p99" and cis and all(c and c[0] > 0 for c in cis):
            # what the spread of the true p99s may be, from each interval's 95% interval: the noise of the estimate
            low = max(1.0, max(c[0] for c in cis) / min(c[1] for c in cis))
            high = max(c[1] for c in cis) / min(c[0] for c in cis)
            text += f" (95% intervals allow {low:.2f}-{high:.2f}x)"
        if name.startswith(("sqlite", "echo", "cpu", "dsync")):
            out.append((name, f"{text} (the {'disk' if name.startswith('dsync') else 'machine'}'s probe)"))
            continue
        net = [r[name] / d for r, d in rows if d == d and d > 0 and r[name] > 0]
        net_spread = max(net) / min(net) if len(net) >= 2 else float("nan")
        if figures is not None:
            figures[name] = min(spread, net_spread) if net_spread == net_spread else spread
            figures[f"{name} trend"] = _trend(net) if len(net) >= 2 else float("nan")
        if spread <= FLAT:
            verdict = "flat"
        else:
            verdict = "follows the machine" if net_spread <= FLAT else "MOVED"
        of = f"{pct} drift and the disk's" if machine is not drift[pct] else f"{pct} drift"
        if cpu and spread > FLAT:  # what the verdict was before the CPU probe, beside it
            # the disk's drift where it was admitted, as above, against the two probes' p99 drift
            two = drift["disk without cpu"] if machine is not drift[pct] else drift[f"{pct} without cpu"]
            bare = dict(zip(map(id, after), two, strict=True))
            bare_net = [r[name] / bare[id(r)] for r, _ in rows if bare[id(r)] > 0 and r[name] > 0]
            if len(bare_net) >= 2:
                of += f"; {max(bare_net) / min(bare_net):.2f}x net of the SQLite and echo probes' alone"
        out.append((name, f"{text}, {net_spread:.2f}x net of the machine's {of} ({verdict})"))
    return out


# --------------------------------------------------------------------------------------------------------------
# a young broker beside the soak's: the same load at the same moments, started afresh every interval
# --------------------------------------------------------------------------------------------------------------
YOUNG_WARM = 60.0  # seconds of a young broker's interval not measured (a quarter of shorter intervals): its start


def _latency_row(sends: list[float], receives: list[float], settles: list[float]) -> dict[str, float]:
    return {
        "send_p50": _pct(sends, 0.5), "send_p99": _pct(sends, 0.99), "recv_p50": _pct(receives, 0.5),
        "recv_p99": _pct(receives, 0.99), "settle_p50": _pct(settles, 0.5), "settle_p99": _pct(settles, 0.99),
        "n_send": len(sends), "n_recv": len(receives), "n_settle": len(settles),
    }  # fmt: skip


def young_yardstick(args: argparse.Namespace, root: Path, rows_out: Path) -> int:
    """The soak's load against a broker that is never more than one interval old, in step with the soak that
    started this process (``--young-of``: its start on the machine's monotonic clock, which every process shares):
    each interval a new broker process over a new data directory and a new load, measured after its first
    ``YOUNG_WARM`` seconds (a quarter of a shorter interval), one row per interval written to ``rows_out`` as it
    ends. Nothing is reconciled: this is a yardstick, and each interval's broker is stopped with its messages where
    they are. Terminated (the soak ended early), it stops its broker first."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started, end = args.young_of, args.young_of + args.minutes * 60
    warm = min(YOUNG_WARM, args.interval / 4)
    rows: list[dict[str, float]] = []
    k = 0
    while (begin := started + k * args.interval) < end:
        until = min(begin + args.interval, end)
        data = root / f"interval{k + 1}"
        data.mkdir(parents=True, exist_ok=True)
        broker = Broker(data, args.workers)
        ledger = Ledger()
        load = Load(broker.connection_string, ledger, args.rate, args.consumers, args.prefetch)
        try:
            load.start()
            time.sleep(max(0.0, begin + warm - time.monotonic()))
            measured = time.monotonic()
            ledger.take_latencies()  # its start is not measured
            time.sleep(max(0.0, until - time.monotonic()))
            sends, receives, settles, _ = ledger.take_latencies()
            row = _latency_row(sends, receives, settles)
            row.update(t=until - started, seconds=time.monotonic() - measured, errors=sum(ledger.send_errors.values()))
            rows.append(row)
            rows_out.write_text(json.dumps(rows))
        finally:
            load.producing.clear()
            load.consuming.clear()
            broker.stop()
            shutil.rmtree(data, ignore_errors=True)
        k += 1
    return 0


def against_young(
    after: list[dict[str, float]], young: list[dict[str, float]], interval: float
) -> list[tuple[str, str]]:
    """Each latency of the soak's broker over the young one's in the same interval (both after warm-up), and the
    spread of that ratio over the intervals: the machine's weather is in both, so what is left is what uptime did.
    ``flat`` within ``FLAT``; p99s only over intervals with ``MIN_P99_SAMPLES`` on both sides."""
    # each interval with the young one's that ended with it (the soak's end by its clock, the young's by plan)
    pairs = [(old, new) for old in after for new in young if abs(old["t"] - new["t"]) < interval / 2]
    out = []
    for name in LATENCIES:
        ratios = []
        for old, new in pairs:
            if not (_judged(old, name) and _judged(new, name)):
                continue
            if old[name] > 0 and new.get(name, 0) > 0:
                ratios.append(old[name] / new[name])
        if len(ratios) < 2:
            out.append((name, "too few intervals measured on both"))
            continue
        spread = max(ratios) / min(ratios)
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        young_ms = ", ".join(f"{new[name]:.2f}" for _, new in pairs)
        out.append((name, f"old/young {shown} per interval (young {young_ms} ms), spread {spread:.2f}x "
                          f"({'flat' if spread <= FLAT else 'MOVED'})"))  # fmt: skip
    return out


def _count_fsyncs(trace: Path, rows: list[dict[str, float]]) -> None:
    """Each interval's synced commits per second (``io_fsyncs``), from the broker's stall trace: its fsyncs."""
    import bisect

    starts = []
    try:
        with trace.open() as lines:
            for line in lines:
                parts = line.split(" ", 3)
                if len(parts) == 4 and parts[2] == "commit" and parts[3].rstrip().endswith("sync=True"):
                    starts.append(float(parts[0]))
    except OSError:
        return
    starts.sort()
    for row in rows:
        n = bisect.bisect_left(starts, row["t1"]) - bisect.bisect_left(starts, row["t0"])
        row["io_fsyncs"] = n / (row["t1"] - row["t0"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    parser.add_argument("--interval", type=float, default=300.0, help="seconds per printed interval")
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="messages a second to soak-q, open loop (others in proportion)"
    )
    parser.add_argument("--workers", type=int, default=0, help="shardbus serve --workers")
    parser.add_argument(
        "--consumers", type=int, default=CONSUMERS,
        help="competing consumers per subscription (soak-q gets twice as many); 1: the load before issue #28.6",
    )  # fmt: skip
    parser.add_argument(
        "--prefetch", type=int, default=TIMED_PREFETCH, help="prefetch_count of the receivers of soak-q and the topic"
    )
    parser.add_argument(
        "--disk-rate", type=float, default=50.0, help="the disk probe's syncs a second (bench/disk_probe.py; 0: none)"
    )
    parser.add_argument("--drain", type=float, default=90.0, help="seconds the final drain may take at most")
    parser.add_argument("--data-dir", type=Path, help="where the broker's data goes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--trace", action="store_true", help="have the broker trace its stalls and match them with the slow sends"
    )
    parser.add_argument(
        "--control", action="store_true",
        help="beside the soak, the same load against a broker started afresh every interval (a process of its own);"
        " each latency is also judged as the soak's over the young one's in the same interval",
    )  # fmt: skip
    parser.add_argument(
        "--young-of", type=float, metavar="T",
        help="run only the young broker's yardstick (--control's child), its intervals from T on the monotonic clock;"
        " two of them with the same T measure how far apart two brokers of the same age read",
    )  # fmt: skip
    parser.add_argument(
        "--verdicts", type=Path, nargs="+", metavar="ROWS",
        help="only print the flatness verdicts of runs' saved rows.json (several: each run's, then their median)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.verdicts is not None:  # a run's intervals again, e.g. after the rule changed
        runs = []
        for path in args.verdicts:
            figures: dict[str, float] = {}
            if len(args.verdicts) > 1:
                print(f"run {path}:")
            rows = json.loads(path.read_text())
            for name, verdict in flatness(rows[1:], figures):
                print(f"flatness: {name}: {verdict}")
            if (young := path.parent / "young_rows.json").exists() and len(rows) >= 2:  # a --control run's
                interval = rows[1]["t"] - rows[0]["t"]
                for name, verdict in against_young(rows[1:], json.loads(young.read_text())[1:], interval):
                    print(f"flatness against a young broker: {name}: {verdict}")
            runs.append((str(path), figures))
        if len(runs) > 1:
            for line in runs_summary(runs):
                print(line)
        return 0

    root = args.data_dir or Path(tempfile.mkdtemp(prefix="shardbus-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.young_of is not None:
        return young_yardstick(args, root, root / "young_rows.json")
    trace = root / "stalls.trace" if args.trace else None
    broker = Broker(root, args.workers, trace)
    ledger = Ledger()
    load = Load(broker.connection_string, ledger, args.rate, args.consumers, args.prefetch)
    probe = Probe(root)
    disk = Disk(root)
    disk_probe = DiskProbe(root, args.disk_rate, root / "disk_probe.trace" if trace is not None else None)
    client_stalls = ClientStalls()
    if trace is not None:
        client_stalls.start()
    print(f"soak: {args.minutes:g} min at {args.rate:g} msg/s to {Q} (+ {TTL_Q}, {S_Q}, {TOPIC}); broker pid "
          f"{broker.proc.pid}, workers={args.workers}, consumers={args.consumers}, "
          f"prefetch={load.receiver_options['prefetch_count']}, data in {root}", flush=True)  # fmt: skip
    print(f"{'interval':>9} {'sent':>7} {'settled':>8} {'rss_mb':>7} {'fds':>5} {'send_p50':>9} {'send_p99':>9} "
          f"{'recv_p50':>9} {'recv_p99':>9} {'cmpl_p50':>9} {'cmpl_p99':>9} {'errors':>7} {'sqlite':>8} "
          f"{'sql_p99':>8} {'echo':>8} {'echo_p99':>8} {'cpu':>7} {'cpu_p99':>8} {'disk_ms':>8} {'io_stall':>8} "
          f"{'dsync':>7} {'dsy_p99':>8} "
          f"{'wr_kB/s':>8} {'wr_n/s':>7}", flush=True)  # fmt: skip
    rows: list[dict[str, float]] = []
    started = time.monotonic()
    young = None
    if args.control:
        young_dir = root / "young"
        young_dir.mkdir(exist_ok=True)
        with open(young_dir / "young.log", "w") as young_log:  # (the child holds it open)
            young = subprocess.Popen(
                [sys.executable, __file__, "--young-of", repr(started), "--data-dir", str(young_dir),
                 "--minutes", str(args.minutes), "--interval", str(args.interval), "--rate", str(args.rate),
                 "--workers", str(args.workers), "--consumers", str(args.consumers), "--prefetch",
                 str(load.receiver_options["prefetch_count"])],
                stdout=young_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
    load.start()
    probe.start()
    disk.start()
    disk_probe.start()
    end = started + args.minutes * 60
    io_before, io_at = broker.io(), started
    sent_before = 0
    errors_before = 0
    try:
        while True:
            now = time.monotonic()
            if now >= end:
                break
            # Descriptors are sampled through the interval and the median printed: the SDK opens a connection per
            # receiver, so one sample may catch a few more or fewer in flight; a leak moves the median all the same.
            until = now + min(args.interval - ((now - started) % args.interval), end - now)
            fd_samples = []
            while (left := until - time.monotonic()) > 0:
                time.sleep(min(left, max(1.0, args.interval / 20)))
                fd_samples.append(broker.usage()[1])
                # What the ledger holds lives to the end: out of the collector's way (a full collection of this
                # process walked all of it, 240 ms at 10 minutes, and every SDK thread waited; ``client-gc``).
                gc.freeze()
            rss, fds = broker.usage()
            fds = int(statistics.median([*fd_samples, fds]))
            sends, receives, settles, settled = ledger.take_latencies()
            sqlite_ms, echo_ms, cpu_ms = probe.take()
            disk_ms, io_stall = disk.take()
            dsync_ms = disk_probe.take()
            io_now, io_now_at = broker.io(), time.monotonic()
            seconds = io_now_at - io_at
            with ledger.lock:
                held = time.monotonic()
                sent_total = sum(1 for s in ledger.sent.values() if s.acked)
                errors = sum(ledger.send_errors.values()) + sum(ledger.other_errors.values())
                client_stalls.note("client-ledger", held, "interval totals")
            row = {
                "t": time.monotonic() - started, "sent": sent_total - sent_before, "settled": settled, "rss": rss,
                "fds": fds, **_latency_row(sends, receives, settles), "errors": errors - errors_before,
                "sqlite": _pct(sqlite_ms, 0.5), "echo": _pct(echo_ms, 0.5),
                "sqlite_p99": _pct(sqlite_ms, 0.99), "echo_p99": _pct(echo_ms, 0.99),
                "send_p99_ci": _pct_ci(sends, 0.99), "recv_p99_ci": _pct_ci(receives, 0.99),
                "settle_p99_ci": _pct_ci(settles, 0.99), "sqlite_p99_ci": _pct_ci(sqlite_ms, 0.99),
                "echo_p99_ci": _pct_ci(echo_ms, 0.99), "n_sqlite": len(sqlite_ms), "n_echo": len(echo_ms),
                "cpu": _pct(cpu_ms, 0.5), "cpu_p99": _pct(cpu_ms, 0.99), "cpu_p99_ci": _pct_ci(cpu_ms, 0.99),
                "n_cpu": len(cpu_ms),
                "disk_ms": disk_ms, "io_stall": io_stall,
                "dsync": _pct(dsync_ms, 0.5), "dsync_p99": _pct(dsync_ms, 0.99),
                "dsync_p99_ci": _pct_ci(dsync_ms, 0.99), "n_dsync": len(dsync_ms),
                "io_write": (io_now[0] - io_before[0]) / seconds, "io_syscw": (io_now[1] - io_before[1]) / seconds,
                "t0": io_at, "t1": io_now_at,
            }  # fmt: skip
            io_before, io_at = io_now, io_now_at
            sent_before, errors_before = sent_total, errors
            rows.append(row)
            print(f"{row['t'] / 60:8.1f}m {row['sent']:7d} {row['settled']:8d} {rss:7.1f} {fds:5d} "
                  f"{row['send_p50']:7.1f}ms {row['send_p99']:7.1f}ms {row['recv_p50']:7.1f}ms "
                  f"{row['recv_p99']:7.1f}ms {row['settle_p50']:7.1f}ms {row['settle_p99']:7.1f}ms "
                  f"{row['errors']:7d} {row['sqlite']:6.2f}ms {row['sqlite_p99']:6.2f}ms {row['echo']:6.3f}ms "
                  f"{row['echo_p99']:6.3f}ms {row['cpu']:5.3f}ms {row['cpu_p99']:6.3f}ms {disk_ms:6.1f}ms "
                  f"{io_stall:6.0f}ms {row['dsync']:5.2f}ms "
                  f"{row['dsync_p99']:6.2f}ms {row['io_write'] / 1024:8.0f} {row['io_syscw']:7.0f}",
                  flush=True)  # fmt: skip
        # Drain: producers stop, consumers go on until everything acknowledged reached its outcome.
        load.producing.clear()
        drain_start = time.monotonic()
        time.sleep(max(0.0, load.last_scheduled - time.time()) + 1)
        with ledger.lock:  # once over everything; then only what is still pending is looked at again
            pending = {m for m, s in ledger.sent.items() if s.acked and not _finished(s, ledger.events.get(m, []))}
        report = time.monotonic() + 10
        while pending and time.monotonic() - drain_start < args.drain:
            time.sleep(1)
            with ledger.lock:
                pending = {m for m in pending if not _finished(ledger.sent[m], ledger.events.get(m, []))}
            if pending and time.monotonic() >= report:
                report += 10
                kinds = collections.Counter(f"{ledger.sent[m].entity} {ledger.sent[m].plan}" for m in pending)
                print(f"drain: {len(pending)} not done yet: {dict(kinds)}", flush=True)
        print(f"drain: every outcome reached after {time.monotonic() - drain_start:.1f} s" if not pending
              else f"drain: gave up after {args.drain:g} s", flush=True)  # fmt: skip
        time.sleep(2)  # anything delivered twice after its outcome shows up in the ledger now
        load.consuming.clear()
        stopping = time.monotonic()
        for t in load.threads:
            t.join(15)
        late = [t.name for t in load.threads if t.is_alive()]
        print(f"load stopped in {time.monotonic() - stopping:.1f} s{f' (still running: {late})' if late else ''}")
    finally:
        if young is not None and young.poll() is None and load.producing.is_set():  # the soak ended early
            young.terminate()
        probe.close()
        disk.close()
        disk_probe.close()
        stopping = time.monotonic()
        rc_broker = broker.stop()
        print(f"broker stopped in {time.monotonic() - stopping:.1f} s", flush=True)
    result = reconcile(ledger)
    problems = result.pop("problems")
    print(f"broker exit status {rc_broker}")
    for name, count in sorted(result.items()):
        print(f"reconcile: {name}: {count}")
    if ledger.send_errors or ledger.other_errors:
        print(f"errors: sends {dict(ledger.send_errors)}, other {dict(ledger.other_errors)}")
    for line in problems[:50]:  # type: ignore[union-attr]
        print(f"PROBLEM {line}")
    status = 0
    if problems:
        print(f"reconcile: FAILED ({len(problems)} problems)")  # type: ignore[arg-type]
        status = 1
    else:
        print("reconcile: clean (0 lost, 0 unexplained duplicates, 0 misrouted)")
    if trace is not None:
        _count_fsyncs(trace, rows)
        # every interval's figures, kept beside the trace: ``--verdicts`` judges them again
        (trace.parent / "rows.json").write_text(json.dumps(rows))
    after = rows[1:]  # the first interval is warm-up
    if len(after) >= 2:
        for name, verdict in flatness(after):
            print(f"flatness: {name}: {verdict}")
            if "GREW" in verdict and len(after) >= 3 and status == 0:
                status = 2
        if young is not None:
            try:
                young.wait(args.interval + 60)  # its last interval ends with the soak's load; then it stops
            except subprocess.TimeoutExpired:
                young.terminate()
            young_rows = root / "young" / "young_rows.json"
            young_all = json.loads(young_rows.read_text()) if young_rows.exists() else []
            for name, verdict in against_young(after, young_all[1:], args.interval):
                print(f"flatness against a young broker: {name}: {verdict}")
            if trace is not None:  # beside rows.json: ``--verdicts`` judges them again
                (trace.parent / "young_rows.json").write_text(json.dumps(young_all))
        for name, what in (("disk_ms", "ms per write/flush request"), ("io_stall", "ms stalled on I/O")):
            shown = ", ".join(f"{r[name]:.0f}" if r[name] == r[name] else "-" for r in after)
            print(f"flatness: {name}: the disk's worst second per interval: {shown} {what} (not in the net drift)")
    if trace is not None:
        for line in stall_report(trace, ledger.slow_sends, ledger.sample_sends,
                                 client_stalls.events + disk_probe.events, ledger.slow_recvs,
                                 ledger.sample_recvs):  # fmt: skip
            print(line)
    if not args.keep and args.data_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    print(f"soak: exit status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
