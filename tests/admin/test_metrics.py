"""GET /metrics: Prometheus text with per entity and partition counts, and the front end's own metrics."""

from __future__ import annotations

import http.client

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError
from prometheus_client.parser import text_string_to_metric_families


def scrape(broker) -> dict[str, list]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.server.port, timeout=10)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    assert response.status == 200 and response.getheader("content-type").startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def total(samples, name, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_per_entity_and_partition(broker, ns, conn_str, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True, max_delivery_count=5)
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            for m in got:
                receiver.complete_message(m)
        with pytest.raises(MessagingEntityNotFoundError), client.get_queue_sender("no-such-queue") as sender:
            sender.send_messages(ServiceBusMessage("x"))
    metrics = scrape(broker)
    assert total(metrics["shardbus_messages_in"], "shardbus_messages_in_total", entity=q) == 5
    assert total(metrics["shardbus_messages_out"], "shardbus_messages_out_total", entity=q) >= len(got) > 0
    assert total(metrics["shardbus_messages_active"], "shardbus_messages_active", entity=q) == 5 - len(got)
    up = [s for s in metrics["shardbus_partition_up"] if s.labels["entity"] == q]
    assert len(up) == 16 and all(s.value == 1 for s in up)
    assert total(metrics["shardbus_errors"], "shardbus_errors_total", condition="amqp:not-found") >= 1
    assert "shardbus_connections" in metrics and "shardbus_lock_expiries" in metrics
    assert total(metrics["shardbus_send_seconds"], "shardbus_send_seconds_count") >= 1  # one batch transfer
    assert total(metrics["shardbus_receive_seconds"], "shardbus_receive_seconds_count") >= len(got)


def test_metrics_show_a_partition_down(broker, ns, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    ns.faults.stop_partition(q, 2)
    try:
        up = {
            s.labels["partition"]: s.value for s in scrape(broker)["shardbus_partition_up"] if s.labels["entity"] == q
        }
        assert up["2"] == 0 and up["3"] == 1
    finally:
        ns.faults.restore_partition(q, 2)
