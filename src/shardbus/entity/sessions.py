"""Session receivers on a session-enabled queue or subscription.

A session lives in exactly one partition (its SessionId is the partition key), so a session receiver talks to
that one partition once it holds the session. Accepting "the next available session" asks every partition,
starting at a rotating one so no partition is starved, and takes the first free session found; if none is free
it waits (for a send, or a session lock to end) up to its time limit.
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from ..model.errors import (
    InvalidOperation,
    MessageLockLost,
    MessageNotFound,
    OperationTimeout,
    PartitionUnavailable,
    SessionLockLost,
)
from ..model.message import Message, ReceiveMode, SubQueue
from ..model.routing import decode_sequence_number, partition_for_key
from ..partition.handle import PartitionHandle, RemoteVerdict
from .entity import Target
from .receiver import LockRef, Settling, _token, settle

_rotation = itertools.count()


def accept_session(target: Target, session_id: str | None) -> tuple[PartitionHandle, str, uuid.UUID, int] | None:
    """Lock ``session_id`` (or the next free session, asking every partition) without waiting."""
    target.check_receive(session=True)
    if not target.description.requires_session:
        raise InvalidOperation(
            f"'{target.path}' does not require sessions: it cannot be received from with a session receiver."
        )
    partitions = target.partitions
    if session_id is not None:
        p = partitions[partition_for_key(session_id, len(partitions))]
        sid, token, until = p.accept_session(target.slot, session_id)  # type: ignore[misc]
        return p, sid, token, until
    start = next(_rotation) % len(partitions)
    for i in range(len(partitions)):
        p = partitions[(start + i) % len(partitions)]
        if not p.healthy:
            continue
        try:
            found = p.accept_session(target.slot, None)
        except PartitionUnavailable:
            continue
        if found is not None:
            return (p, *found)
    return None


class SessionReceiver(Settling):
    """Holds one session lock and receives that session's messages in order."""

    sub_queue = SubQueue.MAIN  # sessions live in the main queue; dead-letter queues have none

    def __init__(
        self,
        target: Target,
        session_id: str | None = None,
        mode: ReceiveMode = ReceiveMode.PEEK_LOCK,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.mode = mode
        self._clock = clock
        deadline = None if max_wait is None else clock() + max_wait
        while True:
            generation = target.generation
            accepted = accept_session(target, session_id)
            if accepted is not None:
                break
            remaining = math.inf if deadline is None else deadline - clock()
            if remaining <= 0:
                raise OperationTimeout(f"No session with messages is available in '{target.path}'.")
            target.wait(generation, min(remaining, 0.5))
        self.partition, self.session_id, self.token, self.locked_until_ms = accepted
        self.closed = False

    @classmethod
    def holding(
        cls,
        target: Target,
        accepted: tuple[PartitionHandle, str, uuid.UUID, int],
        mode: ReceiveMode,
        clock: Callable[[], float] = time.time,
    ) -> SessionReceiver:
        """A receiver for a session already accepted with ``accept_session`` (front ends that wait their own way)."""
        receiver = cls.__new__(cls)
        receiver.target, receiver.mode, receiver._clock, receiver.closed = target, mode, clock, False
        receiver.partition, receiver.session_id, receiver.token, receiver.locked_until_ms = accepted
        return receiver

    @property
    def slot(self) -> int:
        return self.target.slot

    def _partition(self, token: uuid.UUID) -> PartitionHandle:
        return self.partition

    # --- receiving -------------------------------------------------------------------------------------------
    def take(self, max_count: int, on_more: Callable[[], None] | None = None) -> list[Message]:
        """Lock up to ``max_count`` of the session's next messages (one partition: its answer is waited for, so
        ``on_more``, ``Receiver.take``'s call back, is never needed)."""
        if self.closed:
            raise InvalidOperation("The session receiver is closed.")
        return self.partition.lock_session_messages(self.slot, self.session_id, self.token, max_count)

    def receive(self, max_count: int = 1, max_wait: float | None = None) -> list[Message]:
        deadline = None if max_wait is None else self._clock() + max_wait
        while True:
            generation = self.target.generation
            out = self.take(max_count)
            if out:
                if self.mode is ReceiveMode.RECEIVE_AND_DELETE:
                    for f in self.submit_complete(out):
                        f.result()
                    for m in out:
                        m.lock_token = m.locked_until_ms = None
                return out
            remaining = math.inf if deadline is None else deadline - self._clock()
            if remaining <= 0:
                return []
            self.target.wait(generation, min(remaining, 0.5))

    def receive_deferred(self, sequence_numbers: Iterable[int]) -> list[Message]:
        locals_ = []
        for seq in sequence_numbers:
            pid, local = decode_sequence_number(seq)
            if pid != self.partition.id:
                raise MessageNotFound(f"No message with sequence number {seq} is in session '{self.session_id}'.")
            locals_.append(local)
        messages, future = self.partition.receive_deferred(
            self.slot,
            SubQueue.MAIN,
            locals_,
            lock=self.mode is ReceiveMode.PEEK_LOCK,
            session=(self.session_id, self.token),
        )
        if future is not None:
            future.result()
        return messages

    def peek(self, max_count: int = 1, from_sequence_number: int | None = None) -> list[Message]:
        local = decode_sequence_number(from_sequence_number or 0)[1]
        return self.partition.peek(self.slot, SubQueue.MAIN, max(local, 1), max_count, self.session_id)

    # --- settling ------------------------------------------------------------------------------------------
    def _settle(self, operation: Callable[[], Future | None]) -> Future | None:
        """Run a settlement; a lock that is gone because the session lock is gone is reported as such."""
        try:
            future = operation()
        except MessageLockLost:
            holder = self.partition.session_lock_holder(self.slot, self.session_id)
            if holder is None or holder[0] != self.token or holder[1] <= int(self._clock() * 1000):
                raise self._lock_lost() from None
            raise
        if not isinstance(future, RemoteVerdict):
            return future  # a local partition already raised a lost lock above; its future only waits for the disk
        # A remote partition reports a lost lock through the future: judge the session lock by our own record
        # (asking the partition from a completion callback could wait on the very thread that answers).
        translated: Future = RemoteVerdict()  # still a remote verdict (the endpoint waits for those)

        def done(f: Future) -> None:
            exc = f.exception()
            if isinstance(exc, MessageLockLost) and self.locked_until_ms <= int(self._clock() * 1000):
                exc = self._lock_lost()
            if exc is None:
                translated.set_result(f.result())
            else:
                translated.set_exception(exc)

        future.add_done_callback(done)
        return translated

    def _lock_lost(self) -> SessionLockLost:
        return SessionLockLost(f"The session lock of session '{self.session_id}' was lost; accept the session again.")

    def submit_complete(self, refs: Iterable[LockRef], partition: int | None = None) -> list[Future]:
        """As ``Receiver.submit_complete`` (a session's messages are all in its one partition)."""
        tokens = [_token(r) for r in refs]
        return [self._settle(lambda: self.partition.complete(self.slot, tokens))]

    def submit_settle(
        self, outcome: str, ref: LockRef, reason: str | None = None, description: str | None = None
    ) -> Future | None:
        """As ``Receiver.submit_settle``, for this session's messages."""
        token = _token(ref)
        return self._settle(lambda: settle(self.partition, self.slot, outcome, token, reason, description))

    # --- the session ---------------------------------------------------------------------------------------
    def renew_session_lock(self) -> int:
        self.locked_until_ms = self.partition.renew_session_lock(self.slot, self.session_id, self.token)
        return self.locked_until_ms

    def get_state(self) -> bytes | None:
        return self.partition.get_session_state(self.slot, self.session_id)

    def set_state(self, state: bytes | str | None) -> None:
        if isinstance(state, str):
            state = state.encode("utf-8")
        self.partition.set_session_state(self.slot, self.session_id, self.token, state).result()

    def close(self) -> None:
        """Give the session back; unsettled messages return to it without counting a delivery."""
        if self.closed:
            return
        self.closed = True
        self.partition.release_session(self.slot, self.session_id, self.token)

    def __enter__(self) -> SessionReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_sessions(target: Target, updated_after_ms: int | None = None) -> list[str]:
    """Sessions with messages or state on every available partition."""
    found: list[str] = []
    for p in target.partitions:
        if p.healthy:
            try:
                found.extend(p.list_sessions(target.slot, updated_after_ms))
            except PartitionUnavailable:
                continue
    return sorted(found)
