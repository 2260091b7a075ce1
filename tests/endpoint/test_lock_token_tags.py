"""A peek-lock delivery's tag is its lock token in .NET byte order (``UUID.bytes_le``), and a settlement's tag is
turned back into that token: the official SDK over real sockets reads each message's token from its tag, so a
token it shows must name the message's partition and sequence number, and every outcome settled with it (complete,
abandon, defer, dead-letter) must reach that message. (endpoint/receiving.py converts tags with the structs of
model/routing.py, not ``uuid.UUID``: this holds them to the SDK's reading.)"""

from __future__ import annotations

import uuid

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from shardbus.model.routing import (
    TAG_ORDER,
    UUID_ORDER,
    decode_sequence_number,
    local_seq_of_lock_token,
    new_lock_tokens,
    partition_of_lock_token,
    uuid_of_bytes_le,
)


def test_tag_structs_are_bytes_le() -> None:
    for token in [*new_lock_tokens(3, 200), uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)]:
        tag = TAG_ORDER.pack(*UUID_ORDER.unpack(token.int.to_bytes(16, "big")))
        assert tag == token.bytes_le
        assert uuid_of_bytes_le(tag) == token
        assert int.from_bytes(UUID_ORDER.pack(*TAG_ORDER.unpack(tag)), "big") == token.int


def test_sdk_reads_each_lock_token_from_its_tag_and_settles_with_it(conn_str, queue, ns) -> None:
    name = queue(enable_partitioning=True)
    count = 40
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(name) as sender:
            for i in range(count):  # keys spread them over partitions (a list would be one batch, one partition)
                sender.send_messages(ServiceBusMessage(f"m{i}", partition_key=f"k{i % 7}"))
        with client.get_queue_receiver(name, max_wait_time=5) as receiver:
            got = []
            while len(got) < count:
                batch = receiver.receive_messages(max_message_count=count, max_wait_time=5)
                assert batch, f"only {len(got)} of {count} delivered"
                got += batch
            tokens = set()
            for message in got:
                token = uuid.UUID(str(message.lock_token))
                partition, local_seq = decode_sequence_number(message.sequence_number)
                assert partition_of_lock_token(token) == partition
                assert local_seq_of_lock_token(token) == local_seq
                tokens.add(token)
            assert len(tokens) == count
            # each outcome through the token the SDK read from the tag
            abandoned, deferred, dead = got[0], got[1], got[2]
            receiver.abandon_message(abandoned)
            receiver.defer_message(deferred)
            receiver.dead_letter_message(dead, reason="r", error_description="d")
            for message in got[3:]:
                receiver.complete_message(message)
            again = receiver.receive_messages(max_message_count=5, max_wait_time=5)
            assert [str(m) for m in again] == [str(abandoned)]
            assert again[0].delivery_count == 1
            receiver.complete_message(again[0])
            (back,) = receiver.receive_deferred_messages([deferred.sequence_number])
            assert str(back) == str(deferred)
            receiver.complete_message(back)
        with client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5) as dlq:
            (dead_again,) = dlq.receive_messages(max_message_count=5, max_wait_time=5)
            assert str(dead_again) == str(dead)
            assert dead_again.dead_letter_reason == "r"
            dlq.complete_message(dead_again)
    props = ns.get_runtime_properties(name)
    assert props.active_message_count == 0
    assert props.dead_letter_message_count == 0
