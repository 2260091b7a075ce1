"""Runs of plain transfer frames (amqp/transfer_run.py) against the layered path on the same bytes.

Two servers in the same state are fed the same client bytes, cut into the same reads: one takes runs of plain
transfers in one loop (the default), the other takes every frame through the layered path
(``Connection.transfer_runs = False``). Whatever the bytes (plain transfers mixed with multi-frame, aborted,
settled and stateful ones, bad handles, a closed window, deliveries too large, other frames, damaged frames), both
must hand out the same events, write the same bytes and end in the same state. The real-socket tests of the same
ways out are in tests/endpoint/test_transfer_runs.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardbus.amqp import connection as connection_module
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.framing import FRAME_AMQP, encode_frame
from shardbus.amqp.link import Link
from shardbus.amqp.message import BATCH_MESSAGE_FORMAT
from shardbus.amqp.performatives import RECEIVER, SENDER, Accepted, Disposition, Flow, Source, Target, Transfer
from shardbus.amqp.session import Session

# ------------------------------------------------------------------------------------------- two servers


def _servers(make_pair: Any, window: int, auto_flow: bool, max_frame_size: int = 1048576) -> list[Any]:
    """Two pairs set up alike: the client attached senders "s" (handle 0) and "s2" (1) and a receiver "r" (2) on
    one session; the server's links bound messages at 3000 bytes, "s2" batches at 600."""
    pairs = []
    for runs in (True, False):
        server = Connection(Role.SERVER, "server", max_frame_size=max_frame_size)
        server.transfer_runs = runs
        p = make_pair(Connection(Role.CLIENT, "client", hostname="localhost"), server)
        c = p.client
        c.open()
        session = c.begin()
        c.attach(session, "s", SENDER, source=Source(), target=Target(address="q"))
        c.attach(session, "s2", SENDER, source=Source(), target=Target(address="q"))
        c.attach(session, "r", RECEIVER, source=Source(address="q"), target=Target())
        p.pump()
        (s_session,) = server._remote_sessions.values()
        for link in s_session.links.values():
            link.max_message_size = 3000
            if link.name == "s2":
                link.format_limits = {BATCH_MESSAGE_FORMAT: 600}
        s_session.incoming_window = window
        s_session.configured_incoming_window = window
        s_session.auto_flow = auto_flow
        server.next_events()
        server.data_to_send()
        pairs.append(p)
    return pairs


def _norm(v: Any) -> Any:
    """A comparable picture of an event field (links and sessions by name, ints with their type)."""
    if isinstance(v, Link):
        return ("link", v.name, v.role)
    if isinstance(v, Session):
        return ("session", v.remote_channel)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return (type(v).__name__, int(v))
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if dataclasses.is_dataclass(v):
        return (type(v).__name__, [_norm(getattr(v, f.name)) for f in dataclasses.fields(v)])
    return v


def _state(server: Connection) -> Any:
    sessions = []
    for s in server._remote_sessions.values():
        links = [
            (
                lk.name,
                lk.state.value,
                lk.delivery_count,
                lk.link_credit,
                sorted(lk.unsettled.items()),
                lk._partial is not None,
            )
            for lk in s.links.values()
        ]
        sessions.append(
            (
                s.state.value,
                s.incoming_window,
                s.next_incoming_id,
                s.remote_outgoing_window,
                sorted((k, _norm(r)) for k, r in s.incoming_unsettled.items()),
                links,
            )
        )
    return (server.is_done, _norm(server.error), sessions)


# ------------------------------------------------------------------------------------------- the frames


def _transfer(handle: int, did: int | None, tag: bytes | None, payload: bytes, **fields: Any) -> bytes:
    t = Transfer(handle=handle, delivery_id=did, delivery_tag=tag, **fields)
    return encode_frame(FRAME_AMQP, 0, t.encode() + payload)


