"""Prometheus metrics (``GET /metrics``): per entity and partition, read from the namespaces at scrape time, plus
the front end's own counters (connections, errors by condition, send and receive latency).

The partition brokers keep plain counters (``PartitionBroker.stats``) and do no metrics I/O; this adapter turns
them, and each partition's runtime counts, into metric families only when Prometheus asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .model.errors import ShardbusError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The front end's own metrics: one set per process, shared by every broker in it.
CONNECTIONS = Gauge("shardbus_connections", "Open AMQP connections.", registry=None)
ERRORS = Counter("shardbus_errors", "Errors returned to clients, by AMQP condition.", ["condition"], registry=None)
SEND_SECONDS = Histogram(
    "shardbus_send_seconds",
    "From a send's arrival to its acknowledgement (stored durably).",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=None,
)
RECEIVE_SECONDS = Histogram(
    "shardbus_receive_seconds",
    "How long a message waited between being enqueued and its delivery to a receiver.",
    buckets=(0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0),
    registry=None,
)
PROCESS_METRICS = (CONNECTIONS, ERRORS, SEND_SECONDS, RECEIVE_SECONDS)

_LABELS = ["namespace", "entity", "partition"]


class NamespaceCollector:
    """Per entity (queue or subscription) and partition: depth, dead letters, scheduled, size, health, and the
    partition's counters of messages in, out and lock expiries."""

    def __init__(self, namespaces: Callable[[], dict[str, Any]]) -> None:
        self._namespaces = namespaces

    def describe(self) -> list[Metric]:
        return []  # families are dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "active": GaugeMetricFamily("shardbus_messages_active", "Active messages (depth).", labels=_LABELS),
            "dead_letter": GaugeMetricFamily(
                "shardbus_messages_dead_lettered", "Messages in the dead-letter queue.", labels=_LABELS
            ),
            "scheduled": GaugeMetricFamily("shardbus_messages_scheduled", "Scheduled messages.", labels=_LABELS),
            "size_in_bytes": GaugeMetricFamily("shardbus_size_bytes", "Stored bytes.", labels=_LABELS),
        }
        up = GaugeMetricFamily("shardbus_partition_up", "1 when the partition is available.", labels=_LABELS)
        counters = {
            "incoming": CounterMetricFamily("shardbus_messages_in", "Messages stored.", labels=_LABELS),
            "delivered": CounterMetricFamily(
                "shardbus_messages_out", "Messages handed to receivers (each delivery).", labels=_LABELS
            ),
            "lock_expired": CounterMetricFamily(
                "shardbus_lock_expiries", "Locks that expired before settlement.", labels=_LABELS
            ),
        }
        for ns_name, ns in self._namespaces().items():
            for path in _receive_paths(ns):
                try:
                    target, _ = ns.resolve(path)
                except ShardbusError:
                    continue  # deleted while we looked
                for p in target.partitions:
                    labels = [ns_name, path, str(p.id)]
                    stats = p.stats(target.slot)
                    for name, family in counters.items():
                        family.add_metric(labels, getattr(stats, name))
                    try:
                        runtime = p.runtime(target.slot)
                    except ShardbusError:
                        up.add_metric(labels, 0)
                        continue
                    up.add_metric(labels, 1)
                    gauges["active"].add_metric(labels, runtime.active_message_count)
                    gauges["dead_letter"].add_metric(labels, runtime.dead_letter_message_count)
                    gauges["scheduled"].add_metric(labels, runtime.scheduled_message_count)
                    gauges["size_in_bytes"].add_metric(labels, runtime.size_in_bytes)
        yield from gauges.values()
        yield up
        yield from counters.values()


def _receive_paths(ns: Any) -> list[str]:
    paths = [q.name for q in ns.list_queues()]
    for topic in ns.list_topics():
        paths += [f"{topic.name}/Subscriptions/{s.name}" for s in ns.list_subscriptions(topic.name)]
    return paths


def registry_for(namespaces: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry with the process's front-end metrics and the given namespaces' entity metrics."""
    registry = CollectorRegistry(auto_describe=False)
    for metric in PROCESS_METRICS:
        registry.register(metric)
    registry.register(NamespaceCollector(namespaces))  # type: ignore[arg-type]
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def count_error(condition: str) -> None:
    ERRORS.labels(condition).inc()
