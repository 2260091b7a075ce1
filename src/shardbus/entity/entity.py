"""A partitioned entity over its partition brokers: where sends go, and what receivers read from.

``Target`` is anything that holds messages for receivers: a queue (slot 0 of its partitions) or a subscription
(its own slot in each of its topic's partitions, so a subscription is partitioned exactly like its topic and a
copy keeps its topic partition, hence its partition key). ``QueueEntity`` and ``TopicEntity`` take sends:

- the partition-key rule (model.routing) picks one partition for a keyed message or batch; if that partition
  is unavailable the send fails with ``PartitionUnavailable`` (retriable) and other keys keep working;
- keyless sends go round-robin, and when the chosen partition is unavailable, or its store fails while
  writing, the next healthy partition takes the message, so the send succeeds. Exactly once: the failed write
  may have reached the disk all the same (a worker killed after committing), so the partition takes that copy
  back before it is healthy again (``PartitionBroker.start`` for its own failed writes, and for a worker's
  partition ``RemotePartition.revoke_in_doubt``), and until then no send or receive uses it. A partition whose
  store is full refuses with ``PartitionFull`` (nothing stored, nothing to take back) and the next one is tried;
  when every one refuses, the send fails with ``PartitionFull`` (ServerBusy);
- a topic copies each message to every subscription whose rules match, within the same partition.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any

from ..model.entities import (
    EntityStatus,
    QueueDescription,
    RuntimeProperties,
    SubscriptionDescription,
    TopicDescription,
)
from ..model.errors import (
    EntityDisabled,
    InternalError,
    InvalidOperation,
    MessageNotFound,
    PartitionFull,
    PartitionUnavailable,
    ShardbusError,
)
from ..model.filters import Rule, route
from ..model.message import Message, SubQueue
from ..model.routing import (
    batch_partition_key,
    decode_sequence_number,
    partition_for_key,
    partition_key_of,
)
from ..partition.handle import PartitionHandle

QUEUE_SLOT = 0


def _per_batch(flat: list[Any], counts: list[int]) -> Iterator[list[Any]]:
    """Each batch's items again, from a group's one list of them and how many each batch has there, in order."""
    start = 0
    for count in counts:
        yield flat[start : start + count]
        start += count


def _dedup_id(message: Message) -> str | None:
    """What duplicate detection keys a message by: a forwarding transfer id first, else its MessageId."""
    if message.transfer_id is not None:
        return message.transfer_id
    return None if message.message_id is None else str(message.message_id)


def _keyless_items(batches: list[list[Message]]) -> list[Any] | None:
    """The items of batches that are each one message without a session id, partition key or transfer id (a
    queue's usual send, without duplicate detection: each goes to the call's keyless partition), in one list, as
    ``submit_many``'s loop makes them one by one; None as soon as one batch is anything else."""
    flat = []
    append = flat.append
    try:
        for (m,) in batches:  # (a batch of any other length raises ValueError: not this shape)
            if m.session_id is not None or m.partition_key is not None or m.transfer_id is not None:
                return None  # (a forwarded copy is keyed by its transfer id: model/routing.py)
            dedup_id = m.message_id
            if dedup_id.__class__ is not str and dedup_id is not None:
                dedup_id = str(dedup_id)
            append((dedup_id, [(QUEUE_SLOT, m)]))
    except ValueError:
        return None
    return flat


