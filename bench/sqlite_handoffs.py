"""How many times a store commit lets go of the GIL (and must take it back), per kind of batch the soak writes.

The ``sqlite3`` module wraps every call into SQLite that may take time (prepare, reset, step, ...) in
``Py_BEGIN_ALLOW_THREADS``: it lets go of the GIL, and afterwards waits to take it back. Beside a busy event loop
each take-back may wait up to the switch interval (5 ms), so a commit's count of them is a count of its chances
to stall (docs/operations.md, "What stalls a send"). This script counts them exactly: a tiny shared library,
preloaded, stands in for ``PyEval_SaveThread`` (the first half of ``Py_BEGIN_ALLOW_THREADS``; libpython is a
shared library here, so the ``_sqlite3`` extension's calls go through the preload) and counts its calls. Each kind
of batch is applied ``--rounds`` times to a fresh ``SqliteStore`` (after one untimed round, so statements are
prepared as in a long-running broker) and the mean count per commit printed, with the statements SQLite ran
(its trace callback: one per statement, one per row of an ``executemany``).

    send-1           a send of one message to a queue: its row, ``next_seq``, its sub-queue's counts (synced)
    send-5           a batch of five (synced)
    topic-send       one message to a topic partition with three subscriptions, two of which take it (synced)
    settle           what a lingering group of settlements commits: five completes out of order, one
                     dead-letter, the main and dead-letter queues' counts (unsynced)
    send-after-settle  send-1 right after a ``settle``: the soak's usual synced commit (stores alternate)

With ``--base DIR`` the same runs with ``DIR/src`` first on the path (a base tree, e.g. ``git archive 7f1b7dc``).

    python bench/sqlite_handoffs.py [--rounds 200] [--base DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
unsigned long shardbus_gil_releases = 0;
static void *(*real_save)(void);
void *PyEval_SaveThread(void) {
    if (!real_save) real_save = (void *(*)(void))dlsym(RTLD_NEXT, "PyEval_SaveThread");
    shardbus_gil_releases++;
    return real_save();
}
"""
_ENV = "SHARDBUS_HANDOFF_SHIM"


def _shim() -> Path:
    """Compile the counting ``PyEval_SaveThread`` (once per run, into a temporary folder)."""
    folder = Path(tempfile.mkdtemp(prefix="shardbus-handoffs-"))
    (folder / "shim.c").write_text(_SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", folder / "shim.so", folder / "shim.c", "-ldl"], check=True)
    return folder / "shim.so"


def _kinds(rounds: int) -> list[tuple[str, float, float]]:
    """(kind, GIL releases per commit, statements per commit) in this process (the shim preloaded)."""
    from shardbus.store.base import Row, Update
    from shardbus.store.sqlite import SqliteStore

    counter = ctypes.c_ulong.in_dll(ctypes.CDLL(None), "shardbus_gil_releases")
    data = os.urandom(200)
    folder = Path(tempfile.mkdtemp(prefix="shardbus-handoffs-db-"))
    out = []
    store = SqliteStore(folder / "p.db")
    store.apply([("create_slot", slot) for slot in range(4)])
    seq = [1]

    def rows(n: int) -> list[Row]:
        first = seq[0]
        seq[0] += n
        return [Row(first + i, 0, 0, 0, None, data, None) for i in range(n)]

    def send(n: int) -> list:
        return [("put", 0, rows(n)), ("meta", "next_seq", seq[0]), ("counts", 0, 0, seq[0], 200 * seq[0])]

    def topic() -> list:
        put = rows(1)
        return [("put", 1, put), ("put", 2, put), ("meta", "next_seq", seq[0]), ("counts", 1, 0, 9, 9),
                ("counts", 2, 0, 9, 9)]  # fmt: skip

    def settle() -> list:
        s = seq[0]
        batch = send(8)  # what it settles
        store.apply(batch)
        ops: list = [("delete", 0, [x]) for x in (s + 3, s, s + 5, s + 1, s + 6)]
        ops.append(("update", 0, [Update(s + 2, 1, 0, 1, b"dl")]))
        ops += [("counts", 0, 0, 1, 200), ("counts", 0, 1, 1, 200)]
        return ops

    plans = {
        "send-1": lambda: (send(1), True),
        "send-5": lambda: (send(5), True),
        "topic-send": lambda: (topic(), True),
        "settle": lambda: (settle(), False),
    }

    def measure(plan, before_each=None) -> tuple[float, float]:
        """GIL releases and statements per commit of ``plan``: every other round traced (the trace callback lets
        go of the GIL too, so releases are counted in the untraced rounds, statements in the traced ones)."""
        statements: list[str] = []
        releases = 0
        for i in range(2 * rounds):
            if before_each is not None:
                before_each()
            ops, sync = plan()
            traced = i % 2
            if traced:
                store._db.set_trace_callback(statements.append)
            before = counter.value
            store.apply(ops, sync)
            if traced:
                store._db.set_trace_callback(None)
            else:
                releases += counter.value - before
        return releases / rounds, len(statements) / rounds

    for kind, plan in plans.items():
        ops, sync = plan()
        store.apply(ops, sync)  # untimed: statements prepared
        out.append((kind, *measure(plan)))
    # a send right after a settlement batch (the connection's synchronous setting flips back)
    out.append(("send-after-settle", *measure(lambda: (send(1), True), lambda: store.apply(settle(), False))))
    store.close()
    return out


def _run(rounds: int, shim: Path, src: Path | None) -> list[list[str]]:
    env = dict(os.environ, LD_PRELOAD=str(shim), **{_ENV: "1"})
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run([sys.executable, __file__, "--rounds", str(rounds)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"sqlite_handoffs: the count failed:\n{done.stderr}")
    return [line.split() for line in done.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--base", type=Path, help="a base tree: its src counted too")
    args = parser.parse_args(argv)
    if os.environ.get(_ENV):  # the child: the shim is loaded
        for kind, releases, n in _kinds(args.rounds):
            print(kind, f"{releases:.2f}", f"{n:.2f}")
        return 0
    shim = _shim()
    here = _run(args.rounds, shim, Path(__file__).resolve().parent.parent / "src")
    base = _run(args.rounds, shim, args.base / "src") if args.base else None
    print(f"{'commit':>18} {'GIL releases':>13} {'statements':>11}" + (f" {'base releases':>14} {'base stmts':>11}"
                                                                         if base else ""))  # fmt: skip
    for i, (kind, releases, n) in enumerate(here):
        line = f"{kind:>18} {float(releases):13.2f} {float(n):11.2f}"
        if base:
            line += f" {float(base[i][1]):14.2f} {float(base[i][2]):11.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
