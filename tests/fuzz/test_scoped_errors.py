"""Errors scoped as the spec scopes them (AMQP 1.0 part 2, 2.8.15-2.8.18), over a real socket: a session-level
error ends that session only (``end`` with the condition, after answering its ``begin`` if it was not answered
yet), a link-level error detaches that link only (``detach`` closed=true with the condition, after an ``attach``
with null source and target if it was not answered yet). The connection, its other sessions and their links keep
sending and receiving; the broker logs one WARNING line without a traceback and keeps nothing of what it ended."""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid

import pytest
from fuzz_wire import AMQP_HEADER, KEY, KEY_NAME, SASL_HEADER, wait_for_no_connections

from shardbus.amqp.framing import FrameReader
from shardbus.amqp.message import AmqpMessage, decode_message
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
    SaslOutcome,
    Source,
    Target,
    Transfer,
    decode_performative,
)
from shardbus.amqp.types import Symbol


def _frame(perf, channel: int = 0, payload: bytes = b"", frame_type: int = 0) -> bytes:
    body = perf.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


class Peer:
    """A hand-driven client on a raw socket: writes frames, reads the broker's performatives one by one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader()
        self.seen: list[tuple[int, object, bytes]] = []  # (channel, performative, payload)
        self.waiting: list[tuple[int, object, bytes]] = []  # read but not taken by ``expect`` yet
        self.queue = "fuzzq"
        plain = b"\x00" + KEY_NAME.encode() + b"\x00" + KEY.encode()
        self.send(
            SASL_HEADER,
            _frame(SaslInit(mechanism=Symbol("PLAIN"), initial_response=plain, hostname="localhost"), frame_type=1),
            AMQP_HEADER,
            _frame(Open(container_id="scoped", hostname="localhost", max_frame_size=65536)),
        )
        self.expect(lambda c, p: isinstance(p, Open))

    def send(self, *parts: bytes) -> None:
        self.sock.sendall(b"".join(parts))

    def _read_one(self, deadline: float) -> tuple[int, object, bytes]:
        while True:
            if self.reader.buffered >= 8 and self.reader.peek(4) == b"AMQP":
                self.reader.read_protocol_header()
                continue
            frame = self.reader.next_frame() if self.reader.buffered else None
            if frame is not None:
                if not frame.body:
                    continue
                perf, offset = decode_performative(frame.body)
                if isinstance(perf, SaslOutcome) or not hasattr(perf, "CODE") or perf.CODE >= 0x40:
                    continue
                item = (frame.channel, perf, bytes(frame.body[offset:]))
                self.seen.append(item)
                return item
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise AssertionError(f"the broker closed the connection; it sent {self.summary()}")
            self.reader.feed(chunk)

    def expect(self, match, limit: float = 10.0) -> tuple[int, object, bytes]:
        """The first performative ``match(channel, perf)`` accepts, among those not taken yet or coming."""
        for i, (channel, perf, payload) in enumerate(self.waiting):
            if match(channel, perf):
                del self.waiting[i]
                return channel, perf, payload
        deadline = time.monotonic() + limit
        while True:
            try:
                channel, perf, payload = self._read_one(deadline)
            except TimeoutError:
                raise AssertionError(f"nothing matching came; the broker sent {self.summary()}") from None
            if isinstance(perf, Close):
                raise AssertionError(f"the broker closed the connection: {perf.error}")
            if match(channel, perf):
                return channel, perf, payload
            self.waiting.append((channel, perf, payload))

    def summary(self) -> list[str]:
        return [f"{type(p).__name__}@{c}" for c, p, _ in self.seen]

    def close(self) -> None:
        self.send(_frame(Close()))
        try:
            self.expect(lambda c, p: False, limit=2)
        except AssertionError:
            pass
        self.sock.close()

    # -- a well-behaved session with a sender and a receiver on ``fuzzq`` ----------------------------------------------
    def good_session(self, channel: int, queue: str = "fuzzq") -> int:
        """Begin a session on ``channel``, attach a sender (handle 0) and a receiver (handle 1) to ``fuzzq`` and
        wait until the sender has credit. Returns the broker's channel for it."""
        self.send(_frame(Begin(next_outgoing_id=0, incoming_window=5000, outgoing_window=5000), channel))
        ours, _, _ = self.expect(lambda c, p: isinstance(p, Begin) and p.remote_channel == channel)
        self.send(
            _frame(
                Attach(
                    name="s",
                    handle=0,
                    role=False,
                    source=Source(address="me"),
                    target=Target(address=queue),
                    initial_delivery_count=0,
                ),
                channel,
            ),
            _frame(
                Attach(
                    name="r",
                    handle=1,
                    role=True,
                    source=Source(address=queue),
                    target=Target(address="me"),
                    rcv_settle_mode=1,
                ),
                channel,
            ),
        )
        self.expect(lambda c, p: c == ours and isinstance(p, Flow) and p.handle is not None and p.link_credit)
        return ours

    def round_trip(self, channel: int, ours: int, delivery_id: int) -> None:
        """Send one message on the good session's sender, get it accepted, receive it back and complete it."""
        body = str(uuid.uuid4()).encode()
        self.send(
            _frame(
                Transfer(handle=0, delivery_id=delivery_id, delivery_tag=b"t%d" % delivery_id, message_format=0),
                channel,
                AmqpMessage.with_data(body).encode(),
            )
        )
        _, d, _ = self.expect(
            lambda c, p: c == ours and isinstance(p, Disposition) and p.first == delivery_id and p.role
        )
        assert isinstance(d.state, Accepted), d
        self.send(
            _frame(
                Flow(
                    next_incoming_id=0,
                    incoming_window=5000,
                    next_outgoing_id=delivery_id + 1,
                    outgoing_window=5000,
                    handle=1,
                    delivery_count=0,
                    link_credit=1000,
                ),
                channel,
            )
        )
        while True:
            _, t, payload = self.expect(lambda c, p: c == ours and isinstance(p, Transfer))
            if decode_message(payload).body == [body] or decode_message(payload).body == body:
                break
            self.settle(channel, t.delivery_id)
        self.settle(channel, t.delivery_id)

    def settle(self, channel: int, delivery_id: int) -> None:
        self.send(_frame(Disposition(role=True, first=delivery_id, settled=True, state=Accepted()), channel))


