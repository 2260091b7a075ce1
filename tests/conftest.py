"""Shared fixtures: namespaces in temporary data directories, a clock tests can move, and a real broker on a
free port (one per test module) for the tests that go over the wire."""

from __future__ import annotations

import threading
import time

import pytest

import shardbus


class FakeClock:
    """A wall clock that only moves when a test says so (locks, TTLs and windows without sleeping)."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_ns(tmp_path):
    """Open namespaces under one data directory; all are closed at the end of the test."""
    opened: list[shardbus.Namespace] = []

    def factory(**options) -> shardbus.Namespace:
        ns = shardbus.Namespace.open(tmp_path / "data", **options)
        opened.append(ns)
        return ns

    yield factory
    for ns in opened:
        ns.close()


@pytest.fixture
def ns(open_ns):
    return open_ns()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A real broker (AMQP and HTTPS on one free port) for this test module."""
    from shardbus.server import Broker  # only the wire tests pay for the server's imports

    b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def conn_str(broker) -> str:
    return broker.connection_string
