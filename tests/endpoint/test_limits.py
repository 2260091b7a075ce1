"""Connection limits through real sockets (endpoint/limits.py): connections per broker, sessions and links per
connection, idle time-outs both ways, and sockets that never open. A broker with tiny limits serves the module."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from shardbus.amqp import framing
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.events import ConnectionClosed, ConnectionOpened
from shardbus.amqp.performatives import Source, Target
from shardbus.amqp.transport import AmqpClient, AmqpClientError
from shardbus.endpoint.limits import ConnectionLimits
from shardbus.server import Broker

LIMITS = ConnectionLimits(
    max_connections=4, max_sessions=2, max_links_per_session=8, max_links=3, idle_timeout=0.5, handshake_timeout=1.0
)
PLAIN = {"sasl_mechanism": "PLAIN", "username": "RootManageSharedAccessKey", "password": "SAS_KEY_VALUE"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(data_dir=tmp_path_factory.mktemp("limits"), port=0, limits=LIMITS).start()
    b.namespace.create_queue("q")
    yield b
    b.stop()


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def raw_exchange(port: int, client: Connection, seconds: float = 5.0, send_heartbeats: bool = False) -> list:
    """Send what ``client`` has pipelined over a raw socket, read until the broker closes (or ``seconds`` pass);
    the client engine's events. With ``send_heartbeats`` the socket stays silent otherwise (no timers run)."""
    events: list = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(client.data_to_send())
        sock.settimeout(0.1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            client.receive_data(data)
            events += client.next_events()
            out = client.data_to_send()
            if out:
                sock.sendall(out)
            if not data or any(isinstance(e, ConnectionClosed) for e in events):
                break
    return events


def plain_client(**options) -> Connection:
    conn = Connection(Role.CLIENT, "raw", hostname="localhost", **PLAIN, **options)
    conn.open()
    return conn


def closed_with(events: list) -> str | None:
    closed = [e for e in events if isinstance(e, ConnectionClosed)]
    assert closed, f"the broker did not close the connection: {events}"
    return str(closed[0].error.condition) if closed[0].error else None


# --- connections ----------------------------------------------------------------------------------------------
def test_connections_beyond_the_limit_are_refused_and_the_rest_go_on(broker):
    async def scenario() -> None:
        clients = [await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN) for _ in range(4)]
        try:
            wait_until(lambda: broker.server.amqp_connections == 4)
            extra = await AmqpClient.connect("127.0.0.1", broker.server.port, timeout=5, **PLAIN)
            for _ in range(100):  # the broker answered open, then closed at once: nothing more is served
                if extra._conn.is_done:
                    break
                await asyncio.sleep(0.02)
            assert str(extra._conn.error.condition) == "amqp:resource-limit-exceeded"
            assert "--max-connections" in extra._conn.error.description
            session = await clients[0].session()  # the connections within the limit are served as before
            await (await session.sender("q")).close()
        finally:
            await clients[0].close()
        wait_until(lambda: broker.server.amqp_connections == 3)
        again = await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN)  # room again
        await again.session()
        for c in [*clients[1:], again]:
            await c.close()

    asyncio.run(scenario())
    wait_until(lambda: broker.server.amqp_connections == 0)


def test_refusal_names_the_condition_on_the_wire(broker):
    async def fill() -> list[AmqpClient]:
        return [await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN) for _ in range(4)]

    loop = asyncio.new_event_loop()
    try:
        clients = loop.run_until_complete(fill())
        wait_until(lambda: broker.server.amqp_connections == 4)
        events = raw_exchange(broker.server.port, plain_client())
        assert any(isinstance(e, ConnectionOpened) for e in events)
        assert closed_with(events) == "amqp:resource-limit-exceeded"
        for c in clients:
            loop.run_until_complete(c.close())
    finally:
        loop.close()


# --- sessions and links ---------------------------------------------------------------------------------------
def test_open_and_begin_announce_the_limits(broker):
    client = plain_client()
    client.begin()
    events = raw_exchange(broker.server.port, client, seconds=1.0)
    opened = next(e for e in events if isinstance(e, ConnectionOpened))
    assert opened.open.channel_max == 1
    assert opened.open.idle_time_out == 500
    assert client.sessions[0].remote_handle_max == 7


def test_a_session_beyond_channel_max_closes_the_connection_with_framing_error(broker):
    client = plain_client()
    for _ in range(3):  # pipelined before the broker's open: channels 0, 1 and 2 (channel-max is 1)
        client.begin()
    assert closed_with(raw_exchange(broker.server.port, client)) == "amqp:connection:framing-error"


def test_a_handle_beyond_handle_max_closes_the_connection_with_framing_error(broker):
    client = plain_client()
    session = client.begin()
    for i in range(9):  # handles 0..8, handle-max is 7
        client.attach(session, f"cbs-{i}", role=False, source=Source(address="$cbs"), target=Target(address="$cbs"))
    assert closed_with(raw_exchange(broker.server.port, client)) == "amqp:connection:framing-error"


