"""The broker's CPU per durable message, counted in instructions (valgrind's callgrind), not seconds.

bench/amqp.py's timings swing by a third on these shared machines, more than most changes move them. An
instruction count does not: the same code, input and Python give the same count, whatever else the machine does.
So this script measures one of the broker's paths the way callgrind can count it, in one process:

  1. ``record``: our engine's client opens a connection to an in-process broker (SASL PLAIN, a premium
     namespace's queue) and records every byte it sends, read by read, as a socket would bring them:
       - ``produce``: a sender link, then ``--batches`` reads of 76 unsettled 1 KB transfers (about what one
         socket read brings the broker under bench/amqp.py's producer);
       - ``peek-lock``: a peek-lock receiver link on a queue holding ``--batches`` x 100 messages, then per batch
         a flow granting 100 credits and 100 reads of one ``accepted`` disposition each: what the SDK sends for
         ``receive_messages(max_message_count=100)`` and a ``complete_message`` per message;
       - ``peek-lock-ranges``: the same flows, each batch then accepted with one unsettled disposition of its
         100 delivery ids (first..last) in one read: what our own client (``shardbus.client``, bench/scale.py)
         sends;
       - ``receive-and-delete``: the same with a receive-and-delete link, so a batch is just the flow.
       - ``sdk-batch``: a sender link, then ``--batches`` SDK batches of 1000 1 KB messages, each one unsettled
         transfer in the batch format (``0x80013700``: an envelope whose body is a data section per message, each
         an encoded message; about 1.1 MB, split into frames at the broker's max-frame-size), brought in reads
         of 64 KB: what bench/amqp.py's sdk-batch-send-1000 sends. The queue allows 100 MB messages and the
         namespace 100 MB batches, as bench/amqp.py's broker does.
  2. ``replay``: a fresh broker (durable SQLite store, as ``shardbus serve`` runs it) is fed those bytes through
     its real ``AmqpProtocol`` and ``ServiceBusConnection``, with a transport that keeps what it is given; each
     read waits for its answer (dispositions; all 100 transfers; the echo), so every step runs to its end.
     Settlements linger for company before their commit (``SETTLE_LINGER``), and how many share one depends on
     the clock, which callgrind slows fifty-fold; so the replay lets them linger for ever and commits them itself
     every ``SETTLE_GROUP`` completes (about what a 2 ms linger gathers at the SDK's pace) and after each batch.
  3. callgrind counts the replay with ``--batches`` batches and with none (the consume paths still fill their
     queue: the fill is in both counts); the difference over the messages is the broker's instructions per
     message (event loop and store threads, user space: the kernel's share of a write and an fsync is not
     counted).

With ``--base REV`` the same recording is replayed by that git revision's ``src`` too (checked out into a
temporary directory), and the line ends with ``ratio`` = this checkout / base: below 1 is fewer instructions.

    python bench/amqp_instructions.py [--path produce|peek-lock|peek-lock-ranges|receive-and-delete|sdk-batch]
                                      [--batches N] [--base REV] [--counts [TOP]]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve()
BATCH = 76  # transfers per produce read
CONSUME_BATCH = 100  # credit per consume batch (the SDK bench's max_message_count)
SETTLE_GROUP = 8  # completes per commit in the peek-lock replay
BODY = bytes(range(256)) * 4
MESSAGE_ID = "5b4f3c1e-0000-4000-8000-000000000001"  # fixed, so that every run packs the same bytes
PATHS = ("produce", "peek-lock", "peek-lock-ranges", "receive-and-delete", "sdk-batch")
SDK_BATCH = 1000  # messages per sdk-batch transfer
READ_BYTES = 65536  # what one socket read brings of a batch transfer
BATCH_LIMIT = 100 * 1024 * 1024  # the sdk-batch path's namespace batch quota and queue message size


class KeepingTransport:
    """What ``AmqpProtocol`` writes to, kept; ``written`` is set at each write (the broker's answers)."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.written = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.out.append(data)
        self.written.set()

    async def answer(self) -> None:
        """Wait for a write since the last wait (or ``feed``)."""
        await self.written.wait()
        self.written.clear()

    def feed(self, protocol: Any, data: bytes) -> None:
        """Hand ``protocol`` one read (``answer`` then waits for what it writes in reply)."""
        self.written.clear()
        protocol.data_received(data)

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Recording(NamedTuple):
    path: str
    handshake: list[bytes]  # reads before the measured part
    batches: list[list[bytes]]  # per batch, its reads


def _namespace(data_dir: str, big: bool = False) -> Any:
    """A premium namespace with queue ``q``; ``big``: 100 MB batches and messages (where the tree bounds them)."""
    from shardbus.model.tiers import Quotas
    from shardbus.namespace import Namespace

    if big and "max_batch_size_bytes" in Quotas.__dataclass_fields__:
        ns = Namespace(data_dir, tier="premium", quotas={"max_batch_size_bytes": BATCH_LIMIT})
        ns.create_queue("q", max_message_size_in_kilobytes=BATCH_LIMIT // 1024)
        return ns
    ns = Namespace(data_dir, tier="premium")  # a tree from before batches were bounded (7735009) takes them
    ns.create_queue("q")
    return ns


def _connect(ns: Any) -> tuple[Any, KeepingTransport]:
    """A new in-process connection to ``ns``: its protocol and transport."""
    from shardbus.amqp.transport import AmqpProtocol
    from shardbus.endpoint.connection import ServiceBusConnection

    try:
        from shardbus.access.directory import NamespaceDirectory
    except ImportError:  # a --base revision from before access/ existed
        from shardbus.endpoint.connection import NamespaceDirectory  # type: ignore[attr-defined,no-redef]

    handler = ServiceBusConnection(NamespaceDirectory({"ns": ns}, "ns", {"ns": {"K": "V"}}), asyncio.get_running_loop())
    protocol = AmqpProtocol(handler.amqp, handler)
    transport = KeepingTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


def _client(role: bool, settled: bool = False) -> tuple[Any, Any]:
    """Our engine's client, SASL PLAIN, with one link to ``q``: a sender, or a receiver (receive-and-delete when
    ``settled``, else peek-lock); returns (connection, link)."""
    from shardbus.amqp.connection import Connection, Role
    from shardbus.amqp.performatives import SENDER, SndSettleMode, Source, Target

    client = Connection(Role.CLIENT, "c", hostname="localhost", sasl_mechanism="PLAIN", username="K", password="V")
    client.open()
    session = client.begin(incoming_window=0x7FFFFFFF)
    if role == SENDER:
        return client, client.attach(session, "snd", SENDER, source=Source(), target=Target(address="q"))
    mode = SndSettleMode.SETTLED if settled else SndSettleMode.UNSETTLED
    return client, client.attach(
        session, "rcv", not SENDER, source=Source(address="q"), target=Target(), snd_settle_mode=mode
    )


def _answered(client: Any, transport: KeepingTransport) -> list[Any]:
    """Hand the client what the broker wrote; the client's events."""
    client.receive_data(b"".join(transport.out))
    transport.out.clear()
    return client.next_events()


async def _handshake(client: Any, protocol: Any, transport: KeepingTransport) -> list[bytes]:
    """Run the client's opening (each step its own read, as a socket would bring it); returns the reads."""
    reads: list[bytes] = []
    for _ in range(20):
        data = client.data_to_send()
        if data:
            reads.append(data)
            protocol.data_received(data)
        await asyncio.sleep(0.01)
        if transport.out:
            _answered(client, transport)
    return reads


def _transfers(client: Any, link: Any, first: int, count: int, payload: bytes) -> bytes:
    """``count`` unsettled transfers of ``payload`` (tags counting from ``first``), as one read's bytes."""
    for i in range(first, first + count):
        client.send_transfer(link, i.to_bytes(16, "little"), payload)
    return client.data_to_send()


def _payload() -> bytes:
    from shardbus.amqp.message import AmqpMessage, BodyType, Properties

    return AmqpMessage(properties=Properties(message_id=MESSAGE_ID), body=[BODY], body_type=BodyType.DATA).encode()


def _sdk_batch() -> bytes:
    """An SDK batch's envelope: the first message's message-id, a data section per message (each encoded)."""
    from shardbus.amqp.message import AmqpMessage, BodyType, Properties

    inner = _payload()
    return AmqpMessage(
        properties=Properties(message_id=MESSAGE_ID), body=[inner] * SDK_BATCH, body_type=BodyType.DATA
    ).encode()


def _batch_reads(client: Any, link: Any, tag: int) -> list[bytes]:
    """One SDK batch transfer (its frames at the broker's max-frame-size), cut into socket reads."""
    from shardbus.amqp.message import BATCH_MESSAGE_FORMAT

    client.send_transfer(link, tag.to_bytes(4, "big"), _sdk_batch(), message_format=BATCH_MESSAGE_FORMAT)
    data = client.data_to_send()
    return [data[i : i + READ_BYTES] for i in range(0, len(data), READ_BYTES)]


async def _fill(ns: Any, count: int) -> None:
    """Send ``count`` messages to ``q`` over AMQP, as a client would (so they keep their wire sections)."""
    from shardbus.amqp import events as E
    from shardbus.amqp.performatives import SENDER

    protocol, transport = _connect(ns)
    client, link = _client(SENDER)
    await _handshake(client, protocol, transport)
    if link.credit < count:
        raise SystemExit(f"the broker granted {link.credit} credits, fewer than the {count} messages to fill")
    payload = _payload()
    for start in range(0, count, BATCH):
        todo = min(BATCH, count - start)
        transport.feed(protocol, _transfers(client, link, start, todo, payload))
        done = 0
        while done < todo:
            await transport.answer()
            events = _answered(client, transport)
            done += sum(e.last - e.first + 1 for e in events if isinstance(e, E.DispositionReceived))


def _delivered(protocol: Any) -> int:
    """Deliveries the broker has sent on this connection (its sessions' next delivery ids)."""
    return sum(s.next_delivery_id for s in protocol.conn._local_sessions.values())


async def record(file: str, path: str, batches: int) -> None:
    """Run the client for ``path`` against an in-process broker; save its reads to ``file``."""
    from shardbus.amqp import events as E
    from shardbus.amqp.performatives import RECEIVER, SENDER, Accepted

    consume = path not in ("produce", "sdk-batch")
    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as data_dir:
        ns = _namespace(data_dir, big=path == "sdk-batch")
        if consume:
            await _fill(ns, batches * CONSUME_BATCH)
        protocol, transport = _connect(ns)
        client, link = _client(RECEIVER if consume else SENDER, settled=path == "receive-and-delete")
        handshake = await _handshake(client, protocol, transport)
        reads: list[list[bytes]] = []
        if path == "sdk-batch":
            reads += [_batch_reads(client, link, b + 1) for b in range(batches)]
        elif not consume:
            if link.credit < batches * BATCH:
                most = link.credit // BATCH
                raise SystemExit(f"the broker granted {link.credit} credits; use at most {most} batches")
            payload = _payload()
            reads += [[_transfers(client, link, b * BATCH, BATCH, payload)] for b in range(batches)]
        for _ in range(batches if consume else 0):
            client.flow(link, link_credit=CONSUME_BATCH)
            batch = [client.data_to_send()]
            transport.feed(protocol, batch[0])
            ids: list[int] = []
            while len(ids) < CONSUME_BATCH:
                await transport.answer()
                ids += [e.delivery_id for e in _answered(client, transport) if isinstance(e, E.DeliveryReceived)]
            if path == "peek-lock-ranges":
                client.disposition(link, min(ids), max(ids), settled=False, state=Accepted())
                batch.append(client.data_to_send())
                transport.feed(protocol, batch[-1])
                await transport.answer()  # the echo
                _answered(client, transport)
            if path == "peek-lock":
                for delivery_id in ids:
                    client.disposition(link, delivery_id, settled=False, state=Accepted())
                    batch.append(client.data_to_send())
                    transport.feed(protocol, batch[-1])
                    await transport.answer()  # the echo
                    _answered(client, transport)
            reads.append(batch)
        ns.close()
    Path(file).write_bytes(pickle.dumps(Recording(path, handshake, reads)))


async def replay(file: str, batches: int, profiles: str | None = None) -> None:
    recording: Recording = pickle.loads(Path(file).read_bytes())
    from shardbus.partition import broker
    from shardbus.server import tune_garbage_collector

    consume = recording.path not in ("produce", "sdk-batch")
    broker.SETTLE_LINGER = 3600.0  # commits come from ``settled`` below, never from the clock
    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as data_dir:
        ns = _namespace(data_dir, big=recording.path == "sdk-batch")
        if consume:
            await _fill(ns, len(recording.batches) * CONSUME_BATCH)
        protocol, transport = _connect(ns)
        partition = ns.resolve("q")[0].partitions[0]

        def settled() -> None:
            partition._committer.wait_idle()

        for data in recording.handshake:
            protocol.data_received(data)
            await asyncio.sleep(0.01)
        tune_garbage_collector()  # as the broker does once it serves
        # ``profiles``: the event loop's calls while it handles the flows (deliveries) and the sends or
        # dispositions (settles), apart (``--counts``)
        deliver = settle = _NoProfile()
        if profiles:
            import cProfile

            deliver, settle = cProfile.Profile(), cProfile.Profile()
        for reads in recording.batches[:batches]:
            if not consume:
                settle.enable()
                for data in reads:  # a batch's reads, then its disposition
                    transport.feed(protocol, data)
                await transport.answer()  # the dispositions: stored
                settle.disable()
                transport.out.clear()
                continue
            expected = _delivered(protocol) + CONSUME_BATCH
            deliver.enable()
            transport.feed(protocol, reads[0])
            while _delivered(protocol) < expected:
                await transport.answer()
            deliver.disable()
            settle.enable()
            for i, data in enumerate(reads[1:], 1):
                transport.feed(protocol, data)
                await transport.answer()  # the echo
                if i % SETTLE_GROUP == 0:
                    settled()
            settled()
            settle.disable()
            transport.out.clear()
        ns.close()
        if profiles:
            Path(profiles).write_bytes(pickle.dumps((_calls(deliver), _calls(settle))))


class _NoProfile:
    def enable(self) -> None:
        pass

    def disable(self) -> None:
        pass


def _calls(profile: Any) -> dict[str, int]:
    """Calls per function (``file:line(name)``, the file from ``shardbus/`` on) of a cProfile run."""
    out: dict[str, int] = {}
    if isinstance(profile, _NoProfile):
        return out
    profile.create_stats()
    for (file, line, name), (_, calls, *_rest) in profile.stats.items():
        short = file.split("/shardbus/", 1)[-1] if "/shardbus/" in file else file.rsplit("/", 1)[-1]
        out[f"{short}:{line}({name})"] = out.get(f"{short}:{line}({name})", 0) + calls
    return out


# The allocator's entry points that callgrind sees called (pymalloc serves objects and small buffers alike).
ALLOCATORS = ("_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "_PyMem_RawMalloc")


def allocations(src: Path, recording: str, batches: int) -> int:
    """Calls into Python's allocators (``ALLOCATORS``) callgrind counts for a replay of ``batches`` reads."""
    with tempfile.NamedTemporaryFile(prefix="shardbus-callgrind-") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"]
        command += [sys.executable, str(HERE), "--replay", recording, "--batches", str(batches), "--src", str(src)]
        subprocess.run(command, capture_output=True, text=True, check=True)
        names: dict[str, str] = {}
        total = 0
        counted = False
        for line in Path(out.name).read_text(errors="replace").splitlines():
            if line.startswith("cfn="):
                match = re.match(r"cfn=\((\d+)\)(?: (.*))?", line)
                if match is None:
                    counted = False
                    continue
                if match[2]:
                    names[match[1]] = match[2]
                counted = names.get(match[1]) in ALLOCATORS
            elif line.startswith(("fn=", "fi=", "fe=")):
                match = re.match(r"fn=\((\d+)\) (.*)", line)
                if match is not None:
                    names[match[1]] = match[2]
                counted = False if line.startswith("fn=") else counted
            elif line.startswith("calls=") and counted:
                total += int(line[6:].split()[0])
                counted = False
        return total


def counts(src: Path, recording: str, batches: int, messages: int, top: int) -> None:
    """Per message: allocations (callgrind) and the event loop's Python calls (cProfile), deliveries and settles
    (or sends) apart, with the functions called most."""
    allocs = (allocations(src, recording, batches) - allocations(src, recording, 0)) / messages
    print(f"allocations per message (loop and store threads, callgrind): {allocs:,.1f}")
    with tempfile.NamedTemporaryFile(prefix="shardbus-calls-") as out:
        command = [sys.executable, str(HERE), "--replay", recording, "--batches", str(batches), "--src", str(src)]
        subprocess.run([*command, "--profiles", out.name], check=True)
        parts = pickle.loads(Path(out.name).read_bytes())
    for label, calls in zip(("deliveries", "settles or sends"), parts, strict=True):
        total = sum(calls.values())
        if not total:
            continue
        print(f"{label}: {total / messages:,.1f} Python-level calls per message (event loop, cProfile)")
        for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {n / messages:7.2f}  {name}")


def instructions(src: Path, recording: str, batches: int) -> int:
    """Instructions callgrind counts for a replay of ``batches`` reads by the code in ``src``."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, str(HERE), "--replay", recording, "--batches", str(batches), "--src", str(src)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    match = re.search(r"Collected : (\d+)", out)
    if match is None:
        raise SystemExit(f"no count from callgrind:\n{out}")
    return int(match[1])


def per_message(src: Path, recording: str, batches: int, messages: int) -> float:
    return (instructions(src, recording, batches) - instructions(src, recording, 0)) / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=PATHS, default="produce", help="what the client does")
    parser.add_argument(
        "--batches",
        type=int,
        help="produce: reads of 76 transfers (at most 131, default 100); consume: of 100 (60); sdk-batch: SDK "
        "batches of 1000 (10)",
    )
    parser.add_argument("--base", help="a git revision to compare with")
    parser.add_argument(
        "--counts",
        type=int,
        nargs="?",
        const=15,
        metavar="TOP",
        help="instead: allocations and Python calls per message, and the TOP functions called most (default 15)",
    )
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--profiles", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batches is None:
        args.batches = {"produce": 100, "sdk-batch": 10}.get(args.path, 60)
    if args.replay:
        sys.path.insert(0, args.src)
        asyncio.run(replay(args.replay, args.batches, args.profiles))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    src = HERE.parents[1] / "src"
    sys.path.insert(0, str(src))
    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as tmp:
        recording = os.path.join(tmp, "client.bin")
        asyncio.run(record(recording, args.path, args.batches))
        base_src = None
        if args.base:  # first, so that a bad revision fails before the long part
            base = Path(tmp) / "base"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(HERE.parents[1]), "archive", args.base, "src"], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            base_src = base / "src"
        size = {"produce": BATCH, "sdk-batch": SDK_BATCH}.get(args.path, CONSUME_BATCH)
        what = {
            "produce": "unsettled 1 KB transfers",
            "peek-lock": "peek-lock deliveries of 1 KB, each completed in its own read",
            "peek-lock-ranges": "peek-lock deliveries of 1 KB, completed with one range disposition a batch",
            "receive-and-delete": "receive-and-delete deliveries of 1 KB",
            "sdk-batch": "1 KB messages in one SDK batch transfer each",
        }[args.path]
        print(f"broker {args.path} path, {args.batches} x {size} {what}, callgrind", flush=True)
        messages = args.batches * size
        if args.counts:
            counts(src, recording, args.batches, messages, args.counts)
            if base_src is not None:
                print(f"base {args.base}:")
                counts(base_src, recording, args.batches, messages, args.counts)
            return
        ours = per_message(src, recording, args.batches, messages)
        line = f"instructions per message: {ours:,.0f}"
        if base_src is not None:
            theirs = per_message(base_src, recording, args.batches, messages)
            line += f"  base {args.base}: {theirs:,.0f}  ratio={ours / theirs:.3f}"
        print(line)


if __name__ == "__main__":
    main()
