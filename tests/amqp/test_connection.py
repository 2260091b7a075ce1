"""Connection/session/link machines: two Connection objects talking in memory, plus violations and fuzzing."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardbus.amqp import events as E
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.errors import Condition, LocalProtocolError
from shardbus.amqp.framing import AMQP_HEADER, FRAME_AMQP, FRAME_SASL, SASL_HEADER, encode_frame
from shardbus.amqp.link import LinkState
from shardbus.amqp.message import BATCH_MESSAGE_FORMAT, AmqpMessage, build_batch, decode_message, split_batch
from shardbus.amqp.performatives import (
    RECEIVER,
    SENDER,
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
    SaslInit,
    SndSettleMode,
    Source,
    Target,
    Transfer,
)
from shardbus.amqp.session import SessionState


def _open_session(p: Any) -> Any:
    p.client.open()
    s = p.client.begin()
    p.pump()
    assert s.mapped
    return s


def test_full_conversation_anonymous(pair: Any) -> None:
    c = pair.client
    c.open()
    sess = c.begin()
    snd = c.attach(
        sess,
        "snd",
        SENDER,
        source=Source(address="me"),
        target=Target(address="q1"),
        snd_settle_mode=SndSettleMode.UNSETTLED,
    )
    rcv = c.attach(sess, "rcv", RECEIVER, source=Source(address="q1"), target=Target(address="me"))
    pair.pump()
    assert c.is_open and pair.server.is_open
    assert pair.server.authenticated_as is not None and pair.server.authenticated_as.mechanism == "ANONYMOUS"
    assert [type(e) for e in pair.server_events[:5]] == [
        E.SaslInit,
        E.ConnectionOpened,
        E.SessionBeginRequested,
        E.LinkAttachRequested,
        E.LinkAttachRequested,
    ]
    assert snd.attached and rcv.attached and snd.credit == 100
    assert rcv.remote_attach is not None and rcv.remote_attach.initial_delivery_count == 0

    # client -> server transfer, accepted
    did = c.send_transfer(snd, b"tag1", AmqpMessage.with_data(b"hello").encode())
    pair.pump()
    got = pair.of("server", E.DeliveryReceived)[0]
    assert decode_message(got.payload).data == b"hello" and got.delivery_tag == b"tag1" and not got.settled
    disp = pair.of("client", E.DispositionReceived)[0]
    assert disp.settled and isinstance(disp.state, Accepted) and disp.first == did
    assert [r.delivery_tag for r in disp.deliveries] == [b"tag1"]
    assert not sess.outgoing_unsettled and snd.credit == 99

    # server -> client on the client's receiver: credit, transfer, modified disposition echo
    srv_link = pair.of("server", E.LinkAttachRequested)[1].link
    c.flow(rcv, link_credit=3)
    pair.pump()
    assert srv_link.credit == 3
    sdid = pair.server.send_transfer(srv_link, b"L" * 16, b"\x00\x53\x77\x41", settled=False)
    pair.pump()
    d = pair.of("client", E.DeliveryReceived)[-1]
    assert d.delivery_id == sdid and d.payload == b"\x00\x53\x77\x41" and rcv.credit == 2
    c.disposition(rcv, d.delivery_id, settled=True, state=Modified(True, False))
    pair.pump()
    sd = pair.of("server", E.DispositionReceived)[-1]
    assert sd.role == RECEIVER and isinstance(sd.state, Modified) and sd.deliveries[0].delivery_tag == b"L" * 16

    # drain: server has nothing, completes the drain
    c.flow(rcv, link_credit=5, drain=True)
    pair.pump()
    assert srv_link.drain and srv_link.credit == 5
    pair.server.drained(srv_link)
    pair.pump()
    assert rcv.credit == 0 and not rcv.drain and rcv.delivery_count == srv_link.delivery_count

    # detach, end, close
    c.detach(snd)
    c.detach(rcv)
    pair.pump()
    assert snd.state is LinkState.DETACHED and rcv.state is LinkState.DETACHED
    assert len(pair.of("server", E.LinkDetached)) == 2
    c.end(sess)
    pair.pump()
    assert sess.state is SessionState.ENDED
    c.close()
    pair.pump()
    assert c.is_done and pair.server.is_done
    closed = pair.of("server", E.ConnectionClosed)
    assert closed and closed[0].by_peer and closed[0].error is None


def test_sasl_plain_credentials_and_rejection(make_pair: Any) -> None:
    p = make_pair(Connection(Role.CLIENT, "c", sasl_mechanism="PLAIN", username="user", password="pw"), auto=False)
    p.pump()
    init = p.of("server", E.SaslInit)[0]
    assert (init.mechanism, init.username, init.password) == ("PLAIN", "user", "pw")
    p.server.reject_sasl()
    p.pump()
    assert p.server.is_done and p.client.is_done
    assert p.of("client", E.SaslOutcome)[0].code == 1
    assert p.of("client", E.ConnectionClosed)[0].error.condition == Condition.UNAUTHORIZED_ACCESS


def test_client_without_sasl_and_server_requiring_it(make_pair: Any) -> None:
    p = make_pair(Connection(Role.CLIENT, "c", sasl_mechanism=None))
    _open_session(p)
    assert p.client.is_open
    p2 = make_pair(Connection(Role.CLIENT, "c", sasl_mechanism=None), Connection(Role.SERVER, "s", require_sasl=True))
    p2.client.open()
    p2.pump()
    assert p2.server.is_done and p2.client.is_done


def _frame(perf, channel: int = 0, payload: bytes = b"", ftype: int = FRAME_AMQP) -> bytes:  # type: ignore[no-untyped-def]
    return encode_frame(ftype, channel, perf.encode() + payload)


def _sdk_like_prelude() -> bytes:
    """What the Azure SDK pipelines: SASL, header, open, begin (channel 1), both $cbs attaches, flows."""
    return (
        SASL_HEADER
        + _frame(SaslInit("ANONYMOUS", b"", "localhost"), ftype=FRAME_SASL)
        + AMQP_HEADER
        + _frame(Open(container_id="SBSender-1", hostname="localhost", max_frame_size=1048576, channel_max=65535))
        + _frame(Begin(next_outgoing_id=0, incoming_window=65536, outgoing_window=65536), 1)
        + _frame(
            Attach(
                name="cbs-rsp",
                handle=2,
                role=RECEIVER,
                snd_settle_mode=0,
                rcv_settle_mode=0,
                source=Source(address="$cbs"),
                target=Target(address="$cbs"),
            ),
            1,
        )
        + _frame(
            Attach(
                name="cbs-req",
                handle=1,
                role=SENDER,
                snd_settle_mode=0,
                rcv_settle_mode=0,
                source=Source(address="$cbs"),
                target=Target(address="$cbs"),
                initial_delivery_count=0,
            ),
            1,
        )
    )


def test_pipelined_before_open_in_one_chunk() -> None:
    srv = Connection(Role.SERVER, "s")
    srv.receive_data(_sdk_like_prelude())
    evs = srv.next_events()
    assert [type(e) for e in evs] == [E.SaslInit]
    srv.accept_sasl()
    evs = srv.next_events()
    assert [type(e) for e in evs] == [
        E.ConnectionOpened,
        E.SessionBeginRequested,
        E.LinkAttachRequested,
        E.LinkAttachRequested,
    ]
    srv.open()
    session = evs[1].session
    srv.begin(session, incoming_window=2**31 - 1)
    for ev in evs[2:]:
        srv.attach_reply(ev.link)
    out = srv.data_to_send()
    assert out.startswith(SASL_HEADER)
    # the SDK's decoder reads our frames
    from azure.servicebus._pyamqp._decode import decode_frame

    pos = out.index(AMQP_HEADER, 8) + 8
    codes = []
    while pos < len(out):
        size, doff, _ftype, ch = struct.unpack_from(">IBBH", out, pos)
        assert doff == 2
        code, fields = decode_frame(memoryview(out[pos + 8 : pos + size]))
        codes.append((code, ch))
        if code == 0x11:
            assert fields[0] == 1  # remote-channel = the client's channel
        if code == 0x12:
            assert fields[5] is not None and fields[6] is not None
        pos += size
    assert codes == [(0x10, 0), (0x11, 0), (0x12, 0), (0x12, 0)]


def test_detach_after_end_is_tolerated(make_pair: Any) -> None:
    p = make_pair()
    sess = _open_session(p)
    rcv = p.client.attach(sess, "mgmt", RECEIVER, source=Source(address="q/$management"), target=Target(address="x"))
    p.pump()
    ch = sess.local_channel
    # SDK shutdown order: end, then detach(closed=false) on the ended channel, then close; no waiting
    raw = (
        _frame(End(), ch)
        + _frame(Detach(handle=rcv.handle, closed=False), ch)
        + _frame(Flow(incoming_window=1, next_outgoing_id=0, outgoing_window=1), ch)
        + _frame(Close())
    )
    p.server.receive_data(raw)
    evs = p.server.next_events()
    assert [type(e) for e in evs] == [E.SessionEnded, E.ConnectionClosed]
    assert evs[1].error is None and evs[1].reply_needed
    p.server.end(evs[0].session)
    p.server.close()
    assert p.server.is_done


def test_multi_frame_transfers_both_ways_and_batch_format_preserved(make_pair: Any) -> None:
    p = make_pair(Connection(Role.CLIENT, "c", max_frame_size=600), Connection(Role.SERVER, "s", max_frame_size=512))
    sess = _open_session(p)
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    inner = [AmqpMessage.with_data(bytes([i]) * 700).encode() for i in range(3)]
    batch = build_batch(inner)
    before = sess.next_outgoing_id
    p.client.send_transfer(snd, b"\x00\x00\x00\x01", batch, message_format=BATCH_MESSAGE_FORMAT)
    frames_used = sess.next_outgoing_id - before
    assert frames_used == -(-len(batch) // 450) or frames_used >= 5
    p.pump()
    d = p.of("server", E.DeliveryReceived)[0]
    assert d.message_format == BATCH_MESSAGE_FORMAT and d.payload == batch
    assert split_batch(d.payload) == inner
    # server -> client, split at the client's 600 bytes
    rcv = p.client.attach(sess, "r", RECEIVER, source=Source(address="q"), target=Target())
    p.pump()
    p.client.flow(rcv, link_credit=1)
    p.pump()
    srv_link = p.of("server", E.LinkAttachRequested)[1].link
    big = b"z" * 5000
    p.server.send_transfer(srv_link, b"t", big, settled=True)
    out = p.server.data_to_send()
    sizes = []
    pos = 0
    while pos < len(out):
        (size,) = struct.unpack_from(">I", out, pos)
        sizes.append(size)
        pos += size
    assert len(sizes) > 8 and max(sizes) <= 600
    p.client.receive_data(out)
    d = next(e for e in p.client.next_events() if isinstance(e, E.DeliveryReceived))
    assert d.payload == big and d.settled


def test_aborted_multi_frame_delivery(make_pair: Any) -> None:
    p = make_pair()
    sess = _open_session(p)
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    ch = sess.local_channel
    raw = _frame(
        Transfer(handle=snd.handle, delivery_id=0, delivery_tag=b"a", message_format=0, more=True), ch, b"xx"
    ) + _frame(Transfer(handle=snd.handle, aborted=True), ch)
    p.server.receive_data(raw)
    evs = p.server.next_events()
    assert [type(e) for e in evs] == [E.DeliveryAborted]


def test_session_window_exhaustion_and_flow(make_pair: Any) -> None:
    p = make_pair()
    p.client.open()
    sess = p.client.begin()
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.auto = False
    p.pump()
    srv = p.server
    srv.accept_sasl()
    p.pump()
    srv.open()
    sreq = p.of("server", E.SessionBeginRequested)[0].session
    srv.begin(sreq, incoming_window=3, auto_flow=False)
    lreq = p.of("server", E.LinkAttachRequested)[0].link
    srv.attach_reply(lreq)
    srv.flow(lreq, link_credit=100)
    p.pump()
    assert sess.remote_incoming_window == 3
    for i in range(3):
        p.client.send_transfer(snd, b"%d" % i, b"m", settled=True)
    with pytest.raises(LocalProtocolError):
        p.client.send_transfer(snd, b"x", b"m", settled=True)
    p.pump()
    assert sreq.incoming_window == 0
    srv.flow(sreq)  # session-only flow reopens the window
    sreq.incoming_window = 3
    srv.flow(sreq)
    p.pump()
    assert sess.remote_incoming_window == 3
    p.client.send_transfer(snd, b"y", b"m", settled=True)
    # a peer that ignores the window gets its session ended with window-violation
    raw = b"".join(
        _frame(
            Transfer(handle=snd.handle, delivery_id=10 + i, delivery_tag=b"t", message_format=0, settled=True),
            sess.local_channel,
            b"m",
        )
        for i in range(5)
    )
    srv.receive_data(p.client.data_to_send() + raw)
    ended = [e for e in srv.next_events() if isinstance(e, E.SessionEnded)]
    assert ended and ended[0].error.condition == Condition.WINDOW_VIOLATION and not ended[0].by_peer


def test_auto_session_flow_keeps_many_transfers_going(make_pair: Any) -> None:
    p = make_pair()
    sess = _open_session(p)
    for s in p.server.sessions:
        s.configured_incoming_window = s.incoming_window = 4
    p.server.flow(p.server.sessions[0])
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    sent = 0
    while sent < 50:
        while snd.credit and sess.remote_incoming_window > 0 and sent < 50:
            p.client.send_transfer(snd, b"%d" % sent, b"m", settled=True)
            sent += 1
        p.pump()
    assert len(p.of("server", E.DeliveryReceived)) == 50


def test_link_credit_enforced_for_sender_and_echo(make_pair: Any) -> None:
    p = make_pair(server_credit=1)
    sess = _open_session(p)
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    p.client.send_transfer(snd, b"1", b"m")
    with pytest.raises(LocalProtocolError):
        p.client.send_transfer(snd, b"2", b"m")
    p.client.send_transfer(snd, b"2", b"m", ignore_credit=True)
    p.pump()
    before = len(p.of("client", E.FlowReceived))
    p.client.flow(snd, echo=True)
    p.pump()
    assert len(p.of("client", E.FlowReceived)) == before + 1


def test_unattached_handle_ends_session(make_pair: Any) -> None:
    p = make_pair()
    sess = _open_session(p)
    p.server.receive_data(
        _frame(Transfer(handle=9, delivery_id=0, delivery_tag=b"t", message_format=0), sess.local_channel, b"x")
    )
    evs = p.server.next_events()
    assert isinstance(evs[0], E.SessionEnded) and evs[0].error.condition == Condition.UNATTACHED_HANDLE
    assert not p.server.is_done
    p.pump()
    assert sess.state is SessionState.ENDED or sess.state is SessionState.END_RCVD


def test_message_size_exceeded_is_refused_and_the_link_stays(make_pair: Any) -> None:
    p = make_pair(server=Connection(Role.SERVER, "s", max_message_size=100))
    sess = _open_session(p)
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    p.client.send_transfer(snd, b"t", b"x" * 1000)
    p.pump()
    (big,) = p.of("server", E.DeliveryTooLarge)
    assert (big.size, big.limit) == (1000, 100) and not p.of("server", E.DeliveryReceived)
    disp = p.of("client", E.DispositionReceived)[-1]
    assert disp.state.error.condition == Condition.MESSAGE_SIZE_EXCEEDED
    assert snd.state is LinkState.ATTACHED and not sess.outgoing_unsettled
    p.client.send_transfer(snd, b"u", b"y" * 10)  # the link goes on
    p.pump()
    assert p.of("server", E.DeliveryReceived)[-1].payload == b"y" * 10


def test_multi_frame_delivery_is_refused_as_soon_as_it_passes_the_bound(make_pair: Any) -> None:
    """The receiver drops what it buffered on the frame that passes the bound and discards the rest of the
    delivery frame by frame: it never holds more than the bound of it."""
    server = Connection(Role.SERVER, "s", max_frame_size=512)
    p = make_pair(server=server)
    sess = _open_session(p)
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    (link,) = [lk for s in server.sessions for lk in s.links.values()]
    link.max_message_size = 2000
    p.client.send_transfer(snd, b"t", b"z" * 10_000)  # about 21 frames of 512 bytes
    data = p.client.data_to_send()
    cut = 5 * 512  # the first five frames pass the bound
    server.receive_data(data[:cut])
    (big,) = [e for e in server.next_events() if isinstance(e, E.DeliveryTooLarge)]
    assert big.limit == 2000 and 2000 < big.size <= 2500
    assert link._partial is not None and link._partial[5] is None  # nothing kept, the rest is discarded
    server.receive_data(data[cut:])
    assert not [e for e in server.next_events() if isinstance(e, E.DeliveryReceived)]
    assert link._partial is None and link.attached
    p.client.send_transfer(snd, b"u", b"ok")
    p.pump()
    assert p.of("server", E.DeliveryReceived)[-1].payload == b"ok"


def test_frames_over_512_bytes_before_open_are_refused() -> None:
    srv = Connection(Role.SERVER, "s")
    header = struct.pack(">IBBH", 1 << 20, 2, 0, 0)  # announces 1 MiB, before any open
    srv.receive_data(b"AMQP\x00\x01\x00\x00" + header)
    assert srv.is_done and srv.error.condition == Condition.FRAMING_ERROR
    out = srv.data_to_send()
    assert b"amqp:connection:framing-error" in out  # answered with open + close, not a dropped socket


def test_refused_attach_then_detach_like_service_bus(make_pair: Any) -> None:
    p = make_pair(auto=False)
    p.client.open()
    sess = p.client.begin()
    snd = p.client.attach(sess, "s", SENDER, source=Source(), target=Target(address="missing"))
    p.pump()
    p.server.accept_sasl()
    p.pump()
    p.server.open()
    p.server.begin(p.of("server", E.SessionBeginRequested)[0].session)
    link = p.of("server", E.LinkAttachRequested)[0].link
    p.server.detach(link, error=Error("amqp:not-found", "no such entity"))  # auto null-source attach first
    p.pump()
    att = p.of("client", E.LinkAttached)[0]
    assert att.attach.source is None and att.attach.target is None
    det = p.of("client", E.LinkDetached)[0]
    assert det.error.condition == "amqp:not-found" and det.reply_needed
    assert snd.state is LinkState.DETACHED  # the harness answered the detach
    p.client.detach(snd)  # detaching again is a no-op


@pytest.mark.parametrize(
    ("raw", "condition"),
    [
        (AMQP_HEADER + b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x10\xff", Condition.DECODE_ERROR),
        (AMQP_HEADER + b"\x00\x10\x00\x00\x02\x00\x00\x00", Condition.FRAMING_ERROR),
        (
            AMQP_HEADER + _frame(Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1)),
            Condition.ILLEGAL_STATE,
        ),
        (AMQP_HEADER + _frame(Open(container_id="x"), 3), Condition.NOT_ALLOWED),
        (AMQP_HEADER + _frame(Open(container_id="x", max_frame_size=100)), Condition.INVALID_FIELD),
        (
            AMQP_HEADER + _frame(Open(container_id="x")) + b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x12\x45",
            Condition.INVALID_FIELD,
        ),
        (
            AMQP_HEADER + _frame(Open(container_id="x")) + _frame(Disposition(role=True, first=0), 4),
            Condition.NOT_FOUND,
        ),
        (AMQP_HEADER + _frame(Open(container_id="x")) + _frame(Open(container_id="x")), Condition.ILLEGAL_STATE),
    ],
)
def test_violations_close_cleanly(raw: bytes, condition: str) -> None:
    srv = Connection(Role.SERVER, "s", max_frame_size=65536)
    srv.receive_data(raw)
    evs = srv.next_events()
    closed = [e for e in evs if isinstance(e, E.ConnectionClosed)]
    assert closed and closed[0].error.condition == condition and not closed[0].by_peer
    assert srv.is_done
    out = srv.data_to_send()
    assert out.startswith(AMQP_HEADER)
    # the last frame we sent is a close carrying the condition
    assert b"\x00\x53\x18" in out and condition.encode() in out
    srv.receive_data(b"more garbage")  # ignored once done
    assert srv.next_events() == []


def test_bad_protocol_header() -> None:
    srv = Connection(Role.SERVER, "s")
    srv.receive_data(b"HTTP/1.1 GET /")
    assert srv.is_done and srv.data_to_send() == AMQP_HEADER
    assert isinstance(srv.next_events()[0], E.ConnectionClosed)


def test_transport_lost_event(make_pair: Any) -> None:
    p = make_pair()
    _open_session(p)
    p.server.receive_data(b"")
    ev = p.server.next_events()
    assert isinstance(ev[0], E.ConnectionClosed) and ev[0].by_peer and p.server.is_done


def test_idle_timeout_heartbeat_and_expiry() -> None:
    srv = Connection(Role.SERVER, "s", idle_timeout=10, now=0)
    cli = Connection(Role.CLIENT, "c", sasl_mechanism=None, now=0)
    cli.open()
    srv.receive_data(cli.data_to_send(now=0), now=0)
    srv.open()
    cli.receive_data(srv.data_to_send(now=0), now=0)
    assert cli.remote_idle_timeout == 10
    assert srv.next_deadline() == 10
    assert cli.next_deadline() == 5
    cli.tick(now=4)
    assert cli.data_to_send(now=4) == b""
    cli.tick(now=6)
    assert cli.data_to_send(now=6) == b"\x00\x00\x00\x08\x02\x00\x00\x00"
    srv.receive_data(b"\x00\x00\x00\x08\x02\x00\x00\x00", now=6)
    srv.tick(now=15)
    assert not srv.is_done
    srv.tick(now=17)
    assert srv.is_done
    assert srv.next_events()[-1].error.condition == Condition.RESOURCE_LIMIT_EXCEEDED


def test_local_misuse_raises() -> None:
    c = Connection(Role.CLIENT, "c")
    with pytest.raises(LocalProtocolError):
        c.begin()
    c.open()
    with pytest.raises(LocalProtocolError):
        c.open()
    s = c.begin()
    link = c.attach(s, "l", RECEIVER, source=Source(), target=Target())
    with pytest.raises(LocalProtocolError):
        c.send_transfer(link, b"t", b"x")


def test_rejected_outcome_and_settle_modes(make_pair: Any) -> None:
    p = make_pair(auto=True)
    sess = _open_session(p)
    snd = p.client.attach(
        sess, "s", SENDER, source=Source(), target=Target(address="q"), snd_settle_mode=SndSettleMode.SETTLED
    )
    p.pump()
    p.client.send_transfer(snd, b"t", b"x")
    p.pump()
    d = p.of("server", E.DeliveryReceived)[0]
    assert d.settled and not sess.outgoing_unsettled
    p.auto = False
    snd2 = p.client.attach(sess, "s2", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    lk = p.of("server", E.LinkAttachRequested)[1].link
    p.server.attach_reply(lk)
    p.server.flow(lk, link_credit=5)
    p.pump()
    ids = [p.client.send_transfer(snd2, b"%d" % i, b"x") for i in range(3)]
    p.pump()
    p.server.disposition(
        lk, ids[0], ids[2], settled=True, state=Rejected(Error("amqp:link:message-size-exceeded", "big"))
    )
    p.pump()
    disp = p.of("client", E.DispositionReceived)[-1]
    assert len(disp.deliveries) == 3 and disp.state.error.condition == "amqp:link:message-size-exceeded"
    assert not sess.outgoing_unsettled and not snd2.unsettled


# -------------------------------------------------------------------------------------------- fuzzing


def _drive_server(data: bytes, chunk: int) -> None:
    srv = Connection(Role.SERVER, "s", max_frame_size=4096)
    for i in range(0, len(data), chunk):
        srv.receive_data(data[i : i + chunk])
        for ev in srv.next_events():
            assert isinstance(ev, E.Event)
            # Answers to events the peer has meanwhile taken back (or to a connection it broke) are never
            # misuse: none of these may raise (see connection.py, "Stale answers").
            if isinstance(ev, E.SaslInit):
                srv.accept_sasl()
            elif isinstance(ev, E.ConnectionOpened):
                srv.open()
            elif isinstance(ev, E.SessionBeginRequested):
                srv.begin(ev.session)
            elif isinstance(ev, E.LinkAttachRequested):
                srv.attach_reply(ev.link)
                if ev.link.is_sender:
                    srv.flow(ev.link)
                else:
                    srv.flow(ev.link, link_credit=10)
            elif isinstance(ev, E.DeliveryReceived | E.DeliveryTooLarge) and not ev.settled:
                srv.settle(ev.link, ev.delivery_id, Accepted())
            elif isinstance(ev, E.LinkDetached) and ev.reply_needed:
                srv.detach(ev.link, closed=ev.closed)
            elif isinstance(ev, E.SessionEnded) and ev.reply_needed:
                srv.end(ev.session)
            elif isinstance(ev, E.ConnectionClosed) and ev.reply_needed:
                srv.close()
        srv.data_to_send()
    srv.receive_data(b"")
    assert srv.is_done


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_client_stream(client_stream: bytes, data: st.DataObject) -> None:
    raw = bytearray(client_stream)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(8, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _drive_server(bytes(raw), data.draw(st.sampled_from([1, 7, 64, 4096])))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", SASL_HEADER, AMQP_HEADER]))
def test_fuzz_random_bytes_into_server(data: bytes, prefix: bytes) -> None:
    _drive_server(prefix + data, 16)


def test_valid_stream_drives_cleanly(client_stream: bytes) -> None:
    """Replaying a real client's bytes one at a time through a server gives a clean conversation."""
    srv = Connection(Role.SERVER, "s")
    kinds = []
    for i in range(len(client_stream)):
        srv.receive_data(client_stream[i : i + 1])
        for ev in srv.next_events():
            kinds.append(type(ev))
            if isinstance(ev, E.SaslInit):
                srv.accept_sasl()
            elif isinstance(ev, E.ConnectionOpened):
                srv.open()
            elif isinstance(ev, E.SessionBeginRequested):
                srv.begin(ev.session)
            elif isinstance(ev, E.LinkAttachRequested):
                srv.attach_reply(ev.link)
            elif isinstance(ev, E.LinkDetached) and ev.reply_needed:
                srv.detach(ev.link)
            elif isinstance(ev, E.SessionEnded) and ev.reply_needed:
                srv.end(ev.session)
            elif isinstance(ev, E.ConnectionClosed) and ev.reply_needed:
                srv.close()
    assert E.DeliveryReceived in kinds and kinds[-1] is E.ConnectionClosed
    assert srv.error is None and srv.is_done


