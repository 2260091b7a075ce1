"""Shared fixtures: namespaces in temporary data directories, and a clock tests can move."""

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
