"""The front end delivers the partitions' own locked messages (lent, not copied: ``Receiver(lend=True)``): through
the SDK over a real socket, every settlement still gives what it gave with copies (delivery counts, new lock
tokens, deferred and dead-lettered messages with their fields), and a message delivered again after its lock ended
carries its new lock, not the first one's."""

from __future__ import annotations

import time
from datetime import timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue


def test_settlements_of_lent_deliveries(conn_str, queue, receive_until) -> None:
    q = queue(lock_duration=timedelta(seconds=5), max_delivery_count=5)
    with ServiceBusClient.from_connection_string(conn_str) as client:
        with client.get_queue_sender(q) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={"i": i}) for i in range(6)])
        with client.get_queue_receiver(q) as receiver:
            got = receive_until(receiver, 6, 10)
            assert [str(m) for m in got] == [f"m{i}" for i in range(6)]
            assert all(m.delivery_count == 0 for m in got)
            tokens = {str(m): m.lock_token for m in got}
            first_until = got[4].locked_until_utc
            time.sleep(1.1)
            receiver.renew_message_lock(got[4])
            assert got[4].locked_until_utc > first_until
            receiver.abandon_message(got[0])
            receiver.defer_message(got[1])
            receiver.dead_letter_message(got[2], reason="why", error_description="because")
            receiver.complete_message(got[3])
            receiver.complete_message(got[4])  # its renewed lock settles it
            deferred_seq = got[1].sequence_number

            (again,) = receive_until(receiver, 1, 10)
            assert str(again) == "m0" and again.delivery_count == 1 and again.lock_token != tokens["m0"]
            assert again.application_properties == {b"i": 0}
            receiver.complete_message(again)
            (deferred,) = receiver.receive_deferred_messages([deferred_seq])
            assert str(deferred) == "m1" and deferred.delivery_count == 1 and deferred.lock_token != tokens["m1"]
            receiver.complete_message(deferred)
            # m5's lock (5 s) runs out unsettled: it comes back with a new lock and a delivery counted
            (late,) = receive_until(receiver, 1, 15)
            assert str(late) == "m5" and late.delivery_count == 1 and late.lock_token != tokens["m5"]
            receiver.complete_message(late)
        with client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = receive_until(dlq, 1, 10)
            assert str(dead) == "m2" and dead.dead_letter_reason == "why"
            assert dead.dead_letter_error_description == "because"
            dlq.complete_message(dead)
        with client.get_queue_receiver(q, max_wait_time=1) as receiver:
            assert receiver.receive_messages(max_message_count=10, max_wait_time=1) == []
