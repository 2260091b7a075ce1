"""Framing, performatives and messages, including interop with the azure-servicebus SDK's own codec."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.amqp.codec import DecodeError, decode
from shardbus.amqp.connection import _transfer_head
from shardbus.amqp.framing import (
    FRAME_AMQP,
    FRAME_SASL,
    FrameReader,
    FramingError,
    encode_frame,
    heartbeat_frame,
)
from shardbus.amqp.message import (
    BATCH_MESSAGE_FORMAT,
    AmqpMessage,
    BodyType,
    Header,
    Properties,
    build_batch,
    decode_message,
    scan_sections,
    set_message_annotations,
    split_batch,
)
from shardbus.amqp.performatives import (
    RECEIVER,
    SENDER,
    Accepted,
    Attach,
    Begin,
    Close,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    End,
    Error,
    Flow,
    InvalidField,
    Modified,
    Open,
    Received,
    Rejected,
    Released,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
    Source,
    Target,
    TransactionalState,
    Transfer,
    decode_composite,
    decode_performative,
)
from shardbus.amqp.types import Long, Symbol, Timestamp, UInt

# ------------------------------------------------------------------------------------------- framing


def test_frame_reader_splits_arbitrary_chunks() -> None:
    frames = [encode_frame(FRAME_AMQP, i, bytes([i]) * (i * 7)) for i in range(20)] + [heartbeat_frame()]
    stream = b"AMQP\x00\x01\x00\x00" + b"".join(frames)
    for chunk in (1, 3, 7, 64, len(stream)):
        r = FrameReader()
        got = []
        header = None
        for i in range(0, len(stream), chunk):
            r.feed(stream[i : i + chunk])
            if header is None:
                header = r.read_protocol_header()
                if header is None:
                    continue
            while (f := r.next_frame()) is not None:
                got.append(f)
        assert header == b"AMQP\x00\x01\x00\x00"
        assert [(f.channel, f.body) for f in got[:-1]] == [(i, bytes([i]) * (i * 7)) for i in range(20)]
        assert got[-1].body == b""
        assert r.buffered == 0


def test_frame_reader_skips_extended_header_and_enforces_limits() -> None:
    r = FrameReader(max_frame_size=512)
    r.feed(b"\x00\x00\x00\x0f\x03\x01\x00\x00" + b"EXT!" + b"abc")
    f = r.next_frame()
    assert f is not None and f.type == FRAME_SASL and f.body == b"abc"
    r = FrameReader(max_frame_size=512)
    r.feed(b"\x00\x00\x02\x01\x02\x00\x00\x00")
    with pytest.raises(FramingError):
        r.next_frame()
    for bad in (
        b"\x00\x00\x00\x04\x02\x00\x00\x00",
        b"\x00\x00\x00\x08\x01\x00\x00\x00",
        b"\x00\x00\x00\x08\x03\x00\x00\x00",
    ):
        r = FrameReader()
        r.feed(bad)
        with pytest.raises(FramingError):
            r.next_frame()


# ------------------------------------------------------------------------------------- performatives

ALL = [
    Open(
        container_id="c",
        hostname="h",
        max_frame_size=65536,
        channel_max=10,
        idle_time_out=120000,
        offered_capabilities=[Symbol("x")],
        properties={Symbol("product"): "p"},
    ),
    Begin(remote_channel=1, next_outgoing_id=0, incoming_window=5, outgoing_window=6, handle_max=7),
    Attach(
        name="l",
        handle=1,
        role=RECEIVER,
        snd_settle_mode=0,
        rcv_settle_mode=1,
        source=Source(
            address="a",
            filter={Symbol("com.microsoft:session-filter"): "s"},
            default_outcome=Released(),
            outcomes=[Symbol("amqp:accepted:list")],
        ),
        target=Target(address="t", capabilities=[Symbol("c")]),
        unsettled={b"tag": Accepted()},
        initial_delivery_count=0,
        max_message_size=1048576,
        properties={Symbol("k"): "v"},
    ),
    Attach(name="txn", handle=2, role=SENDER, source=Source(), target=Coordinator([Symbol("amqp:local-transactions")])),
    Flow(
        next_incoming_id=1,
        incoming_window=2,
        next_outgoing_id=3,
        outgoing_window=4,
        handle=5,
        delivery_count=6,
        link_credit=7,
        available=8,
        drain=True,
        echo=True,
        properties={Symbol("p"): 1},
    ),
    Transfer(
        handle=1,
        delivery_id=2,
        delivery_tag=b"t",
        message_format=BATCH_MESSAGE_FORMAT,
        settled=False,
        more=True,
        rcv_settle_mode=1,
        state=TransactionalState(b"tx", Accepted()),
        resume=True,
        aborted=True,
        batchable=True,
    ),
    Disposition(
        role=RECEIVER, first=1, last=5, settled=True, state=Modified(True, False, {Symbol("a"): 1}), batchable=True
    ),
    Disposition(role=SENDER, first=1, state=Received(1, 2)),
    Disposition(role=SENDER, first=1, state=Rejected(Error("com.microsoft:dead-letter", "d", {Symbol("r"): "x"}))),
    Disposition(role=SENDER, first=1, state=Declared(b"txn")),
    Detach(handle=3, closed=True, error=Error("amqp:not-found", "nope")),
    End(Error("amqp:internal-error")),
    End(),
    Close(Error("amqp:connection:forced")),
    Close(),
    SaslMechanisms([Symbol("ANONYMOUS"), Symbol("PLAIN")]),
    SaslInit("PLAIN", b"\x00u\x00p", "localhost"),
    SaslChallenge(b"c"),
    SaslResponse(b"r"),
    SaslOutcome(0, b"x"),
]


@pytest.mark.parametrize("perf", ALL, ids=[type(p).__name__ for p in ALL])
def test_performative_round_trip(perf: object) -> None:
    wire = perf.encode()  # type: ignore[attr-defined]
    assert wire[:3] == bytes((0, 0x53, perf.CODE))  # type: ignore[attr-defined]
    back, end = decode_performative(wire + b"payload")
    assert end == len(wire)
    assert back == perf


def test_performative_short_list_and_defaults() -> None:
    # attach with only the 3 mandatory fields; defaults fill in
    back, _ = decode_performative(b"\x00\x53\x12\xc0\x06\x03\xa1\x01x\x43\x42")
    assert back == Attach(name="x", handle=0, role=False)
    assert back.snd_settle_mode == 2 and back.rcv_settle_mode == 0
    # explicit null for a defaulted field reads as the default
    back, _ = decode_performative(b"\x00\x53\x10\xc0\x06\x03\xa1\x01c\x40\x40")
    assert back.max_frame_size == 0xFFFFFFFF
    # symbolic descriptor
    back, _ = decode_performative(b"\x00\xa3\x0famqp:close:list\x45")
    assert back == Close()
    # extra trailing fields are ignored
    back, _ = decode_performative(b"\x00\x53\x17\xc0\x03\x02\x40\x40")
    assert back == End()


def test_trailing_defaults_are_omitted() -> None:
    assert Transfer(handle=0, delivery_id=0, delivery_tag=b"", message_format=0, settled=True).encode() == (
        b"\x00\x53\x14\xc0\x07\x05\x43\x43\xa0\x00\x43\x41"
    )
    assert Close().encode() == b"\x00\x53\x18\x45"
    assert Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1).encode().endswith(b"\x52\x01")


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x53\x12\xc0\x03\x01\xa1\x00",  # attach missing handle/role
        b"\x00\x53\x12\xc0\x07\x03\xa1\x01x\xa1\x00\x42",  # handle is a string
        b"\x00\x53\x14\xc0\x03\x01\x41",  # transfer handle is a bool
        b"\x00\x53\x15\xc0\x06\x03\x41\x43\x41\x00",  # truncated
        b"\x00\x53\x99\x45",  # unknown performative
        b"\x00\x53\x10\x41",  # not a list
        b"\x40",
        b"\x00\x53\x15\xc0\x07\x05\x41\x43\x40\x41\x41",  # disposition state is not described
    ],
)
def test_bad_performatives(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_performative(wire)


def test_invalid_field_is_decode_error_subclass() -> None:
    with pytest.raises(InvalidField):
        decode_performative(b"\x00\x53\x12\xc0\x03\x01\xa1\x00")


def test_decode_composite_leaves_unknown_described() -> None:
    d = decode(b"\x00\x53\x2b\x45")
    assert decode_composite(d) is d
    assert decode_composite(decode(Declare(b"g").encode())) == Declare(b"g")
    assert decode_composite(decode(Discharge(b"t", True).encode())) == Discharge(b"t", True)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ALL), st.data())
def test_fuzz_performatives(perf: object, data: st.DataObject) -> None:
    wire = bytearray(perf.encode())  # type: ignore[attr-defined]
    for _ in range(data.draw(st.integers(1, 3))):
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_performative(bytes(wire))
    except DecodeError:
        pass


# -------------------------------------------------------------------------------------------- messages


def _sample_message() -> AmqpMessage:
    return AmqpMessage(
        header=Header(durable=True, ttl=60000, delivery_count=2),
        delivery_annotations={Symbol("x-opt-lock-token"): uuid.UUID(int=3)},
        message_annotations={Symbol("x-opt-sequence-number"): Long(7), Symbol("x-opt-enqueued-time"): Timestamp(5)},
        properties=Properties(
            message_id="m1",
            correlation_id=uuid.UUID(int=9),
            content_type=Symbol("text/plain"),
            group_id="s1",
            creation_time=Timestamp(1),
            group_sequence=UInt(3),
        ),
        application_properties={"a": 1, "b": "x", "c": None},
        body=[b"part1", b"part2"],
        body_type=BodyType.DATA,
        footer={Symbol("f"): b"z"},
    )


def test_message_round_trip_and_multiple_data_sections() -> None:
    m = _sample_message()
    wire = m.encode()
    back = decode_message(wire)
    assert back == m
    assert back.data == b"part1part2"
    assert [s.code for s in scan_sections(wire)] == [0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x75, 0x78]


def test_message_value_and_sequence_bodies() -> None:
    for m in (
        AmqpMessage.with_value({"k": [1, 2]}),
        AmqpMessage.with_value(None),
        AmqpMessage(body=[[1], ["a"]], body_type=BodyType.SEQUENCE),
        AmqpMessage(),
    ):
        assert decode_message(m.encode()) == m


def test_message_sections_in_any_order() -> None:
    m = _sample_message()
    wire = m.encode()
    secs = scan_sections(wire)
    shuffled = b"".join(wire[s.start : s.end] for s in reversed(secs))
    back = decode_message(shuffled)
    assert back.properties == m.properties
    assert back.body == [b"part2", b"part1"]


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x53\x75\xa1\x01x",
        b"\x00\x53\x77\x40\x00\x53\x75\xa0\x00",
        b"\x00\x53\x99\x40",
        b"\x41",
        b"\x00\x53\x73\x41",
        b"\x00\x53\x75\xa0\x05ab",
    ],
)
def test_bad_messages(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_message(wire)


def test_set_message_annotations_splices_only_that_section() -> None:
    m = _sample_message()
    m.message_annotations = None
    wire = m.encode()
    stamped = set_message_annotations(wire, {Symbol("x-opt-sequence-number"): Long(42)})
    back = decode_message(stamped)
    assert back.message_annotations == {"x-opt-sequence-number": 42}
    assert [s.code for s in scan_sections(stamped)][:3] == [0x70, 0x71, 0x72]
    again = set_message_annotations(
        stamped, {Symbol("x-opt-locked-until"): Timestamp(9)}, remove=(Symbol("x-opt-sequence-number"),)
    )
    assert decode_message(again).message_annotations == {"x-opt-locked-until": 9}


def test_batch_build_and_split() -> None:
    inner = [
        AmqpMessage.with_data(b"%d" % i, properties=Properties(message_id=f"id{i}", group_id="g")).encode()
        for i in range(3)
    ]
    env = build_batch(inner, message_annotations={Symbol("x-opt-partition-key"): "g"})
    assert split_batch(env) == inner
    decoded = decode_message(env)
    assert decoded.properties == Properties(message_id="id0", group_id="g")
    with pytest.raises(DecodeError):
        split_batch(AmqpMessage.with_value(1).encode())


# ------------------------------------------------------------------------ interop with the SDK's codec


def test_sdk_message_decodes_with_ours_and_back() -> None:
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus._pyamqp._decode import decode_payload
    from azure.servicebus._pyamqp._encode import encode_payload

    sbm = ServiceBusMessage(
        b"body",
        session_id="s1",
        application_properties={"k": 5, "s": "v"},
        content_type="application/json",
        subject="subj",
        time_to_live=None,
        partition_key="s1",
    )
    from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

    raw = bytes(encode_payload(bytearray(), PyamqpTransport.to_outgoing_amqp_message(sbm.raw_amqp_message)))
    ours = decode_message(raw)
    assert ours.properties.group_id == "s1"
    assert ours.properties.content_type == "application/json"
    assert ours.application_properties == {"k": 5, "s": "v"}
    assert ours.message_annotations[Symbol("x-opt-partition-key")] == "s1"
    assert ours.data == b"body"
    back = decode_payload(memoryview(ours.encode()))
    assert back.data == [b"body"]
    assert back.properties.group_id == b"s1"
    assert back.application_properties == {b"k": 5, b"s": b"v"}


def test_our_frames_decode_with_sdk_decoder() -> None:
    from azure.servicebus._pyamqp._decode import decode_frame, decode_payload

    for perf in ALL:
        if perf.CODE >= 0x40 or isinstance(perf, Transfer):
            continue
        code, fields = decode_frame(memoryview(perf.encode()))
        assert code == perf.CODE
    # transfer + message payload, as a broker would send a peek-locked message
    lock = uuid.uuid4()
    msg = _sample_message()
    payload = msg.encode()
    code, fields = decode_frame(
        memoryview(
            Transfer(handle=1, delivery_id=0, delivery_tag=lock.bytes_le, message_format=0, settled=False).encode()
            + payload
        )
    )
    assert code == 0x14
    assert uuid.UUID(bytes_le=bytes(fields[2])) == lock
    sdk_msg = decode_payload(fields[-1])
    assert sdk_msg.message_annotations[b"x-opt-sequence-number"] == 7
    assert sdk_msg.header.delivery_count == 2
    assert sdk_msg.data == [b"part1", b"part2"]
    assert sdk_msg.properties.correlation_id == uuid.UUID(int=9)
    # outcome echo the SDK receiver expects
    code, fields = decode_frame(
        memoryview(Disposition(role=SENDER, first=4, settled=True, state=Modified(True, False)).encode())
    )
    assert fields[4] == {"modified": [True, False]}
    code, fields = decode_frame(
        memoryview(
            Attach(
                name="n",
                handle=0,
                role=SENDER,
                source=Source(address="q", filter={"com.microsoft:session-filter": "s"}),
                target=Target(address="t"),
                initial_delivery_count=0,
                properties={},
            ).encode()
        )
    )
    assert fields[9] == 0 and fields[5][7] == {b"com.microsoft:session-filter": b"s"}


def test_sdk_frames_decode_with_ours() -> None:
    from azure.servicebus._pyamqp import performatives as P
    from azure.servicebus._pyamqp._encode import encode_frame
    from azure.servicebus._pyamqp.endpoints import Source as SdkSource
    from azure.servicebus._pyamqp.endpoints import Target as SdkTarget

    n = None
    frames = [
        P.OpenFrame("SBSender-x", "localhost", 1048576, 65535, n, n, n, n, n, {"product": "azsdk-python-servicebus"}),
        P.BeginFrame(n, 0, 65536, 65536, 4294967295, n, n, n),
        P.AttachFrame(
            "n",
            1,
            True,
            0,
            1,
            SdkSource(address="amqps://localhost:5672/q", filters={"com.microsoft:session-filter": "s"}),
            SdkTarget(address="receiver-link-n"),
            n,
            n,
            n,
            1048576,
            n,
            n,
            {"com.microsoft:receiver-name": "SB"},
        ),
        P.FlowFrame(0, 65536, 0, 65536, 1, 0, 10000, n, False, False, n),
        P.TransferFrame(
            handle=1,
            delivery_id=0,
            delivery_tag=b"\x00\x00\x00\x01",
            message_format=BATCH_MESSAGE_FORMAT,
            settled=False,
            more=False,
            payload=b"\x00\x53\x75\xa0\x01x",
        ),
        P.DispositionFrame(True, 3, n, False, n, False),
        P.DetachFrame(1, True, n),
        P.EndFrame(n),
        P.CloseFrame(n),
        P.SASLInit(b"ANONYMOUS", b"", "localhost"),
    ]
    for f in frames:
        header, body = encode_frame(f)
        assert header[4] == 2
        perf, end = decode_performative(bytes(body))
        assert f._code == perf.CODE
        if isinstance(perf, Transfer):
            assert perf.message_format == BATCH_MESSAGE_FORMAT
            assert bytes(body)[end:] == b"\x00\x53\x75\xa0\x01x"
        if isinstance(perf, Open):
            assert perf.max_frame_size == 1048576
            assert perf.properties[Symbol("product")] == "azsdk-python-servicebus"
        if isinstance(perf, Attach):
            assert perf.source.address == "amqps://localhost:5672/q"
            assert perf.source.filter == {"com.microsoft:session-filter": "s"}
            assert perf.target.address == "receiver-link-n"
            assert perf.role is RECEIVER and perf.rcv_settle_mode == 1


@pytest.mark.parametrize("tag", [b"", b"\x01", bytes(16), bytes(255)])
@pytest.mark.parametrize("handle, delivery_id", [(0, 0), (1, 255), (256, 2**32 - 1)])
def test_transfer_head_fast_path_matches_the_generic_encoder(tag, handle, delivery_id):
    for message_format, settled in [(0, False), (0, True), (0x80013700, False)]:
        generic = Transfer(
            handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=message_format, settled=settled
        ).encode()
        assert _transfer_head(handle, delivery_id, tag, message_format, settled) == generic
