"""The wire beyond the SDK's happy path: namespaces by host name, large messages, SASL PLAIN, claims-based
access, and malformed input that must close only the offending connection."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardbus.amqp.transport import AmqpClient, AmqpClientError
from shardbus.server import Broker

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


@pytest.fixture(scope="module")
def two_namespace_broker(tmp_path_factory):
    b = Broker(
        data_dir=tmp_path_factory.mktemp("data"),
        port=0,
        extra_namespaces={"premiumns": {"tier": "premium", "premium_partitions": 2}},
    ).start()
    yield b
    b.stop()


@pytest.fixture
def resolve_localhost_names(monkeypatch):
    """Let '<namespace>.localhost' reach this machine, as DNS would for a real namespace host name."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        return real("127.0.0.1" if str(host).endswith(".localhost") else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_namespace_chosen_by_host_name_with_multi_frame_messages(two_namespace_broker, resolve_localhost_names):
    b = two_namespace_broker
    premium = b.namespaces["premiumns"]
    premium.create_queue("big", max_message_size_in_kilobytes=4096)  # 1 MB unless the entity says more
    port = b.server.port
    cs = (
        f"Endpoint=sb://premiumns.localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB: several 1 MiB frames each way
    with ServiceBusClient.from_connection_string(cs, retry_total=0) as client:
        with client.get_queue_sender("big") as sender:
            sender.send_messages(ServiceBusMessage(body))
        with client.get_queue_receiver("big") as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            assert b"".join(m.body) == body
            receiver.complete_message(m)
    assert len(premium._queue("big").partitions) == 2
    assert "big" not in {q.name for q in b.namespace.list_queues()}  # not in the default namespace


def test_bare_ip_reaches_the_default_namespace(two_namespace_broker):
    b = two_namespace_broker
    b.namespace.create_queue("ipq")
    cs = b.connection_string.replace("localhost", "127.0.0.1")
    with ServiceBusClient.from_connection_string(cs) as client, client.get_queue_sender("ipq") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    assert b.namespace.get_runtime_properties("ipq").active_message_count == 1


# --- SASL and claims ----------------------------------------------------------------------------------------
async def _send_raw(port: int, address: str, **connect) -> object:
    client = await AmqpClient.connect("127.0.0.1", port, timeout=10, **connect)
    try:
        session = await client.session()
        sender = await session.sender(address)
        from shardbus.amqp.message import AmqpMessage

        return await sender.send(AmqpMessage.with_data(b"raw").encode())
    finally:
        await client.close()


def test_sasl_plain_with_the_namespace_key_needs_no_token(two_namespace_broker):
    b = two_namespace_broker
    b.namespace.create_queue("plainq")
    outcome = asyncio.run(
        _send_raw(
            b.server.port,
            "plainq",
            sasl_mechanism="PLAIN",
            username="RootManageSharedAccessKey",
            password="SAS_KEY_VALUE",
        )
    )
    assert type(outcome).__name__ == "Accepted"
    assert b.namespace.get_runtime_properties("plainq").active_message_count == 1


def test_sasl_plain_with_a_wrong_key_is_refused(two_namespace_broker):
    b = two_namespace_broker
    with pytest.raises(Exception):  # noqa: B017 - the client reports the failed SASL outcome its own way
        asyncio.run(_send_raw(b.server.port, "plainq", sasl_mechanism="PLAIN", username="Root", password="nope"))


def test_links_without_a_token_are_unauthorized(two_namespace_broker):
    b = two_namespace_broker
    b.namespace.create_queue("guarded")

    async def attach() -> None:
        client = await AmqpClient.connect("127.0.0.1", b.server.port, timeout=10)
        try:
            session = await client.session()
            await session.sender("guarded")
        finally:
            await client.close()

    with pytest.raises(AmqpClientError, match="refused"):
        asyncio.run(attach())


# --- malformed input ----------------------------------------------------------------------------------------
def _read_until_closed(sock: socket.socket, limit: float = 5) -> bytes:
    sock.settimeout(limit)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _close_condition(data: bytes) -> bytes | None:
    """The error condition of the last frame if it is a 'close' with an error (None otherwise)."""
    pos = data.rfind(b"\x00\x53\x18")  # close performative descriptor
    if pos < 0:
        return None
    tail = data[pos:]
    for cond in (
        b"amqp:decode-error",
        b"amqp:connection:framing-error",
        b"amqp:invalid-field",
        b"amqp:frame-size-too-small",
        b"amqp:not-allowed",
        b"amqp:internal-error",
    ):
        if cond in tail:
            return cond
    return b"?"


def _open_frame() -> bytes:
    from shardbus.amqp.performatives import Open

    body = Open(container_id="fuzz", hostname="localhost").encode()
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


def test_garbage_after_the_header_closes_that_connection_only(broker, queue):
    q = queue()
    with socket.create_connection(("127.0.0.1", broker.server.port)) as sock:
        sock.sendall(AMQP_HEADER + _open_frame() + struct.pack(">IBBH", 12, 2, 0, 0) + b"\xff\xfe\xfd\xfc")
        data = _read_until_closed(sock)
    assert data.startswith(AMQP_HEADER)
    assert _close_condition(data) in (b"amqp:decode-error", b"amqp:connection:framing-error", b"amqp:invalid-field")
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages(ServiceBusMessage("still serving"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.sampled_from([b"", AMQP_HEADER, SASL_HEADER]), junk=st.binary(min_size=1, max_size=300))
def test_fuzzed_connections_never_harm_the_broker(broker, prefix, junk):
    with socket.create_connection(("127.0.0.1", broker.server.port)) as sock:
        sock.sendall(prefix + junk)
        sock.shutdown(socket.SHUT_WR)
        _read_until_closed(sock, limit=2)
    # The broker still answers a well-behaved client on another connection.
    with socket.create_connection(("127.0.0.1", broker.server.port), timeout=5) as ok:
        ok.sendall(AMQP_HEADER)
        assert ok.recv(8) == AMQP_HEADER


def test_a_live_sdk_connection_survives_a_bad_neighbour(broker, queue, ns):
    q = queue(enable_partitioning=True)
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages(ServiceBusMessage("before"))
            with socket.create_connection(("127.0.0.1", broker.server.port)) as bad:
                bad.sendall(AMQP_HEADER + b"\x00\x00\x00\x01garbage")
                _read_until_closed(bad, limit=2)
            sender.send_messages(ServiceBusMessage("after"))
    assert ns.get_runtime_properties(q).active_message_count == 2
