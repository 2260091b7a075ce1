"""The HTTP side of the listener without the SDK: protocol sniffing, /health, raw ATOM errors, TLS files and options.

One broker for the module (others only where a test is about start-up: certificate reuse, own certificates, the
``serve`` command).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import stat
from datetime import timedelta

import pytest
from cryptography import x509

from serve_process import ServeProcess
from shardbus.access.sas import generate_token
from shardbus.cli import main as cli_main
from shardbus.http.tls import ensure_certificates
from shardbus.http.xmlvalues import TIMESPAN_MAX_TEXT, format_duration, parse_duration
from shardbus.model import errors
from shardbus.model.entities import TIMESPAN_MAX
from shardbus.server import DEFAULT_KEY_NAME, Broker

ENTRY = (
    '<?xml version="1.0" encoding="utf-8"?><entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
    '<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">{}'
    "</QueueDescription></content></entry>"
)


def _https(broker, cafile=None) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=cafile or str(broker.ca_path))
    return http.client.HTTPSConnection("localhost", broker.server.port, context=context, timeout=10)


def _token(broker) -> str:
    return generate_token(f"https://localhost:{broker.server.port}", DEFAULT_KEY_NAME, broker.key)


def _request(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.getheader("content-type") or "", response.read()


# --- sniffing and health -------------------------------------------------------------------------------------------
def test_health_over_plain_http_and_https(broker):
    conn = http.client.HTTPConnection("127.0.0.1", broker.server.port, timeout=10)
    status, ctype, body = _request(conn, "GET", "/health")
    assert status == 200 and ctype.startswith("application/json")
    health = json.loads(body)
    assert health["alive"] is True and health["ready"] is True
    assert broker.namespace.name in health["namespaces"]
    status, _, body = _request(conn, "GET", "/health")  # keep-alive: a second request on the same connection
    assert status == 200
    conn.close()
    tls = _https(broker)
    status, _, body = _request(tls, "GET", "/health")
    assert status == 200 and json.loads(body)["ready"] is True
    tls.close()


def test_health_lists_limited_entities(broker, ns, name):
    q = name("q")
    ns.create_queue(q, enable_partitioning=True)
    ns.faults.stop_partition(q, 1)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", broker.server.port, timeout=10)
        health = json.loads(_request(conn, "GET", "/health")[2])
        assert q in health["namespaces"][ns.name]["limited"]
    finally:
        ns.faults.restore_partition(q, 1)


def test_amqp_and_https_connections_interleave(broker, conn_str, name):
    """An HTTPS connection stays open (keep-alive) while AMQP clients come and go on the same port."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    q = name("q")
    broker.namespace.create_queue(q)
    tls = _https(broker)
    assert _request(tls, "GET", "/health")[0] == 200
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages(ServiceBusMessage("x"))
        path = f"/{q}?api-version=2024-05"
        status, ctype, body = _request(tls, "GET", path, headers={"Authorization": _token(broker)})
        assert status == 200 and "xml" in ctype
        assert b"<d2p1:ActiveMessageCount>1</d2p1:ActiveMessageCount>" in body
        with client.get_queue_receiver(q, max_wait_time=5) as receiver:
            assert [str(m) for m in receiver.receive_messages(max_wait_time=5)] == ["x"]
    tls.close()


def test_unknown_first_byte_gets_an_amqp_answer(broker):
    with socket.create_connection(("127.0.0.1", broker.server.port), timeout=5) as sock:
        sock.sendall(b"\x00garbage")
        reply = sock.recv(8)
    assert reply.startswith(b"AMQP")  # the engine answers a bad header with its own header, then closes


