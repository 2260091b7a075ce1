"""A worker on its own clock ticks its partitions itself (lock expiry, scheduled messages, TTL), as one process's
upkeep does; a ``serve --workers`` front end then sends ``tick_all`` only for health (``HEALTH_INTERVAL``). On the
caller's clock (tests' fake time) the front end's ticks still drive the worker."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import shardbus
from shardbus.cluster.remote import HEALTH_INTERVAL, TICK_INTERVAL
from shardbus.cluster.supervisor import LocalCluster
from shardbus.namespace import Namespace

pytestmark = pytest.mark.timeout(120)


def test_an_expired_message_is_dead_lettered_with_no_ticks_from_the_front_end(tmp_path):
    """Only a tick moves an expired message nobody asks for to the dead-letter queue (a peek of that queue does
    not look at the main one): here the worker's own."""
    with LocalCluster(tmp_path / "data", 1, "k").start() as cluster:
        assert cluster.client is not None and cluster.client.tick_interval == HEALTH_INTERVAL
        cluster.client.tick_interval = 3600.0  # from its next round on, the front end sends no tick_all at all
        time.sleep(HEALTH_INTERVAL + 0.2)  # the round asleep now ends
        ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
        try:
            ns.create_queue(
                "q",
                enable_partitioning=True,
                default_message_time_to_live=timedelta(seconds=1),
                dead_lettering_on_message_expiration=True,
            )
            ns.send("q", shardbus.Message(b"short-lived", message_id="e1"))
            deadline = time.monotonic() + 10
            while not (dead := ns.peek_messages("q/$DeadLetterQueue", 10)):
                assert time.monotonic() < deadline, "the worker did not expire it by its own tick"
                time.sleep(0.1)
            assert [str(m.message_id) for m in dead] == ["e1"]
        finally:
            ns.close()


def test_on_the_callers_clock_the_front_end_keeps_ticking_every_tenth_of_a_second(tmp_path):
    with LocalCluster(tmp_path / "data", 1, "k", follow_caller_clock=True).start() as cluster:
        assert cluster.client is not None and cluster.client.tick_interval == TICK_INTERVAL


def test_a_tick_all_to_a_worker_on_its_own_clock_answers_every_partitions_health(tmp_path):
    """The worker ticks its partitions itself; the front end's ``tick_all`` (once a second) only brings their health,
    a down partition's reason included."""
    with LocalCluster(tmp_path / "data", 1, "k").start() as cluster:
        assert cluster.client is not None
        ns = Namespace.open(tmp_path / "data", partition_factory=cluster.partition)
        try:
            ns.create_queue("q", enable_partitioning=True)
            link = next(iter(cluster.client.links.values()))
            keys = set(link.partitions)
            assert len(keys) == 16
            health = link.call(None, "", "tick_all", [{}], time.time()).result(10)
            assert set(health) == keys and all(failure is None for failure in health.values())
            stopped = sorted(keys)[0]
            link.partitions[stopped].stop("stopped by the test")
            health = link.call(None, "", "tick_all", [{}], time.time()).result(10)
            assert health[stopped] == "stopped by the test"
            assert all(failure is None for key, failure in health.items() if key != stopped)
        finally:
            ns.close()
