"""The cluster wire's codec per message, counted in instructions (valgrind's callgrind), this checkout against
another: the hot calls' packing and unpacking without sockets, threads or brokers.

bench/hop_micro.py times the whole hop in seconds, which move by a fifth on a shared machine; an instruction
count of the same code and input does not. Each operation runs ``--reps`` times over ``--batch`` messages of
``--body`` bytes, as bench/scale.py's "both" carries them (1 KB bodies, a lock reply of 50, an enqueue and a
complete of 100):

  - ``pack-enqueue`` / ``unpack-enqueue``: an ``enqueue`` request's frame, its items one message each (a front
    end packs, the worker reads, and builds the messages as the worker does for the operation);
  - ``pack-lock-reply`` / ``unpack-lock-reply``: a ``lock_messages`` reply's frame, its messages locked (the
    worker packs, the front end reads);
  - ``pack-complete`` / ``unpack-complete``: a ``complete`` request's frame, its lock tokens;
  - ``pack-send`` / ``unpack-send``: an ``enqueue``'s send records (``held_item_arrays``) and their frame, read
    back by the worker (``held_items_of``), as a queue's sends through one front end go since SBW6;
  - ``pack-locked`` / ``unpack-locked``: a lock reply naming the messages the front end holds
    (``named_records_of``, ``reply_frame``) and the front end's reading of it (``locked_of``; each rep copies the
    held dictionary, a few instructions a message).

Run it with ``SHARDBUS_PURE_HOP=1`` in the environment to count the pure-Python codec of a tree that has the
compiled one (``cluster/_hopcodec.pyx``).

A frame is read as the tree's stream reads it: from its bytes where they lie (``wire.unpack_frame``, since SBW4),
or before that through a streaming ``msgpack.Unpacker`` fed the bytes.

Each operation is counted in a process of its own, and so is one that only sets up (``--reps 0``); the difference
over the messages is the operation's instructions per message.

    python bench/hop_codec.py [--base DIR] [--reps R] [--batch N] [--ops a,b,...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPS = ("pack-enqueue", "unpack-enqueue", "pack-lock-reply", "unpack-lock-reply", "pack-complete", "unpack-complete")
# The paths a queue's sends and receives through one front end take since SBW6 (bench/scale.py's "both"): an
# enqueue's send records (``held_item_arrays``, the worker's ``held_items_of``) and a lock reply that names what
# the front end holds (``named_records_of``, the front end's ``locked_of``).
HELD_OPS = ("pack-send", "unpack-send", "pack-locked", "unpack-locked")


def _messages(n: int, body: bytes, locked: bool) -> list[Any]:
    from shardbus.model.message import Message
    from shardbus.model.routing import new_lock_tokens

    tokens = new_lock_tokens(3, n)
    out = []
    for i in range(n):
        m = Message(body, message_id=f"m{i}")
        m.wire_sections = b"\x00Sp\xc0\x07\x05B@@pH\x19\x08\x00@C" + b"\x00Ss\xd0" + bytes(40)  # a front end's
        if locked:
            m.sequence_number = m.enqueued_sequence_number = (3 << 48) | (1000 + i)
            m.enqueued_time_ms, m.locked_until_ms, m.expires_at_ms = 1_790_000_000_000, 1_790_000_060_000, 1 << 52
            m.lock_token, m.delivery_count, m.partition_id = tokens[i], 1, 3
        out.append(m)
    return out


def run_one(op: str, reps: int, batch: int, body_size: int) -> None:
    """One operation ``reps`` times (in this process, under callgrind)."""
    from shardbus.cluster import wire
    from shardbus.store.amqp_values import register_stored_types

    register_stored_types()
    body = os.urandom(body_size)
    key, now = "ns/entities/1/p03.db", time.time()
    what, _, name = op.partition("-")
    if name in ("send", "locked"):
        _run_held(wire, what, name, reps, batch, body, key, now)
        return
    if name == "enqueue":
        items = [(None, [(0, m)]) for m in _messages(batch, body, locked=False)]
        inline = getattr(wire, "ItemsArg", None)  # in the request itself (before it: one extension value)
        args = [(inline or wire.Items)(items), "0123456789abcdef0123456789abcdef"]
        frame: list[Any] = [7, key, now, "enqueue", args]
        if inline is not None and what == "unpack":
            data = wire.pack_frame(frame)
            for _ in range(reps):
                for request in _frames(wire, data):
                    wire.items_of(request[4][0])
            return
    elif name == "lock-reply":
        messages = _messages(batch, body, locked=True)
        if hasattr(wire, "reply_frame"):  # a messages frame (before it: one extension value in a reply frame)
            data = wire.reply_frame(8, True, messages, None)
            if what == "pack":
                for _ in range(reps):
                    wire.reply_frame(8, True, messages, None)
            else:
                for _ in range(reps):
                    for frame in _frames(wire, data):
                        wire.messages_of(frame[2])
            return
        frame = [8, True, wire.wrap_reply(messages), None]
    else:
        tokens = [m.lock_token for m in _messages(batch, body, locked=True)]
        frame = [9, key, now, "complete", [0, wire.Tokens(tokens)]]
    data = wire.pack_frame(frame)
    if what == "pack":
        for _ in range(reps):
            wire.pack_frame(frame)
    else:
        for _ in range(reps):
            for _ in _frames(wire, data):
                pass


def _run_held(wire: Any, what: str, name: str, reps: int, batch: int, body: bytes, key: str, now: float) -> None:
    """``HELD_OPS``: the front end's and the worker's codec calls and the frame's packing or reading."""
    if name == "send":
        items = [(None, [(0, m)]) for m in _messages(batch, body, locked=False)]
        arrays, _ = wire.held_item_arrays(items)
        data = wire.pack_frame([7, key, now, "enqueue", [arrays, "0123456789abcdef0123456789abcdef"]])
        for _ in range(reps):
            if what == "pack":
                arrays, _ = wire.held_item_arrays(items)
                wire.pack_frame([7, key, now, "enqueue", [arrays, "0123456789abcdef0123456789abcdef"]])
            else:
                wire.held_items_of(wire.unpack_frame(memoryview(data))[4][0])
        return
    messages = _messages(batch, body, locked=True)
    held = {m.sequence_number: m for m in messages}
    data = wire.reply_frame(8, True, wire.Locked(wire.named_records_of(messages, dict(held))), None)
    for _ in range(reps):
        if what == "pack":
            wire.reply_frame(8, True, wire.Locked(wire.named_records_of(messages, dict(held))), None)
        else:
            frame = wire.unpack_frame(memoryview(data))
            wire.locked_of(frame[5], frame[2], dict(held))