def test_tls_handshake_failure_closes_only_that_connection(broker):
    with socket.create_connection(("127.0.0.1", broker.server.port), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01\x00\x05hello-not-tls")
        while sock.recv(100):  # perhaps a TLS alert, then the server closes (a timeout here fails the test)
            pass
    assert _request(_https(broker), "GET", "/health")[0] == 200


# --- raw ATOM answers ----------------------------------------------------------------------------------------------
def test_missing_or_bad_token_is_401(broker):
    conn = _https(broker)
    status, ctype, body = _request(conn, "GET", "/$namespaceinfo?api-version=2024-05")
    assert status == 401 and "xml" in ctype
    assert b"<Code>401</Code>" in body and b"MissingToken" in body
    status, _, body = _request(conn, "GET", "/$namespaceinfo", headers={"Authorization": "Bearer abc"})
    assert status == 401
    entity_token = generate_token(f"https://localhost:{broker.server.port}/q1", DEFAULT_KEY_NAME, broker.key)
    status, _, body = _request(conn, "GET", "/$Resources/queues", headers={"Authorization": entity_token})
    assert status == 401 and b"InvalidAudience" in body  # a token for one entity does not list the namespace


def test_bad_requests_are_400_with_a_reason(broker, name):
    conn = _https(broker)
    auth = {"Authorization": _token(broker), "Content-Type": "application/atom+xml"}
    status, ctype, body = _request(conn, "PUT", f"/{name('q')}?api-version=2024-05", b"<entry><oops", auth)
    assert status == 400 and "xml" in ctype and b"not well-formed" in body
    bad_duration = ENTRY.format("<LockDuration>soon</LockDuration>").encode()
    status, _, body = _request(conn, "PUT", f"/{name('q')}", bad_duration, auth)
    assert status == 400 and b"LockDuration" in body
    status, _, body = _request(conn, "GET", "/$namespaceinfo?api-version=1999-01", headers=auth)
    assert status == 400 and b"api-version" in body
    status, _, _ = _request(conn, "POST", "/$namespaceinfo", b"", auth)
    assert status == 405


def test_hand_written_put_and_paths_with_slashes(broker, ns):
    conn = _https(broker)
    auth = {"Authorization": _token(broker), "Content-Type": "application/atom+xml"}
    body = ENTRY.format("<MaxDeliveryCount>3</MaxDeliveryCount><LockDuration>PT30S</LockDuration>").encode()
    status, ctype, answer = _request(conn, "PUT", "/orders%2Feu?api-version=2024-05", body, auth)
    assert status == 201 and ctype.startswith("application/atom+xml")
    assert ns.get_queue("orders/eu").max_delivery_count == 3
    assert ns.get_queue("orders/eu").lock_duration == timedelta(seconds=30)
    status, _, answer = _request(conn, "GET", "/orders/eu", headers=auth)  # raw slashes work too
    assert status == 200 and b'<title type="text">orders/eu</title>' in answer
    status, _, _ = _request(conn, "DELETE", "/orders%2Feu", headers=auth)
    assert status == 200
    assert "orders/eu" not in [q.name for q in ns.list_queues()]


def test_every_domain_error_has_an_http_status():
    for cls in errors.ALL_ERRORS:
        assert cls in errors.HTTP_STATUS, cls
        assert errors.http_status_of(cls("x")) == errors.HTTP_STATUS[cls]
    assert errors.http_status_of(ValueError("x")) == 500
    assert errors.http_status_of(errors.PartitionUnavailable("x")) == 503


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PT45S", timedelta(seconds=45)),
        ("P1D", timedelta(days=1)),
        ("P1DT2H3M4.5S", timedelta(days=1, hours=2, minutes=3, seconds=4.5)),
        ("PT0S", timedelta(0)),
        (TIMESPAN_MAX_TEXT, TIMESPAN_MAX),
    ],
)
def test_durations_round_trip(text, value):
    assert parse_duration(text) == value
    assert format_duration(value) == text


# --- TLS files and options -----------------------------------------------------------------------------------------
def test_local_ca_is_kept_and_reused(tmp_path):
    data = tmp_path / "data"
    with Broker(data_dir=data, port=0) as first:
        ca_bytes = first.ca_path.read_bytes()
        assert first.ca_path == data / "tls" / "ca.pem"
        assert stat.S_IMODE(os.stat(data / "tls" / "ca-key.pem").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(data / "tls" / "server-key.pem").st_mode) == 0o600
    with Broker(data_dir=data, port=0, tls_hosts=["sb.example.test"]) as second:
        assert second.ca_path.read_bytes() == ca_bytes  # clients that trust it keep working
        cert = x509.load_pem_x509_certificate((data / "tls" / "server.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "sb.example.test" in san.get_values_for_type(x509.DNSName)
        assert "localhost" in san.get_values_for_type(x509.DNSName)
        assert _request(_https(second), "GET", "/health")[0] == 200


def test_own_certificate(tmp_path):
    own = ensure_certificates(tmp_path / "elsewhere")
    with Broker(data_dir=tmp_path / "data", port=0, tls_cert=own.cert, tls_key=own.key) as broker:
        assert broker.ca_path is None
        assert not (tmp_path / "data" / "tls").exists()
        assert _request(_https(broker, cafile=str(own.ca)), "GET", "/health")[0] == 200
    with pytest.raises(ValueError):
        Broker(data_dir=tmp_path / "data", port=0, tls_cert=own.cert)
    assert cli_main(["serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--tls-cert", str(own.cert)]) == 2


def test_serve_prints_the_ca_path(tmp_path):
    data = tmp_path / "served"
    serve = ServeProcess(["--port", "0", "--data-dir", str(data)], tmp_path / "serve.log", ready_prefix="health:")
    try:
        serve.wait_ready(20)
        match = re.search(r"CA certificate: (\S+)", serve.stdout)
        assert match, serve.stdout
        assert match.group(1) == str(data / "tls" / "ca.pem")
        assert os.path.exists(match.group(1))
    finally:
        serve.kill()


def test_premium_namespace_info_and_partitioning(tmp_path):
    from azure.servicebus.management import ServiceBusAdministrationClient

    with Broker(data_dir=tmp_path / "data", port=0, tier="premium", premium_partitions=2) as broker:
        with ServiceBusAdministrationClient.from_connection_string(
            broker.connection_string, connection_verify=str(broker.ca_path), retry_total=0
        ) as admin:
            props = admin.get_namespace_properties()
            assert props.messaging_sku == "Premium" and props.messaging_units == 2
            created = admin.create_queue("pq", max_size_in_megabytes=4096)
            assert created.enable_partitioning is True  # premium partitions every entity
            assert len(broker.namespace._queue("pq").partitions) == 2
            admin.update_queue(admin.get_queue("pq"), max_delivery_count=3)
            assert admin.get_queue("pq").max_delivery_count == 3
