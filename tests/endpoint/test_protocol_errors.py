"""A peer's protocol error ends in a proper close: ``close`` (or ``end``/``detach`` where the error is scoped) with
the condition the spec names and a description, ONE WARNING line naming it (no traceback), the socket closed and
the connection's state released; the broker serves everyone else on."""

from __future__ import annotations

import logging
import socket
import struct

import pytest
from raw_amqp import AMQP_HEADER, SASL_HEADER, frame, performatives

from shardbus.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    End,
    Open,
    SaslInit,
    Source,
    Target,
    Transfer,
)
from shardbus.amqp.types import Symbol


def _handshake() -> bytes:
    plain = b"\x00RootManageSharedAccessKey\x00SAS_KEY_VALUE"
    return b"".join(
        [
            SASL_HEADER,
            frame(SaslInit(mechanism=Symbol("PLAIN"), initial_response=plain, hostname="localhost"), frame_type=1),
            AMQP_HEADER,
            frame(Open(container_id="bad-peer", hostname="localhost")),
            frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100)),
        ]
    )


def _answers(port: int, data: bytes | tuple[bytes, bytes], close_after: bool = False) -> list:
    """Every performative the broker sent after the handshake (once it answered our begin) brought ``data``,
    until it closed the socket (or, with ``close_after``, until we did)."""
    out = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_handshake())
        while not any(isinstance(p, Begin) for p in performatives(bytes(out))):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed during the handshake"
            out += chunk
        if isinstance(data, tuple):  # (a prelude whose answer we wait for, the violation)
            prelude, data = data
            answered = len(performatives(bytes(out)))
            sock.sendall(prelude)
            while len(performatives(bytes(out))) <= answered:
                out += sock.recv(65536)
        seen = len(performatives(bytes(out)))
        sock.sendall(data)
        if close_after:
            sock.settimeout(0.5)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            assert close_after, "the broker did not close the connection"
    return performatives(bytes(out))[seen:]


CASES = {
    # connection-scoped: close with the condition
    "open twice": (frame(Open(container_id="again")), Close, "amqp:illegal-state"),
    "frame type 7": (struct.pack(">IBBH", 9, 2, 7, 0) + b"\x00", Close, "amqp:connection:framing-error"),
    "not a performative": (struct.pack(">IBBH", 12, 2, 0, 0) + b"\xa1\x02hi", Close, "amqp:decode-error"),
    "doff below 2": (struct.pack(">IBBH", 12, 1, 0, 0) + b"\x00\x00\x00\x00", Close, "amqp:connection:framing-error"),
    "begin on a used channel": (frame(Begin(incoming_window=1, outgoing_window=1)), Close, "amqp:illegal-state"),
    "end on an unused channel": (frame(End(), channel=9), Close, "amqp:not-found"),
    # session-scoped: end with the condition
    "transfer on no link": (
        frame(Transfer(handle=5, delivery_id=0, delivery_tag=b"t"), payload=b"\x00Su\xa0\x01x"),
        End,
        "amqp:session:unattached-handle",
    ),
    # link-scoped: detach with the condition
    "first transfer without id": (
        (
            frame(
                Attach(
                    name="s",
                    handle=0,
                    role=False,
                    source=Source(),
                    target=Target(address="q-proto"),
                    initial_delivery_count=0,
                )
            ),
            frame(Transfer(handle=0), payload=b"\x00Su\xa0\x01x"),
        ),
        Detach,
        "amqp:invalid-field",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_violation_gets_its_condition_and_one_warning(broker, ns, caplog, case):
    if "q-proto" not in {q.name for q in ns.list_queues()}:
        ns.create_queue("q-proto")
    data, kind, condition = CASES[case]
    caplog.set_level(logging.INFO)
    scoped = kind is not Close
    answers = _answers(broker.server.port, data, close_after=scoped)
    errors = [p for p in answers if isinstance(p, Close | End | Detach) and p.error is not None]
    assert [(type(p), str(p.error.condition)) for p in errors] == [(kind, condition)], answers
    assert errors[0].error.description
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("shardbus")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert condition in warnings[0].getMessage() and warnings[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_violating_connections_leave_nothing_behind(broker, ns):
    import time

    if "q-proto" not in {q.name for q in ns.list_queues()}:
        ns.create_queue("q-proto")
    for data, _, _ in CASES.values():
        _answers(broker.server.port, data, close_after=True)
    deadline = time.monotonic() + 5
    while broker.server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not broker.server.connections