class Target:
    """Something receivers read from: a queue, or one subscription of a topic."""

    def __init__(self, path: str, partitions: list[PartitionHandle], slot: int) -> None:
        self.path = path
        self.partitions = partitions
        self.slot = slot
        self._cond = threading.Condition()
        self._generation = 0
        self._listeners: list[Callable[[], None]] = []

    @property
    def description(self) -> QueueDescription | SubscriptionDescription:
        raise NotImplementedError

    @property
    def partitioned(self) -> bool:
        return len(self.partitions) > 1

    def check_receive(self, session: bool = False) -> None:
        status = self.description.status
        if not status.can_receive:
            raise EntityDisabled(f"Messaging entity '{self.path}' is currently disabled for receiving ({status}).")
        if self.description.requires_session and not session:
            raise InvalidOperation(
                f"It is not possible for an entity that requires sessions to create a non-sessionful message "
                f"receiver: '{self.path}' requires sessions."
            )

    # --- waking receivers -----------------------------------------------------------------------------------
    def messages_available(self) -> None:
        """Called by partitions when this target gained receivable messages."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Front ends subscribe to be told (from any thread) that messages may be available."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    @property
    def generation(self) -> int:
        return self._generation

    def wait(self, generation: int, timeout: float) -> None:
        with self._cond:
            if self._generation == generation:
                self._cond.wait(timeout)

    def next_due_ms(self, sub_queue: SubQueue) -> int | None:
        times = [t for p in self.partitions if (t := p.next_due_ms(self.slot, sub_queue)) is not None]
        return min(times) if times else None

    # --- browsing -----------------------------------------------------------------------------------------
    def peek(self, from_sequence_number: int | None, max_count: int, sub_queue: SubQueue) -> list[Message]:
        """The service's peek: the oldest messages of one partition, starting at the partition the sequence
        number names (partition-relative order); an exhausted or unavailable partition passes to the next."""
        pid, local = decode_sequence_number(from_sequence_number or 0)
        local = max(local, 1)
        for p in self.partitions[pid:]:
            if p.healthy:
                try:
                    found = p.peek(self.slot, sub_queue, local, max_count)
                except PartitionUnavailable:
                    found = []
                if found:
                    return found
            local = 1
        return []

    def browse(
        self,
        sub_queue: SubQueue = SubQueue.MAIN,
        partitions: list[int] | None = None,
        from_local: dict[int, int] | None = None,
        to_local: dict[int, int] | None = None,
        page: int = 256,
    ) -> Iterator[Message]:
        """Walk partitions to their end (ours, beyond the service): every message in (partition, sequence)
        order, optionally limited to partition-relative ranges [from, to). Walking all partitions skips
        unavailable ones; naming partitions explicitly raises PartitionUnavailable for them instead."""
        for pid in partitions if partitions is not None else range(len(self.partitions)):
            p = self.partitions[pid]
            if partitions is None and not p.healthy:
                continue
            start = (from_local or {}).get(pid, 1)
            stop = (to_local or {}).get(pid)
            while True:
                found = p.peek(self.slot, sub_queue, start, page)
                for m in found:
                    local = decode_sequence_number(m.sequence_number)[1]
                    if stop is not None and local >= stop:
                        found = []
                        break
                    yield m
                if len(found) < page:
                    break
                start = decode_sequence_number(found[-1].sequence_number)[1] + 1

    # --- sequence-range reads (ours) ------------------------------------------------------------------------
    def range_offsets(
        self, sub_queue: SubQueue = SubQueue.MAIN, count_from: dict[int, int] | None = None
    ) -> list[tuple[int, int, int, int] | None]:
        """Per partition (first, end, mark, count), see ``PartitionBroker.range_offsets`` (``count_from`` maps a
        partition to where its count starts); None for an unavailable partition."""
        out: list[tuple[int, int, int, int] | None] = []
        for p in self.partitions:
            try:
                out.append(p.range_offsets(self.slot, sub_queue, (count_from or {}).get(p.id, 0)))
            except PartitionUnavailable:
                out.append(None)
        return out

    def browse_range(
        self, partition: int, start: int, end: int, max_count: int, sub_queue: SubQueue = SubQueue.MAIN
    ) -> list[Message]:
        return self._partition(partition).browse_range(self.slot, sub_queue, start, end, max_count)

    def completed_mark(self, partition: int, sub_queue: SubQueue = SubQueue.MAIN) -> int:
        return self._partition(partition).completed_mark(self.slot, sub_queue)

    def complete_below(self, marks: dict[int, int], sub_queue: SubQueue = SubQueue.MAIN) -> list[Future]:
        """``complete_below`` in each named partition (partition -> mark)."""
        return [self._partition(pid).complete_below(self.slot, sub_queue, mark) for pid, mark in marks.items()]

    def _partition(self, partition: int) -> PartitionHandle:
        if not 0 <= partition < len(self.partitions):
            raise InvalidOperation(
                f"'{self.path}' has {len(self.partitions)} partitions; partition {partition} does not exist."
            )
        return self.partitions[partition]

    def runtime(self) -> RuntimeProperties:
        """Counts summed over partitions; 'Limited' when any partition does not answer."""
        total = RuntimeProperties()
        for p in self.partitions:
            try:
                part = p.runtime(self.slot)
            except ShardbusError:
                total.availability = "Limited"
                total.partitions.append({"partition": p.id, "healthy": False, "failure": p.failure})
                continue
            total.add(part)
            total.partitions.append({"partition": p.id, "healthy": True, **_counts(part)})
        return total


def _counts(props: RuntimeProperties) -> dict[str, int]:
    return {
        "active": props.active_message_count,
        "dead_letter": props.dead_letter_message_count,
        "scheduled": props.scheduled_message_count,
        "size_in_bytes": props.size_in_bytes,
    }


class _Sender:
    """Send routing shared by queues and topics."""

    partitions: list[PartitionHandle]
    path: str

    def __init__(self) -> None:
        self._round_robin = itertools.count()

    @property
    def description(self) -> QueueDescription | TopicDescription:
        raise NotImplementedError

    def _fan_out(self, message: Message) -> list[tuple[str | None, list[tuple[int, Message]]]]:
        raise NotImplementedError

    def _requires_session(self) -> bool:
        return False

    def _prepare(self, messages: list[Message], owned: bool = False) -> tuple[str | None, list[Any]]:
        """Check a batch against the entity and route it: (its partition key, the items to store). The stored
        messages are copies unless the caller hands ``owned`` messages over (a front end's freshly decoded ones),
        so that a caller's later changes never reach a stored message."""
        desc = self._sendable()
        return self._route(messages, owned, desc.requires_duplicate_detection, self._requires_session())

    def _sendable(self) -> QueueDescription | TopicDescription:
        desc = self.description
        if not desc.status.can_send:
            raise EntityDisabled(f"Messaging entity '{self.path}' is currently disabled for sending ({desc.status}).")
        return desc

    def _route(
        self, messages: list[Message], owned: bool, duplicate_detection: bool, sessions: bool
    ) -> tuple[str | None, list[Any]]:
        """``_prepare`` once the entity's own checks passed (done once for many batches by ``submit_many``)."""
        if sessions and any(m.session_id is None for m in messages):
            raise InvalidOperation(
                "The SessionId was not set on a message, and it cannot be sent to the entity. Entities that have "
                "session support enabled can only receive messages that have the SessionId set to a valid value."
            )
        if len(messages) == 1:  # the usual send: no batch key rule (a set of keys) and no items list to build
            m = messages[0]
            return partition_key_of(m, duplicate_detection), self._fan_out(m if owned else m.copy())
        key = batch_partition_key(messages, duplicate_detection, len(self.partitions) > 1)
        if owned and type(self) is QueueEntity:  # the queue's ``_fan_out`` of each, in one list (an SDK batch)
            items = []
            append = items.append
            for m in messages:  # ``_dedup_id`` written out: one Python call fewer per message of a batch
                dedup_id = m.transfer_id
                if dedup_id is None:
                    dedup_id = m.message_id
                    if dedup_id is not None and type(dedup_id) is not str:
                        dedup_id = str(dedup_id)
                append((dedup_id, [(QUEUE_SLOT, m)]))
            return key, items
        items = []
        fan_out = self._fan_out
        for m in messages:
            items.extend(fan_out(m if owned else m.copy()))
        return key, items

    def _submit_prepared(self, key: str | None, items: list[Any]) -> Future:
        if key is not None:
            return self.partitions[partition_for_key(key, len(self.partitions))].enqueue(items)
        return self._send_keyless(items)

    def submit_send(self, messages: list[Message]) -> Future:
        """Route and store a batch (all-or-nothing, in one partition). Never blocks on I/O."""
        if not messages:
            done: Future = Future()
            done.set_result([])
            return done
        return self._submit_prepared(*self._prepare(messages))

    def submit_many(
        self, batches: list[list[Message]], on_done: Callable[[list[int], list[Any]], None], owned: bool = False
    ) -> None:
        """Store many independent batches (each all-or-nothing): those bound for the same partition share one
        store operation, so a front end can hand over everything one socket read brought in. ``on_done(indices,
        outcomes)`` reports each batch's outcome (None when stored, else the exception), once per group and from
        whichever thread finished it. Keyless batches of one call go to one partition, chosen round-robin.
        ``owned``: the messages are handed over (the caller never touches them again), so they are not copied."""
        # per partition: the batches' indices, their items in one list (what ``enqueue`` takes), how many items
        # each batch has there, and their keys
        groups: dict[int, tuple[list[int], list[Any], list[int], list[str | None]]] = {}
        keyless_partition: int | None = None
        n = len(self.partitions)
        try:
            desc = self._sendable()
        except ShardbusError as exc:
            on_done(list(range(len(batches))), [exc] * len(batches))
            return
        duplicate_detection, sessions = desc.requires_duplicate_detection, self._requires_session()
        # A queue's usual send (one owned message, no session id): ``_route``, ``partition_key_of`` and the
        # queue's ``_fan_out`` written out, three Python calls fewer per message; anything else takes ``_route``.
        plain = owned and not sessions and type(self) is QueueEntity
        flat_keyless = _keyless_items(batches) if plain and not duplicate_detection and batches else None
        if flat_keyless is not None:  # every batch the usual keyless send: one group, built in one pass
            count = len(batches)
            groups[self._keyless_partition()] = (list(range(count)), flat_keyless, [1] * count, [None] * count)
        for i, messages in enumerate(batches if flat_keyless is None else ()):
            if plain and len(messages) == 1 and messages[0].session_id is None:
                m = messages[0]
                key = m.partition_key
                if key is None:
                    if duplicate_detection and m.message_id is not None:
                        key = str(m.message_id)
                    else:
                        key = m.transfer_id  # None but for a forwarded copy (model/routing.py)
                dedup_id = m.transfer_id
                if dedup_id is None:
                    dedup_id = m.message_id
                    if dedup_id is not None and type(dedup_id) is not str:
                        dedup_id = str(dedup_id)
                items = None
                item = (dedup_id, [(QUEUE_SLOT, m)])  # the batch's one item, straight into its group's list
            else:
                try:
                    key, items = self._route(messages, owned, duplicate_detection, sessions)
                except ShardbusError as exc:
                    on_done([i], [exc])
                    continue
            if key is not None:
                pid = partition_for_key(key, n)
            else:
                if keyless_partition is None:
                    keyless_partition = self._keyless_partition()
                pid = keyless_partition
            group = groups.get(pid)
            if group is None:
                group = groups[pid] = ([], [], [], [])
            indices, flat, counts, keys = group
            indices.append(i)
            if items is None:
                flat.append(item)
                counts.append(1)
            else:
                flat += items
                counts.append(len(items))
            keys.append(key)
        for pid, (indices, flat, counts, keys) in groups.items():
            try:
                future = self.partitions[pid].enqueue(flat)
            except ShardbusError:
                # Something in the group is refused (a message too large, a quota, a partition down): send
                # the batches one by one, so each gets its own outcome and keyless ones can fail over.
                self._one_by_one(indices, flat, counts, keys, on_done)
                continue
            future.add_done_callback(partial(self._group_done, indices, flat, counts, keys, on_done))

    def _keyless_partition(self) -> int:
        """The partition a call's keyless batches go to: the next in turn, or the first healthy one after it."""
        n = len(self.partitions)
        start = next(self._round_robin)
        healthy = [(start + k) % n for k in range(n) if self.partitions[(start + k) % n].healthy]
        return healthy[0] if healthy else start % n

    def _one_by_one(
        self,
        indices: list[int],
        flat: list[Any],
        counts: list[int],
        keys: list[str | None],
        on_done: Callable[..., None],
    ) -> None:
        """A group refused whole, nothing of it stored: its batches sent again one by one, each its own outcome."""
        for i, items, key in zip(indices, _per_batch(flat, counts), keys, strict=True):
            self._submit_one(i, key, items, on_done)

    def _submit_one(self, index: int, key: str | None, items: list[Any], on_done: Callable[..., None]) -> None:
        try:
            future = self._submit_prepared(key, items)
        except ShardbusError as exc:
            on_done([index], [exc])
            return
        future.add_done_callback(lambda f: on_done([index], [f.exception()]))

    def _group_done(
        self,
        indices: list[int],
        flat: list[Any],
        counts: list[int],
        keys: list[str | None],
        on_done: Callable[..., None],
        future: Future,
    ) -> None:
        exc = future.exception()
        if exc is None:
            on_done(indices, [None] * len(indices))
        elif isinstance(exc, PartitionUnavailable):  # failed mid-write (taken back if it landed): keyless go elsewhere
            for i, items, key in zip(indices, _per_batch(flat, counts), keys, strict=True):
                if key is None:
                    self._submit_one(i, None, items, on_done)
                else:
                    on_done([i], [exc])
        elif isinstance(exc, ShardbusError) and not isinstance(exc, InternalError) and len(indices) > 1:
            # refused whole, nothing of it stored (a remote partition answers ``enqueue``'s refusals here, where a
            # local one raises them in ``submit_many``): the batches one by one, each with its own outcome; not
            # after an internal error, whose write may have landed
            self._one_by_one(indices, flat, counts, keys, on_done)
        else:
            on_done(indices, [exc] * len(indices))

    def submit_cancel_scheduled(self, sequence_numbers: list[int]) -> list[Future]:
        """Cancel scheduled messages, one store operation per partition the sequence numbers name."""
        by_partition: dict[int, list[int]] = {}
        for seq in sequence_numbers:
            pid, local = decode_sequence_number(seq)
            if pid >= len(self.partitions):
                raise MessageNotFound(f"No scheduled message with sequence number {seq} exists in '{self.path}'.")
            by_partition.setdefault(pid, []).append(local)
        return [self.partitions[pid].cancel_scheduled(locals_) for pid, locals_ in by_partition.items()]

    def _send_keyless(self, items: list[Any]) -> Future:
        """Round-robin; an unavailable partition (now, or failing while it writes) hands over to the next."""
        n = len(self.partitions)
        start = next(self._round_robin) % n
        order = [self.partitions[(start + i) % n] for i in range(n)]
        result: Future = Future()
        full: list[PartitionFull] = []  # partitions whose store is full said so: the final error says it too

        def attempt(index: int) -> None:
            while index < n:
                p = order[index]
                index += 1
                if not p.healthy:
                    continue
                try:
                    inner = p.enqueue(items)
                except PartitionUnavailable as exc:
                    if isinstance(exc, PartitionFull):
                        full.append(exc)
                    continue
                except BaseException as exc:
                    result.set_exception(exc)
                    return

                def done(f: Future, next_index: int = index) -> None:
                    exc = f.exception()
                    if isinstance(exc, PartitionUnavailable):
                        if isinstance(exc, PartitionFull):
                            full.append(exc)
                        attempt(next_index)
                    elif exc is not None:
                        result.set_exception(exc)
                    else:
                        result.set_result(f.result())

                inner.add_done_callback(done)
                return
            if full:
                result.set_exception(
                    PartitionFull(
                        f"No partition of '{self.path}' can store the message now: their stores are full "
                        f"({len(full)} refused it). Receives and settlements go on; retry the send later."
                    )
                )
                return
            result.set_exception(
                PartitionUnavailable(f"No partition of '{self.path}' is available to take the message; retry later.")
            )

        def release(_: Future) -> None:
            # ``attempt`` refers to itself (through its closure): once answered, let go of it, or every send
            # through here leaves a reference cycle (with its messages) for the garbage collector to find
            nonlocal attempt
            attempt = None  # type: ignore[assignment]

        result.add_done_callback(release)
        attempt(0)
        return result


class QueueEntity(_Sender, Target):
    def __init__(self, description: QueueDescription, partitions: list[PartitionHandle]) -> None:
        _Sender.__init__(self)
        Target.__init__(self, description.name, partitions, QUEUE_SLOT)
        self._description = description
        for p in partitions:
            p.listeners.append(self._on_partition_messages)

    @property
    def description(self) -> QueueDescription:
        return self._description

    @description.setter
    def description(self, value: QueueDescription) -> None:
        self._description = value
        self.path = value.name

    def _requires_session(self) -> bool:
        return self._description.requires_session

    def _fan_out(self, message: Message) -> list[tuple[str | None, list[tuple[int, Message]]]]:
        # ``_dedup_id``, written out: every send to a queue comes here
        key = message.transfer_id
        if key is None:
            key = message.message_id
            if key is not None and type(key) is not str:
                key = str(key)
        return [(key, [(QUEUE_SLOT, message)])]

    def _on_partition_messages(self, slot: int) -> None:
        self.messages_available()


class SubscriptionEntity(Target):
    def __init__(self, description: SubscriptionDescription, topic: TopicEntity, slot: int, rules: list[Rule]) -> None:
        super().__init__(description.path, topic.partitions, slot)
        self._description = description
        self.topic = topic
        self.rules = rules

    @property
    def description(self) -> SubscriptionDescription:
        return self._description

    @description.setter
    def description(self, value: SubscriptionDescription) -> None:
        self._description = value


class TopicEntity(_Sender):
    def __init__(self, description: TopicDescription, partitions: list[PartitionHandle]) -> None:
        super().__init__()
        self.description_ = description
        self.path = description.name
        self.partitions = partitions
        self.subscriptions: dict[str, SubscriptionEntity] = {}  # by lower-cased name
        self._by_slot: dict[int, SubscriptionEntity] = {}
        for p in partitions:
            p.listeners.append(self._on_partition_messages)

    @property
    def description(self) -> TopicDescription:
        return self.description_

    @description.setter
    def description(self, value: TopicDescription) -> None:
        self.description_ = value

    def add_subscription(self, sub: SubscriptionEntity) -> None:
        self.subscriptions[sub.description.name.lower()] = sub
        self._by_slot[sub.slot] = sub

    def remove_subscription(self, name: str) -> SubscriptionEntity | None:
        sub = self.subscriptions.pop(name.lower(), None)
        if sub is not None:
            self._by_slot.pop(sub.slot, None)
        return sub

    def _fan_out(self, message: Message) -> list[tuple[str | None, list[tuple[int, Message]]]]:
        dedup_id = _dedup_id(message)
        first: list[tuple[int, Message]] = []
        extra: list[tuple[str | None, list[tuple[int, Message]]]] = []
        for sub in self.subscriptions.values():
            if sub.description.status is EntityStatus.DISABLED:  # a disabled subscription gets no copies
                continue
            for i, copy in enumerate(route(sub.rules, message)):
                # A slot holds one copy per sequence number; further copies (several matching rules with
                # actions) are stored as messages of their own.
                if i == 0:
                    first.append((sub.slot, copy))
                else:
                    extra.append((None, [(sub.slot, copy)]))
        return [(dedup_id, first), *extra]

    def _on_partition_messages(self, slot: int) -> None:
        sub = self._by_slot.get(slot)
        if sub is not None:
            sub.messages_available()

    def runtime(self) -> RuntimeProperties:
        total = RuntimeProperties()
        for p in self.partitions:
            try:
                total.scheduled_message_count += p.scheduled_count()
                total.size_in_bytes += p.size_bytes()
                total.partitions.append({"partition": p.id, "healthy": True})
            except ShardbusError:
                total.availability = "Limited"
                total.partitions.append({"partition": p.id, "healthy": False, "failure": p.failure})
        return total
