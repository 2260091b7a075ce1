"""Shared fixtures: namespaces in temporary data directories, a clock tests can move, and a real broker on a
free port (one per test module) for the tests that go over the wire."""

from __future__ import annotations

import os
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


# SHARDBUS_TEST_WORKERS=N runs the same tests with every partition broker in one of N worker processes
# (scripts/test.sh runs the core and AMQP suites once more that way): remote partitions must behave like local ones.
WORKERS = int(os.environ.get("SHARDBUS_TEST_WORKERS", "0"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "embedded_only: reaches into an in-process partition broker's internals (skipped with workers)"
    )
    from shardbus.store.amqp_values import register_stored_types

    # Fixtures open namespaces in this process (``open_ns``), as a broker process does; it registers the AMQP value
    # types messages may carry where it starts (``server.Broker``, the worker), and so does this test process.
    register_stored_types()


def pytest_collection_modifyitems(config, items):
    if WORKERS:
        skip = pytest.mark.skip(reason="inspects an in-process partition broker's internals (SHARDBUS_TEST_WORKERS)")
        for item in items:
            if "embedded_only" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Worker processes shared by the whole run (their partitions follow each test's clock), or None."""
    if not WORKERS:
        yield None
        return
    from shardbus.cluster.supervisor import LocalCluster
    from support.faults import FAULTY_WORKER  # workers that also take fault plans (tests/support/faults.py)

    c = LocalCluster(
        tmp_path_factory.getbasetemp(),
        WORKERS,
        "test-cluster-key",
        follow_caller_clock=True,
        worker_command=FAULTY_WORKER,
    ).start()
    yield c
    c.close()


@pytest.fixture
def open_ns(tmp_path, cluster):
    """Open namespaces under one data directory; all are closed at the end of the test."""
    opened: list[shardbus.Namespace] = []

    def factory(**options) -> shardbus.Namespace:
        if cluster is not None:
            options.setdefault("partition_factory", cluster.partition)
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

    b = Broker(data_dir=tmp_path_factory.mktemp("data"), port=0, workers=WORKERS).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def conn_str(broker) -> str:
    return broker.connection_string