def _plain(did: int, settled: bool | None, size: int, handle: int = 0) -> bytes:
    # as our client writes a first transfer (``_transfer_head``): message format and settled, nothing after them
    return _transfer(handle, did, b"t%d" % did, b"x" * size, message_format=0, settled=settled)


@st.composite
def _frames(draw: Any) -> bytes:
    out = []
    did = draw(st.sampled_from([0, 250, 0xFFFFFFF0]))  # smalluint ids, ids crossing into uint, ids wrapping
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(
            st.sampled_from(
                ["plain"] * 8
                + ["multi", "aborted", "state", "bad-handle", "their-receiver", "too-large", "batch-too-large"]
                + ["heartbeat", "disposition", "flow", "damaged", "extended", "rcv-settle", "resume", "batchable"]
                + ["sdk", "s2", "no-settled-field", "other-channel", "unfinished", "sasl-type"]
            )
        )
        settled = draw(st.sampled_from([None, False, True]))
        size = draw(st.integers(0, 1200))
        d = did & 0xFFFFFFFF
        did += 1
        if kind == "plain":
            out.append(_plain(d, settled, size))
        elif kind == "s2":
            out.append(_plain(d, settled, size, handle=1))
        elif kind in ("other-channel", "sasl-type"):  # channel 1 (no session there); frame type 1 (SASL)
            frame = bytearray(_plain(d, settled, size))
            frame[7 if kind == "other-channel" else 5] = 1
            out.append(bytes(frame))
        elif kind == "no-settled-field":
            out.append(_transfer(0, d, b"n%d" % d, b"y" * size))
        elif kind == "sdk":  # every field written up to batchable, as the SDK writes them
            out.append(
                encode_frame(
                    FRAME_AMQP,
                    0,
                    b"\x00\x53\x14\xc0"
                    + bytes((4 + 6 + len(b"sdk"), 11, 0x43))
                    + struct.pack(">BI", 0x70, d)
                    + b"\xa0\x03sdk"
                    + b"\x43\x42\x42\x40\x40\x42\x42\x42"
                    + b"z" * size,
                )
            )
        elif kind == "multi":
            out.append(_transfer(0, d, b"m", b"a" * size, more=True, settled=settled))
            out.append(_transfer(0, None, None, b"b" * 10, more=True))
            out.append(_transfer(0, d, None, b"c" * 5))
        elif kind == "unfinished":  # a delivery's first frames: what follows on the link meets a partial delivery
            out.append(_transfer(0, d, b"f", b"f" * size, more=True, settled=settled))
        elif kind == "aborted":
            out.append(_transfer(0, d, b"a", b"a" * size, more=True))
            out.append(_transfer(0, None, None, b"", aborted=True))
        elif kind == "state":
            out.append(_transfer(0, d, b"st", b"s" * size, state=Accepted()))
        elif kind == "bad-handle":
            out.append(_plain(d, settled, size, handle=7))
        elif kind == "their-receiver":  # the client's receiver: a transfer on our sending link
            out.append(_plain(d, settled, size, handle=2))
        elif kind == "too-large":
            out.append(_plain(d, settled, 3001))
        elif kind == "batch-too-large":
            out.append(_transfer(1, d, b"b", b"b" * 601, message_format=BATCH_MESSAGE_FORMAT, settled=settled))
        elif kind == "heartbeat":
            out.append(encode_frame(FRAME_AMQP, 0, b""))
        elif kind == "disposition":
            out.append(encode_frame(FRAME_AMQP, 0, Disposition(role=SENDER, first=0, settled=True).encode()))
        elif kind == "flow":
            flow = Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=d, outgoing_window=100)
            out.append(encode_frame(FRAME_AMQP, 0, flow.encode()))
        elif kind == "damaged":
            frame = bytearray(_plain(d, settled, size))
            at = draw(st.integers(0, min(len(frame) - 1, 30)))  # the frame header too
            frame[at] = draw(st.integers(0, 255))
            out.append(bytes(frame))
        elif kind == "extended":  # doff 3: an extended header of 4 bytes
            body = Transfer(handle=0, delivery_id=d, delivery_tag=b"e", settled=settled).encode() + b"e" * size
            out.append(struct.pack(">IBBH", 12 + len(body), 3, 0, 0) + b"\0\0\0\0" + body)
        elif kind == "rcv-settle":
            out.append(_transfer(0, d, b"r", b"r" * size, rcv_settle_mode=1))
        elif kind == "resume":
            out.append(_transfer(0, d, b"u", b"u" * size, resume=True))
        elif kind == "batchable":
            out.append(_transfer(0, d, b"h", b"h" * size, settled=settled, batchable=True))
    return b"".join(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stream=_frames(),
    cuts=st.lists(st.integers(1, 60_000), max_size=6),
    window=st.sampled_from([65536, 3, 12]),
    auto_flow=st.booleans(),
    max_frame_size=st.sampled_from([1048576, 1024]),  # 1024: the larger transfers exceed it
)
def test_runs_and_the_layered_path_agree(
    make_pair: Any, stream: bytes, cuts: list[int], window: int, auto_flow: bool, max_frame_size: int
) -> None:
    fast, layered = (p.server for p in _servers(make_pair, window, auto_flow, max_frame_size))
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for a, b in itertools.pairwise(bounds):
        fast.receive_data(stream[a:b])
        layered.receive_data(stream[a:b])
        assert [_norm(e) for e in fast.next_events()] == [_norm(e) for e in layered.next_events()]
        assert fast.data_to_send() == layered.data_to_send()
        assert _state(fast) == _state(layered)