def _frames(wire: Any, data: bytes) -> list[Any]:
    """One frame read back as the tree's stream reads it: from its bytes where they lie (``unpack_frame``, wire
    SBW4 on), else fed to a streaming unpacker (which copies them into its buffer first)."""
    unpack = getattr(wire, "unpack_frame", None)
    if unpack is not None:
        return [unpack(memoryview(data))]
    reader = wire.reader()
    reader.feed(data)
    return list(reader)


def count(tree: Path, op: str, reps: int, batch: int, body: int) -> int:
    """Instructions callgrind counts for one process of ``run_one`` from ``tree``."""
    with tempfile.NamedTemporaryFile(prefix="shardbus-hop-codec-") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable, __file__]
        command += ["--one", op, "--reps", str(reps), "--batch", str(batch), "--body", str(body)]
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONHASHSEED": "0"}
        subprocess.run(command, env=env, check=True, capture_output=True)
        match = re.search(rb"^(?:summary|totals): (\d+)", Path(out.name).read_bytes(), re.M)
        assert match is not None, "no totals in the callgrind output"
        return int(match[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=None, help="a checkout to count the same from")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=0, help="messages per frame (default: 100, a lock reply 50)")
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--ops", default=",".join(OPS), help=f"of {', '.join(OPS + HELD_OPS)}")
    parser.add_argument("--one", choices=OPS + HELD_OPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args.reps, args.batch, args.body)
        return
    trees = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    ops = args.ops.split(",")
    per: dict[tuple[str, str], float] = {}
    for name, tree in trees:
        for op in ops:
            batch = args.batch or (50 if op.endswith(("lock-reply", "locked")) else 100)
            idle = count(tree, op, 0, batch, args.body)
            busy = count(tree, op, args.reps, batch, args.body)
            per[name, op] = (busy - idle) / (args.reps * batch)
            print(f"{name:5} {op:18} {per[name, op]:9,.0f} instructions per message", flush=True)
    if args.base:
        print("\nthis / base")
        for op in ops:
            print(f"  {op:18} {per['this', op] / per['base', op]:.3f}")
        total = sum(per["this", op] for op in ops) / sum(per["base", op] for op in ops)
        print(f"  {'all':18} {total:.3f}")


if __name__ == "__main__":
    main()
