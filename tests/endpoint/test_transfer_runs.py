"""Runs of plain transfers (amqp/transfer_run.py) through a real broker: what is stored, in what order, and what the
client is answered, are the same as through the layered path (``Connection.transfer_runs = False``), for a run with
each way out of it in its middle: a multi-frame delivery, an aborted one, a settled one, one with a state, more
transfers than the credit given, a delivery too large, a transfer on a handle never attached. Then the same through
the official SDK (sync and async) and our own client, whose concurrent sends arrive as runs."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import MessageSizeExceededError
from raw_amqp import AMQP_HEADER, SASL_HEADER, frame, performatives

from shardbus.amqp.connection import Connection
from shardbus.amqp.message import AmqpMessage, Properties
from shardbus.amqp.performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslInit,
    Source,
    Target,
    Transfer,
)
from shardbus.amqp.types import Symbol

KB = 1024
_names = itertools.count()


def _message(i: int, size: int = 1 * KB) -> bytes:
    return AmqpMessage.with_data(bytes([i % 256]) * size, properties=Properties(message_id=f"m{i}")).encode()


def _plain(did: int, settled: bool = False, size: int = 1 * KB) -> bytes:
    # our client's first transfer: message format and settled after the tag, nothing else
    t = Transfer(handle=0, delivery_id=did, delivery_tag=b"t%d" % did, message_format=0, settled=settled)
    return frame(t, _message(did, size))


def _exchange(port: int, address: str, data: bytes, expect: int) -> list[Any]:
    """Attach a sender to ``address`` over a raw socket, wait for its credit, write ``data`` at once, and return
    what the broker answered until ``expect`` deliveries were settled or it ended the session (or 5 s passed)."""
    plain = b"\x00RootManageSharedAccessKey\x00SAS_KEY_VALUE"
    attach = Attach(name="s", handle=0, role=False, source=Source(), target=Target(address=address))
    hello = b"".join(
        [
            SASL_HEADER,
            frame(SaslInit(mechanism=Symbol("PLAIN"), initial_response=plain, hostname="localhost"), frame_type=1),
            AMQP_HEADER,
            frame(Open(container_id="raw", hostname="localhost")),
            frame(Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000)),
            frame(attach),
        ]
    )
    out = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(hello)
        while not any(isinstance(p, Flow) for p in performatives(bytes(out))):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed during the handshake"
            out += chunk
        seen = len(performatives(bytes(out)))
        sock.sendall(data)
        deadline = time.monotonic() + 30  # ends at ``expect`` settlements (or an end): this only bounds a hang
        sock.settimeout(0.2)
        while time.monotonic() < deadline:
            answers = performatives(bytes(out))[seen:]
            if len(_settled(answers)) >= expect or any(isinstance(p, End | Close) for p in answers):
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            out += chunk
    return performatives(bytes(out))[seen:]


def _settled(answers: list[Any]) -> dict[int, str]:
    """Delivery id -> the outcome's name (with its condition, for a rejection), over every disposition."""
    outcomes: dict[int, str] = {}
    for p in answers:
        if isinstance(p, Disposition):
            name = type(p.state).__name__
            if getattr(p.state, "error", None) is not None:
                name += f":{p.state.error.condition}"
            for did in range(p.first, (p.first if p.last is None else p.last) + 1):
                outcomes[did] = name
    return outcomes


def _outcome(broker: Any, ns: Any, data: bytes, expect: int, runs: bool, monkeypatch: Any) -> Any:
    """What a run of ``data`` comes to: the broker's answers (settlements, errors ending things) and the queue's
    messages in order."""
    monkeypatch.setattr(Connection, "transfer_runs", runs)
    name = f"qrun{next(_names)}"
    ns.create_queue(name)
    answers = _exchange(broker.server.port, name, data, expect)
    errors = [(type(p).__name__, str(p.error.condition)) for p in answers if isinstance(p, End | Detach | Close)]
    errors = [e for e in errors if e[1] != "None"]
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_receiver(name) as receiver:
            stored: list[Any] = []
            while got := receiver.peek_messages(
                max_message_count=250, sequence_number=stored[-1].sequence_number + 1 if stored else 0
            ):
                stored += got
    return _settled(answers), errors, [str(m.message_id) for m in stored]


def _run(first: int, count: int) -> bytes:
    return b"".join(_plain(did) for did in range(first, first + count))


def _multi(did: int) -> bytes:
    m = _message(did, 3 * KB)
    return b"".join(
        [
            frame(Transfer(handle=0, delivery_id=did, delivery_tag=b"m", message_format=0, more=True), m[:1000]),
            frame(Transfer(handle=0, more=True), m[1000:2000]),
            frame(Transfer(handle=0), m[2000:]),
        ]
    )