# --- errors scoped to a session or a link that was not answered yet ------------------------------------------------
def _server_after_open() -> Connection:
    srv = Connection(Role.SERVER, "s", max_frame_size=65536)
    srv.receive_data(AMQP_HEADER + _frame(Open(container_id="x")))
    (opened,) = srv.next_events()
    assert isinstance(opened, E.ConnectionOpened)
    srv.open()
    srv.data_to_send()
    return srv


def _sent(srv: Connection) -> list[tuple[int, Any]]:
    from shardbus.amqp.framing import FrameReader
    from shardbus.amqp.performatives import decode_performative

    reader = FrameReader()
    reader.feed(srv.data_to_send())
    out = []
    while (frame := reader.next_frame()) is not None:
        if frame.body:
            out.append((frame.channel, decode_performative(frame.body)[0]))
    return out


def test_an_error_in_an_unanswered_session_answers_its_begin_then_ends_it() -> None:
    srv = _server_after_open()
    srv.receive_data(
        _frame(Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10), 1)
        + _frame(Flow(next_incoming_id=0, incoming_window=10, next_outgoing_id=0, outgoing_window=10, handle=4), 1)
    )
    requested, ended = srv.next_events()
    assert isinstance(requested, E.SessionBeginRequested) and isinstance(ended, E.SessionEnded)
    assert ended.error.condition == Condition.UNATTACHED_HANDLE and not ended.by_peer and not srv.is_done
    (ch, begin), (ch2, end) = _sent(srv)
    assert isinstance(begin, Begin) and begin.remote_channel == 1 and isinstance(end, End) and ch == ch2
    srv.begin(requested.session)  # the application's answer comes late: stale, nothing sent, nothing raised
    assert srv.data_to_send() == b""
    srv.receive_data(_frame(End(), 1))
    assert not srv.sessions and not srv.is_done


