"""A large backlog: the broker's memory, throughput and restart time as a 16-partition queue fills to N messages.

What it prints (issue 25), for one standard-tier partitioned queue (16 partitions) of 1 KB messages:

  - ``rss``: the broker process's resident memory with 0 messages queued, with 1,000,000 (when N is larger) and
    with N, each measured after the throughput rounds at that size (so the read-ahead windows are full);
  - ``rate``: send + peek-lock receive + complete through the official SDK (batches of 100: ``send_messages`` of
    100, ``receive_messages(max_message_count=100)``, ``complete_message`` each), in msg/s, on an empty queue and
    on the full one, in the same broker process, in alternating rounds (the machine's speed drifts by a third, so
    each side is the median of its rounds, with their range), and the ratio full / empty;
  - ``restart``: a broker started on the data directory holding the backlog (``--restarts`` times, medians):
    seconds from spawning the process to its port accepting a connection (Python's start-up included; in
    brackets the broker's own part, from its script's first line to its port listening), and from there to the
    first message received from the backlog (the SDK's connection set-up included); "0" holds one message;
  - ``disk``: the data directory's size.

``--kind`` says what the backlog is made of (docs/backlog.md has the figures): ``active`` (the default) plain
messages; ``scheduled`` messages scheduled for later (a random time between one hour and a day ahead: they stay
SCHEDULED for the whole run); ``deferred`` messages received and deferred (in this process, through each
partition's broker: lock a batch, defer it), after which one plain message is sent, for the first delivery after a
restart; ``sessions`` plain messages on session-enabled queues, spread round-robin over ``--sessions`` sessions
(default 1,000); ``session-each`` one message per session (a million sessions at 1M). The rate rounds always send
and receive plain messages, next to that backlog; on the session kinds a round's messages go to a session of its
own, received by a receiver of that session, and the first delivery after a restart is the next available
session's (the broker finds it on disk: it knows no session at start).

The backlog is written between broker runs by this process through the Python API (``Namespace.submit_send`` of
keyless 500-message batches, many in flight): the SDK's pace on this machine would take hours for 10 million,
and what is measured is the broker holding the backlog, not the fill. The broker is a child process running
``shardbus.server.Broker`` (durable SQLite stores, partitions in its own process, as ``shardbus serve`` runs).

    python bench/backlog.py [--messages N] [--quick] [--kind active|scheduled|deferred] [--rounds R]
                            [--round-messages M] [--restarts K] [--dir PATH] [--keep] [--measure-only]
                            [--sessions S]

``--quick`` (CI): N = 20,000, two rounds of 500 messages. The default (N = 10,000,000) writes about 12 GB and
takes about 20 minutes here.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from children import ChildProcess, watch_parent

QUEUE = "backlog"
EMPTY = "empty"
BODY = bytes(range(256)) * 4  # 1 KB
FILL_BATCH = 200  # 200 x 1 KB: within the 256 KB batch the Python API allows on standard, as over AMQP
FILL_IN_FLIGHT = 16
MILESTONE = 1_000_000
KEY_NAME = "RootManageSharedAccessKey"
KEY = "SAS_KEY_VALUE"
KINDS = ("active", "scheduled", "deferred", "sessions", "session-each")
SESSION_KINDS = ("sessions", "session-each")


# =================================================================================================================
# the broker (a child process)
# =================================================================================================================
def run_broker(data_dir: str) -> None:
    """Child: a broker on a free port; prints ``READY <port> <seconds>`` once it serves, the seconds from here
    (Python's start-up and this script's imports done) to its port listening."""
    started = time.monotonic()
    from shardbus.server import Broker

    watch_parent()
    broker = Broker(data_dir, port=0)

    def ready(b: Broker) -> None:
        print(f"READY {b.server.port} {time.monotonic() - started:.3f}", flush=True)

    broker.serve_forever(on_ready=ready)


class BrokerProcess(ChildProcess):
    def __init__(self, data_dir: Path) -> None:
        self.spawned = time.monotonic()
        super().__init__("broker", str(Path(__file__).resolve()), ["--broker", str(data_dir)])
        self.port = int(self.ready[0])
        self.open_seconds = float(self.ready[1])  # the broker's own part of its start

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY};"
            "UseDevelopmentEmulator=true"
        )

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")


# =================================================================================================================
# filling (this process, between broker runs)
# =================================================================================================================
def create(data_dir: Path, sessions: bool = False) -> None:
    from shardbus.server import Broker

    broker = Broker(data_dir, port=0)
    try:
        for name in (QUEUE, EMPTY):
            broker.namespace.create_queue(
                name, enable_partitioning=True, max_size_in_megabytes=5120, requires_session=sessions
            )
    finally:
        broker.stop()


def fill(data_dir: Path, count: int, kind: str = "active", sessions: int = 1000, first: int = 0) -> float:
    """Add ``count`` messages of ``kind`` to the backlog queue (``first``: how many it holds); returns msg/s."""
    from shardbus.model.message import Message
    from shardbus.server import Broker

    broker = Broker(data_dir, port=0)
    started = time.monotonic()
    now = datetime.now(UTC)
    try:
        ns = broker.namespace
        if kind in SESSION_KINDS:
            fill_sessions(ns, count, first, sessions if kind == "sessions" else 0)
            return count / (time.monotonic() - started)
        pending = []
        sent = 0
        while sent < count:
            n = min(FILL_BATCH, count - sent)
            batch = [Message(BODY, message_id=uuid.uuid4().hex) for _ in range(n)]
            if kind == "scheduled":
                for m in batch:
                    m.scheduled_enqueue_time = now + timedelta(seconds=random.uniform(3600, 86400))
            pending.append(ns.submit_send(QUEUE, batch))
            sent += n
            if len(pending) >= FILL_IN_FLIGHT:
                pending.pop(0).result()
        for future in pending:
            future.result()
        if kind == "deferred":
            defer_all(ns)
            ns.submit_send(QUEUE, [Message(BODY, message_id=uuid.uuid4().hex)]).result()  # for the first delivery
    finally:
        broker.stop()
    return count / (time.monotonic() - started)


def fill_sessions(ns, count: int, first: int, sessions: int) -> None:
    """Messages ``first`` .. ``first + count`` of the session backlog, message j in session ``s<j % sessions>``
    (``sessions`` 0: ``e<j>``, one each), straight to the partitions their sessions map to, in batches of
    ``FILL_BATCH`` (a batch of the SDK or the Python API holds one session)."""
    from shardbus.model.message import Message
    from shardbus.model.routing import partition_for_key

    partitions = ns._queue(QUEUE).partitions
    batches: list[list] = [[] for _ in partitions]
    pending = []
    for j in range(first, first + count):
        sid = f"s{j % sessions}" if sessions else f"e{j}"
        p = partition_for_key(sid, len(partitions))
        batch = batches[p]
        batch.append((None, [(0, Message(BODY, message_id=uuid.uuid4().hex, session_id=sid))]))
        if len(batch) >= FILL_BATCH:
            pending.append(partitions[p].enqueue(batch))
            batches[p] = []
            if len(pending) >= FILL_IN_FLIGHT:
                pending.pop(0).result()
    for p, batch in enumerate(batches):
        if batch:
            pending.append(partitions[p].enqueue(batch))
    for future in pending:
        future.result()


def defer_all(ns) -> None:
    """Lock every ACTIVE message of the backlog queue and defer it, partition by partition."""
    from shardbus.model.message import SubQueue
    from shardbus.partition.broker import Settle

    for partition in ns._queue(QUEUE).partitions:
        pending = []
        while batch := partition.lock_messages(0, SubQueue.MAIN, 256):
            pending.append(partition.settle(0, [Settle("defer", m.lock_token) for m in batch]))
            if len(pending) >= FILL_IN_FLIGHT:
                pending.pop(0).result()
        for future in pending:
            future.result()


# =================================================================================================================
# measuring (the SDK against the broker process)
# =================================================================================================================
def _cycles(sender: Any, receiver: Any, messages: int, session_id: str | None = None) -> float:
    """msg/s of send 100 + receive 100 (peek-lock) + complete each, ``messages`` in all, on open links."""
    from azure.servicebus import ServiceBusMessage

    done = 0
    started = time.monotonic()
    while done < messages:
        sender.send_messages([ServiceBusMessage(BODY, session_id=session_id) for _ in range(100)])
        got = 0
        while got < 100:
            batch = receiver.receive_messages(max_message_count=100 - got, max_wait_time=5)
            if not batch:
                break
            for m in batch:
                receiver.complete_message(m)
            got += len(batch)
        done += 100
    return done / (time.monotonic() - started)


def session_rate(conn: str, queue: str, messages: int) -> float:
    """``rate`` on a session-enabled queue: the 100s go to a new session, received by a receiver of that session."""
    from azure.servicebus import ServiceBusClient

    sid = f"rate-{uuid.uuid4().hex[:12]}"
    with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
        client.get_queue_receiver(queue, session_id=sid, prefetch_count=0) as receiver,
    ):
        return _cycles(sender, receiver, messages, sid)


def rate(conn: str, queue: str, messages: int, sessions: bool = False) -> float:
    """msg/s of send 100 + receive 100 (peek-lock) + complete each, ``messages`` in all."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    if sessions:
        return session_rate(conn, queue, messages)
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_sender(queue) as sender, client.get_queue_receiver(queue, prefetch_count=0) as receiver:
            sender.send_messages([ServiceBusMessage(BODY) for _ in range(10)])  # links attached and warm
            for m in receiver.receive_messages(max_message_count=10, max_wait_time=5):
                receiver.complete_message(m)
            return _cycles(sender, receiver, messages)


