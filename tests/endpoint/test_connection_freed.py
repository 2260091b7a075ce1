"""A closed AMQP connection is freed by reference counting alone (issue #28, point 6).

A connection's objects that refer to each other in a cycle (the handler and its protocol, the engine's sessions
and links) outlive the connection until the cyclic garbage collector runs, and a broker that serves many short
connections then drives full collections, which pause every thread. Here the collector is off while the official
SDK opens, uses and closes its connections, and while the broker drops one with links still attached: the
server's objects of each must be gone as soon as the broker has seen the connection end, and a collection
afterwards must find none of them.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage

# The modules whose objects make up a client connection on the broker's side.
CONNECTION_MODULES = ("shardbus.amqp.", "shardbus.endpoint.", "shardbus.listener")


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def connection_garbage() -> collections.Counter:
    """What a collection finds of connection objects (by type) that reference counting did not free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return collections.Counter(
            type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith(CONNECTION_MODULES)
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def watch(protocol) -> list[weakref.ref]:
    """Weak references to a server connection's protocol, handler and engine (taken while it is open)."""
    return [weakref.ref(protocol), weakref.ref(protocol.handler), weakref.ref(protocol.conn)]


def wait_freed(refs: list[weakref.ref], limit: float = 10) -> list[str]:
    """The types of what is still alive after ``limit`` seconds (none: all freed)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(r() is not None for r in refs):
        time.sleep(0.05)
    return [type(r()).__qualname__ for r in refs if r() is not None]


def amqp_connections(broker) -> set:
    return {c for c in list(broker.server.connections) if hasattr(c, "handler")}


def test_sdk_connections_are_freed_without_the_collector(broker, conn_str, queue):
    q = queue(enable_partitioning=True)
    with ServiceBusClient.from_connection_string(conn_str) as client:  # a first round: imports, caches, pools
        with client.get_queue_sender(q) as sender:
            sender.send_messages(ServiceBusMessage("warm"))
        with client.get_queue_receiver(q, max_wait_time=1) as receiver:
            for m in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                receiver.complete_message(m)
    time.sleep(0.2)
    before = amqp_connections(broker)
    with collector_off():
        refs: list[weakref.ref] = []
        with ServiceBusClient.from_connection_string(conn_str) as client:
            with client.get_queue_sender(q) as sender:
                sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
                sender.schedule_messages(ServiceBusMessage("later"), datetime.now(UTC) + timedelta(hours=1))
                refs += [r for p in amqp_connections(broker) - before for r in watch(p)]
            with client.get_queue_receiver(q, max_wait_time=1) as receiver:
                got = []
                deadline = time.monotonic() + 10
                while len(got) < 5 and time.monotonic() < deadline:
                    got += receiver.receive_messages(max_message_count=5 - len(got), max_wait_time=1)
                for m in got:
                    receiver.complete_message(m)
                receiver.peek_messages(5)
                refs += [r for p in amqp_connections(broker) - before for r in watch(p)]
        assert len(got) == 5
        assert refs, "the SDK's connections were not seen on the broker"
        assert wait_freed(refs) == []
        assert connection_garbage() == {}


def test_a_dropped_connection_with_links_is_freed_without_the_collector(broker, conn_str, queue):
    """The broker drops the SDK's connections while their links are attached (a receiver with credit waiting for
    messages, a sender): the engine's sessions and links and the receiver's callbacks must not keep them."""
    q = queue(enable_partitioning=True)
    before = amqp_connections(broker)
    with collector_off():
        client = ServiceBusClient.from_connection_string(conn_str, retry_total=0)
        sender = client.get_queue_sender(q)
        sender.send_messages(ServiceBusMessage("one"))
        receiver = client.get_queue_receiver(q, max_wait_time=1, prefetch_count=10)
        for m in receiver.receive_messages(max_message_count=1, max_wait_time=5):
            receiver.complete_message(m)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []  # credit left waiting
        dropped = amqp_connections(broker) - before
        assert len(dropped) >= 2 and all(p.handler._links for p in dropped)
        refs = [r for p in dropped for r in watch(p)]
        for p in dropped:
            broker.server.loop.call_soon_threadsafe(p.transport.abort)
        del p, dropped
        assert wait_freed(refs) == []
        for handler in (sender, receiver, client):
            with contextlib.suppress(Exception):
                handler.close()
        assert connection_garbage() == {}