def test_links_beyond_the_connection_limit_are_refused_alone(broker):
    async def scenario() -> None:
        client = await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN)
        try:
            first = await client.session()
            second = await client.session()
            senders = [await first.sender("q", name="a"), await first.sender("q", name="b")]
            senders.append(await second.sender("q", name="c"))  # links count over all sessions
            with pytest.raises(AmqpClientError, match="links, the broker's limit per connection"):
                await second.sender("q", name="d")
            await senders[0].close()  # the connection goes on, and a detached link frees its place
            await (await second.sender("q", name="e")).send(b"\x00Sw\xa1\x01x")
        finally:
            await client.close()

    asyncio.run(scenario())


# --- silence ----------------------------------------------------------------------------------------------------
def test_a_silent_connection_is_closed_after_twice_the_announced_idle_time(broker):
    client = plain_client()
    started = time.monotonic()
    events = raw_exchange(broker.server.port, client, seconds=5.0)  # opens, then says nothing
    took = time.monotonic() - started
    assert closed_with(events) == "amqp:resource-limit-exceeded"
    assert took >= 2 * LIMITS.idle_timeout * 0.9, took


def test_a_client_sending_empty_frames_stays_connected(broker):
    async def scenario() -> None:
        client = await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN)  # honours the 0.5 s
        try:
            await asyncio.sleep(2.5)
            session = await client.session()
            await (await session.sender("q")).close()
        finally:
            await client.close()

    asyncio.run(scenario())


def test_the_broker_sends_empty_frames_to_honour_the_clients_idle_timeout(broker):
    client = plain_client(idle_timeout=0.4)  # asks for a frame at least every 0.4 s
    heartbeats = 0
    with socket.create_connection(("127.0.0.1", broker.server.port)) as sock:
        sock.sendall(client.data_to_send())
        sock.settimeout(0.1)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                sock.sendall(framing.heartbeat_frame())  # keep our side alive too
                continue
            heartbeats += data.count(framing.heartbeat_frame())
            client.receive_data(data)
            client.next_events()
            sock.sendall(client.data_to_send())  # the SASL exchange's answers, then our pipelined open
    assert heartbeats >= 4, heartbeats  # 2 s at one per <= 0.2 s (half the time-out), with room for scheduling


def test_a_socket_that_never_opens_is_dropped(broker):
    for first_bytes in (b"", b"AMQP\x03\x01\x00\x00"):  # nothing at all, or a SASL header and then nothing
        with socket.create_connection(("127.0.0.1", broker.server.port)) as sock:
            if first_bytes:
                sock.sendall(first_bytes)
            sock.settimeout(5)
            started = time.monotonic()
            while sock.recv(65536):
                pass
            assert time.monotonic() - started < 4
    wait_until(lambda: len(broker.server.connections) == 0)


# --- backpressure -------------------------------------------------------------------------------------------------
@pytest.mark.embedded_only
def test_a_fast_producer_against_a_slow_store_gets_server_busy(broker):
    """Unsettled transfers pumped without waiting: past the partition's bound of unwritten bytes the broker rejects
    them with com.microsoft:server-busy (the SDK's ServiceBusServerBusyError, which it retries after a pause); what
    it accepted is stored, and it takes sends again once the store caught up."""
    from shardbus.amqp.message import AmqpMessage
    from shardbus.amqp.message import BodyType as WireBody
    from shardbus.amqp.performatives import Accepted, Rejected

    broker.namespace.create_queue("busy")
    partition = broker.namespace._queue("busy").partitions[0]
    partition.max_unwritten_bytes = 16 * 1024
    store = partition._committer.store
    apply, fast = store.apply, threading.Event()

    def slow_apply(ops, sync=True):  # a slow disk until ``fast`` is set
        if not fast.is_set():
            time.sleep(0.1)
        return apply(ops, sync)

    store.apply = slow_apply
    payload = AmqpMessage(body=[b"x" * 1024], body_type=WireBody.DATA).encode()

    async def pump(count: int) -> list:
        client = await AmqpClient.connect("127.0.0.1", broker.server.port, **PLAIN)
        try:
            sender = await (await client.session()).sender("busy")
            return await asyncio.gather(*(sender.send(payload) for _ in range(count)))
        finally:
            await client.close()

    outcomes = asyncio.run(pump(300))
    busy = [o for o in outcomes if isinstance(o, Rejected)]
    assert busy and all(str(o.error.condition) == "com.microsoft:server-busy" for o in busy)
    accepted = sum(isinstance(o, Accepted) for o in outcomes)
    assert accepted + len(busy) == 300
    fast.set()
    assert all(isinstance(o, Accepted) for o in asyncio.run(pump(20)))
    assert broker.namespace.get_runtime_properties("busy").active_message_count == accepted + 20


def test_an_idle_http_keep_alive_connection_is_closed(broker, monkeypatch):
    from shardbus.http import protocol

    monkeypatch.setattr(protocol, "IDLE_TIMEOUT", 0.5)
    with socket.create_connection(("127.0.0.1", broker.server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        while sock.recv(65536):  # kept alive, then closed once silent for the idle time-out
            pass
        assert 0.3 < time.monotonic() - started < 4
