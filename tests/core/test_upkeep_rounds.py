"""The upkeep thread's rounds (registry/upkeep.py): an idle round over many partitions lets the GIL go once it has
held it ``YIELD_AFTER``, not after every partition, so an idle namespace's upkeep sleeps about once per round (its
wait for the next one) instead of once per partition; and a round still does every partition's work."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from shardbus import Message
from shardbus.model.routing import decode_sequence_number
from shardbus.registry import upkeep


def _voluntary_switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the thread's switches in /proc")
def test_an_idle_round_over_64_partitions_sleeps_about_once(ns):
    for i in range(4):
        ns.create_queue(f"q{i}", enable_partitioning=True)  # 64 partitions, all idle
    thread = ns._maintenance
    assert thread is not None and thread.native_id is not None
    time.sleep(0.3)  # the queues' first rounds are behind us
    before, started = _voluntary_switches(thread.native_id), time.monotonic()
    time.sleep(2.0)
    switches = _voluntary_switches(thread.native_id) - before
    rounds = (time.monotonic() - started) / upkeep.MAINTENANCE_INTERVAL
    # One sleep per round (its wait), a few more where a round ran past YIELD_AFTER on a loaded machine; a yield
    # after every partition was 65 per round.
    assert switches < rounds * 8, (switches, rounds)


def test_a_round_still_does_every_partitions_work(ns):
    """Scheduled messages in all 16 partitions of a queue become receivable within a few rounds."""
    ns.create_queue("sched", enable_partitioning=True)
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    seqs = []
    for key in range(64):
        seqs += ns.schedule_messages("sched", Message(f"{key}".encode(), partition_key=f"k{key}"), soon)
    assert len({decode_sequence_number(s)[0] for s in seqs}) == 16  # spread over every partition
    deadline = time.monotonic() + 10
    while ns.get_runtime_properties("sched").active_message_count < 64:
        assert time.monotonic() < deadline, "scheduled messages not activated"
        time.sleep(0.02)
