"""A delivery of several frames comes out whole and as ``bytes`` whether the link keeps its frames (below
``JOIN_BELOW``) or one growing buffer (past it): amqp/link.py. The size bound is tests/amqp/test_connection.py's."""

from __future__ import annotations

import os
from typing import Any

import pytest

from shardbus.amqp import events as E
from shardbus.amqp import link as link_module
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.message import BATCH_MESSAGE_FORMAT
from shardbus.amqp.performatives import SENDER, Source, Target


@pytest.mark.parametrize("join_below", [100_000, 3000])  # every delivery below it; the larger ones past it
def test_multi_frame_deliveries_whole_either_way(make_pair: Any, monkeypatch: Any, join_below: int) -> None:
    monkeypatch.setattr(link_module, "JOIN_BELOW", join_below)
    p = make_pair(Connection(Role.CLIENT, "c", max_frame_size=1000), Connection(Role.SERVER, "s", max_frame_size=1000))
    p.client.open()
    session = p.client.begin()
    p.pump()
    snd = p.client.attach(session, "s", SENDER, source=Source(), target=Target(address="q"))
    p.pump()
    payloads = [os.urandom(n) for n in (10, 1500, 2999, 3001, 20_000)]
    for i, payload in enumerate(payloads):
        p.client.send_transfer(snd, bytes([i]), payload, message_format=BATCH_MESSAGE_FORMAT)
        p.pump()
    got = p.of("server", E.DeliveryReceived)
    assert [d.payload for d in got] == payloads
    assert all(type(d.payload) is bytes and d.message_format == BATCH_MESSAGE_FORMAT for d in got)