def test_a_begin_answering_nothing_is_refused_with_its_session_only() -> None:
    srv = _server_after_open()
    srv.receive_data(_frame(Begin(remote_channel=7, next_outgoing_id=0, incoming_window=10, outgoing_window=10), 2))
    (ended,) = srv.next_events()
    assert isinstance(ended, E.SessionEnded) and ended.error.condition == Condition.ILLEGAL_STATE
    assert [type(p) for _, p in _sent(srv)] == [Begin, End] and not srv.is_done


def test_a_transfer_on_an_unanswered_link_refuses_that_link_only() -> None:
    srv = _server_after_open()
    srv.receive_data(_frame(Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10), 0))
    (requested,) = srv.next_events()
    srv.begin(requested.session)
    srv.data_to_send()
    attach = Attach(
        name="a", handle=3, role=SENDER, source=Source(), target=Target(address="q"), initial_delivery_count=0
    )
    srv.receive_data(_frame(attach, 0) + _frame(Transfer(handle=3, delivery_id=0, delivery_tag=b"t"), 0, b"m"))
    req, detached = srv.next_events()
    assert isinstance(req, E.LinkAttachRequested) and isinstance(detached, E.LinkDetached)
    assert detached.error.condition == Condition.TRANSFER_LIMIT_EXCEEDED and not detached.by_peer
    (_, a), (_, d) = _sent(srv)
    assert isinstance(a, Attach) and a.source is None and a.target is None
    assert isinstance(d, Detach) and d.closed and d.handle == a.handle
    srv.attach_reply(req.link)  # stale answers: nothing sent, nothing raised
    srv.flow(req.link, link_credit=10)
    assert srv.data_to_send() == b""
    srv.receive_data(_frame(Detach(handle=3, closed=True), 0))
    srv.next_events()
    assert requested.session.mapped and not requested.session.links and not srv.is_done
