"""The hop to a worker in one process, without clients: CPU per message of the partition calls a front end makes
per message (enqueue in batches, lock, complete), on an in-process ``PartitionBroker`` and on the same broker in a
``Worker`` reached through ``ClusterClient`` / ``RemotePartition`` (its loop on a thread of this process), rounds
interleaved.

bench/scale.py measures the hop end to end through real clients on a shared machine, where a round's CPU per
message moves by a fifth; this leaves out the endpoint and the clients, so what differs between the two lines is
the hop alone (codec, framing both ways, futures, hand-offs, sockets) and it is steady enough to compare a
change to the cluster wire against its base (``--base DIR`` runs the same from another checkout in a child
process, interleaved).

``--callgrind`` counts instructions instead (valgrind's callgrind, every thread of the process: the front end's
calls, the cluster client's loop, the worker's loop and its store threads), which the machine's load does not move:
each line and tree runs once with ``--messages`` and once with a tenth of them, and the difference over the
messages between is its instructions per message, start-up and the partition's opening left out. How settlements
share a commit still depends on the clock (callgrind slows the process fifty-fold), alike for both trees.

    python bench/hop_micro.py [--messages N] [--rounds R] [--batch B] [--lock L] [--base DIR] [--callgrind]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(kind: str, messages: int, batch: int, lock: int) -> float:
    """CPU seconds per message of this process for one round on a fresh partition (``kind``: local, remote)."""
    import shardbus
    from shardbus.cluster.remote import ClusterClient, RemotePartition
    from shardbus.cluster.worker import Worker
    from shardbus.partition.broker import PartitionBroker
    from shardbus.partition.handle import PartitionSpec
    from shardbus.partition.values import PartitionConfig, SlotSettings
    from shardbus.runtime import new_event_loop
    from shardbus.store.amqp_values import register_stored_types
    from shardbus.store.sqlite import SqliteStore

    register_stored_types()
    # the cyclic collector as ``shardbus serve`` and a worker set it (runtime.py): with Python's default thresholds
    # a collection every 700 allocations walks whatever the hop holds at that moment, which neither process does
    from shardbus.runtime import tune_garbage_collector

    tune_garbage_collector()
    body = os.urandom(1024)
    config = PartitionConfig("q", 0, max_size_bytes=1 << 34, max_message_size_bytes=1 << 20)
    with tempfile.TemporaryDirectory(prefix="shardbus-hop-micro-") as tmp:
        data = Path(tmp)
        key = "ns/entities/1/p00.db"
        (data / key).parent.mkdir(parents=True)
        worker = client = loop = thread = None
        if kind == "local":
            p = PartitionBroker(config, lambda: SqliteStore(data / key), time.time)
        else:
            worker = Worker(data, "k")
            loop = new_event_loop()
            ready = threading.Event()
            port: list[int] = []
            thread = threading.Thread(
                target=lambda: loop.run_until_complete(
                    worker.serve("127.0.0.1", 0, lambda b: (port.append(b), ready.set()))
                ),
                daemon=True,
            )
            thread.start()
            ready.wait(10)
            client = ClusterClient("k", time.time, tick_interval=1.0)
            link = client.link("0", ("127.0.0.1", port[0]))
            client.wait_connected()
            spec = PartitionSpec(1, config, data / key, time.time, lambda: None)
            p = RemotePartition(link, key, spec)
        try:
            p.configure_slot(0, SlotSettings("q"))
            p.start()
            p.create_slot(0, SlotSettings("q")).result()
            start = time.process_time()
            sent = 0
            done = 0
            while done < messages:
                # a send's batch, then the locks and completes that take it out again, as in "both"
                items = [(None, [(0, shardbus.Message(body, message_id=f"m{sent + i}"))]) for i in range(batch)]
                p.enqueue(items).result()
                sent += batch
                while True:
                    got = p.submit_lock_messages(0, 0, lock).result()
                    if not got:
                        break
                    p.complete(0, [m.lock_token for m in got]).result()
                    done += len(got)
            return (time.process_time() - start) / done
        finally:
            if kind == "local":
                p.stop()
            else:
                p.close()
                client.close()
                worker.call_soon(worker._stop_event.set)
                thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100, help="messages per enqueue (default 100)")
    parser.add_argument("--lock", type=int, default=20, help="messages per lock request (default 20)")
    parser.add_argument("--base", type=Path, default=None, help="a checkout to run the same from, interleaved")
    parser.add_argument("--callgrind", action="store_true", help="count instructions (valgrind) instead of time")
    parser.add_argument("--one", choices=("local", "remote"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.messages, args.batch, args.lock)))
        return
    trees = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    if args.callgrind:
        _count_all(trees, args)
        return
    figures: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, tree in trees:
            for kind in ("local", "remote"):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        kind,
                        "--messages",
                        str(args.messages),
                        "--batch",
                        str(args.batch),
                        "--lock",
                        str(args.lock),
                    ],
                    env={**os.environ, "PYTHONPATH": str(tree / "src")},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                us = json.loads(out.stdout.strip().splitlines()[-1]) * 1e6
                figures.setdefault(f"{name} {kind}", []).append(us)
            ratio = figures[f"{name} remote"][-1] / figures[f"{name} local"][-1]
            figures.setdefault(f"{name} remote/local", []).append(ratio)
            print(
                f"round {r + 1} {name}: local {figures[f'{name} local'][-1]:.1f}, remote "
                f"{figures[f'{name} remote'][-1]:.1f} us/msg, ratio {ratio:.2f}",
                flush=True,
            )
    print("\nmedians (min-max), process CPU per message sent, locked and completed")
    for key, values in figures.items():
        print(f"  {key:<20} {statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})")
    if args.base:
        overs = [a - b for a, b in zip(figures["this remote"], figures["base remote"], strict=True)]
        print(f"  remote this - base   {statistics.median(overs):+7.2f} ({min(overs):+.2f} to {max(overs):+.2f})")


def _instructions(tree: Path, kind: str, messages: int, args: argparse.Namespace) -> int:
    with tempfile.NamedTemporaryFile(prefix="shardbus-hop-micro-") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable, __file__]
        command += ["--one", kind, "--messages", str(messages), "--batch", str(args.batch), "--lock", str(args.lock)]
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONHASHSEED": "0"}
        subprocess.run(command, env=env, check=True, capture_output=True)
        match = re.search(rb"^(?:summary|totals): (\d+)", Path(out.name).read_bytes(), re.M)
        assert match is not None, "no totals in the callgrind output"
        return int(match[1])


def _count_all(trees: list[tuple[str, Path]], args: argparse.Namespace) -> None:
    """Instructions per message of each line and tree (``--callgrind``), and the hop's share."""
    few = max(args.batch, args.messages // 10)
    per: dict[tuple[str, str], float] = {}
    for name, tree in trees:
        for kind in ("local", "remote"):
            many = _instructions(tree, kind, args.messages, args)
            some = _instructions(tree, kind, few, args)
            per[name, kind] = (many - some) / (args.messages - few)
            print(f"{name:5} {kind:6} {per[name, kind]:10,.0f} instructions per message", flush=True)
        hop = per[name, "remote"] - per[name, "local"]
        print(f"{name:5} hop    {hop:10,.0f} (remote/local {per[name, 'remote'] / per[name, 'local']:.3f})", flush=True)
    if len(trees) > 1:
        for kind in ("local", "remote"):
            print(f"this/base {kind}: {per['this', kind] / per['base', kind]:.3f}")
        hops = [per[n, "remote"] - per[n, "local"] for n in ("this", "base")]
        print(f"this/base hop (remote - local): {hops[0] / hops[1]:.3f}")


if __name__ == "__main__":
    main()