def rates(conn: str, rounds: int, per_round: int, sessions: bool = False) -> tuple[list[float], list[float]]:
    empty: list[float] = []
    full: list[float] = []
    for r in range(rounds):  # alternating which goes first
        order = [(EMPTY, empty), (QUEUE, full)] if r % 2 == 0 else [(QUEUE, full), (EMPTY, empty)]
        for queue, out in order:
            out.append(rate(conn, queue, per_round, sessions))
    return empty, full


def first_delivery(conn: str, sessions: bool = False) -> float:
    """When (monotonic) a new SDK client's receiver got its first message from the backlog queue (on a
    session-enabled queue: a receiver of the next available session)."""
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient

    options = {"session_id": NEXT_AVAILABLE_SESSION, "max_wait_time": 10} if sessions else {}
    with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_receiver(QUEUE, **options) as receiver,
    ):
        for _ in range(6):
            got = receiver.receive_messages(max_message_count=1, max_wait_time=10)
            if got:
                at = time.monotonic()
                receiver.abandon_message(got[0])
                return at
    raise RuntimeError("no message came from the backlog")


def wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.005)
    raise RuntimeError("the broker's port never accepted a connection")


def restart(data_dir: Path, sessions: bool = False) -> tuple[BrokerProcess, float, float]:
    """A broker started on the data directory: (it, seconds from spawning it to its port, seconds from there to
    a message received from the backlog queue)."""
    broker = BrokerProcess(data_dir)  # returns when the broker printed READY (its port listens)
    wait_for_port(broker.port, time.monotonic() + 60)
    at_port = time.monotonic()
    delivered = first_delivery(broker.connection_string, sessions)
    return broker, at_port - broker.spawned, delivered - at_port