@pytest.fixture
def peer(fuzz_broker):
    queue = f"scoped-{uuid.uuid4().hex[:8]}"
    fuzz_broker.namespace.create_queue(queue)
    p = Peer(fuzz_broker.server.port)
    ours = p.good_session(0, queue)
    p.round_trip(0, ours, 0)
    p.ours = ours
    yield p
    p.round_trip(0, ours, 1)  # the session and links that did nothing wrong go on after the error
    p.round_trip(0, ours, 2)
    p.close()
    wait_for_no_connections(fuzz_broker)
    fuzz_broker.namespace.delete_queue(queue)


def _warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == logging.WARNING and r.name.startswith("shardbus")]


def _ended(peer: Peer, condition: str) -> tuple[int, End]:
    channel, end, _ = peer.expect(lambda c, p: isinstance(p, End))
    assert end.error is not None and str(end.error.condition) == condition, end
    return channel, end


def _check_one_warning(records: list[logging.LogRecord], condition: str) -> None:
    warnings = _warnings(records)
    assert len([w for w in warnings if condition in w]) == 1, warnings
    assert not [r for r in records if r.exc_info], "a traceback was logged"


# --- session-level errors -------------------------------------------------------------------------------------------
def test_unattached_handle_on_an_answered_session_ends_it_only(peer, no_error_logs):
    peer.send(_frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100), 1))
    ch, _, _ = peer.expect(lambda c, p: isinstance(p, Begin) and p.remote_channel == 1)
    peer.send(_frame(Transfer(handle=7, delivery_id=0, delivery_tag=b"x"), 1, AmqpMessage.with_data(b"x").encode()))
    channel, _ = _ended(peer, "amqp:session:unattached-handle")
    assert channel == ch
    peer.send(_frame(End(), 1))
    _check_one_warning(no_error_logs, "unattached-handle")


def test_an_error_in_a_session_not_answered_yet_answers_its_begin_then_ends_it(peer, no_error_logs):
    """Begin and a flow for a handle never attached, in one write: the broker has not answered the begin when it
    meets the error, so it answers it first (the peer must learn the channel it ends)."""
    peer.send(
        _frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100), 1)
        + _frame(
            Flow(
                next_incoming_id=0,
                incoming_window=100,
                next_outgoing_id=0,
                outgoing_window=100,
                handle=9,
                delivery_count=0,
                link_credit=5,
            ),
            1,
        )
    )
    ch, _, _ = peer.expect(lambda c, p: isinstance(p, Begin) and p.remote_channel == 1)
    channel, _ = _ended(peer, "amqp:session:unattached-handle")
    assert channel == ch
    peer.send(_frame(End(), 1))
    _check_one_warning(no_error_logs, "unattached-handle")


