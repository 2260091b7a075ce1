"""Micro-benchmark: the AMQP engine's per-message CPU on the broker's hot paths, with no sockets and no broker.

A server ``Connection`` (the broker's side) and a client ``Connection`` are set up in memory (SASL, open, begin,
a sender and a receiver link); then each measurement times only the **server** side of one hot path, on bytes
the client produced beforehand:

    transfer-in       receive_data() of N unsettled 1 KB transfers (16-byte tags) + next_events()
    transfer-in-psd   the same, pre-settled
    disposition-in    receive_data() of N single-delivery dispositions (unsettled accepted, as our consumer sends)
    complete-in       the same, settled
    complete-roundtrip  one unsettled disposition per read, echoed settled and written (the SDK's peek-lock
                      complete_message: it waits for each echo)
    transfer-out      send_transfer() of N unsettled 1 KB deliveries (16-byte tags) + data_to_send()
    settle-out        N settle() echoes (settled accepted, one delivery each) + data_to_send()
    settle-out-range  one disposition() for a range of 100 deliveries, per message

Input arrives in 64 KB reads, as a socket delivers it; output is taken every 100 messages, as a transport
writes it once per loop turn. Each line prints the best of ``--repeat`` runs in
microseconds per message. Below, the same run measures the fast paths the engine takes against the generic
codec for the same work (``ratio`` = generic / fast): decoding a transfer and a disposition performative,
encoding a transfer head.

    python bench/amqp_engine.py [--n N] [--repeat R] [--profile NAME]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from shardbus.amqp import events as E
from shardbus.amqp import performatives as P
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.performatives import RECEIVER, SENDER, Accepted, SndSettleMode, Source, Target

PAYLOAD = b"\x00Su\xb0\x00\x00\x04\x00" + bytes(1024)  # a data section of 1 KB
READ = 65536
FLUSH = 100  # output is taken (as a transport writes it) every FLUSH messages
WINDOW = 0x7FFFFFFF


class Setup:
    """A connected client/server pair: the client has a sender link (``snd``) and a receiver link (``rcv``);
    ``server_in`` / ``server_out`` are the server's ends of them."""

    def __init__(self, *, settled: bool = False, credit: int = 1_000_000) -> None:
        self.client = Connection(Role.CLIENT, "client", hostname="localhost")
        self.server = Connection(Role.SERVER, "server")
        c = self.client
        c.open()
        mode = SndSettleMode.SETTLED if settled else SndSettleMode.UNSETTLED
        sess = c.begin(incoming_window=WINDOW)
        self.snd = c.attach(sess, "snd", SENDER, source=Source(), target=Target(address="q"), snd_settle_mode=mode)
        self.rcv = c.attach(sess, "rcv", RECEIVER, source=Source(address="q"), target=Target(), snd_settle_mode=mode)
        self.server_in: Any = None
        self.server_out: Any = None
        self.credit = credit
        self.pump()
        c.flow(self.rcv, link_credit=credit)
        self.pump()
        assert self.server_in is not None and self.server_out is not None and self.snd.credit == credit

    def pump(self) -> None:
        c, s = self.client, self.server
        for _ in range(20):
            d = c.data_to_send()
            if d:
                s.receive_data(d)
            for ev in s.next_events():
                self._answer(ev)
            d2 = s.data_to_send()
            if d2:
                c.receive_data(d2)
            c.next_events()
            if not d and not d2:
                return

    def _answer(self, ev: E.Event) -> None:
        s = self.server
        if isinstance(ev, E.SaslInit):
            s.accept_sasl()
        elif isinstance(ev, E.ConnectionOpened):
            s.open()
        elif isinstance(ev, E.SessionBeginRequested):
            s.begin(ev.session, incoming_window=WINDOW, outgoing_window=WINDOW)
        elif isinstance(ev, E.LinkAttachRequested):
            s.attach_reply(ev.link)
            if ev.link.is_sender:
                self.server_out = ev.link
            else:
                self.server_in = ev.link
                s.flow(ev.link, link_credit=self.credit)


def feed(conn: Connection, data: bytes) -> int:
    """Feed ``data`` in socket-sized reads, draining events as a transport does; returns the event count."""
    count = 0
    for i in range(0, len(data), READ):
        conn.receive_data(data[i : i + READ])
        count += len(conn.next_events())
        conn.data_to_send()
    return count


def tag(i: int) -> bytes:
    return i.to_bytes(16, "little")


def m_transfer_in(n: int, settled: bool) -> tuple[Callable[[], Any], Setup]:
    st = Setup(settled=settled)
    c = st.client
    for i in range(n):
        c.send_transfer(st.snd, tag(i), PAYLOAD)
    data = c.data_to_send()
    return (lambda: feed(st.server, data)), st


def m_disposition_in(n: int, settled: bool) -> tuple[Callable[[], Any], Setup]:
    st = Setup()
    s, c = st.server, st.client
    for i in range(n):
        s.send_transfer(st.server_out, tag(i), PAYLOAD)
    c.receive_data(s.data_to_send())
    dids = [ev.delivery_id for ev in c.next_events() if isinstance(ev, E.DeliveryReceived)]
    assert len(dids) == n
    for did in dids:
        c.disposition(st.rcv, did, settled=settled, state=Accepted())
    data = c.data_to_send()
    return (lambda: feed(s, data)), st


