"""End-to-end AMQP throughput and broker CPU per message, each beside the same client against a null endpoint.

Every measurement runs the same client twice in one run: against **shardbus** (a child process: durable SQLite
stores, the default) and against a **null endpoint** (another child process: an AMQP server on our engine that
answers the Service Bus handshake, accepts and discards every transfer and hands out pre-made messages; it stores
nothing). The null endpoint is the client's own ceiling. Both clients are opened and warmed up first, then take
turns: ``--slices`` turns each (default 6, which one goes first alternating), timed separately and summed. The
machine's speed drifts by tens of percent over seconds; measured one after the other, the two runs of a line met
different machines and the ratio swung with them. Each line prints msg/s against both, ``ratio`` = shardbus / null,
and the broker process's CPU per message (time on a CPU of every thread, read from ``/proc/<pid>/task/*/schedstat``
before and after each timed turn, after the broker has gone idle so that work it does after acknowledging, such as
receive-and-delete's deletes, is counted); in brackets the event-loop thread's share and the rest (the partition
stores' commit threads).

Measurements (1 KB bodies unless ``--body-size`` says otherwise):

    sdk-batch-send-100 / -1000   azure-servicebus sync ``send_messages`` of a list of 100 / 1000 messages
    sdk-receive-and-delete       ``receive_messages(max_message_count=100)`` in RECEIVE_AND_DELETE mode
    sdk-peek-lock-complete       the same in PEEK_LOCK mode, then ``complete_message`` for each message
    own-produce-unsettled        our ``AmqpClient``: unsettled transfers, a window of in-flight sends, each awaited
    own-produce-presettled       pre-settled transfers, then one unsettled transfer as a fence (the queue has one
                                 partition, so its outcome means everything before it is stored)
    own-consume-presettled       a receive-and-delete link (snd-settle-mode settled), credit kept topped up
    own-consume-unsettled        a peek-lock link; the deliveries one socket read brings are accepted together
                                 (one unsettled ``accepted`` disposition per run of consecutive delivery ids, as
                                 AMQP allows) and counted when the broker's settled echoes arrive. One disposition
                                 per delivery is the SDK's pattern, which sdk-peek-lock-complete measures; with it
                                 this line cost 26-30 us/msg of broker CPU, about 21 of it paid by the null
                                 endpoint too (a frame in and an echo out per message), against 15-22 this way

The SDK receive lines add a ``sdk waits`` line: per endpoint, the SDK's time per message in ``receive_messages`` and
in the completes, and how many receives came back with fewer messages than asked for; a broker slower than the null
endpoint shows there on which call it is slower.

Each line ends with ``target met``/``MISSED``: the issue's targets are ratio >= 0.80 for the SDK lines and
broker_cpu < 25 us/msg for our own client's lines. One run of a line swings by a third on a shared 2-core machine
(the clients, the broker and whatever else runs share the cores), so ``--repeat R`` measures everything R times,
round by round, and ends with each line's median and range; its verdict is the median's.

Placement: the client (this process, the SDK's or our own) runs on one CPU and each endpoint process, all its
threads, on the others (``--no-pin`` leaves placement to the scheduler). The null endpoint barely runs, but
shardbus's event loop and store threads do, and on 2 CPUs the scheduler sometimes put them on the client's CPU
after the pauses between turns, so the client waited for them: in two alternating runs on the same machine,
peek-lock + complete read 0.94 and 0.90 pinned against 0.79 and 0.71 unpinned. Pinned, shardbus's threads share a
CPU with each other instead of with the client, as a broker on a machine of its own would.

Choices: the broker runs a **premium** namespace (one partition per entity) whose batch quota is raised to 100 MB
(``max_batch_size_bytes``; the service's premium batch is 1 MB) and queues of 100 MB messages, so the sender link
advertises 100 MB batches; with 1 MB (or the standard tier's 256 KB) the SDK refuses a list of 1000 x 1 KB messages
(``MessageSizeExceededError``), and we wanted the same 1 KB body everywhere. The null endpoint advertises
the same limit. Our own producer spreads its messages over sender links of at most ``LINK_MESSAGES`` each,
attached before the timed run: the broker grants a sender link 10,000 credits once and never tops them up, so a
client that honours credit stalls after 10,000 transfers on one link (``--check-credit`` shows it). Receive counts
stay below 65,536 per SDK receiver: past that the broker exhausts the SDK's session incoming window and closes the
connection with amqp:internal-error.

Memory: the lines share one broker process, whose memory budget (``SHARDBUS_MEMORY_MB``, 32) the send lines use up
(their queues keep about 40 MB), so run whole the receive lines read all but a read-ahead window of their queues
back from the store, while run alone (or with ``SHARDBUS_MEMORY_MB=1000``) they are served from memory; set
``SHARDBUS_MEMORY_MB=0`` to measure the read-back path alone (docs/benchmarks.md has both).

Body size: 1 KB is the default everywhere. The issue's reference figures (the engines it compared) were measured
with ~231-byte messages; ``--body-size 182`` gives our own producer messages of that size (its 36-character
message-id and the data section's header make up the rest). The broker's CPU per message grows with the bytes it
stores (SQLite's insert, the WAL write, the checkpoint's copy, the fsync's writeback), so both sizes are worth
reading.

    python bench/amqp.py [--quick] [--scale F] [--repeat R] [--slices S] [--only NAME[,NAME]] [--check-credit]
                         [--window N] [--ack-each] [--no-pin] [--body-size BYTES]
                         [--profile [--top N] [--sort tottime|cumulative] [--profile-wall]] [--broker-gc-off]
                         [--base DIR]

``--base DIR`` serves a second broker from another checkout (``DIR/src``, e.g. ``git archive 7735009 | tar -x -C
DIR``; bench/amqp_broker.py imports that tree's ``Broker``) next to this tree's, and every line takes turns among the
null endpoint and both brokers (the order rotates and reverses slice by slice). Each line is printed for both trees
(``@base``) and then as this tree over the base: rate and broker CPU per message, each round's own quotient, whose
median and range end a ``--repeat`` run. The null endpoint always runs this tree's engine, so both brokers are held
to one ceiling; running the base's own bench/amqp.py would instead measure against the base's null endpoint.

``--profile`` runs the broker's event-loop thread under cProfile (timer: thread CPU time, so waits for the GIL are
not counted; the profiler makes the broker about three times slower, so read shares, not absolute numbers) and
prints its top functions and the garbage collector's work per measurement; ``--profile-wall`` makes it count wall
time instead, so that what the loop waits for shows. ``--broker-gc-off`` (diagnosis only)
runs the broker with Python's cyclic garbage collector disabled, to show what its full collections cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/children.py, bench/amqp_broker.py

from amqp_broker import BATCH_LIMIT, SRC_ENV
from children import ChildProcess, watch_parent
from shardbus.access import sas
from shardbus.amqp import events as E
from shardbus.amqp.connection import Connection
from shardbus.amqp.message import AmqpMessage, BodyType, Header, Properties, decode_message
from shardbus.amqp.performatives import RECEIVER, Accepted, SndSettleMode, Source, Target
from shardbus.amqp.transport import AmqpClient, AmqpProtocol, ClientReceiver, ClientSession, install_uvloop, serve
from shardbus.amqp.types import Int, Long, Symbol, Timestamp

BODY_SIZE = 1024  # bytes of every message body (--body-size)
BODY = os.urandom(BODY_SIZE)
KEY_NAME = "RootManageSharedAccessKey"
KEY = "SAS_KEY_VALUE"
LINK_MESSAGES = 5_000  # messages per sender link of our own producer (the broker never tops up sender credit)
WINDOW = 256  # in-flight unsettled transfers of our own producer (--window changes it for own-produce-unsettled)
CREDIT = 500  # credit our own consumer keeps granted
SDK_RECEIVE_BATCH = 100
WARMUP = 100
SLICES = 6  # turns each endpoint gets per measurement: they alternate, so drift reaches both
SDK_TARGET_RATIO = 0.80  # the SDK against shardbus reaches at least this share of its null-endpoint rate
OWN_TARGET_US = 25.0  # broker CPU per durable message with our own client
BASE = "@base"  # a line's suffix for the broker served from the --base checkout


# =================================================================================================================
# child processes
# =================================================================================================================


class NullEndpoint:
    """Just enough Service Bus for the SDK and our client: SASL, open/begin, ``$cbs`` put-token answered 202,
    attach replies echoing source and target, every transfer accepted and dropped, and on receiver links pre-made
    1 KB messages (16-byte tags, ``x-opt-*`` annotations) with settle dispositions echoed. Stores nothing."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.cbs_out: dict[Any, Any] = {}  # session -> our sending $cbs link
        self.receivers: set[Any] = set()  # our sending links (client receivers)
        self.tags = 0

    def handle_event(self, proto: AmqpProtocol, ev: E.Event) -> None:
        c = proto.conn
        t = type(ev)
        if t is E.DeliveryReceived:
            self._on_delivery(c, ev)  # type: ignore[arg-type]
        elif t is E.DispositionReceived:
            if ev.role and not ev.settled:  # type: ignore[attr-defined]
                for ref in ev.deliveries:  # type: ignore[attr-defined]
                    c.disposition(ref.link, ref.delivery_id, settled=True, state=ev.state)  # type: ignore[attr-defined]
        elif t is E.FlowReceived:
            link = ev.link  # type: ignore[attr-defined]
            if link is None:  # a session flow may open the peer's incoming window again
                for other in [lk for lk in self.receivers if lk.session is ev.session]:  # type: ignore[attr-defined]
                    self._pump(c, other)
            elif link in self.receivers:
                self._pump(c, link)
        elif t is E.SaslInit:
            c.accept_sasl()
        elif t is E.ConnectionOpened:
            c.open()
        elif t is E.SessionBeginRequested:
            c.begin(ev.session, incoming_window=0x7FFFFFFF, outgoing_window=0x7FFFFFFF)  # type: ignore[attr-defined]
        elif t is E.LinkAttachRequested:
            self._on_attach(c, ev)  # type: ignore[arg-type]
        elif t is E.LinkDetached:
            self.receivers.discard(ev.link)  # type: ignore[attr-defined]
            if ev.reply_needed:  # type: ignore[attr-defined]
                c.detach(ev.link, closed=ev.closed)  # type: ignore[attr-defined]
        elif t is E.SessionEnded:
            if ev.reply_needed:  # type: ignore[attr-defined]
                c.end(ev.session)  # type: ignore[attr-defined]
        elif t is E.ConnectionClosed and ev.reply_needed:  # type: ignore[attr-defined]
            c.close()

    def connection_lost(self, proto: AmqpProtocol) -> None:
        self.receivers.clear()

    def _on_attach(self, c: Connection, ev: E.LinkAttachRequested) -> None:
        link, attach = ev.link, ev.attach
        client_sends = not attach.role
        node = attach.target if client_sends else attach.source
        address = str(getattr(node, "address", "") or "")
        if address == "$cbs" or address.endswith("/$management"):
            c.attach_reply(link)
            if client_sends:
                c.flow(link, link_credit=10_000)
            else:
                self.cbs_out[link.session] = link
        elif client_sends:
            c.attach_reply(link, properties={Symbol("com.microsoft:max-message-batch-size"): Int(BATCH_LIMIT)})
            c.flow(link, link_credit=10_000)
        else:
            c.attach_reply(
                link,
                snd_settle_mode=attach.snd_settle_mode,
                rcv_settle_mode=attach.rcv_settle_mode,
                initial_delivery_count=0,
                max_message_size=attach.max_message_size or 0,
            )
            self.receivers.add(link)

    def _on_delivery(self, c: Connection, ev: E.DeliveryReceived) -> None:
        link = ev.link
        if not ev.settled:
            c.settle(link, ev.delivery_id, Accepted())
        if link.credit < 5_000 and link.attached:
            c.flow(link, link_credit=10_000)
        address = str(getattr(link.target, "address", "") or "")
        if address == "$cbs":
            request = decode_message(ev.payload)
            out = self.cbs_out.get(link.session)
            if out is not None:
                reply = AmqpMessage(
                    properties=Properties(correlation_id=request.properties.message_id if request.properties else None),
                    application_properties={"status-code": Int(202), "status-description": "Accepted"},
                )
                c.send_transfer(out, uuid.uuid4().bytes, reply.encode(), settled=True, ignore_credit=True)

    def _pump(self, c: Connection, link: Any) -> None:
        settled = link.snd_settle_mode == SndSettleMode.SETTLED
        payload = self.payload
        n = min(link.credit, link.session.remote_incoming_window)
        for _ in range(max(0, n)):
            self.tags += 1
            c.send_transfer(link, self.tags.to_bytes(16, "little"), payload, settled=settled)
        if link.drain:
            c.drained(link)