def test_a_handle_attached_twice_ends_the_session(peer, no_error_logs):
    peer.send(_frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100), 1))
    ch, _, _ = peer.expect(lambda c, p: isinstance(p, Begin) and p.remote_channel == 1)
    attach = dict(
        handle=0, role=False, source=Source(address="me"), target=Target(address="fuzzq"), initial_delivery_count=0
    )
    peer.send(_frame(Attach(name="one", **attach), 1) + _frame(Attach(name="two", **attach), 1))
    channel, _ = _ended(peer, "amqp:session:handle-in-use")
    assert channel == ch
    peer.send(_frame(End(), 1))
    _check_one_warning(no_error_logs, "handle-in-use")


def test_a_begin_answering_no_begin_of_ours_is_answered_and_ended(peer, no_error_logs):
    """The broker begins no session, so a begin with a remote-channel answers nothing: that session is refused,
    not the connection."""
    peer.send(_frame(Begin(remote_channel=5, next_outgoing_id=0, incoming_window=100, outgoing_window=100), 1))
    ch, _, _ = peer.expect(lambda c, p: isinstance(p, Begin) and p.remote_channel == 1)
    channel, _ = _ended(peer, "amqp:illegal-state")
    assert channel == ch
    peer.send(_frame(End(), 1))
    _check_one_warning(no_error_logs, "illegal-state")


# --- link-level errors ----------------------------------------------------------------------------------------------
def test_a_transfer_on_a_link_not_answered_yet_detaches_that_link_only(peer, no_error_logs):
    """Attach and a transfer in one write: no credit was granted, so the link is refused (attach with null source
    and target, then detach with the condition) and the session goes on."""
    peer.send(
        _frame(
            Attach(
                name="eager",
                handle=5,
                role=False,
                source=Source(address="me"),
                target=Target(address="fuzzq"),
                initial_delivery_count=0,
            ),
            0,
        )
        + _frame(Transfer(handle=5, delivery_id=100, delivery_tag=b"e"), 0, AmqpMessage.with_data(b"e").encode())
    )
    _, attach, _ = peer.expect(lambda c, p: isinstance(p, Attach) and p.name == "eager")
    assert attach.source is None and attach.target is None
    _, detach, _ = peer.expect(lambda c, p: isinstance(p, Detach) and p.handle == attach.handle)
    assert detach.closed and str(detach.error.condition) == "amqp:link:transfer-limit-exceeded", detach
    peer.send(_frame(Detach(handle=5, closed=True), 0))
    _check_one_warning(no_error_logs, "transfer-limit-exceeded")


def test_a_first_transfer_without_a_delivery_id_detaches_that_link_only(peer, no_error_logs):
    peer.send(
        _frame(
            Attach(
                name="bad",
                handle=5,
                role=False,
                source=Source(address="me"),
                target=Target(address="fuzzq"),
                initial_delivery_count=0,
            ),
            0,
        )
    )
    _, attach, _ = peer.expect(lambda c, p: isinstance(p, Attach) and p.name == "bad")
    peer.expect(lambda c, p: isinstance(p, Flow) and p.handle == attach.handle and p.link_credit)
    peer.send(_frame(Transfer(handle=5, delivery_tag=b"b"), 0, AmqpMessage.with_data(b"b").encode()))
    _, detach, _ = peer.expect(lambda c, p: isinstance(p, Detach) and p.handle == attach.handle)
    assert detach.closed and str(detach.error.condition) == "amqp:invalid-field", detach
    peer.send(_frame(Detach(handle=5, closed=True), 0))
    _check_one_warning(no_error_logs, "invalid-field")


def test_scoped_errors_leave_nothing_behind(fuzz_broker):
    """After each of the above, the connection's state is gone once it closes (checked by the fixture); here: many
    refused sessions and links on one connection cost nothing once refused."""
    queue = f"scoped-{uuid.uuid4().hex[:8]}"
    fuzz_broker.namespace.create_queue(queue)
    peer = Peer(fuzz_broker.server.port)
    ours = peer.good_session(0, queue)
    for _ in range(50):
        peer.send(
            _frame(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100), 1)
            + _frame(
                Flow(
                    next_incoming_id=0,
                    incoming_window=100,
                    next_outgoing_id=0,
                    outgoing_window=100,
                    handle=9,
                    delivery_count=0,
                    link_credit=5,
                ),
                1,
            )
        )
        _ended(peer, "amqp:session:unattached-handle")
        peer.send(_frame(End(), 1))
    (conn,) = list(fuzz_broker.server.connections)
    peer.round_trip(0, ours, 0)
    handler = conn.handler
    assert len(handler.amqp.sessions) == 1, handler.amqp.sessions  # the good one; the refused ones are gone
    assert len(handler._links) == 2 and len(handler._receivers) == 1  # its sender and receiver only
    peer.close()
    wait_for_no_connections(fuzz_broker)