def test_a_run_is_taken_in_one_loop_and_payloads_are_bytes(make_pair: Any, monkeypatch: Any) -> None:
    """The fast path is really taken (a read of many plain transfers: a run), and what it hands out is what the
    layered path does: ``bytes`` payloads and tags, ``UInt`` delivery ids, unsettled deliveries remembered."""
    taken: list[int] = []
    take = connection_module.take_transfers

    def counting(buf: Any, pos: int, *args: Any) -> int:
        end = take(buf, pos, *args)
        taken.append(end - pos)
        return end

    monkeypatch.setattr(connection_module, "take_transfers", counting)
    fast, layered = (p.server for p in _servers(make_pair, 65536, True))
    stream = b"".join(_plain(i, i % 3 == 0, 1024) for i in range(300, 400))
    for server in (fast, layered):
        server.receive_data(stream)
    got, want = fast.next_events(), layered.next_events()
    assert [_norm(e) for e in got] == [_norm(e) for e in want] and len(got) == 100
    assert sum(taken) >= 99 * len(_plain(300, False, 1024))  # the first of a new tail may go the layered way
    assert all(type(e.payload) is bytes and type(e.delivery_tag) is bytes for e in got)
    assert all(type(e.delivery_id).__name__ == "UInt" for e in got)
    assert _state(fast) == _state(layered)
    (session,) = fast._remote_sessions.values()
    assert len(session.incoming_unsettled) == 66


def test_a_receiving_client_takes_runs_too(make_pair: Any) -> None:
    """Our own client runs on this engine: the deliveries it receives come through the run as well."""
    p = make_pair()
    c = p.client
    c.open()
    session = c.begin()
    rcv = c.attach(session, "r", RECEIVER, source=Source(address="q"), target=Target())
    p.pump()
    c.flow(rcv, link_credit=50)
    p.pump()
    (s_session,) = p.server._remote_sessions.values()
    (snd,) = [lk for lk in s_session.links.values() if lk.is_sender]
    for i in range(50):
        p.server.send_transfer(snd, b"%d" % i, b"p" * 100)
    p.pump()
    from shardbus.amqp import events as E

    got = p.of("client", E.DeliveryReceived)
    assert [e.delivery_tag for e in got] == [b"%d" % i for i in range(50)]
    assert all(e.payload == b"p" * 100 for e in got) and rcv.link_credit == 0