def null_payload() -> bytes:
    """A delivered message as the broker encodes one: header, the broker's annotations, a message-id, the body."""
    now = int(time.time() * 1000)
    return AmqpMessage(
        header=Header(delivery_count=0),
        message_annotations={
            Symbol("x-opt-sequence-number"): Long(1),
            Symbol("x-opt-enqueued-time"): Timestamp(now),
            Symbol("x-opt-locked-until"): Timestamp(now + 24 * 3600 * 1000),
        },
        properties=Properties(message_id=str(uuid.uuid4())),
        body=[BODY],
        body_type=BodyType.DATA,
    ).encode()


def run_null() -> None:
    """Child: the null endpoint on a free port; prints ``READY <port>``."""
    watch_parent()
    install_uvloop()
    payload = null_payload()

    async def main() -> None:
        server = await serve(lambda: NullEndpoint(payload), "127.0.0.1", 0)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
        await stop.wait()
        server.close()

    asyncio.run(main())


# =================================================================================================================
# the parent's view of a child
# =================================================================================================================


def _task_cpu(pid: int, tid: int | str) -> float:
    """CPU seconds a thread has run (``/proc/<pid>/task/<tid>/schedstat``: nanoseconds on a CPU)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


class Child(ChildProcess):
    """A child process (broker or null endpoint) on a free port, with its CPU readable from /proc."""

    def __init__(
        self, name: str, script: str, args: list[str], profile_dir: Path | None = None, src: Path | None = None
    ) -> None:
        self.profile_dir = profile_dir
        self._dumps = 0
        env = {**os.environ, SRC_ENV: str(src)} if src is not None else None
        super().__init__(name, str(Path(__file__).resolve().parent / script), args, env)
        self.port = int(self.ready[0])
        self.src = self.ready[1] if len(self.ready) > 1 else ""  # the shardbus it serves (a broker's)

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY};"
            "UseDevelopmentEmulator=true"
        )

    def cpu(self) -> tuple[float, float]:
        """(every thread, event-loop thread) CPU seconds so far. The broker's threads (event loop, store commit
        pool, maintenance) live as long as it does, so the sum over live threads is the process's CPU."""
        pid = self.proc.pid
        total = 0.0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += _task_cpu(pid, tid)
        return total, _task_cpu(pid, pid)

    def cpu_when_idle(self, quiet: float = 0.3, limit: float = 15.0) -> tuple[float, float]:
        """CPU once it has stopped growing for ``quiet`` seconds (work left after the client's last answer)."""
        last = self.cpu()
        still = time.monotonic()
        deadline = still + limit
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.cpu()
            if now[0] - last[0] > 0.002:
                last, still = now, time.monotonic()
            elif time.monotonic() - still >= quiet:
                break
        return last

    def dump_profile(self) -> Path | None:
        if self.profile_dir is None:
            return None
        path = self.profile_dir / f"{self._dumps}.prof"
        self._dumps += 1
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return path if path.exists() else None


