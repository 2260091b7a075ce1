"""A peer's protocol error ends in a proper close: ``close`` (or ``end``/``detach`` where the error is scoped) with
the condition the spec names and a description, ONE WARNING line naming it (no traceback), the socket closed and
the connection's state released; the broker serves everyone else on."""

from __future__ import annotations

import logging
import socket
import struct

import pytest

from shardbus.amqp.framing import FrameReader
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
    decode_performative,
)
from shardbus.amqp.types import Symbol

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def _frame(perf, channel: int = 0, payload: bytes = b"", frame_type: int = 0) -> bytes:
    body = perf.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


def _handshake() -> bytes:
    plain = b"\x00RootManageSharedAccessKey\x00SAS_KEY_VALUE"
    return b"".join(
        [
            SASL_HEADER,
            _frame(SaslInit(mechanism=Symbol("PLAIN"), initial_response=plain, hostname="localhost"), frame_type=1),
            AMQP_HEADER,
            _frame(Open(container_id="bad-peer", hostname="localhost")),
            _frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100)),
        ]
    )


def _performatives(data: bytes) -> list:
    reader = FrameReader()
    reader.feed(data)
    perfs = []
    while reader.buffered:
        if reader.peek(4) == b"AMQP":
            reader.read_protocol_header()
            continue
        frame = reader.next_frame()
        if frame is None:
            break
        if frame.body:
            perfs.append(decode_performative(frame.body)[0])
    return perfs


def _answers(port: int, data: bytes | tuple[bytes, bytes], close_after: bool = False) -> list:
    """Every performative the broker sent after the handshake (once it answered our begin) brought ``data``,
    until it closed the socket (or, with ``close_after``, until we did)."""
    out = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_handshake())
        while not any(isinstance(p, Begin) for p in _performatives(bytes(out))):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed during the handshake"
            out += chunk
        if isinstance(data, tuple):  # (a prelude whose answer we wait for, the violation)
            prelude, data = data
            answered = len(_performatives(bytes(out)))
            sock.sendall(prelude)
            while len(_performatives(bytes(out))) <= answered:
                out += sock.recv(65536)
        seen = len(_performatives(bytes(out)))
        sock.sendall(data)
        if close_after:
            sock.settimeout(0.5)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            assert close_after, "the broker did not close the connection"
    return _performatives(bytes(out))[seen:]


CASES = {
    # connection-scoped: close with the condition
    "open twice": (_frame(Open(container_id="again")), Close, "amqp:illegal-state"),
    "frame type 7": (struct.pack(">IBBH", 9, 2, 7, 0) + b"\x00", Close, "amqp:connection:framing-error"),
    "not a performative": (struct.pack(">IBBH", 12, 2, 0, 0) + b"\xa1\x02hi", Close, "amqp:decode-error"),
    "doff below 2": (struct.pack(">IBBH", 12, 1, 0, 0) + b"\x00\x00\x00\x00", Close, "amqp:connection:framing-error"),
    "begin on a used channel": (_frame(Begin(incoming_window=1, outgoing_window=1)), Close, "amqp:illegal-state"),
    "end on an unused channel": (_frame(End(), channel=9), Close, "amqp:not-found"),
    # session-scoped: end with the condition
    "transfer on no link": (
        _frame(Transfer(handle=5, delivery_id=0, delivery_tag=b"t"), payload=b"\x00Su\xa0\x01x"),
        End,
        "amqp:session:unattached-handle",
    ),
    # link-scoped: detach with the condition
    "first transfer without id": (
        (
            _frame(
                Attach(
                    name="s",
                    handle=0,
                    role=False,
                    source=Source(),
                    target=Target(address="q-proto"),
                    initial_delivery_count=0,
                )
            ),
            _frame(Transfer(handle=0), payload=b"\x00Su\xa0\x01x"),
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