def _aborted(did: int) -> bytes:
    m = _message(did)
    return frame(Transfer(handle=0, delivery_id=did, delivery_tag=b"a", more=True), m[:500]) + frame(
        Transfer(handle=0, aborted=True)
    )


SCENARIOS = {  # the bytes, and how many deliveries the broker settles
    "a multi-frame delivery in a run": (_run(0, 20) + _multi(20) + _run(21, 20), 41),
    "an aborted delivery in a run": (_run(0, 20) + _aborted(20) + _run(21, 20), 40),
    "settled deliveries in a run": (_run(0, 10) + _plain(10, True) + _run(11, 5) + _plain(16, True) + _run(17, 3), 18),
    "a delivery with a state in a run": (
        _run(0, 10)
        + frame(Transfer(handle=0, delivery_id=10, delivery_tag=b"s", state=Accepted()), _message(10))
        + _run(11, 10),
        21,
    ),
    "beyond the credit given": (_run(0, 1500), 1500),
    "a delivery too large in a run": (_run(0, 10) + _plain(10, size=300 * KB) + _run(11, 10), 21),
    "a handle never attached in a run": (
        _run(0, 10)
        + frame(Transfer(handle=9, delivery_id=10, delivery_tag=b"x", message_format=0, settled=False), _message(10))
        + _run(11, 10),
        10,
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_run_with_a_way_out_ends_as_through_the_layered_path(broker, ns, monkeypatch, scenario):
    data, expect = SCENARIOS[scenario]
    fast = _outcome(broker, ns, data, expect, True, monkeypatch)
    layered = _outcome(broker, ns, data, expect, False, monkeypatch)
    assert fast == layered
    settled, errors, stored = fast
    if scenario == "a handle never attached in a run":  # the session ends; what came before it is stored
        assert errors == [("End", "amqp:session:unattached-handle")] and stored == [f"m{i}" for i in range(10)]
        return
    assert not errors and len(settled) == expect
    if scenario == "settled deliveries in a run":
        assert stored == [f"m{i}" for i in range(20)]
    else:
        assert stored == [f"m{did}" for did in sorted(settled) if settled[did] == "Accepted"]
        assert len(stored) == expect - (scenario == "a delivery too large in a run")


def test_the_sdk_sends_through_runs(broker, ns, monkeypatch):
    """The SDK's sends (sync, one at a time; async, many in flight): stored in order; one too large refused alone."""
    name = f"qrun{next(_names)}"
    ns.create_queue(name)
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender(name) as sender:
            for i in range(5):
                sender.send_messages(ServiceBusMessage(b"s%d" % i, message_id=f"s{i}"))
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"x" * 300 * KB))
            sender.send_messages(ServiceBusMessage(b"s5", message_id="s5"))

    async def send_async() -> None:
        async with AsyncServiceBusClient.from_connection_string(broker.connection_string) as client:
            async with client.get_queue_sender(name) as sender:
                await asyncio.gather(
                    *(sender.send_messages(ServiceBusMessage(b"a%d" % i, message_id=f"a{i}")) for i in range(50))
                )

    asyncio.run(send_async())
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_receiver(name, max_wait_time=2) as receiver:
            got: list[Any] = []
            while len(got) < 56:
                batch = receiver.receive_messages(max_message_count=56 - len(got), max_wait_time=2)
                if not batch:
                    break
                for m in batch:
                    receiver.complete_message(m)
                got += batch
    ids = [str(m.message_id) for m in got]
    assert ids[:6] == [f"s{i}" for i in range(6)]
    assert sorted(ids[6:]) == sorted(f"a{i}" for i in range(50))


def test_our_client_sends_through_runs(broker, ns, root_client):
    """Our client's window of concurrent sends arrives as runs; a delivery too large to fit in one frame (several
    frames, refused) in their middle changes nothing for the others."""
    name = f"qrun{next(_names)}"
    ns.create_queue(name)

    async def send() -> list[Any]:
        client = await root_client()
        try:
            session = await client.session()
            sender = await session.sender(name)
            sends = [_message(i) for i in range(100)]
            sends[50] = _message(50, 1100 * KB)
            return await asyncio.gather(*(sender.send(p) for p in sends))
        finally:
            await client.close()

    outcomes = asyncio.run(send())
    assert [type(o).__name__ for o in outcomes].count("Accepted") == 99
    assert type(outcomes[50]).__name__ == "Rejected"
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_receiver(name) as receiver:
            peeked: list[Any] = []
            while len(peeked) < 99:
                batch = receiver.peek_messages(max_message_count=99 - len(peeked))
                if not batch:
                    break
                peeked += batch
    assert [str(m.message_id) for m in peeked] == [f"m{i}" for i in range(100) if i != 50]
