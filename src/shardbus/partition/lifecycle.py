"""The partition broker's life cycle and health: ``start`` (open the store and rebuild the resident set and the
counts from its snapshot; rows come in through ``_load_row``), ``stop``, ``close``, ``delete``, what a store
failure or a full store does to the partition, and the reload after a full store (``_recover``); ``_check``
refuses every call of an unavailable partition. See partition/broker.py, "Health".

``Lifecycle`` is a part of ``PartitionBroker``; the state is the broker's (its ``__init__``). It changes no
message's state: the in-doubt ranges ``start`` deletes go through the broker's ``_revoke_range``.
``_on_store_resumed`` stays in broker.py, beside the settlement writes whose linger (``settle_linger``) it shares.
Keeps nothing of its own.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any

from ..model.errors import PartitionFull, PartitionUnavailable
from ..model.message import MessageState
from ..model.routing import encode_sequence_number
from ..store.base import Op, Row, StoreError, StoreFull
from ..store.committer import FULL_RETRY, GroupCommitter
from ..store.records import unpack_dead_letter, unpack_message
from .memory import _MAIN, BATCH_ID_PREFIX, MARK_PREFIX, Entry, MessageQueue, _mark_key, _ms, _scheduled_ms

log = logging.getLogger("shardbus.partition.broker")  # the broker's log, as before the split


class Lifecycle:
    """The life-cycle and health part of ``PartitionBroker``."""

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def failure(self) -> str | None:
        return self._failure

    def start(self) -> None:
        """Open the store and rebuild the in-memory state from it (also how a stopped partition recovers):
        counts, session states, meta; every message stays on disk until needed."""
        with self._lock:
            if self._healthy:
                return
            self._reset_memory()
            try:
                store = self._store_factory()
                sessions = {slot for slot, settings in self._slots.items() if settings.requires_session}
                snapshot = store.load(set(), sessions=sessions)  # no rows: counts, states, meta
            except StoreError as exc:
                self._failure = str(exc)
                raise PartitionUnavailable(self._unavailable_text()) from exc
            self._store = store
            self._committer = GroupCommitter(
                store,
                self._on_store_failure,
                on_full=self._on_store_full,
                on_resumed=self._on_store_resumed,
            )
            now = _ms(self._clock)
            self._next_seq = self._visible_next = snapshot.meta.get("next_seq", 1)
            self._marks = {_mark_key(k): v for k, v in snapshot.meta.items() if k.startswith(MARK_PREFIX)}
            self._dedup = snapshot.dedup
            for key in [k for k in self._dedup if k.startswith(BATCH_ID_PREFIX)]:
                del self._dedup[key]
                batch_id, first, end = key[len(BATCH_ID_PREFIX) :].rsplit(":", 2)
                self._batches[batch_id] = (int(first), int(end), now)  # age counts from this start
            for (slot, queue), (count, size) in snapshot.counts.items():
                q = self._queue(slot, queue)
                q.count, q.bytes = count, size
                self._size += size
            for slot, rows in snapshot.rows.items():
                for row in rows:
                    self._load_row(slot, row, now)
            for (slot, queue), (count, _) in snapshot.counts.items():
                if queue == _MAIN and count:
                    self._queue(slot, queue).next_expiry = 0  # unknown: the first upkeep looks at the index
            for slot, n in snapshot.scheduled.items():
                if n:  # on disk, by their time: the soonest are read as they come due (``_process_due``)
                    q = self._queue(slot, _MAIN)
                    q.scheduled_count = n
                    q.sched_disk = (0, 0)
            for q in self._queues.values():
                if q.count > len(q.entries):  # the rest is on disk
                    q.disk_from = 1
                    if q.sessions is not None:  # and so are its sessions: found as receivers ask for them
                        q.sess_from = 1
            self._session_states = dict(snapshot.session_states)
            if self._in_doubt:  # before anyone can see them: gone, and durably so, or the start fails
                ops: list[Op] = []
                try:
                    for first, end in self._in_doubt:
                        self._revoke_range(first, end, ops)
                    ops += self._count_ops()
                    if ops:
                        store.apply(ops)
                except (StoreError, PartitionUnavailable) as exc:
                    store.close()
                    self._store = self._committer = None
                    self._reset_memory()
                    self._failure = str(exc)
                    raise PartitionUnavailable(self._unavailable_text()) from exc
                self._in_doubt = []
            self._healthy = True
            self._failure = None

    def stop(self, reason: str = "the partition broker is stopped") -> None:
        """Stop serving: wait for queued writes, close the store, forget memory (locks are lost)."""
        with self._lock:
            committer, store = self._committer, self._store
            if committer is not None and self._healthy and self._dirty:  # started: _dirty exists
                self._write([])  # counts no write has carried yet (see _undo_refused): stored before the close
            self._healthy = False
            self._failure = reason
            self._recover_at = None  # stopped on purpose (or by ``_recover``, which starts it again)
        if committer is not None:
            committer.wait_idle(30)
        if store is not None:
            store.close()
        with self._lock:
            self._store = None
            self._committer = None
            self._reset_memory()

    def close(self) -> None:
        """The namespace closes: stop (everything queued is written first)."""
        self.stop("the namespace is closed")

    def delete(self) -> None:
        """The entity was deleted: stop for good (the namespace removes the store's folder)."""
        self.stop("the entity was deleted")

    def _reset_memory(self) -> None:
        self._hold(-self._resident)
        self._epoch += 1
        self._queues = {}
        self._dirty: set[MessageQueue] = set()  # sub-queues whose counts the next write stores
        self._locks = {}
        self._dedup = {}
        self._session_states: dict[tuple[int, str], bytes] = {}
        self._size = 0
        self._batches: dict[str, tuple[int, int, int]] = {}  # batch id -> [first, end) seqs, kept since (ms)
        self._staged: dict[str, tuple[list[int], list[str]]] = {}  # uncommitted batch -> its slots, dedup ids
        self._revoked_staged: set[str] = set()  # revoked before their commit: never made visible
        # What the next write's commit settles: (sub-queue, entry) to leave memory once its row is stored (see
        # "Memory and the store"), or (None, (slot, seq)) of a deferred message whose row goes with that write.
        self._evict: list[tuple[MessageQueue | None, Any]] = []
        self._leaving: set[tuple[int, int]] = set()  # deferred messages that left, their rows not yet changed
        self._dues: list[tuple[int, int, int]] = []  # (slot, seq, due ms) of scheduled sends being staged
        self._expiries: list[tuple[int, int]] = []  # (slot, expiry ms) of sends being staged (FAR_TTL_MS: none)

    def _on_store_failure(self, exc: BaseException) -> BaseException:
        with self._lock:
            running, self._healthy = self._healthy, False
            self._failure = f"store error: {exc}"
            if isinstance(exc, StoreFull) and running:  # transient: reload once the store can take writes again
                self._recover_at = time.monotonic() + FULL_RETRY
                log.warning("partition %s of '%s': %s; reloading it from its store", self.id, self.config.path, exc)
        return PartitionUnavailable(self._unavailable_text())

    def _on_store_full(self, exc: BaseException) -> BaseException:
        """A send's write found the store full (see "Health"): the error its sender gets."""
        log.warning("partition %s of '%s': %s; refusing sends until space returns", self.id, self.config.path, exc)
        return PartitionFull(  # the store's path and error stay in the log: they are the operator's business
            f"Partition {self.id} of '{self.config.path}' cannot store messages now: its store is full (no space "
            "left on its disk). Receives and settlements go on; retry the send later."
        )

    def _recover(self) -> None:
        """Reload a partition its full store made unavailable (from ``tick``; see "Health")."""
        self._recover_at = None
        self.stop(self._failure or "recovering from a full store")
        try:
            self.start()
        except PartitionUnavailable:
            self._recover_at = time.monotonic() + FULL_RETRY
            return
        log.warning("partition %s of '%s' reloaded from its store: available again", self.id, self.config.path)

    def _unavailable_text(self) -> str:
        return (
            f"Partition {self.id} of '{self.config.path}' is unavailable ({self._failure}). Messages with a "
            "partition key that maps to it cannot be processed now; retry later."
        )

    def _check(self) -> None:
        if not self._healthy:
            raise PartitionUnavailable(self._unavailable_text())

    def _load_row(self, slot: int, row: Row, now: int) -> None:
        msg = unpack_message(row.data)
        msg.sequence_number = encode_sequence_number(self.id, row.seq)
        msg.delivery_count = row.delivery_count
        msg.partition_id = self.id
        unpack_dead_letter(msg, row.dead_letter)
        state = MessageState(row.state)
        scheduled = _scheduled_ms(msg) if state is MessageState.SCHEDULED else None
        if scheduled is not None and scheduled <= now:
            state = MessageState.ACTIVE
        msg.state = state
        entry = Entry(msg, slot, row.seq, row.queue, len(row.data))
        q = self._queue(slot, row.queue)
        q.entries[row.seq] = entry
        q.top = max(q.top, row.seq)
        self._hold(entry.size)
        if state is MessageState.ACTIVE:
            self._push_ready(q, entry)
        elif state is MessageState.SCHEDULED:
            heapq.heappush(q.scheduled, (scheduled, row.seq))
            q.scheduled_count += 1