def disk_mb(data_dir: Path) -> float:
    return sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file()) / 1e6


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f} s"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} msg/s ({min(values):,.0f}-{max(values):,.0f})"


def measure(data_dir: Path, queued: int, args: argparse.Namespace, baseline: list[float] | None) -> list[float]:
    """Restart on the backlog (``--restarts`` times), time it, run the rate rounds, print a line; returns the
    empty queue's rates."""
    to_port, to_open, to_delivery = [], [], []
    sessions = args.kind in SESSION_KINDS
    for attempt in range(args.restarts):
        broker, port_seconds, delivery_seconds = restart(data_dir, sessions)
        to_port.append(port_seconds)
        to_open.append(broker.open_seconds)
        to_delivery.append(delivery_seconds)
        if attempt < args.restarts - 1:
            broker.stop()
    try:
        empty, full = rates(broker.connection_string, args.rounds, args.round_messages, sessions)
        rss = broker.rss_mb()
        ratio = statistics.median(full) / statistics.median(empty)
        print(
            f"queued={queued:,} rss={rss:,.0f} MB restart: port={statistics.median(to_port):.2f} s "
            f"(broker's own {statistics.median(to_open):.2f} s) first_delivery={statistics.median(to_delivery):.2f} s "
            f"(medians of {args.restarts}: port {_range(to_port)}, first delivery {_range(to_delivery)}) "
            f"disk={disk_mb(data_dir):,.0f} MB",
            flush=True,
        )
        print(f"  rate empty={_spread(empty)} full={_spread(full)} ratio={ratio:.2f}", flush=True)
        return empty
    finally:
        broker.stop()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--broker":
        run_broker(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000_000, help="backlog size N (default 10,000,000)")
    parser.add_argument("--quick", action="store_true", help="CI-sized: N = 20,000, 2 rounds of 500")
    parser.add_argument("--kind", choices=KINDS, default="active", help="what the backlog holds (default active)")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions of --kind sessions (default 1,000)")
    parser.add_argument("--rounds", type=int, default=6, help="rate rounds per side (default 6)")
    parser.add_argument("--round-messages", type=int, default=2000, help="messages per rate round (default 2000)")
    parser.add_argument("--restarts", type=int, default=3, help="restarts timed per size (default 3)")
    parser.add_argument("--dir", help="data directory (default: a temporary one, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--measure-only", action="store_true", help="only measure the backlog a kept --dir holds (--messages of it)"
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds, args.round_messages, args.restarts = 20_000, 2, 500, 1
    data_dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardbus-backlog-"))
    try:
        print(
            f"backlog of {args.messages:,} x 1 KB {args.kind} messages, one 16-partition queue; data in {data_dir}",
            flush=True,
        )
        if args.measure_only:
            measure(data_dir, args.messages, args, None)
            return
        sessions = args.kind in SESSION_KINDS
        create(data_dir, sessions)
        fill(data_dir, 1, "sessions" if sessions else "active", 1)  # "0": a first delivery after a restart needs one
        measure(data_dir, 0, args, None)
        queued = 0
        for target in sorted({min(MILESTONE, args.messages), args.messages}):
            speed = fill(data_dir, target - queued, args.kind, args.sessions, queued + 1)
            queued = target
            print(f"filled to {queued:,} ({speed:,.0f} msg/s)", flush=True)
            measure(data_dir, queued, args, None)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
