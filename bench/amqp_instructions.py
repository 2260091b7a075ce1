"""The broker's CPU per durable message, counted in instructions (valgrind's callgrind), not seconds.

bench/amqp.py's timings swing by a third on these shared machines, more than most changes move them. An
instruction count does not: the same code, input and Python give the same count, whatever else the machine does.
So this script measures the broker's whole produce path the way callgrind can count it, in one process:

  1. ``record``: our engine's client opens a connection to an in-process broker (SASL PLAIN, a sender link to a
     queue of a premium namespace) and records every byte it sends: the handshake, then ``--batches`` reads of
     76 unsettled 1 KB transfers (about what one socket read brings the broker under bench/amqp.py's producer).
  2. ``replay``: a fresh broker (durable SQLite store, as ``shardbus serve`` runs it) is fed those bytes through
     its real ``AmqpProtocol`` and ``ServiceBusConnection``, with a transport that keeps what it is given; each
     read waits for its dispositions, so every batch is decoded, routed, stored (one commit) and acknowledged.
  3. callgrind counts the replay with ``--batches`` reads and with none; the difference over the messages is the
     broker's instructions per message (event loop and store threads, user space: the kernel's share of a write
     and an fsync is not counted).

With ``--base REV`` the same recording is replayed by that git revision's ``src`` too (checked out into a
temporary directory), and the line ends with ``ratio`` = this checkout / base: below 1 is fewer instructions.

    python bench/amqp_instructions.py [--batches N] [--base REV]
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
from typing import Any

HERE = Path(__file__).resolve()
BATCH = 76
BODY = bytes(range(256)) * 4
MESSAGE_ID = "5b4f3c1e-0000-4000-8000-000000000001"  # fixed, so that every run packs the same bytes


class KeepingTransport:
    """What ``AmqpProtocol`` writes to, kept; ``written`` is set at each write (the broker's acknowledgements)."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.written: asyncio.Event | None = None

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if self.written is not None:
            self.written.set()

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _broker(data_dir: str) -> tuple[Any, Any, KeepingTransport]:
    """A premium namespace with queue ``q`` served to one in-process connection."""
    from shardbus.amqp.transport import AmqpProtocol
    from shardbus.endpoint.connection import NamespaceDirectory, ServiceBusConnection
    from shardbus.namespace import Namespace

    ns = Namespace(data_dir, tier="premium")
    ns.create_queue("q")
    handler = ServiceBusConnection(NamespaceDirectory({"ns": ns}, "ns", {"ns": {"K": "V"}}), asyncio.get_running_loop())
    protocol = AmqpProtocol(handler.amqp, handler)
    transport = KeepingTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return ns, protocol, transport


async def record(path: str, batches: int) -> None:
    """Run the client against an in-process broker; save (handshake reads, transfer reads) to ``path``."""
    from shardbus.amqp.connection import Connection, Role
    from shardbus.amqp.message import AmqpMessage, BodyType, Properties
    from shardbus.amqp.performatives import SENDER, Source, Target

    payload = AmqpMessage(properties=Properties(message_id=MESSAGE_ID), body=[BODY], body_type=BodyType.DATA).encode()
    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as data_dir:
        ns, protocol, transport = await _broker(data_dir)
        client = Connection(Role.CLIENT, "c", hostname="localhost", sasl_mechanism="PLAIN", username="K", password="V")
        client.open()
        session = client.begin(incoming_window=0x7FFFFFFF)
        link = client.attach(session, "snd", SENDER, source=Source(), target=Target(address="q"))
        handshake: list[bytes] = []
        for _ in range(20):  # each step as its own read, as a socket would bring it
            data = client.data_to_send()
            if data:
                handshake.append(data)
                protocol.data_received(data)
            await asyncio.sleep(0.01)
            if transport.out:
                client.receive_data(b"".join(transport.out))
                transport.out.clear()
                client.next_events()
        if link.credit < batches * BATCH:
            raise SystemExit(f"the broker granted {link.credit} credits; use at most {link.credit // BATCH} batches")
        reads = []
        for b in range(batches):
            for i in range(BATCH):
                client.send_transfer(link, (b * BATCH + i).to_bytes(16, "little"), payload)
            reads.append(client.data_to_send())
        ns.close()
    Path(path).write_bytes(pickle.dumps((handshake, reads)))


async def replay(path: str, batches: int) -> None:
    handshake, reads = pickle.loads(Path(path).read_bytes())
    from shardbus.server import tune_garbage_collector

    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as data_dir:
        ns, protocol, transport = await _broker(data_dir)
        for data in handshake:
            protocol.data_received(data)
            await asyncio.sleep(0.01)
        tune_garbage_collector()  # as the broker does once it serves
        for data in reads[:batches]:
            transport.written = asyncio.Event()
            protocol.data_received(data)
            await transport.written.wait()  # the dispositions: stored
        ns.close()


def instructions(src: Path, recording: str, batches: int) -> int:
    """Instructions callgrind counts for a replay of ``batches`` reads by the code in ``src``."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, str(HERE), "--replay", recording, "--batches", str(batches), "--src", str(src)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    match = re.search(r"Collected : (\d+)", out)
    if match is None:
        raise SystemExit(f"no count from callgrind:\n{out}")
    return int(match[1])


def per_message(src: Path, recording: str, batches: int) -> float:
    return (instructions(src, recording, batches) - instructions(src, recording, 0)) / (batches * BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100, help="reads of 76 transfers (at most 131)")
    parser.add_argument("--base", help="a git revision to compare with")
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        sys.path.insert(0, args.src)
        asyncio.run(replay(args.replay, args.batches))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    src = HERE.parents[1] / "src"
    sys.path.insert(0, str(src))
    with tempfile.TemporaryDirectory(prefix="shardbus-instr-") as tmp:
        recording = os.path.join(tmp, "client.bin")
        asyncio.run(record(recording, args.batches))
        base_src = None
        if args.base:  # first, so that a bad revision fails before the long part
            base = Path(tmp) / "base"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(HERE.parents[1]), "archive", args.base, "src"], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            base_src = base / "src"
        print(f"broker produce path, {args.batches} x {BATCH} unsettled 1 KB transfers, callgrind", flush=True)
        ours = per_message(src, recording, args.batches)
        line = f"instructions per message: {ours:,.0f}"
        if base_src is not None:
            theirs = per_message(base_src, recording, args.batches)
            line += f"  base {args.base}: {theirs:,.0f}  ratio={ours / theirs:.3f}"
        print(line)


if __name__ == "__main__":
    main()
