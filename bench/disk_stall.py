"""Do receives and completes wait on a stalled disk? (issue #28 point 6)

A steady low-rate load through the official ``azure-servicebus`` SDK against a real ``shardbus serve`` (the soak's
entities, bench/soak.py; only ``soak-q`` is used) on the VM's disk, with and without a disk hog, this tree against
a base tree, interleaved: each round runs every (tree, hog) pair once, in an order that changes every round, on a
fresh broker and data directory.

The hog is ``dd if=/dev/zero of=HOG bs=1M count=--hog-mb conv=fsync`` in a loop: it fills the page cache with
dirty pages and syncs them, so every fsync on the device waits behind its writeback (a small fdatasync's p99 goes
from ~5 ms to 100-500 ms on this VM), and writes into the page cache may be throttled (``balance_dirty_pages``).
bench/soak.py's ``DiskProbe`` (bench/disk_probe.py, a process of its own) times a 4 KB overwrite + ``fdatasync``
``--disk-rate`` times a second beside the load, each counted from when it was due (``fsync`` column), so a round
says how badly the disk stalled. Filling the page cache is CPU as well (the kernel's copy: dd's system time
is a core's worth while it fills), so a third condition, ``shm``, runs the same dd into ``/dev/shm`` (tmpfs: the
same copy, no disk at all), pausing ``--shm-pause`` seconds between rounds so that its CPU matches the disk hog's
(``hog_cpu``: the hog's CPU seconds per second of the run, from its processes' rusage): a latency that moves as much
with it as with ``disk`` moved with the CPU, not the disk.

The load: one sender, open loop at ``--rate`` single messages a second (a random partition key each), and
``--consumers`` peek-lock receivers (prefetch 1, one message a call, keep-alive off: bench/soak.py says why), each
completing what it gets; ``--defer`` of the messages are deferred first and then received by sequence number and
completed (a read of the store: deferred messages leave memory once their write is stored). Measured, after
``--warmup`` seconds: a first delivery's latency from its send's due time (it holds the send's synced commit, which
must wait for the disk) and a ``complete_message`` call's (which must not: the broker echoes a complete once
applied, its delete written later). The timed clients share this process (as the soak's do); the probe's and the
hog's work is the same for both trees.

    python bench/disk_stall.py --base /tmp/base [--rounds 3] [--seconds 40] [--rate 40] [--consumers 4]
        [--defer 0.1] [--hog-mb 1500] [--hogs quiet,disk,shm] [--disk-rate 20] [--trace] [--dir /var/tmp/disk_stall]

Held in memory: every timed latency of the round running (a few thousand floats) and the per-round summaries.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from soak import Broker, DiskProbe, Q, _pct  # this script's own folder is on the path

HERE = Path(__file__).resolve().parent.parent


class Load:
    """One round's load and its timings (see the module docstring)."""

    def __init__(self, conn: str, rate: float, consumers: int, defer: float, warmup: float) -> None:
        self.conn, self.rate, self.defer = conn, rate, defer
        self.lock = threading.Lock()
        self.due: dict[str, float] = {}
        self.recv_ms: list[float] = []
        self.cmpl_ms: list[float] = []
        self.errors = 0
        self.stop = threading.Event()
        self.timed_from = time.monotonic() + warmup
        self.threads = [threading.Thread(target=self._send, daemon=True)]
        self.threads += [threading.Thread(target=self._consume, daemon=True) for _ in range(consumers)]

    def run(self, seconds: float, probe: DiskProbe) -> list[float]:
        """Run the load ``seconds`` beside ``probe`` (running); its syncs after the warm-up."""
        end = time.monotonic() + seconds
        for t in self.threads:
            t.start()
        time.sleep(max(0.0, self.timed_from - time.monotonic()))
        probe.take()  # the warm-up's
        time.sleep(max(0.0, end - time.monotonic()))
        self.stop.set()
        for t in self.threads:
            t.join(10)
        return probe.take()

    def _error(self) -> None:
        with self.lock:
            self.errors += 1

    def _client(self) -> ServiceBusClient:
        return ServiceBusClient.from_connection_string(self.conn, retry_total=3)

    def _send(self) -> None:
        with self._client() as client, client.get_queue_sender(Q, keep_alive=None) as sender:
            due = time.monotonic()
            while not self.stop.is_set():
                due += 1 / self.rate
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                mid = uuid.uuid4().hex
                plan = "defer" if random.random() < self.defer else "complete"
                msg = ServiceBusMessage(os.urandom(200), message_id=mid, partition_key=f"k{random.randrange(32)}",
                                        application_properties={"plan": plan})  # fmt: skip
                with self.lock:
                    self.due[mid] = due
                try:
                    sender.send_messages(msg)
                except ServiceBusError:
                    self._error()

    def _timed(self, started: float) -> bool:
        return started >= self.timed_from

    def _complete(self, receiver, msg) -> None:
        started = time.monotonic()
        try:
            receiver.complete_message(msg)
        except ServiceBusError:
            self._error()
            return
        if self._timed(started):
            with self.lock:
                self.cmpl_ms.append((time.monotonic() - started) * 1000)

    def _consume(self) -> None:
        deferred: list[int] = []
        with (
            self._client() as client,
            client.get_queue_receiver(Q, max_wait_time=1, prefetch_count=1, keep_alive=None) as receiver,
        ):
            while not self.stop.is_set():
                for msg in receiver.receive_messages(max_message_count=1, max_wait_time=1):
                    now = time.monotonic()
                    with self.lock:
                        due = self.due.pop(str(msg.message_id), None)
                        if due is not None and self._timed(due):
                            self.recv_ms.append((now - due) * 1000)
                    plan = (msg.application_properties or {}).get(b"plan", b"complete")
                    if plan == b"defer":
                        try:
                            receiver.defer_message(msg)
                            deferred.append(msg.sequence_number)
                        except ServiceBusError:
                            self._error()
                    else:
                        self._complete(receiver, msg)
                if len(deferred) >= 5:
                    try:
                        for msg in receiver.receive_deferred_messages(deferred):
                            self._complete(receiver, msg)
                    except ServiceBusError:
                        self._error()
                    deferred = []


