"""Shared helpers: an in-memory pair of Connection objects and a tiny auto-answering broker."""

from __future__ import annotations

from typing import Any

import pytest

from shardbus.amqp import events as E
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.performatives import Accepted, Error, Rejected


class Pair:
    """Moves bytes between a client and a server Connection and records every event.

    ``auto`` makes the server answer like a minimal broker: accept SASL, answer open/begin/attach (echo),
    grant ``server_credit`` on attached receiving links, accept unsettled deliveries, answer detach/end/close.
    """

    def __init__(
        self,
        client: Connection | None = None,
        server: Connection | None = None,
        *,
        auto: bool = True,
        server_credit: int = 100,
        client_auto: bool = True,
    ) -> None:
        self.client = client or Connection(Role.CLIENT, "client", hostname="localhost")
        self.server = server or Connection(Role.SERVER, "server")
        self.auto = auto
        self.client_auto = client_auto
        self.server_credit = server_credit
        self.server_events: list[Any] = []
        self.client_events: list[Any] = []
        self.client_bytes = bytearray()

    def pump(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            moved = False
            d = self.client.data_to_send()
            if d:
                moved = True
                self.client_bytes += d
                self.server.receive_data(d)
            for ev in self.server.next_events():
                self.server_events.append(ev)
                if self.auto:
                    self._answer(ev)
            d = self.server.data_to_send()
            if d:
                moved = True
                self.client.receive_data(d)
            for ev in self.client.next_events():
                self.client_events.append(ev)
                if self.client_auto:
                    if isinstance(ev, E.LinkDetached) and ev.reply_needed:
                        self.client.detach(ev.link, closed=ev.closed)
                    elif isinstance(ev, E.SessionEnded) and ev.reply_needed:
                        self.client.end(ev.session)
                    elif isinstance(ev, E.ConnectionClosed) and ev.reply_needed:
                        self.client.close()
            if not moved and not self.client._out and not self.server._out:
                return

    def _answer(self, ev: Any) -> None:
        s = self.server
        if isinstance(ev, E.SaslInit):
            s.accept_sasl()
        elif isinstance(ev, E.ConnectionOpened):
            if not s.open_sent:
                s.open()
        elif isinstance(ev, E.SessionBeginRequested):
            s.begin(ev.session)
        elif isinstance(ev, E.LinkAttachRequested):
            s.attach_reply(ev.link)
            if not ev.link.is_sender:
                s.flow(ev.link, link_credit=self.server_credit)
        elif isinstance(ev, E.DeliveryReceived):
            if not ev.settled:
                s.settle(ev.link, ev.delivery_id, Accepted())
        elif isinstance(ev, E.DeliveryTooLarge):
            if not ev.settled:
                error = Error("amqp:link:message-size-exceeded", f"{ev.size} > {ev.limit}")
                s.settle(ev.link, ev.delivery_id, Rejected(error=error))
        elif isinstance(ev, E.LinkDetached) and ev.reply_needed:
            s.detach(ev.link, closed=ev.closed)
        elif isinstance(ev, E.SessionEnded) and ev.reply_needed:
            s.end(ev.session)
        elif isinstance(ev, E.ConnectionClosed) and ev.reply_needed:
            s.close()

    def of(self, side: str, cls: type) -> list[Any]:
        evs = self.server_events if side == "server" else self.client_events
        return [e for e in evs if isinstance(e, cls)]


@pytest.fixture
def pair() -> Pair:
    return Pair()


@pytest.fixture
def make_pair() -> type[Pair]:
    """The ``Pair`` class itself (test modules are not a package, so they cannot import it)."""
    return Pair


@pytest.fixture(scope="session")
def client_stream() -> bytes:
    """Every byte a client sends in a complete conversation (for fuzzing a server with mutations of it)."""
    from shardbus.amqp.message import AmqpMessage
    from shardbus.amqp.performatives import RECEIVER, SENDER, Source, Target

    p = Pair()
    c = p.client
    c.open()
    sess = c.begin()
    snd = c.attach(sess, "s", SENDER, source=Source(), target=Target(address="q"))
    rcv = c.attach(sess, "r", RECEIVER, source=Source(address="q"), target=Target())
    p.pump()
    c.send_transfer(snd, b"t", AmqpMessage.with_data(b"x" * 40).encode())
    c.flow(rcv, link_credit=3, drain=True)
    c.flow(sess, echo=True)
    p.pump()
    c.detach(snd)
    c.detach(rcv)
    c.end(sess)
    c.close()
    p.pump()
    assert p.server.is_done
    return bytes(p.client_bytes)
