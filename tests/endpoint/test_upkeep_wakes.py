"""The upkeep thread is woken early only for forwarding (registry/upkeep.py): sends to a queue that forwards are
forwarded at once, even when forwarding was set after the queue was made, while sends to any other queue leave the
upkeep to its periodic tick (a round per commit of sends cost the event loop CPU and the GIL in bench/scale.py's
"both"). Messages go in and out through the SDK over real sockets; the tick is made long here (30 s) so that
anything forwarded within the test's few seconds was forwarded by a wake-up."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from shardbus.registry import upkeep

WORKERS = int(os.environ.get("SHARDBUS_TEST_WORKERS", "0"))  # as tests/conftest.py reads it


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker of this module's own whose upkeep ticks every 30 s (other modules' brokers keep 0.1 s)."""
    from shardbus.server import Broker

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(upkeep, "MAINTENANCE_INTERVAL", 30.0)
        b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0, workers=WORKERS).start()
        try:
            time.sleep(0.3)  # the thread's first wait (started before the patch reached it) ends: 30 s from now
            yield b
        finally:
            b.stop()


@pytest.fixture
def rounds(ns, monkeypatch) -> list[float]:
    """When each upkeep round ended (the broker's own ``_forward_all``, its last step, counted, not replaced)."""
    started: list[float] = []
    original = ns._forward_all

    def counting(*args: Any) -> None:
        started.append(time.monotonic())
        original(*args)

    monkeypatch.setattr(ns, "_forward_all", counting)
    return started


def _send(conn_str: str, queue: str, batches: int, per_batch: int) -> None:
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender(queue) as sender:
        for b in range(batches):
            sender.send_messages([ServiceBusMessage(f"{b}-{i}".encode()) for i in range(per_batch)])


def _count(ns: Any, queue: str) -> int:
    return ns.get_runtime_properties(queue).active_message_count


def _wait_for(condition: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sends_to_a_queue_that_does_not_forward_leave_the_upkeep_asleep(conn_str, ns, queue, rounds, receive_until):
    name = queue(enable_partitioning=True)
    _send(conn_str, name, batches=20, per_batch=10)
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_receiver(name) as receiver:
        got = receive_until(receiver, 200, 20)
        for m in got:
            receiver.complete_message(m)
    assert len(got) == 200
    assert rounds == []  # 20 commits of sends, none woke it (before: a round per commit)


def test_a_forwarding_queue_wakes_the_upkeep_and_forwards_at_once(conn_str, ns, queue, rounds, receive_until):
    dest = queue()
    src = queue(enable_partitioning=True, forward_to=dest)
    _send(conn_str, src, batches=3, per_batch=5)
    assert _wait_for(lambda: _count(ns, dest) == 15)  # 30 s before the next tick: forwarded by a wake-up
    assert rounds
    with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_receiver(dest) as receiver:
        got = receive_until(receiver, 15, 20)
        for m in got:
            receiver.complete_message(m)
    assert sorted(str(m) for m in got) == sorted(f"{b}-{i}" for b in range(3) for i in range(5))


def test_forwarding_set_after_the_queue_was_made_wakes_the_upkeep_too(conn_str, ns, queue, rounds):
    dest = queue()
    src = queue()
    _send(conn_str, src, batches=1, per_batch=3)
    assert rounds == []  # not forwarding yet: left to the tick
    ns.update_queue(src, forward_to=dest)
    _send(conn_str, src, batches=1, per_batch=2)
    assert _wait_for(lambda: _count(ns, dest) == 5)  # the two new ones woke it, and it took the three before too
    assert _count(ns, src) == 0
