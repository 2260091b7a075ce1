"""The partition broker's store window: how disk-only messages come into memory and leave it again. Read-ahead
(``_refill``) and the scheduled messages' refill and trim, disk entries merged into peeks and range reads, deferred
messages read by key, the held index, evictions once the write they wait for is stored (``_evicted``), and the
resident bytes counted against ``RESIDENT`` (``_hold``). See partition/broker.py, "Memory and the store".

``StoreWindow`` is a part of ``PartitionBroker``. It moves messages between the store and memory but never
changes a message's state (broker.py does). Keeps nothing of its own: one read brings at most ``READ_BATCH``
messages and ``READ_BATCH_BYTES``, into the broker's ``MessageQueue``s, whose bounds broker.py gives.
"""

from __future__ import annotations

import heapq
from concurrent.futures import Future
from typing import Any

from ..model.message import MessageState
from ..model.routing import PARTITION_SHIFT
from ..store.base import Row, StoreError
from ..store.records import unpack_dead_letter, unpack_message
from .memory import (
    _ACTIVE,
    _DEFERRED,
    _MAIN,
    _SCHEDULED,
    READ_BATCH,
    READ_BATCH_BYTES,
    RESIDENT,
    SESSION_TABLE,
    Entry,
    MessageQueue,
    SessionQueue,
    _scheduled_ms,
)


def _read_to_end(rows: list[Any], limit: int) -> bool:
    """Whether a read-ahead of at most ``limit`` rows and ``READ_BATCH_BYTES`` found no more: it stopped short of
    both bounds (``scan``'s ``max_bytes`` ends a read once its rows hold that many bytes)."""
    return len(rows) < limit and sum(len(row[5]) for row in rows) < READ_BATCH_BYTES


