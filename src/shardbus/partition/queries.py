"""The partition broker's read-only queries: ``peek``; the range reads of the Spark connector (``browse_range``,
``range_offsets``, ``last_sequence``, ``completed_mark``); the counts (``runtime``, ``scheduled_count``,
``size_bytes``), the slot counters (``stats``) and ``next_due_ms``. Resident messages are merged with an indexed
scan of the disk-only ones (the store window, window.py), so a page costs what it returns.

``Queries`` is a part of ``PartitionBroker``; it changes no message's state. Keeps nothing of its own but the
per-slot ``SlotStats`` (three counters per slot, created by ``_slot_stats``, in the broker's ``_stats``).
"""

from __future__ import annotations

import heapq

from ..model.entities import RuntimeProperties
from ..model.message import Message, MessageState, SubQueue
from .memory import _DEFERRED, _SCHEDULED, Entry
from .values import SlotStats


class Queries:
    """The read-only part of ``PartitionBroker``: peeks, range reads, counts and counters."""

    def peek(
        self, slot: int, queue: int, from_local_seq: int, max_count: int, session_id: str | None = None
    ) -> list[Message]:
        """The oldest messages from ``from_local_seq`` on, in any state (locked ones too), without locking;
        only one session's with ``session_id``."""
        with self._lock:
            self._check()
            q = self._queues.get((slot, queue))
            if q is None or max_count <= 0:
                return []
            entries = q.entries
            if session_id is None:
                candidates = (s for s in entries if s >= from_local_seq)
            else:
                candidates = (s for s, e in entries.items() if s >= from_local_seq and e.msg.session_id == session_id)
            found = [entries[s] for s in heapq.nsmallest(max_count, candidates)]
            found += self._disk_entries(q, from_local_seq, self._visible_next, max_count, session_id)
            for state in (_DEFERRED, _SCHEDULED):
                found += self._disk_held(q, state, from_local_seq, self._visible_next, max_count, session_id)
            return self._browsed(found, max_count)

    @staticmethod
    def _browsed(found: list[Entry], max_count: int) -> list[Message]:
        """Copies of the oldest ``max_count`` of resident and disk entries, without anyone's lock."""
        if len(found) > 1:
            found.sort(key=lambda e: e.seq)
        out = []
        for entry in found[:max_count]:
            copy = entry.msg.copy()
            copy.lock_token = copy.locked_until_ms = None  # a peek never hands out someone's lock
            out.append(copy)
        return out

    def last_sequence(self) -> int:
        """The highest partition-relative sequence number assigned so far (0 if none)."""
        with self._lock:
            return self._next_seq - 1

    def range_offsets(self, slot: int, queue: int, count_from: int = 0) -> tuple[int, int, int, int]:
        """(first, end, mark, count) of a sub-queue: the lowest readable sequence number (``end`` when none),
        the number every readable message is below (new ones arrive at or above it), the cumulative mark of
        ``complete_below`` (1 when never called), and how many readable messages are at or above ``count_from``.
        Readable: any state but SCHEDULED."""
        with self._lock:
            self._check()
            end = self._visible_next
            first, count = end, 0
            q = self._queues.get((slot, queue))
            if q is not None:
                scheduled = MessageState.SCHEDULED
                resident_scheduled = 0
                for s, e in q.entries.items():
                    if e.msg.state is not scheduled:
                        if s < first:
                            first = s
                        if s >= count_from:
                            count += 1
                    else:
                        resident_scheduled += 1
                if self._on_disk(q):
                    head = self._disk_entries(q, q.disk_from, end, 1) if q.disk_from is not None else []
                    head += self._disk_held(q, _DEFERRED, 1, end, 1)
                    if head:
                        first = min(first, *(e.seq for e in head))
                    # the disk-only messages at or above count_from: all of them but those below it
                    on_disk = q.count - len(q.entries) - q.staged - (q.scheduled_count - resident_scheduled)
                    below = len(self._disk_sizes(q, q.disk_from, count_from)) if q.disk_from is not None else 0
                    below += len(self._held_rows(q, _DEFERRED, 1, count_from, max(on_disk, 1)))
                    count += max(0, on_disk - below)
            return first, end, self._marks.get((slot, queue), 1), count

    def completed_mark(self, slot: int, queue: int) -> int:
        """Everything readable below it was completed by ``complete_below`` (1 when never called)."""
        with self._lock:
            self._check()
            return self._marks.get((slot, queue), 1)

    def browse_range(self, slot: int, queue: int, start: int, end: int, max_count: int) -> list[Message]:
        """Up to ``max_count`` readable messages with ``start <= sequence number < end``, oldest first, in any
        state but SCHEDULED (a scheduled message is read once its time has come), without locking."""
        with self._lock:
            self._check()
            q = self._queues.get((slot, queue))
            if q is None or max_count <= 0 or start >= end:
                return []
            entries = q.entries
            scheduled = MessageState.SCHEDULED
            seqs = heapq.nsmallest(
                max_count, (s for s, e in entries.items() if start <= s < end and e.msg.state is not scheduled)
            )
            found = [entries[s] for s in seqs]
            found += self._disk_entries(q, start, end, max_count)
            found += self._disk_held(q, _DEFERRED, start, end, max_count)
            return self._browsed(found, max_count)

    def next_due_ms(self, slot: int, queue: int) -> int | None:
        """When something in this sub-queue next becomes available without a send (lock expiry, schedule)."""
        with self._lock:
            q = self._queues.get((slot, queue))
            if q is None or not self._healthy:
                return None
            times = [h[0][0] for h in (q.lock_heap, q.scheduled, q.session_locks) if h]
            if q.sched_disk is not None and not q.scheduled:
                times.append(max(q.sched_disk[0], 0))  # no later than the first on disk comes due
            return min(times) if times else None

    def _slot_stats(self, slot: int) -> SlotStats:
        stats = self._stats.get(slot)
        if stats is None:
            stats = self._stats[slot] = SlotStats()
        return stats

    def stats(self, slot: int) -> SlotStats:
        """A copy of the slot's counters (zero for a slot that saw nothing)."""
        with self._lock:
            found = self._stats.get(slot)
            return SlotStats() if found is None else SlotStats(found.incoming, found.delivered, found.lock_expired)

    def runtime(self, slot: int) -> RuntimeProperties:
        with self._lock:
            self._check()
            props = RuntimeProperties()
            settings = self._slots.get(slot)
            forwards = settings is not None and settings.forwards
            for queue in SubQueue:  # the kept counts: nothing is counted by reading messages
                q = self._queues.get((slot, queue))
                if q is None:
                    continue
                props.size_in_bytes += q.bytes - q.staged_bytes  # what receivers can see
                if queue == SubQueue.DEAD_LETTER:
                    props.dead_letter_message_count += q.count
                elif queue == SubQueue.TRANSFER_DEAD_LETTER:
                    props.transfer_dead_letter_message_count += q.count
                else:
                    props.scheduled_message_count += q.scheduled_count
                    ready = q.count - q.scheduled_count - q.staged
                    if forwards:
                        props.transfer_message_count += ready  # waiting to be forwarded
                    else:
                        props.active_message_count += ready
            return props

    def scheduled_count(self) -> int:
        """Scheduled messages counted once however many subscriptions hold a copy (a topic's count)."""
        with self._lock:
            self._check()
            seqs = set()
            most = 0
            for (_, queue), q in self._queues.items():
                if queue == SubQueue.MAIN:
                    seqs.update(s for s, e in q.entries.items() if e.msg.state is MessageState.SCHEDULED)
                    most = max(most, q.scheduled_count)
            # with some on disk only: the subscription with the most (copies share their sequence number)
            return max(len(seqs), most)

    def size_bytes(self) -> int:
        return self._size
