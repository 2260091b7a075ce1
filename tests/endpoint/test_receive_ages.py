"""``_observe_ages`` (a delivered chunk's wait times observed from their enqueued times, no age per message) leaves
the receive-wait histogram as ``_observe_all`` of each delivery's age does: the same bucket counts, and the same
sum but for float rounding."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from shardbus.endpoint.receiving import _observe_ages, _observe_all

NOW = 1_700_000_000_000.25  # ms, as time.time() * 1000 gives it

CASES = [
    [],
    [int(NOW) - 5],  # one, within the first bucket
    [int(NOW) - 5, int(NOW) - 7, int(NOW) - 3],  # a usual chunk: all in one bucket
    [int(NOW) - 5, int(NOW) - 50_000],  # decades apart: two buckets
    [int(NOW) - 20_000_000],  # beyond the last bound
    [int(NOW) + 10, int(NOW) - 5],  # enqueued after now (another clock): 0 for it
    [int(NOW)],  # just before now
    [None, int(NOW) - 5],  # no enqueued time
    [None],
    [None, None],
]


def _histogram() -> Histogram:
    return Histogram("h_seconds", "h", buckets=(0.001, 0.01, 0.1, 0.5, 1.0, 5.0), registry=CollectorRegistry())


def _state(h: Histogram) -> tuple[list[float], float]:
    return [b.get() for b in h._buckets], h._sum.get()


@pytest.mark.parametrize("enqueued", CASES)
def test_ages_from_enqueued_times_match_each_age(enqueued: list[int | None]) -> None:
    fast, each = _histogram(), _histogram()
    _observe_ages(fast, enqueued, NOW)
    _observe_all(each, [0.0 if e is None or e >= NOW else (NOW - e) / 1000 for e in enqueued])
    (fast_buckets, fast_sum), (each_buckets, each_sum) = _state(fast), _state(each)
    assert fast_buckets == each_buckets
    assert fast_sum == pytest.approx(each_sum, rel=1e-9, abs=1e-12)
