"""A receiver on a queue or subscription: receive fan-out across partitions and the front end's cache.

As the seeds describe it: a receive asks every partition for messages, returns what arrives first, and keeps
the rest in this receiver's cache, their locks running, for the next receive; the receiver never sees
partitions. A cached message whose lock ran out is dropped from the cache (its partition makes it available
again). Settlement goes straight to the owning partition, which the lock token names.

ReceiveAndDelete takes messages the same way but deletes each one as it is handed to the caller, so a
cached message is never lost: closing the receiver releases what it cached.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from ..model.errors import InvalidOperation, MessageLockLost, MessageNotFound, PartitionUnavailable
from ..model.message import Message, ReceiveMode, SubQueue
from ..model.routing import decode_sequence_number, partition_of_lock_token
from ..partition.broker import PartitionBroker, Settle
from .entity import Target

LockRef = Message | uuid.UUID


def _token(ref: LockRef) -> uuid.UUID:
    token = ref.lock_token if isinstance(ref, Message) else ref
    if token is None:
        raise InvalidOperation(
            "The operation is only supported for messages received in peek-lock mode (this message has no lock)."
        )
    return token


class Settling:
    """Blocking settlement calls, built on a receiver's ``submit_complete`` and ``submit_settle``."""

    def submit_complete(self, refs: Iterable[LockRef]) -> list[Future]:
        raise NotImplementedError

    def submit_settle(
        self, outcome: str, ref: LockRef, reason: str | None = None, description: str | None = None
    ) -> Future | None:
        raise NotImplementedError

    def complete(self, *refs: LockRef) -> None:
        for f in self.submit_complete(refs):
            f.result()

    def abandon(self, ref: LockRef) -> None:
        self.submit_settle("abandon", ref).result()

    def release(self, ref: LockRef) -> None:
        """Give a message back without counting a delivery."""
        self.submit_settle("release", ref)

    def defer(self, ref: LockRef) -> None:
        self.submit_settle("defer", ref).result()

    def dead_letter(self, ref: LockRef, reason: str | None = None, error_description: str | None = None) -> None:
        self.submit_settle("dead_letter", ref, reason, error_description).result()


