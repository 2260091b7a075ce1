"""A real broker on a free port for the SDK tests, and helpers to make uniquely named entities."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from shardbus.amqp.transport import AmqpClient

_names = itertools.count()


@pytest.fixture
def root_client(broker):
    """Factory (async): our engine's client (``cls``, an ``AmqpClient``) connected to the broker with the root key."""

    async def connect(cls: type[AmqpClient] = AmqpClient, **options: Any) -> AmqpClient:
        return await cls.connect(
            "127.0.0.1",
            broker.server.port,
            sasl_mechanism="PLAIN",
            username="RootManageSharedAccessKey",
            password="SAS_KEY_VALUE",
            **options,
        )

    return connect


@pytest.fixture
def ns(broker):
    return broker.namespace


@pytest.fixture
def queue(ns):
    """Factory: a new queue with a unique name; returns the name."""

    def make(**props) -> str:
        name = f"q{next(_names)}"
        ns.create_queue(name, **props)
        return name

    return make


@pytest.fixture
def topic(ns):
    """Factory: a new topic with subscriptions; returns the topic name."""

    def make(subscriptions=("s1",), **props) -> str:
        name = f"t{next(_names)}"
        ns.create_topic(name, **props)
        for sub in subscriptions:
            ns.create_subscription(name, sub)
        return name

    return make


def _receive_until(receiver, count: int, limit: float) -> list:
    """Receive until ``count`` messages came or ``limit`` seconds passed (a receive may return fewer)."""
    got: list = []
    deadline = time.monotonic() + limit
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=1)
    return got


@pytest.fixture
def receive_until():
    """``receive_until(receiver, count, limit)``: the messages received within ``limit`` seconds (up to ``count``)."""
    return _receive_until
