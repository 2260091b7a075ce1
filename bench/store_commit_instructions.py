"""The SQLite store's work per group commit, counted in instructions (valgrind's callgrind): the commit thread's
part of a send, without the event loop, the AMQP path or the timing of threads around it.

bench/amqp_instructions.py counts the whole broker, and its commits share the process with the event loop and
the background checkpoints, whose rounds depend on timing: a change to the store moves it by less than that noise
(1-2%). This script opens a store (``SqliteStore``, in /dev/shm when it exists) and applies ``--commits`` batches
as a send's group commit brings them: ``--rows`` new 1 KB messages (packed as the broker packs them), the next
sequence number and the main queue's counts; with ``--settle``, each followed by a settlement batch that deletes
them (a range) with its counts, unsynced (as bench/scale.py's "both" alternates them). Background checkpoints are
off (``CHECKPOINT_BYTES``), so the count is the same from run to run (PYTHONHASHSEED=0 is set for the children).
The count with no commits (start-up, imports, five warm-up commits) is taken off.

    python bench/store_commit_instructions.py [--rows 100] [--commits 100] [--settle] [--base DIR]

``--base DIR``: a checkout of another commit (its ``src/``) counted the same way; prints this / base.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
WARM = 5  # commits before the counted ones (statements prepared, pages cached)


def run(src: str, rows: int, commits: int, settle: bool) -> None:
    """(The child under callgrind.) Apply ``WARM + commits`` send batches (and settlements) to a new store."""
    sys.path.insert(0, src)
    from shardbus.model.message import Message
    from shardbus.store import sqlite as sqlite_store
    from shardbus.store.records import pack_message

    sqlite_store.CHECKPOINT_BYTES = 1 << 60  # no background checkpoint: its rounds depend on timing
    data = pack_message(Message(body=bytes(range(256)) * 4, message_id="5b4f3c1e-0000-4000-8000-000000000001"))
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        store = sqlite_store.SqliteStore(os.path.join(tmp, "p.db"))
        store.apply([("create_slot", 0)])
        seq = 1
        for _ in range(WARM + commits):
            batch = [(seq + i, 0, 0, 0, None, data, None) for i in range(rows)]
            store.apply([("put", 0, batch), ("meta", "next_seq", seq + rows), ("counts", 0, 0, rows, rows * len(data))])
            if settle:
                store.apply([("delete", 0, list(range(seq, seq + rows))), ("counts", 0, 0, 0, 0)], sync=False)
            seq += rows
        store.close()


def instructions(src: str, rows: int, commits: int, settle: bool) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(HERE)]
    command += ["--child", src, "--rows", str(rows), "--commits", str(commits)] + ["--settle"] * settle
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stderr
    match = re.search(r"Collected : (\d+)", out)
    if match is None:
        raise SystemExit(f"no count from callgrind:\n{out}")
    return int(match[1])


def per_commit(src: str, rows: int, commits: int, settle: bool) -> float:
    return (instructions(src, rows, commits, settle) - instructions(src, rows, 0, settle)) / commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100, help="new messages per send commit (default 100)")
    parser.add_argument("--commits", type=int, default=100, help="send commits counted (default 100)")
    parser.add_argument("--settle", action="store_true", help="each followed by a settlement commit of its rows")
    parser.add_argument("--base", help="a checkout of another commit (a directory with src/)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child, args.rows, args.commits, args.settle)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    what = f"{args.rows} new 1 KB messages" + (" and a settlement commit of them" if args.settle else "")
    this = per_commit(str(HERE.parents[1] / "src"), args.rows, args.commits, args.settle)
    line = f"per send commit ({what}): {this:,.0f} instructions, {this / args.rows:,.0f} per message"
    if args.base:
        base = per_commit(str(Path(args.base).resolve() / "src"), args.rows, args.commits, args.settle)
        line += f"  base: {base:,.0f} ({base / args.rows:,.0f})  ratio={this / base:.3f}"
    print(line)


if __name__ == "__main__":
    main()
