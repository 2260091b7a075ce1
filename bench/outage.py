"""Outage bench: SIGKILL one worker of four under load, and account for every message.

``Broker(workers=4)`` in this process (the front end; its four workers are child processes), one 16-partition
queue, and through our own client (``shardbus.client.ShardbusClient``, one connection per thread):

    keyless    ``--keyless`` threads, each sending single messages without a partition key back to back
    keyed      one thread sending, in turn, one message to each of the 16 partitions (a key that maps there)
    consumer   one peek-lock receiver completing what it gets (a batch at a time)

Every message has a unique message-id. After ``--warmup`` seconds one worker is SIGKILLed (``LocalCluster.kill``;
the supervisor starts it again) and the load goes on for ``--outage`` seconds; then the producers stop, the
consumer drains the queue, and what is still stored is browsed (peek, which also shows messages whose completion
failed). Printed:

    keyless    the fraction of keyless sends that succeeded (the goal: 100%: another partition takes them)
    keyed      errors by partition and AMQP condition (expected: server-busy, only on the dead worker's 4)
    recovery   kill -> the dead worker's partitions healthy again, and -> a keyed send to each of them succeeded
    throughput acknowledged sends/s and completed receives/s during the outage as a ratio of before it (same run):
               over the ``--outage`` window, and over the time its partitions were down
    reconcile  acknowledged == received + still stored; lost (acknowledged, never seen); stored twice (one message
               id under two sequence numbers: a failed-over batch kept on both partitions); completed and seen
               again; redeliveries of unsettled messages (same sequence number: allowed, at-least-once); stored
               without acknowledgment (a send the client saw fail that is stored anyway); in-doubt messages the
               front end took back from the restarted worker; in-doubt settlements: messages whose settlement
               was echoed but not known durable when the worker died, and how many of them the front end applied
               again (the rest the worker had stored)

Exit status 1 when anything acknowledged is missing, a message is stored twice, or a completed one came back.

    python bench/outage.py [--quick] [--warmup S] [--outage S] [--keyless N] [--kill W]

``--quick`` (the smoke test): 3 s of warm-up, 5 s of outage. Everything shares this machine's cores; read the
ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from shardbus.client import ClientError, OutgoingMessage, ReceivedMessage, ShardbusClient
from shardbus.model.routing import partition_for_key
from shardbus.server import Broker

QUEUE = "outage"
PARTITIONS = 16
WORKERS = 4
BODY = os.urandom(256)
RECOVERY_LIMIT = 60.0  # after the outage window, how long to wait for the dead partitions before giving up
SETTLE_EMPTY = 3  # the drain ends after this many empty receives in a row


@dataclass
class Tally:
    """What the load threads saw (each list is appended by one thread; the GIL keeps appends whole)."""

    acked: list[tuple[float, str]] = field(default_factory=list)  # (when, message id) of acknowledged sends
    keyless_failed: list[str] = field(default_factory=list)  # conditions
    keyed_errors: collections.Counter = field(default_factory=collections.Counter)  # (partition, condition)
    keyed_ok_after: dict[int, float] = field(default_factory=dict)  # partition -> first success after the kill
    deliveries: list[tuple[float, str, int]] = field(default_factory=list)  # (when, message id, sequence number)
    completed: list[tuple[float, str, int]] = field(default_factory=list)  # completions the broker confirmed
    complete_failures: int = 0


def key_for_each_partition() -> dict[int, str]:
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < PARTITIONS:
        keys.setdefault(partition_for_key(f"key-{i}", PARTITIONS), f"key-{i}")
        i += 1
    return keys


def message_id_of(m: ReceivedMessage) -> str:
    props = m.message.properties
    return str(props.message_id if props is not None else None)


def keyless_producer(url: str, tag: int, stop: threading.Event, tally: Tally) -> None:
    with ShardbusClient(url) as client:
        n = 0
        while not stop.is_set():
            message_id = f"u{tag}-{n}"
            n += 1
            try:
                client.send(QUEUE, [OutgoingMessage(BODY, message_id=message_id)], window=1)
            except ClientError as exc:
                tally.keyless_failed.append(str(exc.condition))
                continue
            except Exception as exc:  # a timeout: counted as a failure too
                tally.keyless_failed.append(type(exc).__name__)
                continue
            tally.acked.append((time.monotonic(), message_id))


def keyed_producer(url: str, stop: threading.Event, killed: list[float], tally: Tally) -> None:
    keys = key_for_each_partition()
    with ShardbusClient(url) as client:
        n = 0
        while not stop.is_set():
            for pid, key in keys.items():
                message_id = f"k{pid}-{n}"
                try:
                    client.send(QUEUE, [OutgoingMessage(BODY, message_id=message_id, partition_key=key)], window=1)
                except ClientError as exc:
                    tally.keyed_errors[(pid, str(exc.condition))] += 1
                    continue
                except Exception as exc:
                    tally.keyed_errors[(pid, type(exc).__name__)] += 1
                    continue
                now = time.monotonic()
                tally.acked.append((now, message_id))
                if killed and pid not in tally.keyed_ok_after:
                    tally.keyed_ok_after[pid] = now
            n += 1


def consumer(url: str, done: threading.Event, tally: Tally) -> None:
    """Receive and complete until ``done`` is set and the queue gave nothing ``SETTLE_EMPTY`` times in a row."""
    empty = 0
    with ShardbusClient(url) as client, client.receiver(QUEUE) as receiver:
        while True:
            batch = receiver.receive(100, max_wait=0.5, idle=0.05)
            now = time.monotonic()
            if not batch:
                empty = empty + 1 if done.is_set() else 0
                if empty >= SETTLE_EMPTY:
                    return
                continue
            empty = 0
            seen = [(now, message_id_of(m), m.sequence_number) for m in batch]
            tally.deliveries.extend(seen)
            try:
                receiver.complete(batch)
            except Exception:
                # Some lock was lost (its worker died). Each delivery got its own outcome, but the client reports
                # only the first refusal: the whole batch counts as unsettled (delivering it again is allowed).
                tally.complete_failures += len(batch)
            else:
                tally.completed.extend((time.monotonic(), i, s) for _, i, s in seen)


def still_stored(url: str) -> list[tuple[str, int]]:
    """Every message left in the queue, in any state (peek walks the partitions in sequence-number order)."""
    out: list[tuple[str, int]] = []
    with ShardbusClient(url) as client:
        start = 0
        while batch := client.peek(QUEUE, 100, from_sequence_number=start):
            out += [(message_id_of(m), m.sequence_number) for m in batch]
            start = batch[-1].sequence_number + 1
    return out


class RevokeCounter(logging.Handler):
    """Counts the messages front-end partitions took back from a restarted worker (remote.py logs each revoke),
    and those whose settlements were in doubt (echoed, maybe not stored) and how many of them it applied again."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages = 0
        self.settled = 0
        self.settled_again = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        found = re.search(r"revoked (\d+) in-doubt", text)
        if found:
            self.messages += int(found.group(1))
        found = re.search(r"in-doubt settlements of (\d+) message\(s\): (\d+) applied again", text)
        if found:
            self.settled += int(found.group(1))
            self.settled_again += int(found.group(2))