def m_complete_roundtrip(n: int) -> tuple[Callable[[], Any], Setup]:
    """One unsettled ``accepted`` disposition per read, echoed settled and written at once (the SDK's
    complete_message waits for each echo): the engine's share of a read-answer-write turn."""
    st = Setup()
    s, c = st.server, st.client
    for i in range(n):
        s.send_transfer(st.server_out, tag(i), PAYLOAD)
    c.receive_data(s.data_to_send())
    dids = [ev.delivery_id for ev in c.next_events() if isinstance(ev, E.DeliveryReceived)]
    frames = []
    for did in dids:
        c.disposition(st.rcv, did, settled=False, state=Accepted())
        frames.append(c.data_to_send())
    link = st.server_out

    def run() -> None:
        receive, events, settle, out = s.receive_data, s.next_events, s.disposition, s.data_to_send
        for frame in frames:
            receive(frame)
            for ev in events():
                settle(link, ev.first, ev.last, settled=True, state=ev.state)  # type: ignore[attr-defined]
            out()

    return run, st


def m_transfer_out(n: int) -> tuple[Callable[[], Any], Setup]:
    st = Setup()
    s, link = st.server, st.server_out
    tags = [tag(i) for i in range(n)]

    def run() -> None:
        send = s.send_transfer
        for i, t in enumerate(tags):
            send(link, t, PAYLOAD)
            if i % FLUSH == 0:
                s.data_to_send()
        s.data_to_send()

    return run, st


def _received(n: int) -> tuple[Setup, list[int]]:
    st = Setup()
    c, s = st.client, st.server
    for i in range(n):
        c.send_transfer(st.snd, tag(i), PAYLOAD)
    s.receive_data(c.data_to_send())
    dids = [ev.delivery_id for ev in s.next_events() if isinstance(ev, E.DeliveryReceived)]
    assert len(dids) == n
    s.data_to_send()
    return st, dids


def m_settle_out(n: int) -> tuple[Callable[[], Any], Setup]:
    st, dids = _received(n)
    s, link = st.server, st.server_in
    state = Accepted()

    def run() -> None:
        settle = s.settle
        for i, did in enumerate(dids):
            settle(link, did, state)
            if i % FLUSH == 0:
                s.data_to_send()
        s.data_to_send()

    return run, st


def m_settle_out_range(n: int) -> tuple[Callable[[], Any], Setup]:
    st, dids = _received(n)
    s, link = st.server, st.server_in
    state = Accepted()

    def run() -> None:
        for i in range(0, len(dids), 100):
            s.disposition(link, dids[i], dids[min(i + 99, len(dids) - 1)], settled=True, state=state)
        s.data_to_send()

    return run, st


MEASUREMENTS: dict[str, Callable[[int], tuple[Callable[[], Any], Setup]]] = {
    "transfer-in": lambda n: m_transfer_in(n, False),
    "transfer-in-psd": lambda n: m_transfer_in(n, True),
    "disposition-in": lambda n: m_disposition_in(n, False),
    "complete-in": lambda n: m_disposition_in(n, True),
    "complete-roundtrip": m_complete_roundtrip,
    "transfer-out": m_transfer_out,
    "settle-out": m_settle_out,
    "settle-out-range": m_settle_out_range,
}


def best_of(name: str, n: int, repeat: int) -> float:
    """Best per-message time (s) over ``repeat`` fresh setups (each run changes the engine's state)."""
    best = float("inf")
    for _ in range(repeat):
        run, _st = MEASUREMENTS[name](n)
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / n


def codec_lines(number: int) -> None:
    """Fast path vs the generic codec on the same bytes (where the engine has a fast path)."""
    transfer = P.Transfer(handle=1, delivery_id=70000, delivery_tag=tag(7), message_format=0, settled=False).encode()
    disposition = P.Disposition(role=True, first=70000, settled=True, state=Accepted()).encode()

    generic_decode = getattr(P, "decode_performative_generic", P.decode_performative)  # older trees: no fast path

    def generic(body: bytes) -> Callable[[], Any]:
        return lambda: generic_decode(body)

    rows: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("decode transfer", generic(transfer), lambda: P.decode_performative(transfer)),
        ("decode disposition", generic(disposition), lambda: P.decode_performative(disposition)),
    ]
    from shardbus.amqp import connection as C

    head = getattr(C, "_transfer_head", None)
    if head is not None:
        rows.append(
            (
                "encode transfer head",
                lambda: P.Transfer(
                    handle=1, delivery_id=70000, delivery_tag=tag(7), message_format=0, settled=False
                ).encode(),
                lambda: head(1, 70000, tag(7), 0, False),
            )
        )
    for label, slow, fast in rows:
        g = min(timeit.repeat(slow, number=number, repeat=5)) / number
        f = min(timeit.repeat(fast, number=number, repeat=5)) / number
        print(f"  {label:<24} generic {g * 1e6:6.2f} us  engine {f * 1e6:6.2f} us  ratio {g / f:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="messages per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="fresh runs per measurement (best is shown)")
    parser.add_argument("--only", default="", help="comma-separated measurement names")
    parser.add_argument("--profile", default="", help="cProfile one measurement instead")
    args = parser.parse_args()
    if args.profile:
        run, _st = MEASUREMENTS[args.profile](args.n)
        prof = cProfile.Profile()
        prof.runcall(run)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        return
    names = [x for x in MEASUREMENTS if not args.only or x in args.only.split(",")]
    print(f"engine, server side, 1 KB payloads, n={args.n}, best of {args.repeat}")
    for name in names:
        print(f"  {name:<24} {best_of(name, args.n, args.repeat) * 1e6:6.2f} us/msg", flush=True)
    codec_lines(20_000)


if __name__ == "__main__":
    main()
