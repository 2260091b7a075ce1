"""Auto-forwarding: queues and subscriptions with ``forward_to`` (or ``forward_dead_lettered_messages_to``)
hand their messages on to another queue or topic.

Theory of operation
-------------------
The forwarder is an internal peek-lock receiver on every forwarding source. For each message it locks, it sends
a copy to the destination and completes the original only once the destination has stored it. The copy keeps
its SessionId, PartitionKey and MessageId, so the partition-key rule puts it in the same key's partition of the
destination, partitioned or not.

Exactly-once between entities, across crashes: the copy carries a *transfer id* derived from the source
(entity, slot, sub-queue, partition, sequence number), and a destination partition always drops a second
arrival with a transfer id it has seen (see ``TRANSFER_ID_PREFIX``). A crash after the destination stored the
copy but before the source completed the original loses only the lock: after the restart the original is
forwarded again, the destination drops the duplicate, and the original is completed.

Failures, as the service handles them: a message that has already been forwarded ``MAX_HOPS`` times, a
destination that does not exist or is disabled, or one that refuses the message (too large, full) moves the
original to the source's transfer dead-letter queue with a reason; a busy destination (a partition down) makes
the forwarder try again later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..model.errors import ServerBusy, ShardbusError
from ..model.message import Message, ReceiveMode, SubQueue
from ..model.routing import decode_sequence_number
from ..partition.values import TRANSFER_ID_PREFIX
from .entity import Target
from .receiver import Receiver
from .sessions import SessionReceiver, accept_session

MAX_HOPS = 4  # the service's limit on chained forwarding
HOP_LIMIT_REASON = "MaxTransferHopCountExceeded"
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"
BATCH = 256

log = logging.getLogger("shardbus.forwarding")


def transfer_id(source_id: int, target: Target, sub_queue: SubQueue, message: Message) -> str:
    pid, local = decode_sequence_number(message.sequence_number)
    return f"{TRANSFER_ID_PREFIX}{source_id}:{target.slot}:{int(sub_queue)}:{pid}:{local}"


def forwarded_copy(message: Message, source_id: int, target: Target, sub_queue: SubQueue) -> Message:
    """The message as the destination receives it: same keys and properties, one more hop."""
    copy = message.copy()
    copy.forward_hops = message.forward_hops + 1
    copy.transfer_id = transfer_id(source_id, target, sub_queue, message)
    copy.scheduled_enqueue_time = None  # it was enqueued once already
    copy.lock_token = copy.locked_until_ms = None
    if message.dead_letter_reason is not None or message.dead_letter_error_description is not None:
        # A dead-lettered message keeps its reason, as the service's forwarded copies do.
        copy.application_properties = dict(copy.application_properties or {})
        copy.application_properties[DEAD_LETTER_REASON] = message.dead_letter_reason
        copy.application_properties[DEAD_LETTER_DESCRIPTION] = message.dead_letter_error_description
        copy.wire_sections = None
    copy.dead_letter_reason = copy.dead_letter_error_description = None
    return copy


class Forwarder:
    def __init__(self, destination: Callable[[str], Any], clock: Callable[[], float]) -> None:
        self._destination = destination  # name -> queue or topic entity (raises EntityNotFound)
        self._clock = clock
        self._receivers: dict[tuple[int, int], Receiver] = {}

    def _receiver(self, target: Target, sub_queue: SubQueue) -> Receiver:
        key = (id(target), int(sub_queue))
        receiver = self._receivers.get(key)
        if receiver is None or receiver.target is not target:
            receiver = self._receivers[key] = Receiver(target, ReceiveMode.PEEK_LOCK, sub_queue, self._clock)
        return receiver

    def forget(self, target: Target) -> None:
        for key in [k for k in self._receivers if k[0] == id(target)]:
            self._receivers.pop(key).close()

    def forward(self, source_id: int, target: Target, sub_queue: SubQueue, destination: str) -> int:
        """Move what is waiting in one source to ``destination``; returns how many messages were handled."""
        if sub_queue is SubQueue.MAIN and target.description.requires_session:
            # A session's messages leave in order, under its session lock, one free session after another.
            moved = 0
            while moved < BATCH and (accepted := accept_session(target, None)) is not None:
                session = SessionReceiver.holding(target, accepted, ReceiveMode.PEEK_LOCK, self._clock)
                try:
                    moved += self._move(source_id, target, sub_queue, destination, session)
                finally:
                    session.close()
            return moved
        return self._move(source_id, target, sub_queue, destination, self._receiver(target, sub_queue))

    def _move(
        self,
        source_id: int,
        target: Target,
        sub_queue: SubQueue,
        destination: str,
        receiver: Receiver | SessionReceiver,
    ) -> int:
        messages = receiver.take(BATCH)
        sent: list[tuple[Message, Future]] = []
        for m in messages:
            if m.forward_hops >= MAX_HOPS:
                self._transfer_dead_letter(
                    receiver, m, HOP_LIMIT_REASON, f"The message was forwarded through more than {MAX_HOPS} entities."
                )
                continue
            try:
                entity = self._destination(destination)
                sent.append((m, entity.submit_send([forwarded_copy(m, source_id, target, sub_queue)])))
            except ServerBusy:
                receiver.submit_settle("release", m)
            except ShardbusError as exc:
                self._transfer_dead_letter(receiver, m, type(exc).__name__, str(exc))
        done = []
        for m, future in sent:
            exc = future.exception()
            if exc is None:
                done.append(m)
            elif isinstance(exc, ServerBusy):
                receiver.submit_settle("release", m)
            elif isinstance(exc, ShardbusError):
                self._transfer_dead_letter(receiver, m, type(exc).__name__, str(exc))
            else:
                log.error("forwarding from '%s' failed: %s", target.path, exc)
                receiver.submit_settle("release", m)
        if done:
            for future in receiver.submit_complete(done):
                future.result()
        return len(messages)

    @staticmethod
    def _transfer_dead_letter(receiver: Receiver | SessionReceiver, m: Message, reason: str, description: str) -> None:
        partition = receiver._partition(m.lock_token)
        partition.dead_letter(
            receiver.target.slot, m.lock_token, reason, description, SubQueue.TRANSFER_DEAD_LETTER
        ).result()