def rate(times: list[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / max(end - start, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s warm-up, 5 s outage (smoke test)")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds of load before the kill (default 8)")
    parser.add_argument("--outage", type=float, default=15.0, help="seconds of load after the kill (default 15)")
    parser.add_argument("--keyless", type=int, default=4, help="keyless sending threads (default 4)")
    parser.add_argument("--kill", type=int, default=1, help="which worker to kill (default 1)")
    args = parser.parse_args()
    warmup, outage = (3.0, 5.0) if args.quick else (args.warmup, args.outage)

    revokes = RevokeCounter()
    cluster_log = logging.getLogger("shardbus.cluster")
    cluster_log.addHandler(revokes)
    cluster_log.setLevel(logging.INFO)
    cluster_log.propagate = False  # its connect/reconnect lines would drown the report

    folder = Path(tempfile.mkdtemp(prefix="shardbus-bench-outage-"))
    broker = Broker(data_dir=folder / "data", port=0, workers=WORKERS).start()
    try:
        ns = broker.namespace
        ns.create_queue(QUEUE, enable_partitioning=True)
        entity_id = ns.resolve(QUEUE)[0].entity_id
        partitions = ns.resolve(QUEUE)[0].partitions
        dead = sorted(p for p in range(PARTITIONS) if (entity_id + p) % WORKERS == args.kill)
        url = broker.connection_string
        print(
            f"{os.cpu_count()} CPUs; Broker(workers={WORKERS}), a {PARTITIONS}-partition queue; {args.keyless} keyless "
            f"threads, 1 keyed thread, 1 consumer; {warmup:g} s warm-up, kill worker {args.kill} "
            f"(partitions {', '.join(map(str, dead))}), {outage:g} s of outage",
            flush=True,
        )

        tally = Tally()
        stop_sending, drain = threading.Event(), threading.Event()
        killed: list[float] = []
        threads = [
            threading.Thread(target=keyless_producer, args=(url, i, stop_sending, tally)) for i in range(args.keyless)
        ]
        threads.append(threading.Thread(target=keyed_producer, args=(url, stop_sending, killed, tally)))
        receiver = threading.Thread(target=consumer, args=(url, drain, tally))
        started = time.monotonic()
        for t in [*threads, receiver]:
            t.start()

        time.sleep(warmup)
        kill_at = time.monotonic()
        broker.cluster.kill(args.kill)
        killed.append(kill_at)
        down_seen = healthy_at = None
        while time.monotonic() < kill_at + outage or healthy_at is None:
            if time.monotonic() > kill_at + outage + RECOVERY_LIMIT:
                break
            up = all(partitions[p].healthy for p in dead)
            if not up and down_seen is None:
                down_seen = time.monotonic()
            if up and down_seen is not None and healthy_at is None:
                healthy_at = time.monotonic()
            time.sleep(0.01)
        outage_end = kill_at + outage
        stop_sending.set()
        for t in threads:
            t.join()
        drain.set()
        receiver.join()
        leftovers = still_stored(url)
    finally:
        broker.stop()
        shutil.rmtree(folder, ignore_errors=True)

    # --- the report --------------------------------------------------------------------------------------------
    ok = True
    keyless_ok = sum(1 for _, i in tally.acked if i.startswith("u"))
    keyless_total = keyless_ok + len(tally.keyless_failed)
    print(
        f"keyless sends     {keyless_ok}/{keyless_total} succeeded "
        f"({100.0 * keyless_ok / max(keyless_total, 1):.2f}%)"
        + (f"; failures: {dict(collections.Counter(tally.keyless_failed))}" if tally.keyless_failed else "")
    )
    by_partition: dict[int, dict[str, int]] = collections.defaultdict(dict)
    for (pid, condition), count in tally.keyed_errors.items():
        by_partition[pid][condition] = count
    keyed_ok = sum(1 for _, i in tally.acked if i.startswith("k"))
    errors = ", ".join(f"p{pid}: {conds}" for pid, conds in sorted(by_partition.items())) or "none"
    print(f"keyed sends       {keyed_ok} succeeded; errors by partition: {errors}")
    stray = sorted(set(by_partition) - set(dead))
    if stray:
        print(f"                  (errors on partitions of live workers: {stray})")

    if healthy_at is None:
        print(f"recovery          the dead partitions were not healthy again within {outage + RECOVERY_LIMIT:g} s")
        ok = False
    else:
        keyed_back = [tally.keyed_ok_after.get(p) for p in dead]
        keyed_text = (
            f"{max(keyed_back) - kill_at:.2f} s" if all(t is not None for t in keyed_back) else "not all came back"
        )
        print(
            f"recovery          partitions healthy again {healthy_at - kill_at:.2f} s after the kill; keyed sends "
            f"to each of them succeeding after {keyed_text}"
        )

    send_times = [t for t, _ in tally.acked]
    recv_times = [t for t, _, _ in tally.completed]
    base_from = started + min(1.0, warmup / 3)  # connections warm up first
    send_before, send_during = rate(send_times, base_from, kill_at), rate(send_times, kill_at, outage_end)
    recv_before, recv_during = rate(recv_times, base_from, kill_at), rate(recv_times, kill_at, outage_end)
    print(
        f"throughput        sends {send_before:.0f}/s before, {send_during:.0f}/s during: ratio "
        f"{send_during / max(send_before, 1e-9):.2f}; completes {recv_before:.0f}/s before, {recv_during:.0f}/s "
        f"during: ratio {recv_during / max(recv_before, 1e-9):.2f} (the {outage:g} s after the kill)"
    )
    if healthy_at is not None and healthy_at - kill_at > 0.2:
        send_down, recv_down = rate(send_times, kill_at, healthy_at), rate(recv_times, kill_at, healthy_at)
        print(
            f"                  while its partitions were down: sends ratio {send_down / max(send_before, 1e-9):.2f}, "
            f"completes ratio {recv_down / max(recv_before, 1e-9):.2f}"
        )

    acked = {i for _, i in tally.acked}
    seen = collections.defaultdict(set)  # message id -> sequence numbers it was delivered or stored under
    for _, i, s in tally.deliveries:
        seen[i].add(s)
    for i, s in leftovers:
        seen[i].add(s)
    lost = acked - set(seen)
    stored_twice = sorted(i for i, seqs in seen.items() if len(seqs) > 1)
    deliveries = collections.Counter((i, s) for _, i, s in tally.deliveries)
    redelivered = sum(n - 1 for n in deliveries.values() if n > 1)
    completed_at = {}
    for t, i, s in tally.completed:
        completed_at.setdefault((i, s), t)
    came_back = {(i, s) for t, i, s in tally.deliveries if (i, s) in completed_at and t > completed_at[(i, s)]}
    came_back |= {(i, s) for i, s in leftovers if (i, s) in completed_at}
    unacknowledged = set(seen) - acked
    print(
        f"reconcile         acknowledged {len(acked)} = received {len({i for _, i, _ in tally.deliveries})} "
        f"+ still stored {len({i for i, _ in leftovers} - {i for _, i, _ in tally.deliveries})}: "
        f"lost {len(lost)}, stored twice {len(stored_twice)}, completed and seen again {len(came_back)}; "
        f"redeliveries of unsettled messages {redelivered} (in batches whose completion was refused: "
        f"{tally.complete_failures}), "
        f"stored without acknowledgment {len(unacknowledged)}, in-doubt messages revoked {revokes.messages}, "
        f"in-doubt settlements {revokes.settled} (applied again {revokes.settled_again})"
    )
    if lost:
        print(f"LOST: {sorted(lost)[:20]}")
        ok = False
    if stored_twice:
        print(f"STORED TWICE: {stored_twice[:20]}")
        ok = False
    if came_back:
        print(f"COMPLETED AND SEEN AGAIN: {sorted(came_back)[:20]}")
        ok = False
    print("result            " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
