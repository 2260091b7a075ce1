"""``Connection.send_deliveries`` (a batch of deliveries in one pass) writes and records exactly what one
``send_transfer`` per delivery does, falls back to it for deliveries of several frames or long tags, and refuses a
batch beyond the credit or window before sending anything."""

from __future__ import annotations

from typing import Any

import pytest

from shardbus.amqp import events as E
from shardbus.amqp.connection import Connection, Role
from shardbus.amqp.errors import LocalProtocolError
from shardbus.amqp.performatives import RECEIVER, Source, Target


def _linked(make_pair: Any, credit: int = 1000, max_frame: int = 1048576) -> tuple[Connection, Connection, Any]:
    client = Connection(Role.CLIENT, "client", hostname="localhost", max_frame_size=max_frame)
    pair = make_pair(client=client)
    client.open()
    sess = client.begin(incoming_window=100_000)
    rcv = client.attach(sess, "r", RECEIVER, source=Source(address="q"), target=Target(), snd_settle_mode=0)
    pair.pump()
    link = next(ev.link for ev in pair.server_events if isinstance(ev, E.LinkAttachRequested))
    client.flow(rcv, link_credit=credit)
    pair.pump()
    pair.server.data_to_send()
    return pair.server, client, link


def _state(server: Connection, link: Any) -> tuple[Any, ...]:
    session = link.session
    unsettled = {did: (ref.delivery_id, ref.delivery_tag) for did, ref in session.outgoing_unsettled.items()}
    return (
        session.next_delivery_id,
        session.next_outgoing_id,
        session.remote_incoming_window,
        link.link_credit,
        link.delivery_count,
        unsettled,
        dict(link.unsettled),
    )


DELIVERIES = [
    [(i.to_bytes(16, "little"), b"p" * (i * 37 % 900)) for i in range(300)],  # delivery ids past 255 take the long form
    [(b"", b"x"), (bytes(255), b"y"), (b"t", b"")],  # an empty tag; a tag that makes the performative long
    [(b"a", b"small"), (b"b", b"L" * 5000), (b"c", b"small")],  # a payload of several frames in the middle
]


@pytest.mark.parametrize("settled", [False, True])
@pytest.mark.parametrize("deliveries", DELIVERIES, ids=["many", "tags", "multi-frame"])
def test_send_deliveries_writes_and_records_what_send_transfer_does(
    make_pair: Any, deliveries: list, settled: bool
) -> None:
    one_by_one, _, link1 = _linked(make_pair, max_frame=1024)
    batched, _, link2 = _linked(make_pair, max_frame=1024)
    for _ in range(2):  # twice: the second batch continues the delivery ids of the first
        ids = [one_by_one.send_transfer(link1, tag, payload, settled=settled) for tag, payload in deliveries]
        first = ids[0]
        assert batched.send_deliveries(link2, deliveries, settled=settled) == first
        assert batched.data_to_send() == one_by_one.data_to_send()
        assert _state(batched, link2) == _state(one_by_one, link1)


@pytest.mark.parametrize("settled", [False, True])
@pytest.mark.parametrize(
    "start", [256, 1000, 0xFFFFFFFF - 2, 0xFFFFFFFF - 40], ids=["256", "1000", "wraps", "wraps-later"]
)
def test_batches_from_long_delivery_ids_match_send_transfer(make_pair: Any, start: int, settled: bool) -> None:
    """The one-pack head of a batch whose delivery ids are all 4-byte uints gives what ``send_transfer`` gives,
    and hands over to the general loop where a delivery differs (a tag of another length, several frames)."""
    batches = [
        [(i.to_bytes(16, "little"), b"p" * (i * 37 % 900)) for i in range(60)],  # 16-byte tags, some too long
        [(bytes(16), b"a"), (bytes(4), b"b"), (bytes(16), b"c")],  # the tag's length changes
        [(bytes(16), b"a"), (bytes(16), b"L" * 3000), (bytes(16), b"c")],  # several frames in the middle
        [(bytes(8), b"x") for _ in range(50)],
    ]
    one_by_one, _, link1 = _linked(make_pair, max_frame=1024)
    batched, _, link2 = _linked(make_pair, max_frame=1024)
    link1.session.next_delivery_id = link2.session.next_delivery_id = start
    for deliveries in batches:
        ids = [one_by_one.send_transfer(link1, tag, payload, settled=settled) for tag, payload in deliveries]
        assert batched.send_deliveries(link2, deliveries, settled=settled) == ids[0]
        assert batched.data_to_send() == one_by_one.data_to_send()
        assert _state(batched, link2) == _state(one_by_one, link1)


def test_the_client_receives_every_delivery_of_a_batch(make_pair: Any) -> None:
    server, client, link = _linked(make_pair)
    deliveries = [(i.to_bytes(16, "little"), b"body %d" % i) for i in range(50)]
    server.send_deliveries(link, deliveries, settled=False)
    client.receive_data(server.data_to_send())
    got = [ev for ev in client.next_events() if isinstance(ev, E.DeliveryReceived)]
    assert [(ev.delivery_tag, bytes(ev.payload)) for ev in got] == deliveries
    assert [ev.delivery_id for ev in got] == list(range(50))


def test_a_batch_beyond_the_credit_is_refused_before_anything_is_sent(make_pair: Any) -> None:
    server, _client, link = _linked(make_pair, credit=3)
    before = _state(server, link)
    with pytest.raises(LocalProtocolError):
        server.send_deliveries(link, [(bytes([i]), b"x") for i in range(4)], settled=False)
    assert server.data_to_send() == b""
    assert _state(server, link) == before
    assert server.send_deliveries(link, [], settled=False) == before[0]
    server.send_deliveries(link, [(bytes([i]), b"x") for i in range(3)], settled=False)
    assert link.link_credit == 0


def test_a_batch_beyond_the_peers_session_window_is_refused(make_pair: Any) -> None:
    server, _client, link = _linked(make_pair)
    link.session.remote_incoming_window = 2
    with pytest.raises(LocalProtocolError):
        server.send_deliveries(link, [(bytes([i]), b"x") for i in range(3)], settled=True)
    assert server.data_to_send() == b""


def test_a_batch_on_a_sending_link_of_the_peer_is_refused(make_pair: Any) -> None:
    _server, client, _link = _linked(make_pair)
    rcv = next(iter(client.sessions[0].links.values()))
    with pytest.raises(LocalProtocolError):
        client.send_deliveries(rcv, [(b"t", b"x")], settled=True)
