"""Transactions: sends and settlements that commit together, or not at all.

The seeds' rules for partitioned entities, each refused with InvalidOperation and a message naming the rule:

- every message sent in a transaction needs a partition key (SessionId, PartitionKey, or MessageId on an entity
  with duplicate detection);
- all operations of one transaction share one partition key, so they are handled by one partition broker;
- a transaction sends to at most one session (a consequence of the previous rule, checked with its own message);
- rules cannot be added or removed inside a transaction (checked where rules are managed).

Atomicity comes from the store: everything a transaction does is one SQLite transaction in its partition's store.
That is why a transaction covers one partition of one entity (a topic partition's store also holds its
subscriptions, so sending to a topic and completing from one of its subscriptions can share a transaction).
Sending to one entity while settling messages of another ("send-via") is not supported.
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import datetime
from typing import Any

from ..model.errors import InvalidOperation
from ..model.message import Message
from ..model.routing import partition_for_key, partition_key_of, partition_of_lock_token
from ..partition.handle import PartitionHandle
from ..partition.values import Settle
from .entity import QueueEntity, TopicEntity
from .receiver import LockRef, Receiver, _token
from .sessions import SessionReceiver


class Transaction:
    """Collects operations; ``commit`` applies them atomically, ``rollback`` (or an exception inside a ``with``
    block) discards them. Locks taken while the transaction is open keep running as usual."""

    def __init__(self, resolve_sender: Any) -> None:
        self._resolve_sender = resolve_sender  # entity name -> queue or topic entity
        self._partition: PartitionHandle | None = None
        self._key: str | None = None
        self._session: str | None = None
        self._items: list[Any] = []
        self._settles: list[tuple[int, Settle]] = []
        self.done = False

    # --- the rules ------------------------------------------------------------------------------------------
    def _join(self, partition: PartitionHandle, key: str | None) -> None:
        if self._partition is not None and partition is not self._partition:
            raise InvalidOperation(
                "All operations in a transaction must share one partition key: this one is handled by another "
                "partition (or entity) than the operations before it."
            )
        if key is not None:
            if self._key is not None and key != self._key:
                raise InvalidOperation(
                    f"All operations in a transaction must share one partition key: '{key}' differs from '{self._key}'."
                )
            self._key = key
        self._partition = partition

    def _check_open(self) -> None:
        if self.done:
            raise InvalidOperation("The transaction has already been committed or rolled back.")

    # --- operations -----------------------------------------------------------------------------------------
    def send(self, entity: str, messages: Message | list[Message]) -> None:
        self._check_open()
        target: QueueEntity | TopicEntity = self._resolve_sender(entity)
        batch = [messages] if isinstance(messages, Message) else list(messages)
        dedup = target.description.requires_duplicate_detection
        for m in batch:
            key = partition_key_of(m, dedup)
            if key is None:
                raise InvalidOperation(
                    "A message sent in a transaction must have a partition key: set SessionId or PartitionKey "
                    "(or MessageId, on an entity with duplicate detection)."
                )
            if m.session_id is not None:
                if self._session is not None and m.session_id != self._session:
                    raise InvalidOperation(
                        "A transaction cannot send messages to more than one session on a partitioned entity "
                        f"('{m.session_id}' and '{self._session}')."
                    )
                self._session = m.session_id
            partition = target.partitions[partition_for_key(key, len(target.partitions))]
            self._join(partition, key)
        _, items = target._prepare(batch)
        self._items.extend(items)

    def schedule(self, entity: str, messages: Message | list[Message], enqueue_time: datetime) -> None:
        """Schedule messages as part of the transaction (they appear at ``enqueue_time`` once committed)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        scheduled = []
        for m in batch:
            m = m.copy()
            m.scheduled_enqueue_time = enqueue_time
            scheduled.append(m)
        self.send(entity, scheduled)

    def _settle(self, receiver: Receiver | SessionReceiver, outcome: str, ref: LockRef, **details: Any) -> None:
        self._check_open()
        token = _token(ref)
        partition = receiver.target.partitions[partition_of_lock_token(token)]
        key = None
        if isinstance(ref, Message):  # a subscription's messages take duplicate detection from their topic
            dedup = getattr(receiver.target.description, "requires_duplicate_detection", False)
            key = partition_key_of(ref, dedup)
        self._join(partition, key)
        self._settles.append((receiver.target.slot, Settle(outcome, token, **details)))

    def complete(self, receiver: Receiver | SessionReceiver, message: LockRef) -> None:
        self._settle(receiver, "complete", message)

    def abandon(self, receiver: Receiver | SessionReceiver, message: LockRef) -> None:
        self._settle(receiver, "abandon", message)

    def defer(self, receiver: Receiver | SessionReceiver, message: LockRef) -> None:
        self._settle(receiver, "defer", message)

    def dead_letter(
        self,
        receiver: Receiver | SessionReceiver,
        message: LockRef,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        self._settle(receiver, "dead_letter", message, reason=reason, description=error_description)

    # --- the end --------------------------------------------------------------------------------------------
    def submit_commit(self) -> Future:
        """Apply everything in one store transaction; the future gives the sent messages' sequence numbers."""
        self._check_open()
        self.done = True
        if self._partition is None:
            done: Future = Future()
            done.set_result([])
            return done
        return self._partition.transact(self._items, self._settles)

    def commit(self) -> list[int | None]:
        return self.submit_commit().result()

    def rollback(self) -> None:
        """Discard everything; messages settled in the transaction stay locked as they were."""
        self.done = True
        self._items.clear()
        self._settles.clear()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self.done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
