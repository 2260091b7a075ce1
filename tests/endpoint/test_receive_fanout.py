"""Receive fan-out over worker processes: every partition is asked at once and answers on its own time, so a
worker that does not answer (SIGSTOP: connected, silent) holds up neither the receives from the other worker's
partitions nor the front end's event loop. Through the official SDK against ``Broker(workers=2)``."""

from __future__ import annotations

import os
import signal
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from shardbus.server import Broker


@pytest.fixture
def cluster_broker(tmp_path):
    b = Broker(data_dir=tmp_path / "data", port=0, workers=2).start()
    yield b
    for w in b.cluster.workers:  # never leave a stopped worker behind
        if w.pid is not None:
            try:
                os.kill(w.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    b.stop()


def test_a_silent_worker_holds_up_only_its_own_partitions(cluster_broker, receive_until):
    ns = cluster_broker.namespace
    ns.create_queue("q", enable_partitioning=True)
    with ServiceBusClient.from_connection_string(cluster_broker.connection_string) as client:
        with client.get_queue_sender("q") as sender:
            for i in range(16):  # one at a time: round-robin puts one on every partition, 8 per worker
                sender.send_messages(ServiceBusMessage(f"{i}", message_id=str(i)))
        silent = cluster_broker.cluster.workers[1].pid
        os.kill(silent, signal.SIGSTOP)
        try:
            with client.get_queue_receiver("q") as receiver, client.get_queue_receiver("q") as second:
                # The live worker's eight arrive although the other worker's partitions never answer (waiting
                # for them, as a blocking fan-out would, takes 30 s per call before it gives up).
                first = receive_until(receiver, 16, limit=8)
                assert len(first) == 8
                # The front end's loop is free: another link on it is served at once (nothing left to get).
                started = time.monotonic()
                assert second.receive_messages(max_message_count=1, max_wait_time=1) == []
                assert time.monotonic() - started < 10
                for m in first:
                    receiver.complete_message(m)
                os.kill(silent, signal.SIGCONT)
                silent = None
                # Its partitions answer the requests that waited; nothing was lost or counted twice.
                rest = receive_until(receiver, 8, limit=30)
                more = receive_until(second, 8 - len(rest), limit=10)  # what waited in the second one's cache
                assert sorted(int(str(m)) for m in [*first, *rest, *more]) == list(range(16))
                assert all(m.delivery_count == 0 for m in [*rest, *more])
                for m in rest:
                    receiver.complete_message(m)
                for m in more:
                    second.complete_message(m)
        finally:
            if silent is not None:
                os.kill(silent, signal.SIGCONT)
