"""Micro-benchmark: µs per rule-filter evaluation, against a plain Python lambda doing the same check.

Run with ``python bench/filters.py``. Filters compile to closures once; this measures only evaluation.
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's shardbus

from shardbus.model.filters import CorrelationFilter, SqlFilter
from shardbus.model.message import Message

NUMBER = 200_000


def per_call_us(fn: Callable[[Message], bool], message: Message) -> float:
    """Best of five runs, in microseconds per call."""
    timer = timeit.Timer(lambda: fn(message))
    return min(timer.repeat(repeat=5, number=NUMBER)) / NUMBER * 1e6


def main() -> None:
    message = Message(
        b"payload",
        correlation_id="high",
        subject="red",
        application_properties={"color": "red", "quantity": 12, "priority": "high", "store": "Store3"},
    )
    cases: list[tuple[str, Callable[[Message], bool], Callable[[Message], bool]]] = [
        (
            "correlation(correlation_id='high', color='red')",
            CorrelationFilter(correlation_id="high", properties={"color": "red"}).matches,
            lambda m: (
                m.correlation_id == "high"
                and m.application_properties is not None
                and m.application_properties.get("color") == "red"
            ),
        ),
        (
            "sql: color = 'red' AND quantity > 10",
            SqlFilter("color = 'red' AND quantity > 10").matches,
            lambda m: (
                m.application_properties is not None
                and m.application_properties.get("color") == "red"
                and m.application_properties.get("quantity", 0) > 10
            ),
        ),
        (
            "sql: sys.Label LIKE 're%' OR store IN ('Store1', 'Store2', 'Store3')",
            SqlFilter("sys.Label LIKE 're%' OR store IN ('Store1', 'Store2', 'Store3')").matches,
            lambda m: (
                (m.subject or "").startswith("re")
                or (m.application_properties or {}).get("store") in {"Store1", "Store2", "Store3"}
            ),
        ),
    ]
    print(f"{'filter':<72} {'filter µs':>10} {'lambda µs':>10} {'ratio':>7}")
    for name, compiled, baseline in cases:
        assert compiled(message) is True and bool(baseline(message)) is True
        filter_us = per_call_us(compiled, message)
        lambda_us = per_call_us(baseline, message)
        print(f"{name:<72} {filter_us:>10.3f} {lambda_us:>10.3f} {filter_us / lambda_us:>6.1f}x")


if __name__ == "__main__":
    main()