def _hog(path: Path, mb: int, pause: float) -> subprocess.Popen:
    """A background writer filling the page cache with dirty pages and syncing them, in a loop (own session)."""
    script = f"while :; do dd if=/dev/zero of={path} bs=1M count={mb} conv=fsync status=none; sleep {pause}; done"
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def _run(tree: Path, hog: str, args: argparse.Namespace, where: Path) -> dict[str, float]:
    data = where / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    broker = Broker(data, 0, data / "stalls.trace" if args.trace else None, tree=tree)
    hog_file = Path(f"/dev/shm/disk_stall_hog.{os.getpid()}") if hog == "shm" else where / "hog"
    hogger = _hog(hog_file, args.hog_mb, args.shm_pause if hog == "shm" else 0) if hog != "quiet" else None
    hog_cpu = 0.0
    probe = DiskProbe(data, args.disk_rate)
    probe.start()
    try:
        load = Load(broker.connection_string, args.rate, args.consumers, args.defer, args.warmup)
        fsync_ms = load.run(args.seconds, probe)
    finally:
        probe.close()
        if hogger is not None:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            os.killpg(hogger.pid, signal.SIGTERM)
            hogger.wait(10)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            hog_cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / args.seconds
            hog_file.unlink(missing_ok=True)
        broker.stop()
    if args.trace:
        shutil.copy(data / "stalls.trace", where / f"stalls.{tree.name}.{hog}.{time.time():.0f}")
    return {
        "recv_p50": _pct(load.recv_ms, 0.5), "recv_p99": _pct(load.recv_ms, 0.99),
        "cmpl_p50": _pct(load.cmpl_ms, 0.5), "cmpl_p99": _pct(load.cmpl_ms, 0.99),
        "cmpl_max": max(load.cmpl_ms, default=float("nan")),
        "fsync_p99": _pct(fsync_ms, 0.99), "n_recv": len(load.recv_ms), "n_cmpl": len(load.cmpl_ms),
        "errors": load.errors, "hog_cpu": hog_cpu,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="a base tree (its src/ is served)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--defer", type=float, default=0.1)
    parser.add_argument("--hog-mb", type=int, default=1500)
    parser.add_argument("--shm-pause", type=float, default=3.0, help="seconds between the shm hog's rounds")
    parser.add_argument("--disk-rate", type=float, default=20, help="the disk probe's syncs a second")
    parser.add_argument("--trace", action="store_true", help="serve with SHARDBUS_STALL_TRACE (as soak.py --trace)")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/disk_stall"))
    parser.add_argument("--hogs", default="quiet,disk,shm", help="conditions: quiet, disk (the hog), shm (its CPU)")
    args = parser.parse_args()
    trees = {"this": HERE, "base": args.base.resolve()}
    hogs = args.hogs.split(",")
    pairs = [(name, hog) for hog in hogs for name in trees]
    results: dict[tuple[str, str], list[dict[str, float]]] = {pair: [] for pair in pairs}
    for r in range(args.rounds):
        order = pairs[r % len(pairs) :] + pairs[: r % len(pairs)]
        if r % 2:
            order.reverse()
        for name, hog in order:
            got = _run(trees[name], hog, args, args.dir)
            results[(name, hog)].append(got)
            shown = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in got.items())
            print(f"round {r} {name:4} {hog:5} {shown}", flush=True)
    shutil.rmtree(args.dir / "data", ignore_errors=True)
    print("\nmedians over rounds (range):")
    keys = ("recv_p50", "recv_p99", "cmpl_p50", "cmpl_p99", "cmpl_max", "fsync_p99")
    for pair in pairs:
        cells = []
        for k in keys:
            v = [g[k] for g in results[pair]]
            cells.append(f"{k} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"  {pair[0]:4} {pair[1]:5} " + "  ".join(cells))
    print("\nthis/base, same round:")
    for hog in hogs:
        cells = []
        for k in keys[:5]:
            v = [t[k] / b[k] for t, b in zip(results[("this", hog)], results[("base", hog)], strict=True) if b[k]]
            cells.append(f"{k} x{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
        print(f"  {hog:5} " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
