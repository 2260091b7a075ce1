"""Hostile and careless AMQP peers, over real sockets: mutations of recorded SDK sessions (bytes flipped, frames
dropped, repeated, swapped, cut, spliced from another session) and performative sequences hypothesis makes up
after a proper handshake. Whatever comes, the broker answers with frames that parse, closes (or ends, or detaches)
with a condition the spec names, closes the socket, logs no ERROR and no traceback, keeps serving a well-behaved
client, and keeps nothing of the connection once it is gone."""

from __future__ import annotations

import struct
import uuid

from fuzz_wire import (
    AMQP_HEADER,
    KEY,
    KEY_NAME,
    SASL_HEADER,
    answer_errors,
    assert_proper_answers,
    exchange,
    still_serving,
    wait_for_no_connections,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardbus.amqp.message import BATCH_MESSAGE_FORMAT, AmqpMessage, Properties, build_batch
from shardbus.amqp.performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Modified,
    Open,
    Rejected,
    Released,
    SaslInit,
    Source,
    Target,
    Transfer,
)
from shardbus.amqp.types import Symbol

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def _frame(perf, channel: int = 0, payload: bytes = b"", frame_type: int = 0) -> bytes:
    body = perf.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


# --- mutations of recorded SDK sessions ---------------------------------------------------------------------------
def _mutate(parts: list[bytes], other: list[bytes], data: st.DataObject) -> list[bytes]:
    parts = list(parts)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        # mostly past the handshake (header, SASL, header, open), where the state machines are
        first = min(5, len(parts) - 1) if data.draw(st.booleans(), label="deep") else 0
        i = data.draw(st.integers(first, len(parts) - 1), label="at")
        op = data.draw(st.sampled_from(["flip", "set", "drop", "repeat", "swap", "cut", "splice", "channel"]))
        part = bytearray(parts[i])
        if op == "flip":
            j = data.draw(st.integers(0, len(part) - 1))
            part[j] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and len(part) > 8:
            part[data.draw(st.integers(8, len(part) - 1))] = data.draw(st.integers(0, 255))
        elif op == "drop" and len(parts) > 1:
            del parts[i]
            continue
        elif op == "repeat":
            parts.insert(i, bytes(part))
        elif op == "swap":
            j = data.draw(st.integers(first, len(parts) - 1))
            parts[i], parts[j] = parts[j], parts[i]
            continue
        elif op == "cut":
            part = part[: data.draw(st.integers(0, len(part)))]
        elif op == "splice":
            parts.insert(i, other[data.draw(st.integers(0, len(other) - 1))])
            continue
        elif op == "channel" and len(part) >= 8 and part[:4] != b"AMQP":
            part[6:8] = data.draw(st.integers(0, 3)).to_bytes(2, "big")
        parts[i] = bytes(part)
    return parts


@FUZZ
@given(data=st.data())
def test_mutated_sdk_sessions_sent_at_once(fuzz_broker, corpus, data):
    names = sorted(corpus)
    parts = corpus[data.draw(st.sampled_from(names), label="session")]
    other = corpus[data.draw(st.sampled_from(names), label="spliced")]
    answer = exchange(fuzz_broker.server.port, _mutate(parts, other, data))
    assert_proper_answers(answer)


@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_mutated_sdk_sessions_frame_by_frame(fuzz_broker, corpus, data):
    """One frame per read, with the broker's answers in between, as the SDK paces itself: the mutations then meet
    links and sessions in every state instead of a connection refused early for pipelining."""
    names = sorted(corpus)
    parts = corpus[data.draw(st.sampled_from(names), label="session")]
    other = corpus[data.draw(st.sampled_from(names), label="spliced")]
    answer = exchange(fuzz_broker.server.port, _mutate(parts, other, data), pause=0.01)
    assert_proper_answers(answer)


def test_the_recorded_sessions_replay_cleanly(fuzz_broker, corpus):
    """Unmutated (and re-signed), each recording is a well-behaved session: nothing refused."""
    for name, parts in corpus.items():
        answer = exchange(fuzz_broker.server.port, parts, pause=0.01)
        assert answer_errors(answer) == [], name


# --- made-up performatives after a proper handshake ---------------------------------------------------------------
def _handshake() -> list[bytes]:
    plain = b"\x00" + KEY_NAME.encode() + b"\x00" + KEY.encode()
    return [
        SASL_HEADER,
        _frame(SaslInit(mechanism=Symbol("PLAIN"), initial_response=plain, hostname="localhost"), frame_type=1),
        AMQP_HEADER,
        _frame(Open(container_id="fuzz", hostname="localhost", max_frame_size=65536)),
        _frame(Begin(next_outgoing_id=0, incoming_window=5000, outgoing_window=5000)),
    ]