class StoreWindow:
    """The store-window part of ``PartitionBroker``: disk-only messages into memory and out again."""

    def _evicted(self, epoch: int, items: list[tuple[MessageQueue | None, Any]], future: Future) -> None:
        """A write that settles ``_evict``'s items is stored: deferred messages (and dead-lettered ones beyond
        their queue's window, and a parked session's ready ones: ``_park_session``) that are still unlocked leave
        memory; their rows say what they are now."""
        with self._lock:
            if epoch != self._epoch or future.cancelled() or future.exception() is not None:
                return  # a failed write makes the partition reload (or it stays as it is: resident)
            held = 0
            for q, item in items:
                if q is None:
                    self._leaving.discard(item)
                    continue
                seq = item.seq
                msg = item.msg
                if q.entries.get(seq) is not item or msg.lock_token is not None or self._queues.get(q.key) is not q:
                    continue
                if msg.state is _DEFERRED:
                    del q.entries[seq]
                    held -= item.size
                elif msg.state is _ACTIVE and item.queue == _MAIN and q.sessions is not None:  # a parked session's
                    session = q.sessions.get(msg.session_id)
                    if session is None or session.holder is not None:
                        continue  # locked again meanwhile: its receiver reads on from memory
                    del q.entries[seq]
                    held -= item.size
                    if session.disk_from is None or seq < session.disk_from:
                        session.disk_from = seq
                    self._spill(q, seq)
                elif msg.state is _ACTIVE and item.queue != _MAIN:  # dead-lettered beyond the window
                    if q.disk_from is not None and seq >= q.disk_from:
                        del q.entries[seq]
                        held -= item.size
                    else:  # a read-ahead passed it meanwhile (it skips resident messages): serve it from memory
                        heapq.heappush(q.ready, seq)
            self._hold(held)

    def _hold(self, size: int) -> None:
        """Resident messages of ``size`` stored bytes came (positive) or went (negative)."""
        if size:
            self._resident += size
            RESIDENT.add(size)

    def _left_held(self, entry: Entry) -> None:
        """A deferred or scheduled message left: until the write of that is stored, its row must not be read
        back (by key, by the held index or by the due index)."""
        key = (entry.slot, entry.seq)
        self._leaving.add(key)
        self._evict.append((None, key))

    def _scan(self, q: MessageQueue, first: int, end: int, limit: int, max_bytes: int | None = None) -> list[Row]:
        """The next stored ACTIVE rows of a sub-queue (only committed, visible ones: ``end`` <= _visible_next)."""
        assert self._store is not None
        try:
            return self._store.scan(q.key[0], q.key[1], first, min(end, self._visible_next), limit, max_bytes)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc

    def _entry_of(self, slot: int, row: Row, state: MessageState = _ACTIVE) -> Entry:
        """A resident entry for a stored row (an ACTIVE one unless ``state`` says otherwise)."""
        msg = unpack_message(row[5])
        msg.sequence_number = (self.id << PARTITION_SHIFT) | row[0]
        msg.delivery_count = row[3]
        msg.partition_id = self.id
        if row[4] is not None:
            unpack_dead_letter(msg, row[4])
        msg.state = state
        return Entry(msg, slot, row[0], row[1], len(row[5]))

    def _refill(self, q: MessageQueue) -> None:
        """Read ahead: the next stored ACTIVE messages from ``disk_from`` (``READ_BATCH`` at most, within the
        window, and no more than ``READ_BATCH_BYTES`` of them: bounded by the bytes read, not by the largest
        message the entity allows, which made a read of a queue allowing 100 MB messages one row) become
        resident."""
        first = q.disk_from
        assert first is not None
        limit = min(self.read_ahead, READ_BATCH)
        rows = self._scan(q, first, self._visible_next, limit, READ_BATCH_BYTES)
        entries, ready, gone, slot = q.entries, q.ready, q.gone, q.key[0]
        push = heapq.heappush
        held = 0
        for row in rows:
            seq = row[0]
            if seq in entries or seq in gone:
                continue
            entries[seq] = self._entry_of(slot, row)
            held += len(row[5])
            push(ready, seq)
        self._hold(held)
        if rows:
            q.top = max(q.top, rows[-1][0])
        if _read_to_end(rows, limit):
            q.disk_from = None  # everything is resident now
            gone.clear()
        else:
            q.disk_from = first = rows[-1][0] + 1
            if gone:
                q.gone = {s for s in gone if s >= first}

    def _spill(self, q: MessageQueue, seq: int) -> None:
        """ACTIVE messages of a session-enabled queue numbered ``seq`` or above may be on disk only: its
        ``disk_from`` is the lowest such bound of any of its sessions (so the queue-wide scans of a peek, an
        expiry or a range read start there), and it never moves up."""
        if q.disk_from is None or seq < q.disk_from:
            q.disk_from = seq

    def _refill_session(self, q: MessageQueue, session: SessionQueue) -> None:
        """A session's next stored ACTIVE messages from its ``disk_from`` (``READ_BATCH`` at most, within the
        window, and no more than ``READ_BATCH_BYTES`` of them, as ``_refill``'s) become resident, read by the
        store's session index."""
        first = session.disk_from
        assert first is not None and self._store is not None
        limit = min(self.read_ahead, READ_BATCH)
        slot = q.key[0]
        try:
            rows = self._store.scan_session(
                slot, session.id, int(_ACTIVE), first, self._visible_next, limit, READ_BATCH_BYTES
            )
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc
        entries, ready, leaving = q.entries, session.ready, self._leaving
        held = 0
        for row in rows:
            seq = row[0]
            if seq in entries or (slot, seq) in leaving:
                continue  # resident (come due from the schedule), or gone with its row's change still queued
            entries[seq] = self._entry_of(slot, row)
            held += len(row[5])
            heapq.heappush(ready, seq)
        self._hold(held)
        session.disk_from = None if _read_to_end(rows, limit) else rows[-1][0] + 1

    def _discover_sessions(self, q: MessageQueue) -> bool:
        """Find the sessions not in a session-enabled queue's table, in the order of their oldest messages: one
        indexed read of the next ``READ_BATCH`` ACTIVE rows (their sequence numbers and sessions only) from
        ``sess_from``; each session met that the table lacks joins it (nothing of it resident, its disk part
        from that row) while the table has room. Whether any joined."""
        first = q.sess_from
        assert first is not None and self._store is not None and q.sessions is not None
        slot = q.key[0]
        try:
            rows = self._store.scan_heads(slot, first, self._visible_next, READ_BATCH)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc
        sessions, entries, leaving = q.sessions, q.entries, self._leaving
        joined = False
        for seq, session_id in rows:
            if session_id in sessions or seq in entries or (slot, seq) in leaving:
                continue  # a known session reads its own disk part
            if joined and len(sessions) >= SESSION_TABLE:  # one always joins: a table of held sessions still moves
                q.sess_from = seq  # the table is full: the rest are found once it has room
                return joined
            sessions[session_id] = SessionQueue(session_id, seq)
            joined = True
        q.sess_from = None if len(rows) < READ_BATCH else rows[-1][0] + 1
        return joined

    def _refill_scheduled(self, q: MessageQueue) -> None:
        """The next SCHEDULED messages by enqueue time from ``sched_disk`` (``READ_BATCH`` at most, within the
        window, and no more than ``READ_BATCH_BYTES`` of them, as ``_refill``'s) become resident. Rows not yet
        visible are left to ``make_visible`` (which keeps a message resident when it is due before
        ``sched_disk``)."""
        after = q.sched_disk
        assert after is not None and self._store is not None
        limit = min(self.read_ahead, READ_BATCH)
        slot = q.key[0]
        try:
            rows = self._store.scan_due(slot, (after[0], after[1] - 1), limit, READ_BATCH_BYTES)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc
        entries, visible_next, leaving = q.entries, self._visible_next, self._leaving
        held = 0
        for row in rows:
            seq = row[0]
            if seq in entries or seq >= visible_next or (slot, seq) in leaving:
                continue
            entries[seq] = self._entry_of(slot, row, _SCHEDULED)
            held += len(row[5])
            heapq.heappush(q.scheduled, (row[6], seq))
        self._hold(held)
        q.sched_disk = None if _read_to_end(rows, limit) else (rows[-1][6], rows[-1][0] + 1)

    def _trim_scheduled(self, q: MessageQueue) -> None:
        """Too many SCHEDULED messages are resident (sends due sooner than the disk's): the window keeps the
        ``read_ahead`` soonest, the rest (stored and unchanged since) leave memory and ``sched_disk`` moves down
        to the first of them. Amortised: it runs once per ``read_ahead`` such sends at most."""
        entries = q.entries
        keys = sorted(k for k in q.scheduled if (e := entries.get(k[1])) is not None and e.msg.state is _SCHEDULED)
        keep, drop = keys[: self.read_ahead], keys[self.read_ahead :]
        if not drop:
            q.scheduled = keys
            return
        held = 0
        for _, seq in drop:
            held += entries.pop(seq).size
        self._hold(-held)
        q.scheduled = keep  # sorted: a heap
        q.sched_disk = drop[0] if q.sched_disk is None else min(drop[0], q.sched_disk)

    def _disk_entries(
        self, q: MessageQueue, first: int, end: int, limit: int, session_id: str | None = None
    ) -> list[Entry]:
        """Up to ``limit`` disk-only ACTIVE messages of a sub-queue with ``first <= seq < end``, in order."""
        if q.disk_from is None or limit <= 0:
            return []
        first = max(first, q.disk_from)
        out: list[Entry] = []
        slot, leaving = q.key[0], self._leaving
        while first < min(end, self._visible_next) and len(out) < limit:
            if session_id is not None and q.sessions is not None:  # one session's: by the session index
                assert self._store is not None
                try:
                    rows = self._store.scan_session(
                        slot, session_id, int(_ACTIVE), first, min(end, self._visible_next), limit
                    )
                except StoreError as exc:
                    raise self._on_store_failure(exc) from exc
                out += [self._entry_of(slot, r) for r in rows if r[0] not in q.entries and (slot, r[0]) not in leaving]
                if len(rows) < limit:
                    break
                first = rows[-1][0] + 1
                continue
            rows = self._scan(q, first, end, max(limit, 64))
            for row in rows:
                if row[0] not in q.entries and row[0] not in q.gone and (slot, row[0]) not in leaving:
                    entry = self._entry_of(q.key[0], row)
                    if session_id is None or entry.msg.session_id == session_id:
                        out.append(entry)
            if len(rows) < max(limit, 64):
                break
            first = rows[-1][0] + 1
        return out[:limit]

    def _on_disk(self, q: MessageQueue) -> bool:
        """Whether some of the sub-queue's messages are on disk only (ACTIVE beyond the window, or DEFERRED)."""
        return q.count - q.staged > len(q.entries)

    def _held_rows(self, q: MessageQueue, state: int, first: int, end: int, limit: int) -> list[Row]:
        """Up to ``limit`` disk-only rows of a sub-queue in ``state`` (DEFERRED) with ``first <= seq < end``."""
        assert self._store is not None
        out: list[Row] = []
        slot = q.key[0]
        end = min(end, self._visible_next)
        while first < end and len(out) < limit:
            batch = max(limit - len(out), 64)
            try:
                rows = self._store.scan_held(slot, q.key[1], state, first, end, batch)
            except StoreError as exc:
                raise self._on_store_failure(exc) from exc
            out += [r for r in rows if r[0] not in q.entries and (slot, r[0]) not in self._leaving]
            if len(rows) < batch:
                break
            first = rows[-1][0] + 1
        return out[:limit]

    def _disk_held(
        self, q: MessageQueue, state: MessageState, first: int, end: int, limit: int, session_id: str | None = None
    ) -> list[Entry]:
        """Up to ``limit`` disk-only messages in ``state`` (DEFERRED or SCHEDULED) of a sub-queue with
        ``first <= seq < end``, in order."""
        if limit <= 0 or not self._on_disk(q):
            return []
        out: list[Entry] = []
        slot = q.key[0]
        while first < min(end, self._visible_next) and len(out) < limit:
            if session_id is not None and q.sessions is not None:  # one session's: by the session index
                assert self._store is not None
                try:
                    found = self._store.scan_session(
                        slot, session_id, int(state), first, min(end, self._visible_next), limit
                    )
                except StoreError as exc:
                    raise self._on_store_failure(exc) from exc
                rows = [r for r in found if r[0] not in q.entries and (slot, r[0]) not in self._leaving]
                out += [self._entry_of(slot, r, state) for r in rows]
                if len(found) < limit:
                    break
                first = found[-1][0] + 1
                continue
            rows = self._held_rows(q, state, first, end, limit)
            for row in rows:
                entry = self._entry_of(q.key[0], row, state)
                if session_id is None or entry.msg.session_id == session_id:
                    out.append(entry)
            if len(rows) < limit:
                break
            first = rows[-1][0] + 1
        return out[:limit]

    def _read_deferred(self, q: MessageQueue, local_seqs: list[int]) -> None:
        """Deferred messages asked for by sequence number that are on disk only become resident (one read by
        key); until something locks them they leave memory again with the next stored write."""
        slot = q.key[0]
        wanted = [s for s in local_seqs if s not in q.entries and (slot, s) not in self._leaving]
        if not wanted or not self._on_disk(q):
            return
        rows = self._stored_rows(slot, wanted)
        held = 0
        for row in rows:
            if row[1] == q.key[1] and row[2] == _DEFERRED and row[0] not in q.entries:
                entry = q.entries[row[0]] = self._entry_of(slot, row, _DEFERRED)
                held += entry.size
                self._evict.append((q, entry))
        self._hold(held)

    def _stored_rows(self, slot: int, local_seqs: list[int]) -> list[Any]:
        """The stored rows of these messages (one read by key); a store failure as the partition reports it."""
        assert self._store is not None
        try:
            return self._store.get(slot, local_seqs)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc

    def _disk_only(self, q: MessageQueue, row: tuple[Any, ...]) -> bool:
        """Whether a stored row of a main queue whose message is not resident is a message on disk only (and
        not one that left with its row's change still queued, or one not yet visible)."""
        seq, state = row[0], row[2]
        if seq >= self._visible_next or (q.key[0], seq) in self._leaving:
            return False
        if state == _ACTIVE:  # disk-only ACTIVE messages are all at or above disk_from
            return q.disk_from is not None and seq >= q.disk_from and seq not in q.gone
        if state == _DEFERRED:  # one that left is in _leaving
            return True
        # SCHEDULED: on disk only at or above sched_disk (one that came due below it was resident)
        return q.sched_disk is not None and (_scheduled_ms(unpack_message(row[5])), seq) >= q.sched_disk

    def _disk_sizes(self, q: MessageQueue, first: int, end: int) -> list[tuple[int, int]]:
        """(seq, size) of the disk-only ACTIVE rows of a sub-queue with ``first <= seq < end``."""
        assert self._store is not None
        end = min(end, self._visible_next)
        if first >= end:
            return []
        try:
            rows = self._store.scan_sizes(q.key[0], q.key[1], first, end)
        except StoreError as exc:
            raise self._on_store_failure(exc) from exc
        slot, leaving = q.key[0], self._leaving
        return [r for r in rows if r[0] not in q.entries and r[0] not in q.gone and (slot, r[0]) not in leaving]
