"""Our own client's ``send`` (one window of unsettled transfers per call) against the real broker: every message
stored once and in the order sent, with a window smaller or larger than what one read or one commit takes; a
refusal in the middle of a window raises ClientError with the broker's condition, the messages before it are
stored, none after the refusal came, and the client sends on afterwards."""

from __future__ import annotations

import pytest

from shardbus.client import ClientError, OutgoingMessage, ShardbusClient


def _drain(client: ShardbusClient, entity: str, count: int) -> list[str]:
    got: list = []
    with client.receiver(entity, receive_and_delete=True) as receiver:
        while True:
            batch = receiver.receive(max_count=500, max_wait=2 if len(got) < count else 0.5)
            if not batch:
                break
            got += batch
    return [str(m.message.properties.message_id) for m in got]


@pytest.mark.parametrize("window", [1, 7, 100, 1000])
def test_every_message_once_in_order(broker, window: int) -> None:
    entity = f"window-{window}"
    broker.namespace.create_queue(entity)
    ids = [f"w{window}-{i}" for i in range(600)]
    with ShardbusClient(broker.connection_string, timeout=30) as client:
        # one partition key: one partition, whose sequence numbers are the order the broker stored them in
        sent = client.send(
            entity, [OutgoingMessage(b"x" * 100, message_id=i, partition_key="k") for i in ids], window=window
        )
        assert sent == len(ids)
        assert _drain(client, entity, len(ids)) == ids


def test_a_refusal_mid_window_raises_and_the_client_goes_on(broker) -> None:
    entity = "window-refused"
    broker.namespace.create_queue(entity)
    before = [OutgoingMessage(b"x", message_id=f"a{i}", partition_key="k") for i in range(50)]
    too_big = OutgoingMessage(b"x" * (300 * 1024), message_id="big", partition_key="k")  # standard tier: 256 KB
    after = [OutgoingMessage(b"x", message_id=f"b{i}", partition_key="k") for i in range(400)]
    with ShardbusClient(broker.connection_string, timeout=30) as client:
        with pytest.raises(ClientError) as refused:
            client.send(entity, [*before, too_big, *after], window=20)
        assert refused.value.condition == "amqp:link:message-size-exceeded"
        client.send(entity, [OutgoingMessage(b"y", message_id="later", partition_key="k")])
        stored = _drain(client, entity, 51)
    assert stored[:50] == [m.message_id for m in before]
    assert "big" not in stored and stored[-1] == "later"
    # what was in flight with the refused one may be stored (in order); nothing sent after the refusal came
    rest = stored[50:-1]
    assert rest == [m.message_id for m in after[: len(rest)]] and len(rest) < 2 * 20