class Receiver(Settling):
    def __init__(
        self,
        target: Target,
        mode: ReceiveMode = ReceiveMode.PEEK_LOCK,
        sub_queue: SubQueue = SubQueue.MAIN,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Dead-letter sub-queues of session entities are read without sessions, as in the service.
        self._sessionless_ok = sub_queue is not SubQueue.MAIN
        target.check_receive(session=self._sessionless_ok)
        self.target = target
        self.mode = mode
        self.sub_queue = sub_queue
        self._clock = clock
        self._cache: deque[Message] = deque()
        self._rotation = 0
        self.closed = False

    # --- receiving -----------------------------------------------------------------------------------------
    def try_receive(self, max_count: int = 1) -> list[Message]:
        """Whatever is available now, up to ``max_count``, without waiting (never blocks on I/O in
        peek-lock mode; in receive-and-delete mode the deletes are waited for)."""
        out = self.take(max_count)
        if self.mode is ReceiveMode.RECEIVE_AND_DELETE and out:
            return self._delete_taken(out)
        return out

    def receive(self, max_count: int = 1, max_wait: float | None = None) -> list[Message]:
        """Up to ``max_count`` messages, waiting up to ``max_wait`` seconds for the first (None: no limit)."""
        if max_count < 1:
            raise InvalidOperation("max_count must be at least 1.")
        deadline = None if max_wait is None else self._clock() + max_wait
        while True:
            generation = self.target.generation
            out = self.try_receive(max_count)
            if out:
                return out
            now = self._clock()
            remaining = math.inf if deadline is None else deadline - now
            if remaining <= 0:
                return []
            due = self.target.next_due_ms(self.sub_queue)
            wait = min(remaining, 0.5 if due is None else max(0.0, due / 1000 - now))
            self.target.wait(generation, wait)

    def take(self, max_count: int) -> list[Message]:
        """Lock up to ``max_count`` messages (from the cache first) without waiting for anything. In
        receive-and-delete mode the caller then removes them with ``submit_complete`` (front ends do, so as not
        to block on the delete)."""
        if self.closed:
            raise InvalidOperation("The receiver is closed.")
        self.target.check_receive(session=self._sessionless_ok)
        now_ms = int(self._clock() * 1000)
        out: list[Message] = []
        cache = self._cache
        while cache and len(out) < max_count:
            m = cache.popleft()
            if m.locked_until_ms is not None and m.locked_until_ms > now_ms:
                out.append(m)
        need = max_count - len(out)
        if need <= 0:
            return out
        partitions = [p for p in self.target.partitions if p.healthy]
        if not partitions:
            return out
        # Rotate the starting partition so no partition is always asked (and answers) first.
        self._rotation = (self._rotation + 1) % max(1, len(partitions))
        partitions = partitions[self._rotation :] + partitions[: self._rotation]
        # Each partition is asked for the whole request, as the service's front end does; the budget stops
        # the cache from growing past about one more request (but every partition is asked at least for one
        # message, so low-volume receives still reach all of them).
        budget = max(need + len(partitions) - 1, 2 * need)
        fetched: list[Message] = []
        for p in partitions:
            ask = min(need, budget - len(fetched))
            if ask <= 0:
                break
            try:
                fetched.extend(p.lock_messages(self.target.slot, self.sub_queue, ask))
            except PartitionUnavailable:
                continue
        out.extend(fetched[:need])
        cache.extend(fetched[need:])
        return out

    def _delete_taken(self, messages: list[Message]) -> list[Message]:
        """Complete what a receive-and-delete receive hands out, one store operation per partition."""
        by_partition: dict[int, list[Message]] = {}
        for m in messages:
            by_partition.setdefault(m.partition_id, []).append(m)
        pending = []
        for group in by_partition.values():
            try:
                pending.append(
                    (
                        group,
                        self._partition(group[0].lock_token).complete(self.target.slot, [m.lock_token for m in group]),
                    )
                )
            except (MessageLockLost, PartitionUnavailable):
                continue  # they stay with their partition and will be delivered again
        delivered = []
        for group, future in pending:
            future.result()
            delivered.extend(group)
        for m in delivered:
            m.lock_token = None
            m.locked_until_ms = None
        return delivered

    @property
    def cached(self) -> int:
        return len(self._cache)

    def receive_deferred(self, sequence_numbers: Iterable[int]) -> list[Message]:
        """Deferred messages by sequence number (locked in peek-lock mode, removed in receive-and-delete)."""
        return receive_deferred(self.target, self.sub_queue, sequence_numbers, lock=self.mode is ReceiveMode.PEEK_LOCK)

    def peek(self, max_count: int = 1, from_sequence_number: int | None = None) -> list[Message]:
        return self.target.peek(from_sequence_number, max_count, self.sub_queue)

    # --- settling ------------------------------------------------------------------------------------------
    def _partition(self, token: uuid.UUID) -> PartitionBroker:
        pid = partition_of_lock_token(token)
        if pid >= len(self.target.partitions):
            raise MessageLockLost("The lock supplied is invalid for this entity.")
        return self.target.partitions[pid]

    def submit_complete(self, refs: Iterable[LockRef]) -> list[Future]:
        """Complete many messages, one store operation per partition; returns the write futures."""
        by_partition: dict[int, list[uuid.UUID]] = {}
        for ref in refs:
            token = _token(ref)
            by_partition.setdefault(partition_of_lock_token(token), []).append(token)
        return [self._partition(tokens[0]).complete(self.target.slot, tokens) for tokens in by_partition.values()]

    def submit_settle(
        self, outcome: str, ref: LockRef, reason: str | None = None, description: str | None = None
    ) -> Future | None:
        """Settle one message without waiting: ``outcome`` is complete, abandon, defer, dead_letter or release
        (which needs no write, so returns None)."""
        token = _token(ref)
        return settle(self._partition(token), self.target.slot, outcome, token, reason, description)

    def renew_lock(self, ref: LockRef) -> int:
        """Renew a message lock; returns the new locked-until time in ms (and updates the message)."""
        token = _token(ref)
        until = self._partition(token).renew_lock(self.target.slot, token)
        if isinstance(ref, Message):
            ref.locked_until_ms = until
        return until

    def close(self) -> None:
        """Give back what the cache still holds (without counting a delivery)."""
        if self.closed:
            return
        self.closed = True
        while self._cache:
            m = self._cache.popleft()
            try:
                self._partition(m.lock_token).release(self.target.slot, m.lock_token)
            except (MessageLockLost, PartitionUnavailable):
                pass

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def settle(
    partition: PartitionBroker,
    slot: int,
    outcome: str,
    token: uuid.UUID,
    reason: str | None = None,
    description: str | None = None,
) -> Future | None:
    """Settle one message in its partition; a release needs no write, so gives no future."""
    future = partition.settle(slot, [Settle(outcome, token, reason, description)])
    return None if outcome == "release" else future


def receive_deferred(
    target: Target,
    sub_queue: SubQueue,
    sequence_numbers: Iterable[int],
    lock: bool,
    session: tuple[str, uuid.UUID] | None = None,
) -> list[Message]:
    """Deferred messages by sequence number from the partitions the numbers name, in the order asked; locked
    (``lock``) or removed. ``session`` (id, session lock token) is required on session entities."""
    messages, futures = submit_receive_deferred(target, sub_queue, sequence_numbers, lock, session)
    for future in futures:
        future.result()  # a receive-and-delete returns once the messages are gone
    return messages


def submit_receive_deferred(
    target: Target,
    sub_queue: SubQueue,
    sequence_numbers: Iterable[int],
    lock: bool,
    session: tuple[str, uuid.UUID] | None = None,
) -> tuple[list[Message], list[Future]]:
    """``receive_deferred`` without waiting: the messages and the futures of their removal (none when locking),
    so an event loop can answer once the removal is stored instead of blocking on it."""
    order = list(sequence_numbers)
    by_partition: dict[int, list[int]] = {}
    for seq in order:
        pid, local = decode_sequence_number(seq)
        if pid >= len(target.partitions):
            raise MessageNotFound(f"No message with sequence number {seq} exists in '{target.path}'.")
        by_partition.setdefault(pid, []).append(local)
    found: dict[int, Message] = {}
    futures = []
    for pid, locals_ in by_partition.items():
        messages, future = target.partitions[pid].receive_deferred(target.slot, sub_queue, locals_, lock, session)
        if future is not None:
            futures.append(future)
        for m in messages:
            found[m.sequence_number] = m
    return [found[s] for s in order if s in found], futures
