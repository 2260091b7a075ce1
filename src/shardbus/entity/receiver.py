"""A receiver on a queue or subscription: receive fan-out across partitions and the front end's cache.

Theory of operation
-------------------
As the seeds describe it: a receive asks every partition for messages, returns what arrives first, and keeps
the rest in this receiver's cache, their locks running, for the next receive; the receiver never sees
partitions. Settlement goes straight to the owning partition, which the lock token names.

Asking. ``take`` serves the cache first; for what is still missing it sends one request to every partition
that is worth asking *at once* (``submit_lock_messages``: a remote partition's request goes out without
waiting, a local one answers at once) and handles each answer as it arrives (``_answered``: the messages join
the cache). The blocking form waits for the answers of the requests it sent; a front end passes ``on_more``
instead and is called back (any thread) when an answer brought messages, so its event loop never waits for a
worker. Per partition the receiver knows:

    asking   a request is in flight          → not asked again until it answers (or REPLY_LIMIT passes)
    empty    it answered with fewer than asked and no "messages available" event came since the request left
             → not asked, until such an event (the partition's listener), EMPTY_TRUST seconds (restarts and
               dead-lettering raise no event) or a health change
    ready    anything else                   → asked

An event counts only if it came after the request left (an epoch per partition), so an answer that crossed an
event never marks a partition empty. Only the main queue keeps "empty": dead-letter sub-queues raise no events.
Each partition worth asking is asked for the whole request while that stays small (WHOLE_REQUEST_LIMIT messages
in all), so a backlog in one partition comes back in one receive; beyond that they share a budget of about twice
the request (at least one message each), so the cache holds at most about one request more than asked for.

Holding. A cached message that no receive call takes within CACHE_HOLD seconds is released to its partition
(no delivery counted), so another receiver or front end can take it long before its lock would expire; a
cached message whose lock ran out is dropped (its partition makes it available again). Closing the receiver
releases what it cached, and messages that arrive after that.

ReceiveAndDelete takes messages the same way but deletes each one as it is handed to the caller, so a
cached message is never lost.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from functools import partial

from ..model.errors import InvalidOperation, MessageLockLost, MessageNotFound, PartitionUnavailable
from ..model.message import Message, ReceiveMode, SubQueue
from ..model.routing import decode_sequence_number, partition_of_lock_token, uuid_of_int
from ..partition.handle import PartitionHandle
from ..partition.values import Settle
from .entity import Target

_RECEIVE_AND_DELETE = ReceiveMode.RECEIVE_AND_DELETE  # a module constant: an Enum member off its class is slow

LockRef = Message | uuid.UUID

# A message waits at most this long in a receiver's cache for a receive call, then goes back to its partition.
# Long enough for a client's next receive (a processing loop, the next credit) to find it; short against the
# shortest lock the service allows (5 s), so a message handed out from the cache keeps most of its lock, and
# another front end waits seconds for it instead of the whole lock duration (60 s by default).
CACHE_HOLD = 2.0
# How long an empty answer is believed without an event (an idle receiver asks each partition this often).
EMPTY_TRUST = 2.0
# A request not answered for this long (a hung worker) no longer holds its partition back, nor a blocking take.
REPLY_LIMIT = 30.0
# Every partition is asked for the whole request, as the service's front end does (a backlog in one partition
# comes back in one receive), while that asks for at most this many messages in all; larger requests share a
# budget of about twice the request, so the cache never holds much more than one request beyond what was asked.
WHOLE_REQUEST_LIMIT = 256
# How long a target's next due time (lock expiry, scheduled message) is reused. Partitions tick every 100 ms
# and raise an event for what became receivable, so this only bounds how soon a waiter re-checks.
NEXT_DUE_TTL = 1.0
NEXT_DUE_RETRY = 0.1


def _token(ref: LockRef) -> uuid.UUID:
    token = ref.lock_token if isinstance(ref, Message) else ref
    if token is None:
        raise InvalidOperation(
            "The operation is only supported for messages received in peek-lock mode (this message has no lock)."
        )
    return token


class Settling:
    """Blocking settlement calls, built on a receiver's ``submit_complete`` and ``submit_settle``."""

    def submit_complete(self, refs: Iterable[LockRef], partition: int | None = None) -> list[Future]:
        raise NotImplementedError

    def submit_complete_keys(self, keys: list[int], partition: int) -> list[Future]:
        """``submit_complete(tokens, partition)`` of lock tokens given as their ``int``s (``uuid.UUID.int``), as a
        front end reads them from settled deliveries' tags."""
        return self.submit_complete([uuid_of_int(key) for key in keys], partition)

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
        lend: bool = False,
    ) -> None:
        """``lend``: ``take`` may give a local partition's own locked messages, not copies
        (``submit_lock_messages``), for a caller that only reads them (a front end encoding deliveries); what
        ``receive`` and ``try_receive`` give is still the caller's own copy."""
        # Dead-letter sub-queues of session entities are read without sessions, as in the service.
        self._sessionless_ok = sub_queue is not SubQueue.MAIN
        target.check_receive(session=self._sessionless_ok)
        self.target = target
        self.mode = mode
        self.sub_queue = sub_queue
        self._clock = clock
        self._cache: deque[tuple[Message, float]] = deque()  # (message, when it was cached: monotonic)
        self._rotation = 0
        self.closed = False
        self._lock = threading.Lock()
        self._answers = threading.Condition(self._lock)
        count = len(target.partitions)
        self._asking: list[float | None] = [None] * count  # when the request in flight left
        self._empty: list[float | None] = [None] * count  # when a partition answered "no more"
        self._epoch = [0] * count  # "messages available" events seen, per partition
        self._got = [0] * count  # how many the last answer brought
        self._share = [0] * count  # how many the request in flight asks for
        self._asked = 0  # messages asked for by the requests in flight
        self._track_empty = sub_queue is SubQueue.MAIN
        self._listening = False
        self._on_more: Callable[[], None] | None = None
        self._taking = False
        self._error: BaseException | None = None
        self._sweep_due: float | None = None
        self._lend = lend

    # --- receiving -----------------------------------------------------------------------------------------
    def try_receive(self, max_count: int = 1) -> list[Message]:
        """Whatever is available now, up to ``max_count``, without waiting for new messages (peek-lock: waits
        only for the partitions' answers; receive-and-delete: also for the deletes)."""
        out = self.take(max_count)
        if self._lend:
            out = [m.copy() for m in out]  # the caller may change them: never a partition's own
        if self.mode is _RECEIVE_AND_DELETE and out:
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
            due = next_due_ms(self.target, self.sub_queue, self._clock)
            wait = min(remaining, 0.5 if due is None else max(0.0, due / 1000 - now))
            self.target.wait(generation, wait)

    def take(self, max_count: int, on_more: Callable[[], None] | None = None) -> list[Message]:
        """Lock up to ``max_count`` messages, from the cache first, then from the partitions. Without
        ``on_more`` it waits for the answers of the partitions it asked. With ``on_more`` it never waits: it
        returns what is there, and ``on_more`` is called (once, from any thread) when an answer brings more. In
        receive-and-delete mode the caller then removes them with ``submit_complete`` (front ends do, so as not
        to block on the delete)."""
        if self.closed:
            raise InvalidOperation("The receiver is closed.")
        self.target.check_receive(session=self._sessionless_ok)
        if not self._listening:
            self._listen()  # before any request leaves, so no event that follows it goes unheard
        out: list[Message] = []
        with self._lock:
            self._pop_cached(out, max_count)
            if len(out) >= max_count:
                return out
            requests = self._plan(max_count, max_count - len(out))
            if on_more is not None:
                self._on_more = on_more
                self._taking = True  # answers that arrive before the cache is read again need no call back
        if requests:
            self._send(requests)
        if on_more is not None:
            with self._lock:
                self._taking = False
                self._pop_cached(out, max_count)
        else:
            # Waiting: partitions that filled their share may hold more, so they are asked again (with a
            # larger share, as the empty ones drop out) until the request is met or nobody has more.
            while requests:
                self._wait_for([pid for pid, _, _ in requests])
                with self._lock:
                    self._pop_cached(out, max_count)
                    full = {pid for pid, count, _ in requests if self._got[pid] >= count}
                    requests = self._plan(max_count, max_count - len(out), full) if len(out) < max_count else []
                if requests:
                    self._send(requests)
        if not out and self._error is not None:
            with self._lock:
                error, self._error = self._error, None
            if error is not None:
                raise error
        return out

    def _pop_cached(self, out: list[Message], max_count: int) -> None:
        """Move cached messages whose lock still runs to ``out`` (under the lock)."""
        cache = self._cache
        if not cache:
            return
        now_ms = int(self._clock() * 1000)
        while cache and len(out) < max_count:  # taken a run at a time (comprehensions: no loop of calls each)
            room = max_count - len(out)
            if len(cache) <= room:  # the usual take: the whole cache, in one pass
                out += [m for m, _ in cache if (until := m.locked_until_ms) is not None and until > now_ms]
                cache.clear()
                return
            popleft = cache.popleft
            taken = [popleft()[0] for _ in range(room)]
            out += [m for m in taken if m.locked_until_ms is not None and m.locked_until_ms > now_ms]

    def _plan(self, max_count: int, need: int, among: set[int] | None = None) -> list[tuple[int, int, int]]:
        """Which partitions (of ``among``) to ask for how many: (partition, count, epoch) (under the lock; marks
        them asking)."""
        partitions = self.target.partitions
        n = len(partitions)
        if n != len(self._asking):  # never expected (partition counts are fixed), but stay consistent
            return []
        now = time.monotonic()
        # Rotate the starting partition so no partition is always asked (and answers) first.
        self._rotation = start = (self._rotation + 1) % n
        chosen = []
        for k in range(n):
            pid = (start + k) % n
            if among is not None and pid not in among:
                continue
            if not partitions[pid].healthy:
                self._empty[pid] = None  # it may come back with messages and no event
                continue
            asked = self._asking[pid]
            if asked is not None and now - asked < REPLY_LIMIT:
                continue
            empty = self._empty[pid]
            if empty is not None and now - empty < EMPTY_TRUST:
                continue
            chosen.append(pid)
        if not chosen:
            return []
        # Ask every partition at least for one, in all about twice the request (fewer while some are in
        # flight): what arrives beyond the request waits in the cache for the next one.
        budget = max(need + len(chosen) - 1, 2 * max_count) - self._asked
        if budget <= 0:
            return []
        each = min(max(need, max_count), max(1, -(-budget // len(chosen))))
        if need * len(chosen) <= WHOLE_REQUEST_LIMIT:
            each = max(each, need)
        for pid in chosen:
            if self._asking[pid] is not None:  # gave up on its earlier request: that share is not coming
                self._asked -= self._share[pid]
            self._asking[pid] = now
            self._share[pid] = each
        self._asked += each * len(chosen)
        return [(pid, each, self._epoch[pid]) for pid in chosen]

    def _send(self, requests: list[tuple[int, int, int]]) -> None:
        partitions, slot, queue, lend = self.target.partitions, self.target.slot, self.sub_queue, self._lend
        for pid, count, epoch in requests:
            try:
                future = partitions[pid].submit_lock_messages(slot, queue, count, lend)
            except Exception as exc:  # a partition that cannot even take the request answers "unavailable"
                future = Future()
                future.set_exception(exc)
            future.add_done_callback(lambda f, pid=pid, count=count, epoch=epoch: self._answered(pid, count, epoch, f))

    def _answered(self, pid: int, count: int, epoch: int, future: Future) -> None:
        """A partition's answer (any thread): its messages join the cache; a short answer marks it empty."""
        error = None
        failed = True
        try:
            messages: list[Message] = future.result()
            failed = False
        except PartitionUnavailable:
            messages = []
        except Exception as exc:
            messages, error = [], exc
        wake = None
        with self._lock:
            if self._asking[pid] is not None and self._share[pid] == count:
                self._asking[pid] = None
                self._asked -= count
            self._got[pid] = len(messages)
            closed = self.closed
            if not closed:
                now = time.monotonic()
                short = len(messages) < count and not failed
                self._empty[pid] = now if short and self._track_empty and self._epoch[pid] == epoch else None
                if messages:
                    self._cache.extend(zip(messages, itertools.repeat(now)))  # (message, when cached), no frame each
                    if self._sweep_due is None:
                        self._sweep_due = now + CACHE_HOLD
                        _sweeper.schedule(self, self._sweep_due)
                if error is not None:
                    self._error = error
                if (messages or error is not None) and not self._taking:
                    wake, self._on_more = self._on_more, None
            self._answers.notify_all()
        if closed:
            self._release(messages)
        elif wake is not None:
            wake()

    def _wait_for(self, pids: list[int]) -> None:
        """Until the requests to ``pids`` are answered (or REPLY_LIMIT passes)."""
        deadline = time.monotonic() + REPLY_LIMIT
        with self._answers:
            while any(self._asking[pid] is not None for pid in pids):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._answers.wait(remaining)

    def _listen(self) -> None:
        """Hear the partitions' "messages available" events (from the first request on)."""
        if not self._listening and self._track_empty and not self.closed:
            self._listening = True
            _hub(self.target).add(self)

    def _heard(self, pid: int) -> None:
        with self._lock:
            self._epoch[pid] += 1
            self._empty[pid] = None

    def _unlisten(self) -> None:
        if self._listening:
            self._listening = False
            _hub(self.target).remove(self)

    def _sweep(self) -> None:
        """Release what waited in the cache longer than CACHE_HOLD (the sweeper thread calls this)."""
        stale: list[Message] = []
        with self._lock:
            now = time.monotonic()
            cache = self._cache
            while cache and cache[0][1] + CACHE_HOLD <= now:
                stale.append(cache.popleft()[0])
            self._sweep_due = None if not cache else cache[0][1] + CACHE_HOLD
            if self._sweep_due is not None:
                _sweeper.schedule(self, self._sweep_due)
        self._release(stale)

    def _release(self, messages: list[Message]) -> None:
        """Give messages back to their partitions without counting a delivery and without waiting: one
        settlement per partition, one by one if the group is refused (a lock in it was lost)."""
        by_partition: dict[int, list[uuid.UUID]] = {}
        for m in messages:
            if m.lock_token is not None:
                by_partition.setdefault(partition_of_lock_token(m.lock_token), []).append(m.lock_token)
        slot = self.target.slot
        for pid, tokens in by_partition.items():
            partition = self.target.partitions[pid]  # it answered, so it exists
            try:
                future = partition.settle(slot, [Settle("release", t) for t in tokens])
            except MessageLockLost as exc:  # a local partition refuses at once
                future = Future()
                future.set_exception(exc)
            except PartitionUnavailable:
                continue
            if len(tokens) > 1:
                future.add_done_callback(lambda f, p=partition, tokens=tokens: _release_each(f, p, slot, tokens))

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
    def _partition(self, token: uuid.UUID) -> PartitionHandle:
        pid = partition_of_lock_token(token)
        if pid >= len(self.target.partitions):
            raise MessageLockLost("The lock supplied is invalid for this entity.")
        return self.target.partitions[pid]

    def submit_complete(self, refs: Iterable[LockRef], partition: int | None = None) -> list[Future]:
        """Complete many messages, one store operation per partition; returns the write futures. ``partition``:
        ``refs`` are lock tokens (``uuid.UUID``) of that partition alone (a front end grouped them already), so
        they go to it as they are, not grouped again token by token."""
        if partition is not None:
            partitions = self.target.partitions
            if partition >= len(partitions):
                raise MessageLockLost("The lock supplied is invalid for this entity.")
            return [partitions[partition].complete(self.target.slot, refs)]  # type: ignore[arg-type]
        if isinstance(refs, list) and len(refs) == 1:  # a front end completing one message per request
            token = refs[0]
            if token.__class__ is not uuid.UUID:
                token = _token(token)
            partitions = self.target.partitions
            pid = token.int & 0xFFFF  # ``_partition``, inlined
            if pid >= len(partitions):
                raise MessageLockLost("The lock supplied is invalid for this entity.")
            return [partitions[pid].complete(self.target.slot, [token])]
        by_partition: dict[int, list[uuid.UUID]] = {}
        for ref in refs:
            token = _token(ref)
            by_partition.setdefault(partition_of_lock_token(token), []).append(token)
        return [self._partition(tokens[0]).complete(self.target.slot, tokens) for tokens in by_partition.values()]

    def submit_complete_keys(self, keys: list[int], partition: int) -> list[Future]:
        """``Settling.submit_complete_keys`` without a UUID per token: a partition finds a lock by its ``int``
        alone (the partition interface's ``complete_keys``; a worker's reads a complete's tokens as ints too)."""
        partitions = self.target.partitions
        if partition >= len(partitions):
            raise MessageLockLost("The lock supplied is invalid for this entity.")
        return [partitions[partition].complete_keys(self.target.slot, keys)]

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
        with self._lock:
            self.closed = True
            self._on_more = None  # its front end's callback (and, through it, a closed connection): not called now
            cached = [m for m, _ in self._cache]
            self._cache.clear()
            self._answers.notify_all()
        self._unlisten()
        self._release(cached)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def settle(
    partition: PartitionHandle,
    slot: int,
    outcome: str,
    token: uuid.UUID,
    reason: str | None = None,
    description: str | None = None,
) -> Future | None:
    """Settle one message in its partition; a release needs no write, so gives no future."""
    future = partition.settle(slot, [Settle(outcome, token, reason, description)])
    return None if outcome == "release" else future


def _release_each(group: Future, partition: PartitionHandle, slot: int, tokens: list[uuid.UUID]) -> None:
    """A grouped release was refused (one of its locks was lost): release the others one by one."""
    if group.cancelled() or group.exception() is None:
        return
    for token in tokens:
        try:
            partition.settle(slot, [Settle("release", token)])
        except (MessageLockLost, PartitionUnavailable):
            continue


class _Hub:
    """The receivers of one target, told of its partitions' "messages available" events: one listener per
    partition for the target's life (receivers come and go far more often than entities)."""

    def __init__(self, target: Target) -> None:
        self.slot = target.slot
        self._lock = threading.Lock()
        self._receivers: dict[int, weakref.ref[Receiver]] = {}  # replaced, never changed: read without the lock
        for pid, p in enumerate(target.partitions):
            # First, so a receiver hears of messages before the entity's listener wakes it; in place, as the
            # entity's was added, since the partition may be calling its listeners right now (at worst it calls
            # this one twice).
            p.listeners.insert(0, partial(self._heard, pid))

    def add(self, receiver: Receiver) -> None:
        key = id(receiver)
        with self._lock:
            self._receivers = {**self._receivers, key: weakref.ref(receiver, lambda _: self._drop(key))}

    def remove(self, receiver: Receiver) -> None:
        self._drop(id(receiver))

    def _drop(self, key: int) -> None:
        with self._lock:
            if key in self._receivers:
                self._receivers = {k: v for k, v in self._receivers.items() if k != key}

    def _heard(self, pid: int, slot: int) -> None:
        if slot == self.slot:
            for ref in self._receivers.values():
                receiver = ref()
                if receiver is not None:
                    receiver._heard(pid)


_hubs: weakref.WeakKeyDictionary[Target, _Hub] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def _hub(target: Target) -> _Hub:
    with _hubs_lock:
        hub = _hubs.get(target)
        if hub is None:
            hub = _hubs[target] = _Hub(target)
        return hub


class _Sweeper:
    """One daemon thread for every receiver of the process: calls ``Receiver._sweep`` when its cache's oldest
    message reaches CACHE_HOLD. It holds the receivers it will sweep, so a receiver dropped without ``close``
    still gives its cache back."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Receiver]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, receiver: Receiver, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._order), receiver))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardbus-receive-cache", daemon=True)
                self._thread.start()
            elif self._heap[0][0] == due:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > (now := time.monotonic()):
                    self._cond.wait(None if not self._heap else self._heap[0][0] - now)
                _, _, receiver = heapq.heappop(self._heap)
            if not receiver.closed:
                try:
                    receiver._sweep()
                except Exception:  # a release that cannot be sent: its lock runs out instead
                    pass


_sweeper = _Sweeper()
_due_cache: weakref.WeakKeyDictionary[Target, dict[int, tuple[float, int | None]]] = weakref.WeakKeyDictionary()


def next_due_ms(target: Target, sub_queue: SubQueue, clock: Callable[[], float] = time.time) -> int | None:
    """``target.next_due_ms`` reused for NEXT_DUE_TTL (an answer that ``clock`` has passed, for NEXT_DUE_RETRY):
    waiting receivers ask it after every empty receive, and it asks every partition."""
    now = time.monotonic()
    cached = _due_cache.get(target, {}).get(int(sub_queue))
    if cached is not None:
        asked_at, due = cached
        age = now - asked_at
        if age < NEXT_DUE_RETRY or (age < NEXT_DUE_TTL and (due is None or due > clock() * 1000)):
            return due
    try:
        due = target.next_due_ms(sub_queue)
    except PartitionUnavailable:
        due = None
    _due_cache.setdefault(target, {})[int(sub_queue)] = (now, due)
    return due


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
