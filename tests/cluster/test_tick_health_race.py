"""A worker's threaded ``tick_all`` (some partition is down) must not answer a health snapshot older than a
partition's ``start`` that finished meanwhile: the start's reply says the partition is up, and the older snapshot,
arriving after it, would mark it down again at the front end until the next tick (d839450; CI saw it as
``PartitionUnavailable: ... partition(s) 4 unavailable`` right after creating a subscription). The faulty worker
makes the order certain (``faulty_worker._TickRace``): the tick's snapshot is taken first, then the start runs,
and the tick returns after the start's reply went out."""

from __future__ import annotations

import time

import pytest

import shardbus
from shardbus.cluster.supervisor import LocalCluster
from shardbus.namespace import Namespace
from support.faults import CALL_TIMEOUT, FAULTY_WORKER

pytestmark = pytest.mark.timeout(120)


def test_a_tick_held_across_a_start_does_not_mark_the_started_partition_down(tmp_path):
    with LocalCluster(
        tmp_path / "data", 1, "k", follow_caller_clock=True, worker_command=FAULTY_WORKER
    ).start() as cluster:
        ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
        try:
            ns.create_queue("q", enable_partitioning=True)
            p = ns._sender_entity("q").partitions[0]
            link = p.link
            seen_after_start: list[str | None] = []  # p's failure after each tick_all answer applied
            started = False
            apply = link.health

            def health(states: dict[str, str | None]) -> None:  # on the cluster client's loop
                apply(states)
                if started:
                    seen_after_start.append(p.failure)

            link.health = health
            p.stop("stopped by the test")
            link.call(p, p.key, "race_tick", [], p.clock()).result(CALL_TIMEOUT)
            p.start()  # held in the worker until a threaded tick has taken its snapshot (the partition down)
            started = True
            assert p.healthy, p.failure

            def done() -> bool:
                return link.call(p, p.key, "race_tick_done", [], p.clock()).result(CALL_TIMEOUT)

            deadline = time.monotonic() + 30
            while not done():
                assert time.monotonic() < deadline, "the held tick never returned"
                time.sleep(0.05)
            # The held tick's reply was queued as it returned; replies go out in order, so once two tick_all
            # sent after this point are answered, its answer has been applied.
            applied = len(seen_after_start)
            while len(seen_after_start) < applied + 2:
                assert time.monotonic() < deadline, "no tick_all answers"
                time.sleep(0.05)
            assert seen_after_start and all(f is None for f in seen_after_start), seen_after_start
            ns.send("q", shardbus.Message(b"after the race", message_id="m1"))  # the partition serves
        finally:
            ns.close()
