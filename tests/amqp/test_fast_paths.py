"""The engine's fast paths against the generic codec on the same input.

Decoding: ``decode_performative`` tries a generated decoder for transfer, disposition and flow first. Whatever
bytes it is given, it must give what ``decode_performative_generic`` gives (equal values of the same types) or
raise the same error: the fast decoders may only decline, never decide differently. Encoding: the hand-written
transfer and disposition encoders must write byte for byte what the composites' generic encoder writes.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardbus.amqp import events as E
from shardbus.amqp.codec import DecodeError, encode
from shardbus.amqp.connection import _disposition_body
from shardbus.amqp.framing import FRAME_AMQP, encode_frame
from shardbus.amqp.performatives import (
    _FAST_DECODERS,
    RECEIVER,
    SENDER,
    Accepted,
    Disposition,
    Error,
    Flow,
    Modified,
    Rejected,
    Released,
    SndSettleMode,
    Source,
    Target,
    Transfer,
    decode_performative,
    decode_performative_generic,
)

# ------------------------------------------------------------------------------------ field encodings


def e_uint(v: int, form: int) -> bytes:
    """``v`` as uint0 / smalluint / uint, or as ulong forms the fast path leaves to the generic decoder."""
    forms = [b"\x43"] if v == 0 else []
    if v < 256:
        forms.append(bytes((0x52, v)))
    forms.append(b"\x70" + struct.pack(">I", v))
    forms.append(b"\x80" + struct.pack(">Q", v))  # a ulong: valid for the generic decoder (any int)
    return forms[form % len(forms)]


def e_bool(v: bool, form: int) -> bytes:
    return [b"\x41" if v else b"\x42", b"\x56\x01" if v else b"\x56\x00"][form % 2]


def e_binary(v: bytes, form: int) -> bytes:
    if form % 2 == 0 and len(v) < 256:
        return bytes((0xA0, len(v))) + v
    return b"\xb0" + struct.pack(">I", len(v)) + v


STATES = [
    b"\x00\x53\x24\x45",  # accepted, list0
    b"\x00\x53\x24\xc0\x01\x00",  # accepted, empty list8
    b"\x00\x53\x26\x45",  # released
    b"\x00\x53\x24\xd0\x00\x00\x00\x04\x00\x00\x00\x00",  # accepted, empty list32: generic only
    Rejected(error=Error("amqp:not-found", "gone")).encode(),  # generic only
    Modified(delivery_failed=True).encode(),  # generic only
    b"\x00\xa3\x13amqp:accepted:list\x45",  # symbolic descriptor: generic only
]

KIND_OF = {
    Transfer: ["uint", "uint", "binary", "uint", "bool", "bool", "ubyte", "state", "bool", "bool", "bool"],
    Disposition: ["bool", "uint", "uint", "bool", "state", "bool"],
    Flow: ["uint"] * 8 + ["bool", "bool", "map"],
}


def e_field(kind: str, value: Any, form: int) -> bytes:
    if value is None:
        return b"\x40"
    if kind == "uint":
        return e_uint(value, form)
    if kind == "bool":
        return e_bool(value, form)
    if kind == "binary":
        return e_binary(value, form)
    if kind == "ubyte":
        return bytes((0x50, value))
    if kind == "state":
        return STATES[value % len(STATES)]
    return encode({"k": "v"})  # map (flow properties): generic only


def e_body(cls: type, fields: list[bytes], list_form: int) -> bytes:
    """``00 53 code`` + the fields as list0 (no fields), list8 or list32."""
    body = b"".join(fields)
    if not fields and list_form % 3 == 0:
        lst = b"\x45"
    elif list_form % 3 != 2 and len(body) < 255:
        lst = bytes((0xC0, len(body) + 1, len(fields))) + body
    else:
        lst = b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body
    return bytes((0x00, 0x53, cls.CODE)) + lst  # type: ignore[attr-defined]


def values_for(kind: str) -> st.SearchStrategy[Any]:
    if kind == "uint":
        return st.one_of(st.sampled_from([0, 1, 255, 256, 2**32 - 1]), st.integers(0, 2**32 - 1))
    if kind == "bool":
        return st.booleans()
    if kind == "binary":
        return st.one_of(st.binary(max_size=20), st.sampled_from([bytes(16), bytes(255), bytes(256)]))
    if kind == "ubyte":
        return st.integers(0, 255)
    if kind == "state":
        return st.integers(0, len(STATES) - 1)
    return st.just({"k": "v"})


@st.composite
def bodies(draw: Any, common: bool = False) -> bytes:
    """A transfer, disposition or flow body in any mix of encodings; ``common``: only the encodings the fast
    decoders take (then only missing mandatory fields send it to the generic decoder)."""
    cls = draw(st.sampled_from(list(KIND_OF)))
    kinds = KIND_OF[cls]
    count = draw(st.integers(0, len(kinds) - (1 if common and cls is Flow else 0) + (0 if common else 1)))
    fields = []
    for i in range(count):
        kind = kinds[i] if i < len(kinds) else "bool"  # a field beyond the spec: the generic path ignores it
        value = draw(st.one_of(st.none(), values_for(kind))) if draw(st.integers(0, 3)) == 0 else draw(values_for(kind))
        if common and kind == "state" and value is not None:
            value %= 3
        form = draw(st.integers(0, 3))
        if common and kind == "uint" and value is not None:
            form %= 3 if value == 0 else 2 if value < 256 else 1  # no ulong forms
        fields.append(e_field(kind, value, form))
    return e_body(cls, fields, draw(st.integers(0, 2))) + draw(st.binary(max_size=8))  # payload after it


# ------------------------------------------------------------------------------------------ helpers


def outcome(fn: Any, body: bytes) -> Any:
    try:
        return fn(body)
    except DecodeError as exc:
        return type(exc)


def assert_same(fast: Any, generic: Any) -> None:
    """Equal results with fields of identical types (``UInt`` stays ``UInt``, ``bool`` stays ``bool``)."""
    assert fast == generic
    if isinstance(generic, tuple):
        perf_f, perf_g = fast[0], generic[0]
        assert type(perf_f) is type(perf_g)
        for f in dataclasses.fields(perf_g):
            a, b = getattr(perf_f, f.name), getattr(perf_g, f.name)
            assert type(a) is type(b), (f.name, a, b)


# -------------------------------------------------------------------------------------- decoding tests


@settings(max_examples=1500, deadline=None)
@given(bodies())
def test_fast_and_generic_decoders_agree(body: bytes) -> None:
    assert_same(outcome(decode_performative, body), outcome(decode_performative_generic, body))


@settings(max_examples=1500, deadline=None)
@given(bodies(common=True))
def test_fast_and_generic_decoders_agree_on_common_encodings(body: bytes) -> None:
    assert_same(outcome(decode_performative, body), outcome(decode_performative_generic, body))


@settings(max_examples=1500, deadline=None)
@given(bodies(), st.data())
def test_fast_and_generic_decoders_agree_on_damaged_bytes(body: bytes, data: st.DataObject) -> None:
    damaged = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(3, len(damaged)))
    for b in (bytes(damaged), bytes(damaged[:cut]), body[:cut]):
        assert_same(outcome(decode_performative, b), outcome(decode_performative_generic, b))


def _fast_takes(body: bytes) -> bool:
    return _FAST_DECODERS[body[2]](body) is not None


@pytest.mark.parametrize(
    "fields, list_form",
    [
        ([b"\x43"], 1),  # handle uint0, the only mandatory field
        ([b"\x52\x01", b"\x52\x05", b"\xa0\x04abcd", b"\x43", b"\x56\x00", b"\x56\x00"] + [b"\x40"] * 5, 1),  # SDK
        ([b"\x70\x00\x00\x01\x00", b"\x70\xff\xff\xff\xff", b"\xb0\x00\x00\x00\x02ab", b"\x70\x80\x01\x37\x00"], 2),
        ([b"\x52\x01", b"\x40", b"\x40", b"\x40", b"\x41", b"\x41"], 1),  # continuation frame, more=true
        ([b"\x43", b"\x43", b"\xa0\x00", b"\x43", b"\x42", b"\x42", b"\x50\x01", STATES[0]] + [b"\x41"] * 3, 1),
    ],
)
def test_transfer_encodings_taken_by_the_fast_decoder(fields: list[bytes], list_form: int) -> None:
    body = e_body(Transfer, fields, list_form) + b"payload"
    assert _fast_takes(body)
    assert_same(decode_performative(body), decode_performative_generic(body))
    assert decode_performative(body)[1] == len(body) - len(b"payload")


@pytest.mark.parametrize(
    "fields",
    [
        [],  # list0: handle missing
        [b"\x40"],  # null handle
        [b"\x53\x01"],  # handle as smallulong
        [b"\x43", b"\x43", b"\xa0\x00", b"\x43", b"\x56\x02"],  # boolean byte 2: invalid
        [b"\x43", b"\x43", b"\xa0\x05ab"],  # binary longer than the list
        [b"\x43", b"\x43", b"\xa0\x00", b"\x43", b"\x42", b"\x42", b"\x40", STATES[4]],  # rejected state
        [b"\x43"] + [b"\x40"] * 11,  # a 12th field
    ],
)
def test_transfer_encodings_left_to_the_generic_decoder(fields: list[bytes]) -> None:
    body = e_body(Transfer, fields, 0 if not fields else 1)
    assert not _fast_takes(body)
    assert_same(outcome(decode_performative, body), outcome(decode_performative_generic, body))


def test_list_size_mismatch_and_truncation_raise_like_the_generic_decoder() -> None:
    good = e_body(Transfer, [b"\x43", b"\x43", b"\xa0\x01x"], 1)
    for bad in (good[:-1], good[:4] + bytes((good[4] + 1,)) + good[5:] + b"\x40", good[:4] + b"\x00" + good[5:]):
        assert outcome(decode_performative, bad) is outcome(decode_performative_generic, bad)
        assert outcome(decode_performative, bad) in (DecodeError,)


@pytest.mark.parametrize("state", STATES[:3])
def test_disposition_of_the_sdk_taken_by_the_fast_decoder(state: bytes) -> None:
    body = e_body(Disposition, [b"\x56\x01", b"\x52\x05", b"\x40", b"\x56\x00", state, b"\x40"], 1)
    assert _fast_takes(body)
    perf, _ = decode_performative(body)
    assert perf == Disposition(role=RECEIVER, first=5, last=None, settled=False, state=perf.state)
    assert type(perf.state) in (Accepted, Released)
    assert_same(decode_performative(body), decode_performative_generic(body))


@pytest.mark.parametrize("role", [b"\x56\x01", b"\x41", b"\x42"])
@pytest.mark.parametrize("first", [b"\x52\x05", b"\x70\x00\x01\x00\x00", b"\x43"])
@pytest.mark.parametrize("state", STATES[:3])
def test_repeated_disposition_tails_decode_as_the_generic_decoder(role: bytes, first: bytes, state: bytes) -> None:
    """A tail seen once (null last, a fieldless state) is looked up the next time: same values, same types; a
    damaged copy of it decodes (or fails) as the generic decoder has it."""
    for settled in (b"\x56\x00", b"\x41"):
        body = e_body(Disposition, [role, first, b"\x40", settled, state, b"\x40"], 1)
        for _ in range(2):
            assert_same(decode_performative(body), decode_performative_generic(body))
        for i in range(3, len(body)):
            for value in (0x00, 0x40, 0x41, 0x52, 0x70, 0xFF, body[i] ^ 1):
                bad = body[:i] + bytes((value,)) + body[i + 1 :]
                assert_same(outcome(decode_performative, bad), outcome(decode_performative_generic, bad))
            assert_same(outcome(decode_performative, body[:i]), outcome(decode_performative_generic, body[:i]))


@pytest.mark.parametrize("handle", [b"\x43", b"\x52\x07"])
@pytest.mark.parametrize("did", [b"\x52\x05", b"\x70\x00\x01\x00\x00", b"\x43"])
@pytest.mark.parametrize(
    "tail",
    [
        [b"\x43", b"\x42"],  # our client's: message format 0, unsettled
        [b"\x43", b"\x56\x00", b"\x56\x00"] + [b"\x40"] * 5,  # the SDK's
        [b"\x70\x80\x01\x37\x00", b"\x42", b"\x41"],  # a batch's first frame of several
        [b"\x43", b"\x42", b"\x42", b"\x40", STATES[0]],  # a state: never kept
        [],
    ],
)
def test_repeated_transfer_tails_decode_as_the_generic_decoder(handle: bytes, did: bytes, tail: list[bytes]) -> None:
    """A transfer's tail (the fields after its tag) seen once is looked up the next time: same values, same
    types, whatever the tag; a damaged copy decodes (or fails) as the generic decoder has it."""
    for tag in (b"\xa0\x10" + bytes(range(16)), b"\xa0\x00", b"\xa0\x04abcd"):
        body = e_body(Transfer, [handle, did, tag, *tail], 1) + b"payload"
        for _ in range(2):
            assert_same(decode_performative(body), decode_performative_generic(body))
            assert decode_performative(body)[1] == len(body) - len(b"payload")
    for i in range(3, len(body)):
        for value in (0x00, 0x40, 0x41, 0x43, 0x52, 0x70, 0xA0, 0xFF, body[i] ^ 1):
            bad = body[:i] + bytes((value,)) + body[i + 1 :]
            assert_same(outcome(decode_performative, bad), outcome(decode_performative_generic, bad))
        assert_same(outcome(decode_performative, body[:i]), outcome(decode_performative_generic, body[:i]))


def test_flow_taken_by_the_fast_decoder() -> None:
    body = Flow(next_incoming_id=3, incoming_window=70000, next_outgoing_id=0, outgoing_window=2**31 - 1,
                handle=0, delivery_count=5, link_credit=300, drain=True).encode()  # fmt: skip
    assert _fast_takes(body)
    assert_same(decode_performative(body), decode_performative_generic(body))
    with_props = Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1, properties={"a": 1}).encode()
    assert not _fast_takes(with_props)
    assert_same(decode_performative(with_props), decode_performative_generic(with_props))


# -------------------------------------------------------------------------------------- encoding tests


@pytest.mark.parametrize("role", [SENDER, RECEIVER])
@pytest.mark.parametrize("first, last", [(0, None), (5, 5), (255, 256), (2**32 - 1, 0), (7, None)])
@pytest.mark.parametrize("settled", [False, True])
@pytest.mark.parametrize(
    "state", [None, Accepted(), Released(), Rejected(error=Error("amqp:not-found", "x")), Modified(True, True)]
)
@pytest.mark.parametrize("batchable", [False, True])
def test_disposition_encoder_matches_the_generic_one(
    role: bool, first: int, last: int | None, settled: bool, state: Any, batchable: bool
) -> None:
    generic = Disposition(role=role, first=first, last=last, settled=settled, state=state, batchable=batchable)
    assert _disposition_body(role, first, last, settled, state, batchable) == generic.encode()


def test_disposition_encoder_leaves_non_bool_flags_to_the_generic_one() -> None:
    assert _disposition_body(True, 1, None, 1, None, False) is None  # type: ignore[arg-type]


def _linked(make_pair: Any, mode: int = SndSettleMode.UNSETTLED) -> tuple[Any, Any, Any]:
    """A server and client (conftest's ``Pair``) with the server holding the sending end of a link."""
    pair = make_pair()
    client = pair.client
    client.open()
    sess = client.begin(incoming_window=1000)
    rcv = client.attach(sess, "r", RECEIVER, source=Source(address="q"), target=Target(), snd_settle_mode=mode)
    pair.pump()
    attached = pair.of("server", E.LinkAttachRequested)
    assert pair.server.is_open and client.is_open and len(attached) == 1
    client.flow(rcv, link_credit=1000)
    pair.pump()
    return pair.server, client, attached[0].link


@pytest.mark.parametrize("tag", [b"", bytes(16), bytes(255)])
@pytest.mark.parametrize("fmt", [0, 0x80013700])
@pytest.mark.parametrize("settled", [False, True])
def test_send_transfer_writes_what_the_generic_encoder_writes(
    make_pair: Any, tag: bytes, fmt: int, settled: bool
) -> None:
    server, _client, link = _linked(make_pair)
    server.data_to_send()
    for _ in range(300):  # delivery ids past 255 take the 4-byte form
        did = server.send_transfer(link, tag, b"payload", settled=settled, message_format=fmt)
        perf = Transfer(handle=link.handle, delivery_id=did, delivery_tag=tag, message_format=fmt, settled=settled)
        assert server.data_to_send() == encode_frame(FRAME_AMQP, 0, perf.encode() + b"payload")


def test_single_and_range_settlement_keep_the_unsettled_maps_in_step(make_pair: Any) -> None:
    server, client, link = _linked(make_pair)
    dids = [server.send_transfer(link, bytes([i]), b"x") for i in range(6)]
    session = link.session
    client.receive_data(server.data_to_send())
    client.next_events()
    rcv = next(iter(client.sessions[0].links.values()))
    client.disposition(rcv, dids[0], settled=True, state=Accepted())  # one
    client.disposition(rcv, dids[1], dids[3], settled=True, state=Accepted())  # a range
    client.disposition(rcv, dids[4], dids[4], settled=False, state=Accepted())  # unsettled: nothing forgotten
    server.receive_data(client.data_to_send())
    got = [ev for ev in server.next_events() if isinstance(ev, E.DispositionReceived)]
    assert [[r.delivery_id for r in ev.deliveries] for ev in got] == [dids[:1], dids[1:4], dids[4:5]]
    assert sorted(session.outgoing_unsettled) == dids[4:]
    assert sorted(link.unsettled.values()) == dids[4:]
    server.settle(link, dids[5], Accepted())  # settling our own sent delivery locally
    assert sorted(session.outgoing_unsettled) == dids[4:5]
    ref = session.outgoing_unsettled[dids[4]]
    assert (ref.link, ref.delivery_id, ref.delivery_tag) == (link, dids[4], bytes([4]))
    with pytest.raises(AttributeError):
        ref.delivery_id = 9  # type: ignore[misc]
    assert hash(ref) == hash(E.DeliveryRef(link, dids[4], bytes([4])))


@pytest.mark.parametrize(
    "fields, condition",
    [
        ([b"\x43", b"\x43", b"\xa0\x01x", b"\x43", b"\x56\x02"], "amqp:decode-error"),  # boolean byte 2
        ([b"\x43", b"\x43", b"\xa0\x09x"], "amqp:decode-error"),  # tag runs past the list
        ([b"\xa1\x01h", b"\x43", b"\xa0\x01x"], "amqp:invalid-field"),  # handle is a string
    ],
)
def test_malformed_transfer_still_closes_the_connection(make_pair: Any, fields: list[bytes], condition: str) -> None:
    server, _client, _link = _linked(make_pair)
    server.data_to_send()
    server.receive_data(encode_frame(FRAME_AMQP, 0, e_body(Transfer, fields, 1) + b"payload"))
    closed = [ev for ev in server.next_events() if isinstance(ev, E.ConnectionClosed)]
    assert closed and closed[0].error.condition == condition
    assert server.is_done


@pytest.mark.parametrize("state", [Accepted(), Released()])
def test_one_delivery_echo_writes_what_the_generic_encoder_writes(make_pair: Any, state: Any) -> None:
    """``Connection.disposition``'s echo of one settled delivery (its head looked up by shape after the first):
    byte for byte the generic disposition frame, for ids of each encoded length, the first time and again."""
    server, _client, link = _linked(make_pair)
    dids = [server.send_transfer(link, i.to_bytes(2, "big"), b"x") for i in range(300)]
    server.data_to_send()
    channel = link.session.local_channel
    for did in (dids[0], dids[1], dids[2], dids[255], dids[256], dids[299]):
        server.disposition(link, did, state=state)
        perf = Disposition(role=link.role, first=did, last=None, settled=True, state=state)
        assert server.data_to_send() == encode_frame(FRAME_AMQP, channel, perf.encode())
        assert did not in link.session.outgoing_unsettled