class Timer:
    """Marks the timed regions of a run: wall time from each ``start`` to its ``stop``, summed, and CPU of the
    endpoint process from each ``start`` until it is idle after the ``stop``."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.seconds = 0.0
        self._cpu = (0.0, 0.0)
        self._t0 = 0.0
        self._c0 = (0.0, 0.0)

    def start(self) -> None:
        self._c0 = self.child.cpu_when_idle(quiet=0.2)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.seconds += time.perf_counter() - self._t0
        c1 = self.child.cpu_when_idle()
        self._cpu = (self._cpu[0] + c1[0] - self._c0[0], self._cpu[1] + c1[1] - self._c0[1])

    @property
    def cpu(self) -> tuple[float, float]:
        """(every thread, event-loop thread) CPU seconds over the timed regions."""
        return self._cpu


# A measurement's client, opened against one endpoint: ``take(count)`` sends or receives ``count`` messages and
# returns once they are done. Clients are opened by a context manager given the endpoint, the queue, the total
# count it will be asked for and an asyncio runner (our own client's connections live on its loop).
Take = Callable[[int], None]
Opener = Callable[[Child, str, int, asyncio.Runner], contextlib.AbstractContextManager[Take]]


# =================================================================================================================
# the azure-servicebus SDK (sync) as client
# =================================================================================================================


@contextlib.contextmanager
def sdk_sender(child: Child, queue: str, total: int, runner: asyncio.Runner, batch: int) -> Iterator[Take]:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    def take(count: int) -> None:
        for _ in range(count // batch):
            sender.send_messages([ServiceBusMessage(BODY) for _ in range(batch)])

    with (
        ServiceBusClient.from_connection_string(child.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([ServiceBusMessage(BODY) for _ in range(WARMUP)])
        yield take


@contextlib.contextmanager
def sdk_receiver(child: Child, queue: str, total: int, runner: asyncio.Runner, peek_lock: bool) -> Iterator[Take]:
    from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

    mode = ServiceBusReceiveMode.PEEK_LOCK if peek_lock else ServiceBusReceiveMode.RECEIVE_AND_DELETE

    waits = SDK_WAITS.setdefault(child.name, [0.0, 0.0, 0, 0])

    def take(count: int) -> None:
        got = 0
        clock = time.perf_counter
        while got < count:
            want = min(SDK_RECEIVE_BATCH, count - got)
            t0 = clock()
            msgs = receiver.receive_messages(max_message_count=want, max_wait_time=5)
            t1 = clock()
            if not msgs:
                raise RuntimeError(f"{child.name}: only {got} of {count} messages came back")
            if peek_lock:
                for m in msgs:
                    receiver.complete_message(m)
            waits[0] += t1 - t0
            waits[1] += clock() - t1
            waits[2] += 1
            waits[3] += len(msgs) < want
            got += len(msgs)

    with (
        ServiceBusClient.from_connection_string(child.connection_string) as client,
        client.get_queue_receiver(queue, receive_mode=mode) as receiver,
    ):
        take(WARMUP)
        waits[:] = [0.0, 0.0, 0, 0]  # the timed takes only
        yield take


# Per endpoint, over the timed takes of an SDK receive line: seconds in receive_messages, seconds in the completes,
# receive_messages calls, and calls that returned fewer messages than asked for (reset per measurement).
SDK_WAITS: dict[str, list[Any]] = {}


# =================================================================================================================
# our own engine's client
# =================================================================================================================


class CountingClient(AmqpClient):
    """``AmqpClient`` that also counts the settled dispositions the peer sends for deliveries we received."""

    echoes = 0
    echoed: asyncio.Event | None = None
    target = 0

    def handle_event(self, protocol: AmqpProtocol, ev: E.Event) -> None:
        if type(ev) is E.DispositionReceived and not ev.role and ev.settled:  # type: ignore[attr-defined]
            self.echoes += len(ev.deliveries) or 1  # type: ignore[attr-defined]
            if self.echoed is not None and self.echoes >= self.target:
                self.echoed.set()
            return
        super().handle_event(protocol, ev)


async def own_connect(child: Child, queue: str) -> tuple[CountingClient, ClientSession]:
    """Connect, put a SAS token for ``queue`` on ``$cbs`` (as the SDK does), open a session."""
    client = await CountingClient.connect("127.0.0.1", child.port, hostname="localhost")
    session = await client.session(incoming_window=0x7FFFFFFF)
    cbs_in = await session.receiver("$cbs", credit=10)
    cbs_out = await session.sender("$cbs")
    audience = f"sb://localhost:{child.port}/{queue}"
    request = AmqpMessage(
        properties=Properties(message_id=uuid.uuid4()),
        application_properties={
            "name": audience,
            "operation": "put-token",
            "type": "servicebus.windows.net:sastoken",
        },
        body=sas.generate_token(audience, KEY_NAME, KEY),
        body_type=BodyType.VALUE,
    )
    outcome = await cbs_out.send(request.encode())
    if not isinstance(outcome, Accepted):
        raise RuntimeError(f"{child.name}: put-token transfer got {outcome}")
    reply = decode_message((await cbs_in.receive(timeout=30)).payload)
    status = int((reply.application_properties or {}).get("status-code", 0))
    if not 200 <= status < 300:
        raise RuntimeError(f"{child.name}: put-token refused with {status}")
    return client, session


async def own_receiver(session: ClientSession, address: str, settled: bool) -> ClientReceiver:
    """A receiver link whose snd-settle-mode says receive-and-delete (settled) or peek-lock (unsettled)."""
    mode = SndSettleMode.SETTLED if settled else SndSettleMode.UNSETTLED
    link = await session._attach(
        f"receiver-{uuid.uuid4()}", RECEIVER, Source(address=address), Target(address=None), snd_settle_mode=mode
    )
    receiver = ClientReceiver(session, link)
    session.client._receivers[id(link)] = receiver
    return receiver


def send_payload() -> bytes:
    """What our own producer sends: a message-id and the body (``set_body_size`` remakes it)."""
    return AmqpMessage(
        properties=Properties(message_id=str(uuid.uuid4())), body=[BODY], body_type=BodyType.DATA
    ).encode()


SEND_PAYLOAD = send_payload()


def set_body_size(size: int) -> None:
    """Every body (the SDK's, our own producer's, the null endpoint's deliveries) is ``size`` random bytes."""
    global BODY_SIZE, BODY, SEND_PAYLOAD
    BODY_SIZE, BODY = size, os.urandom(size)
    SEND_PAYLOAD = send_payload()


@contextlib.contextmanager
def own_producer(
    child: Child, queue: str, total: int, runner: asyncio.Runner, settled: bool, window: int
) -> Iterator[Take]:
    client, session = runner.run(own_connect(child, queue))
    sent = 0  # messages sent so far, warm-up included: the count picks the link

    async def attach() -> list[Any]:
        return [await session.sender(queue) for _ in range(-(-(total + WARMUP + 1) // LINK_MESSAGES))]

    async def produce(count: int) -> None:
        nonlocal sent
        counter = iter(range(sent, sent + count))
        sent += count
        if settled:
            for k in counter:
                await links[k // LINK_MESSAGES].send(SEND_PAYLOAD, settled=True)
                if k % 64 == 0:
                    await asyncio.sleep(0)  # let the transport write and flows come in
            outcome = await links[-1].send(SEND_PAYLOAD)  # the fence: one partition stores in order
            if not isinstance(outcome, Accepted):
                raise RuntimeError(f"{child.name}: fence got {outcome}")
            return
        failures: list[Any] = []

        async def worker() -> None:
            for k in counter:
                outcome = await links[k // LINK_MESSAGES].send(SEND_PAYLOAD)
                if not isinstance(outcome, Accepted):
                    failures.append(outcome)

        await asyncio.gather(*(worker() for _ in range(window)))
        if failures:
            raise RuntimeError(f"{child.name}: {len(failures)} sends failed, e.g. {failures[0]}")

    try:
        links = runner.run(attach())
        for _ in range(WARMUP):
            runner.run(links[0].send(SEND_PAYLOAD))
        sent = WARMUP
        yield lambda count: runner.run(produce(count))
    finally:
        runner.run(client.close())


def _runs(ids: list[int]) -> Iterator[tuple[int, int | None]]:
    """(first, last) of each run of consecutive ``ids`` (last None for a run of one), as a disposition covers."""
    start = prev = ids[0]
    for did in ids[1:]:
        if did != prev + 1:
            yield start, (None if prev == start else prev)
            start = did
        prev = did
    yield start, (None if prev == start else prev)


@contextlib.contextmanager
def own_consumer(
    child: Child, queue: str, total: int, runner: asyncio.Runner, settled: bool, ack_each: bool
) -> Iterator[Take]:
    client, session = runner.run(own_connect(child, queue))
    conn = client._conn

    async def consume(count: int) -> None:
        client.echoes = 0
        client.target = count
        client.echoed = asyncio.Event()
        # Never more credit than this take still wants, so that nothing is delivered between takes.
        receiver.grant(min(CREDIT, count))
        queued = receiver.deliveries
        got = 0
        while got < count:
            ids = [(await receiver.receive(timeout=30)).delivery_id]
            while not (ack_each or queued.empty()):  # the rest of what the same read brought
                ids.append(queued.get_nowait().delivery_id)
            got += len(ids)
            if not settled:  # accepted together: one unsettled disposition per run of consecutive ids
                for first, last in _runs(ids):
                    conn.disposition(receiver.link, first, last, settled=False, state=Accepted())
                client._flush()
            if receiver.link.credit < CREDIT // 2:
                want = min(CREDIT, count - got - queued.qsize())
                if want > receiver.link.credit:
                    receiver.grant(want)
        if not settled:
            await asyncio.wait_for(client.echoed.wait(), 60)

    try:
        receiver = runner.run(own_receiver(session, queue, settled))
        runner.run(consume(WARMUP))
        yield lambda count: runner.run(consume(count))
        receiver.grant(0)
    finally:
        runner.run(client.close())


async def own_fill(child: Child, queue: str, n: int) -> None:
    """Put ``n`` messages on a broker queue (setup for the receive measurements; not timed)."""
    client, session = await own_connect(child, queue)
    try:
        links = [await session.sender(queue) for _ in range(-(-n // LINK_MESSAGES))]
        counter = iter(range(n))

        async def worker() -> None:
            for k in counter:
                outcome = await links[k // LINK_MESSAGES].send(SEND_PAYLOAD)
                if not isinstance(outcome, Accepted):
                    raise RuntimeError(f"fill: {outcome}")

        await asyncio.gather(*(worker() for _ in range(WINDOW)))
    finally:
        await client.close()


async def check_credit(child: Child, queue: str) -> str:
    """How much credit does a sender link have left after 10,000 pre-settled transfers?"""
    client, session = await own_connect(child, queue)
    try:
        sender = await session.sender(queue)
        start = sender.link.credit
        for k in range(10_000):
            await sender.send(SEND_PAYLOAD, settled=True)
            if k % 64 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(2)
        return f"{child.name}: sender link credit {start} at attach, {sender.link.credit} after 10,000 transfers + 2 s"
    finally:
        await client.close()


# =================================================================================================================
# driver
# =================================================================================================================


class Measurement:
    def __init__(self, name: str, n: int, step: int, opener: Opener, fill: bool = False) -> None:
        self.name = name
        self.n = n
        self.step = step  # every take is a multiple of it (an SDK batch)
        self.opener = opener
        self.fill = fill
        self.queue = name.replace("-", "")


def measurements(scale: float, window: int = WINDOW, ack_each: bool = False) -> list[Measurement]:
    def n(base: int, step: int) -> int:
        return max(step, int(base * scale) // step * step)

    def m(name: str, base: int, step: int, opener: Callable[..., Any], fill: bool = False, **kw: Any) -> Measurement:
        return Measurement(name, n(base, step), step, partial(opener, **kw), fill)

    return [
        m("sdk-batch-send-100", 20_000, 100, sdk_sender, batch=100),
        m("sdk-batch-send-1000", 20_000, 1000, sdk_sender, batch=1000),
        m("sdk-receive-and-delete", 10_000, 100, sdk_receiver, True, peek_lock=False),
        m("sdk-peek-lock-complete", 6_000, 100, sdk_receiver, True, peek_lock=True),
        m("own-produce-unsettled", 20_000, 100, own_producer, settled=False, window=window),
        m("own-produce-presettled", 20_000, 100, own_producer, settled=True, window=window),
        m("own-consume-presettled", 20_000, 100, own_consumer, True, settled=True, ack_each=ack_each),
        m("own-consume-unsettled", 20_000, 100, own_consumer, True, settled=False, ack_each=ack_each),
    ]


def print_profile(path: Path | None, top: int, sort: str) -> None:
    if path is None:
        print("    (no profile)")
        return
    gc_file = path.with_suffix(".gc")
    if gc_file.exists():
        print(f"    garbage collector: {gc_file.read_text()}")
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats(sort).print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start:]:
        if line.strip():
            print("    " + line.replace(str(Path(__file__).resolve().parents[1]) + "/", ""))


def target_met(m: Measurement, ratio: float, per: float) -> bool:
    """The issue's targets: the SDK gets >= 80 % of its ceiling; our own client costs the broker < 25 us/msg."""
    return ratio >= SDK_TARGET_RATIO if m.name.startswith("sdk") else per < OWN_TARGET_US


def measure(m: Measurement, brokers: list[Child], null: Child, args: argparse.Namespace) -> list[tuple[float, float]]:
    """One run of ``m``: the same client opened against the null endpoint and against each broker (this tree's,
    and with ``--base`` the base tree's), its ``m.n`` messages taken in slices from each in turn (the order
    rotates and reverses from slice to slice, so every endpoint goes first and follows every other alike), so that
    drift of the machine's speed during the run reaches all alike; prints a line per broker (and with a base,
    this tree over the base), returns (ratio, broker CPU us/msg) per broker."""
    steps = m.n // m.step
    slices = max(1, min(args.slices, steps))
    sizes = [(steps * (i + 1) // slices - steps * i // slices) * m.step for i in range(slices)]
    if m.fill:
        for broker in brokers:
            asyncio.run(own_fill(broker, m.queue, m.n + WARMUP))
    children = [null, *brokers]
    timers = {child.name: Timer(child) for child in children}
    with asyncio.Runner() as runner, contextlib.ExitStack() as stack:
        takes = {child.name: stack.enter_context(m.opener(child, m.queue, m.n, runner)) for child in children}
        if args.profile:
            for broker in brokers:
                broker.dump_profile()  # discard the fill and the warm-up
        for i, size in enumerate(sizes):
            k = i // 2 % len(children)
            order = children[k:] + children[:k]
            for child in order[:: 1 if i % 2 == 0 else -1]:
                timers[child.name].start()
                takes[child.name](size)
                timers[child.name].stop()
    z = timers[null.name]
    rate_z = m.n / z.seconds
    results: list[tuple[float, float]] = []
    rates: list[float] = []
    for broker in brokers:
        s = timers[broker.name]
        rate_s = m.n / s.seconds
        total, loop = s.cpu
        ratio, per = rate_s / rate_z, total / m.n * 1e6
        results.append((ratio, per))
        rates.append(rate_s)
        label = m.name if broker is brokers[0] else f"{m.name}{BASE}"
        print(
            f"{label:<28} n={m.n:<6} {broker.name}={rate_s:>7,.0f} msg/s  null={rate_z:>7,.0f} msg/s  "
            f"ratio={ratio:.2f}  broker_cpu={per:6.1f} us/msg "
            f"(loop {loop / m.n * 1e6:.1f} + stores {(total - loop) / m.n * 1e6:.1f}; "
            f"null {z.cpu[0] / m.n * 1e6:.1f})  target {'met' if target_met(m, ratio, per) else 'MISSED'}",
            flush=True,
        )
    if m.name.startswith("sdk-") and SDK_WAITS:  # a receive line: where the SDK's time went, per endpoint
        parts = []
        for child in children:
            rcv, cpl, calls, short = SDK_WAITS.get(child.name, [0.0, 0.0, 0, 0])
            parts.append(
                f"{child.name} receive {rcv / m.n * 1e6:.0f} + complete {cpl / m.n * 1e6:.0f} us/msg "
                f"({calls} receives, {short} short)"
            )
        print(f"{'  sdk waits':<28} " + "; ".join(parts), flush=True)
        SDK_WAITS.clear()
    if len(brokers) > 1:
        print(
            f"{m.name + ' this/base':<26} rate {rates[0] / rates[1]:.3f}  "
            f"broker_cpu {results[0][1] / results[1][1]:.3f}",
            flush=True,
        )
    if args.profile:
        for broker in brokers:
            print(f"  profile of {broker.name}:")
            print_profile(broker.dump_profile(), args.top, args.sort)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N (smoke test)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every N")
    parser.add_argument("--profile", action="store_true", help="cProfile the broker's event loop per measurement")
    parser.add_argument("--top", type=int, default=25, help="functions shown per profile")
    parser.add_argument("--sort", default="tottime", help="profile order: tottime or cumulative")
    parser.add_argument(
        "--profile-wall", action="store_true", help="--profile counts wall time (what the loop waits for), not CPU"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every measurement; prints medians")
    parser.add_argument(
        "--slices", type=int, default=SLICES, help="turns each endpoint gets per measurement (they alternate)"
    )
    parser.add_argument("--only", default="", help="comma-separated measurement names (prefixes)")
    parser.add_argument("--window", type=int, default=WINDOW, help="own-produce-unsettled: sends in flight")
    parser.add_argument(
        "--ack-each", action="store_true", help="own-consume-unsettled: one disposition per delivery (the SDK's way)"
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the client and the endpoints wherever the scheduler puts them"
    )
    parser.add_argument(
        "--body-size", type=int, default=BODY_SIZE, help="bytes per message body (182: our producer's 231-byte message)"
    )
    parser.add_argument("--check-credit", action="store_true", help="show sender-link credit after 10,000 sends")
    parser.add_argument(
        "--broker-gc-off", action="store_true", help="diagnosis: run the broker with Python's cyclic GC disabled"
    )
    parser.add_argument(
        "--base",
        metavar="DIR",
        help="also serve a broker from another checkout (DIR/src, e.g. git archive of a commit), interleaved with "
        "this tree's in every line, and print both trees' ratios and this tree over the base",
    )
    parser.add_argument("--null", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)  # an endpoint's CPUs, comma-separated
    args = parser.parse_args()
    base_src: Path | None = None
    if args.base:
        base_src = Path(args.base).resolve() / "src"
        if not (base_src / "shardbus").is_dir():
            parser.error(f"--base: {base_src.parent} is not a shardbus checkout (no src/shardbus)")
    if args.body_size != BODY_SIZE:
        set_body_size(args.body_size)
    if args.cpus:  # before the endpoint starts a thread: they all inherit it
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.null:
        run_null()
        return

    scale = args.scale * (0.05 if args.quick else 1.0)
    chosen = [
        m
        for m in measurements(scale, args.window, args.ack_each)
        if not args.only or any(m.name.startswith(o) for o in args.only.split(","))
    ]
    install_uvloop()
    # SIGTERM (e.g. a test runner's timeout) unwinds through the finally below, which stops the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = Path(tempfile.mkdtemp(prefix="shardbus-bench-amqp-"))
    children: list[Child] = []
    placement = "unpinned"
    endpoint_cpus: list[str] = []
    cpus = sorted(os.sched_getaffinity(0))
    if not args.no_pin and len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[0]})  # the client: this process, before it starts a thread
        endpoint_cpus = ["--cpus", ",".join(map(str, cpus[1:]))]
        placement = f"client on CPU {cpus[0]}, endpoints on CPU {','.join(map(str, cpus[1:]))}"
    try:
        profile_dir = folder / "profiles" if args.profile else None
        broker_args = [str(folder / "data"), ",".join(["credit", *(m.queue for m in chosen)])]
        broker_args += endpoint_cpus
        if args.broker_gc_off:
            broker_args.append("--gc-off")
        if profile_dir is not None:
            profile_dir.mkdir()
            broker_args += ["--profile-dir", str(profile_dir)]
            if args.profile_wall:
                broker_args.append("--wall")
        broker = Child("shardbus", "amqp_broker.py", broker_args, profile_dir)
        children.append(broker)
        brokers = [broker]
        if base_src is not None:
            # The same script serves it (same queues, quotas, placement), importing the base tree's shardbus.
            base_args = [str(folder / "data-base"), *broker_args[1:]]
            base_profile = None
            if profile_dir is not None:
                base_profile = folder / "profiles-base"
                base_profile.mkdir()
                base_args[base_args.index("--profile-dir") + 1] = str(base_profile)
            base = Child("base", "amqp_broker.py", base_args, base_profile, src=base_src)
            children.append(base)
            brokers.append(base)
        # The null endpoint always runs this tree's engine: with --base both brokers are held to one ceiling.
        null = Child("null", "amqp.py", ["--null", "--body-size", str(BODY_SIZE), *endpoint_cpus])
        children.append(null)
        print(
            f"{BODY_SIZE}-byte bodies; broker: premium namespace, durable SQLite store; {os.cpu_count()} CPUs "
            f"({placement})",
            flush=True,
        )
        for b in brokers:
            print(f"{b.name}: shardbus from {b.src}", flush=True)
        if args.check_credit:
            for child in (null, broker):
                print(asyncio.run(check_credit(child, "credit")))
        runs: dict[str, list[list[tuple[float, float]]]] = {m.name: [] for m in chosen}
        for _ in range(args.repeat):  # each round measures everything once: drift hits every line alike
            for m in chosen:
                runs[m.name].append(measure(m, brokers, null, args))
        if args.repeat > 1:
            print(f"medians of {args.repeat} rounds (range):", flush=True)
            for m in chosen:
                for j in range(len(brokers)):
                    ratios = [rnd[j][0] for rnd in runs[m.name]]
                    cpus = [rnd[j][1] for rnd in runs[m.name]]
                    ratio, per = statistics.median(ratios), statistics.median(cpus)
                    label = m.name if j == 0 else f"{m.name}{BASE}"
                    print(
                        f"{label:<28} ratio={ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
                        f"broker_cpu={per:6.1f} us/msg ({min(cpus):.1f}-{max(cpus):.1f})  "
                        f"target {'met' if target_met(m, ratio, per) else 'MISSED'}",
                        flush=True,
                    )
                if len(brokers) > 1:  # each round's this/base, then their median: drift cancels within a round
                    rates = [rnd[0][0] / rnd[1][0] for rnd in runs[m.name]]
                    cpus = [rnd[0][1] / rnd[1][1] for rnd in runs[m.name]]
                    print(
                        f"{m.name + ' this/base':<26} rate {statistics.median(rates):.3f} "
                        f"({min(rates):.3f}-{max(rates):.3f})  broker_cpu {statistics.median(cpus):.3f} "
                        f"({min(cpus):.3f}-{max(cpus):.3f})",
                        flush=True,
                    )
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