uints = st.one_of(st.integers(0, 4), st.integers(0, 0xFFFFFFFF))
handles = st.one_of(st.integers(0, 3), uints)
addresses = st.sampled_from(["fuzzq", "fuzzs", "$cbs", "fuzzq/$management", "missing", "", "fuzzq/$deadletterqueue"])
errors = st.one_of(st.none(), st.builds(Error, condition=st.sampled_from(["amqp:internal-error", "x:y"])))
outcomes = st.one_of(
    st.none(),
    st.just(Accepted()),
    st.just(Released()),
    st.builds(Rejected, error=errors),
    st.builds(Modified, delivery_failed=st.booleans(), undeliverable_here=st.booleans()),
)
payloads = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda b: AmqpMessage.with_data(b).encode(), st.binary(max_size=200)),
    st.builds(
        lambda op, mid: AmqpMessage.with_value(
            {},
            properties=Properties(message_id=mid, reply_to="fuzzq/$management"),
            application_properties={"operation": op},
        ).encode(),
        st.sampled_from(["com.microsoft:peek-message", "com.microsoft:renew-lock", "put-token", "nothing"]),
        st.uuids().map(str),
    ),
    st.builds(lambda n: build_batch([AmqpMessage.with_data(b"b").encode()] * n), st.integers(1, 5)),
)
attaches = st.builds(
    lambda name, handle, role, address, settle: Attach(
        name=name,
        handle=handle,
        role=role,
        snd_settle_mode=settle,
        source=Source(address=address if role else None),
        target=Target(address=None if role else address),
        initial_delivery_count=0 if not role else None,
    ),
    st.sampled_from(["a", "b", "c"]),
    handles,
    st.booleans(),
    addresses,
    st.integers(0, 2),
)
flows = st.builds(
    Flow,
    next_incoming_id=st.one_of(st.none(), uints),
    incoming_window=uints,
    next_outgoing_id=uints,
    outgoing_window=uints,
    handle=st.one_of(st.none(), handles),
    delivery_count=st.one_of(st.none(), uints),
    link_credit=st.one_of(st.none(), st.integers(0, 100), uints),
    drain=st.booleans(),
    echo=st.booleans(),
)
transfers = st.tuples(
    st.builds(
        Transfer,
        handle=handles,
        delivery_id=st.one_of(st.none(), st.integers(0, 10), uints),
        delivery_tag=st.one_of(st.none(), st.binary(min_size=1, max_size=16)),
        message_format=st.one_of(st.none(), st.just(BATCH_MESSAGE_FORMAT), st.just(0)),
        settled=st.one_of(st.none(), st.booleans()),
        more=st.booleans(),
        aborted=st.booleans(),
        state=outcomes,
    ),
    payloads,
)
performatives = st.one_of(
    attaches.map(lambda a: (a, b"")),
    flows.map(lambda f: (f, b"")),
    transfers,
    transfers,
    st.builds(
        Disposition,
        role=st.booleans(),
        first=st.integers(0, 10),
        last=st.one_of(st.none(), st.integers(0, 10)),
        settled=st.booleans(),
        state=outcomes,
    ).map(lambda d: (d, b"")),
    st.builds(Detach, handle=handles, closed=st.booleans(), error=errors).map(lambda d: (d, b"")),
    st.builds(Begin, remote_channel=st.one_of(st.none(), st.integers(0, 2)), incoming_window=uints).map(
        lambda b: (b, b"")
    ),
    st.builds(End, error=errors).map(lambda e: (e, b"")),
    st.builds(Close, error=errors).map(lambda c: (c, b"")),
    st.builds(Open, container_id=st.just("again")).map(lambda o: (o, b"")),
)


@settings(FUZZ, max_examples=120)
@given(steps=st.lists(st.tuples(performatives, st.integers(0, 2)), min_size=1, max_size=14))
def test_made_up_performatives(fuzz_broker, steps):
    parts = _handshake()
    parts += [_frame(perf, channel, payload) for (perf, payload), channel in steps]
    assert_proper_answers(exchange(fuzz_broker.server.port, parts))


@settings(FUZZ, max_examples=20)
@given(steps=st.lists(st.tuples(performatives, st.just(0)), min_size=1, max_size=10))
def test_made_up_performatives_frame_by_frame(fuzz_broker, steps):
    parts = _handshake() + [_frame(perf, channel, payload) for (perf, payload), channel in steps]
    assert_proper_answers(exchange(fuzz_broker.server.port, parts, pause=0.01))


# --- frame sizes ----------------------------------------------------------------------------------------------------
def test_frames_over_512_bytes_before_open_are_refused_at_the_header(fuzz_broker):
    """A header announcing 1 MB before open gets open + close(framing-error) at once: the broker does not wait
    for the megabyte (we never send it)."""
    import socket

    with socket.create_connection(("127.0.0.1", fuzz_broker.server.port), timeout=5) as sock:
        sock.sendall(AMQP_HEADER + struct.pack(">IBBH", 1 << 20, 2, 0, 0))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert ("Close", "amqp:connection:framing-error") in answer_errors(data)


def test_open_of_513_bytes_is_refused_and_one_of_512_accepted(fuzz_broker):
    def open_of(size: int) -> bytes:
        base = Open(container_id="", hostname="localhost")
        pad = size - len(_frame(base))
        frame = _frame(Open(container_id="x" * (pad - 1 if pad > 255 else pad), hostname="localhost"))
        return frame

    for size, refused in ((512, False), (513, True)):
        frame = open_of(size)
        frame = frame if len(frame) == size else open_of(size - (len(frame) - size))
        assert len(frame) == size
        answer = answer_errors(exchange(fuzz_broker.server.port, [AMQP_HEADER, frame]))
        assert (("Close", "amqp:connection:framing-error") in answer) is refused, (size, answer)


# --- after all of it ----------------------------------------------------------------------------------------------
def test_the_broker_still_serves_and_kept_nothing(fuzz_broker):
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    still_serving(fuzz_broker.server.port)
    marker = str(uuid.uuid4())
    with ServiceBusClient.from_connection_string(fuzz_broker.connection_string, retry_total=0) as client:
        with client.get_queue_sender("fuzzs") as sender:
            sender.send_messages(ServiceBusMessage(marker, session_id=marker))
        with client.get_queue_receiver("fuzzs", session_id=marker) as receiver:
            (m,) = receiver.receive_messages(max_wait_time=5)
            assert str(m) == marker
            receiver.complete_message(m)
    wait_for_no_connections(fuzz_broker)
