"""Our own client's receive path (``shardbus.client.MessageReceiver``) through a real broker: a received message's
annotations stay encoded until read and then read as an eager decode would; a partial batch ends after ``idle``
and nothing sent afterwards is lost (receive-and-delete: the drain); receivers waiting together on one link both
get their messages; an empty receive returns after ``max_wait``."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from shardbus.amqp import types as t
from shardbus.amqp.message import Header, decode_message
from shardbus.client import OutgoingMessage, ShardbusClient, _decode_received


def test_received_annotations_read_as_decoded_eagerly(broker):
    broker.namespace.create_queue("lazyann", enable_partitioning=True)
    with ShardbusClient(broker.connection_string, timeout=30) as client:
        sent = [
            OutgoingMessage(
                f"m{i}".encode(),
                message_id=f"m{i}",
                partition_key=f"k{i % 3}",
                application_properties={"n": i},
                time_to_live_ms=600_000,
            )
            for i in range(6)
        ]
        client.send("lazyann", sent)
        with client.receiver("lazyann") as receiver:
            got = []
            while len(got) < 6:
                got += receiver.receive(max_count=6 - len(got), max_wait=5)
            for m in got:
                eager = decode_message(m.delivery.payload)
                assert m.message == eager and eager == m.message
                assert m.body == eager.data and m.message.properties == eager.properties
                assert m.message.application_properties == eager.application_properties
                assert m.sequence_number > 0 and m.enqueued_time_ms is not None
                assert m.annotation("x-opt-partition-key") == f"k{int(m.body[1:]) % 3}"
                assert m.message.message_annotations == eager.message_annotations
                assert m.message.encode() == eager.encode()
                m.message.message_annotations = {t.Symbol("x"): 1}  # still settable
                assert m.annotation("x") == 1
                assert m.lock_token == uuid.UUID(bytes_le=m.delivery.delivery_tag)  # the delivery's tag, .NET order
            assert sorted(m.body for m in got) == sorted(m.body for m in sent)
            receiver.complete(got)


def test_decode_received_falls_back_on_unusual_messages():
    plain = OutgoingMessage(b"no annotations", message_id="a").encode()
    assert _decode_received(plain) == decode_message(plain)
    assert type(_decode_received(plain)) is type(decode_message(plain))
    keyed = OutgoingMessage(b"x", message_id="b", partition_key="k", durable=True).encode()
    lazy = _decode_received(keyed)
    assert type(lazy) is not type(decode_message(keyed)) and lazy == decode_message(keyed)


def test_a_deliverys_header_and_annotations_read_at_once_as_by_the_loop():
    """``_decode_received``'s first step (a list8 header, then map8 annotations, as shardbus delivers) gives what
    its section loop gives: the same message with its annotations left encoded, and anything else (no
    annotations, another map, a truncated section) decoded whole, or refused, as ``decode_message`` does."""
    header = Header(delivery_count=1).encode()  # a list8
    assert header[:4] == b"\x00\x53\x70\xc0"
    body = OutgoingMessage(b"x" * 50, message_id="b").encode()
    annotations = b"\x00\x53\x72\xc1\x11\x02\xa3\x05x-opt\x81" + (12345).to_bytes(8, "big")  # a map8
    null_annotations = b"\x00\x53\x72\x40"
    map32 = b"\x00\x53\x72\xd1" + (4).to_bytes(4, "big") + (0).to_bytes(4, "big")  # an empty map32
    truncated = [(header + annotations)[:cut] + b"\x00" * 2 for cut in (len(header) - 2, len(header) + 3)]
    for payload in (
        header + annotations + body,
        header + body,
        annotations + body,
        header + map32 + body,
        header + null_annotations + body,  # refused, as decode_message refuses it
        *truncated,
    ):
        try:
            eager = decode_message(payload)
        except Exception as exc:
            with pytest.raises(type(exc)):
                _decode_received(payload)
            continue
        got = _decode_received(payload)
        assert got == eager and got.message_annotations == eager.message_annotations
        assert got.encode() == eager.encode()
    assert type(_decode_received(header + annotations + body)) is not type(decode_message(header + body))


def test_partial_batch_then_later_sends_are_not_lost(broker):
    broker.namespace.create_queue("partial")
    with ShardbusClient(broker.connection_string, timeout=30) as client:
        client.send("partial", [OutgoingMessage(f"a{i}".encode(), message_id=f"a{i}") for i in range(3)])
        with client.receiver("partial", receive_and_delete=True) as receiver:
            t0 = time.monotonic()
            first = receiver.receive(max_count=50, max_wait=5, idle=0.2)
            assert [m.body for m in first] == [b"a0", b"a1", b"a2"]
            assert time.monotonic() - t0 < 4  # ended by idle, not max_wait
            # The unused credit was drained: these are not delivered (and lost) before the next receive.
            client.send("partial", [OutgoingMessage(f"b{i}".encode(), message_id=f"b{i}") for i in range(4)])
            time.sleep(0.3)
            second = []
            while len(second) < 4:
                batch = receiver.receive(max_count=50, max_wait=5, idle=0.2)
                assert batch
                second += batch
            assert [m.body for m in second] == [b"b0", b"b1", b"b2", b"b3"]


def test_empty_receive_waits_max_wait(broker):
    broker.namespace.create_queue("empty")
    with ShardbusClient(broker.connection_string, timeout=30) as client, client.receiver("empty") as receiver:
        t0 = time.monotonic()
        assert receiver.receive(max_count=5, max_wait=0.4) == []
        assert 0.35 <= time.monotonic() - t0 < 3


def test_two_threads_receiving_on_one_link(broker):
    broker.namespace.create_queue("twowait")
    with ShardbusClient(broker.connection_string, timeout=30) as client, client.receiver("twowait") as receiver:
        results: list[list] = [[], []]

        def take(i: int) -> None:
            until = time.monotonic() + 20
            while len(results[0]) + len(results[1]) < 20 and time.monotonic() < until:
                results[i] += receiver.receive(max_count=5, max_wait=1, idle=0.1)

        threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        time.sleep(0.3)  # both wait on the link before anything arrives
        client.send("twowait", [OutgoingMessage(f"m{i}".encode(), message_id=f"m{i}") for i in range(20)])
        for th in threads:
            th.join(30)
        got = results[0] + results[1]
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(20))
        receiver.complete(got)
