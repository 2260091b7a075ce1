"""The partition broker's session lookups: which slots require sessions, a slot's session queue, a held session by
its lock token, who holds a session's lock, a session's state, and the sessions of a slot.

``SessionQueries`` is a part of ``PartitionBroker``. The session lock's transitions (``accept_session``,
``lock_session_messages``, ``renew_session_lock``, ``release_session``, ``set_session_state``) lock, free or
write and stay in broker.py. Keeps nothing of its own: sessions live on their ``MessageQueue`` (memory.py).
"""

from __future__ import annotations

import uuid

from ..model.errors import InvalidOperation, SessionLockLost
from ..model.message import SubQueue
from ..store.base import StoreError
from .memory import MessageQueue, SessionQueue


class SessionQueries:
    """The session-lookup part of ``PartitionBroker``."""

    def _is_session_slot(self, slot: int) -> bool:
        settings = self._slots.get(slot)
        return settings is not None and settings.requires_session

    def _session_queue(self, slot: int) -> MessageQueue:
        q = self._queue(slot, SubQueue.MAIN)
        if q.sessions is None:
            raise InvalidOperation(
                f"'{self._slots[slot].path}' does not require sessions: it cannot be received from with sessions."
            )
        return q

    def _held_session(
        self, slot: int, session_id: str, token: uuid.UUID, now: int
    ) -> tuple[MessageQueue, SessionQueue]:
        q = self._session_queue(slot)
        session = q.sessions.get(session_id)
        if session is None or session.holder != token or session.locked_until <= now:
            raise SessionLockLost(
                f"The session lock of session '{session_id}' was lost: it expired or is held by another receiver."
            )
        return q, session

    def session_lock_holder(self, slot: int, session_id: str) -> tuple[uuid.UUID, int] | None:
        with self._lock:
            q = self._queues.get((slot, SubQueue.MAIN))
            session = q.sessions.get(session_id) if q is not None and q.sessions is not None else None
            if session is None or session.holder is None:
                return None
            return session.holder, session.locked_until

    def get_session_state(self, slot: int, session_id: str) -> bytes | None:
        with self._lock:
            self._check()
            return self._session_states.get((slot, session_id))

    def list_sessions(self, slot: int, updated_after_ms: int | None = None) -> list[str]:
        """Sessions with messages or state; with ``updated_after_ms``, those whose state changed after it."""
        with self._lock:
            self._check()
            q = self._session_queue(slot)
            if updated_after_ms is not None:
                return sorted(s.id for s in q.sessions.values() if s.updated_ms > updated_after_ms)
            ids = {e.msg.session_id for e in q.entries.values() if e.msg.session_id is not None}
            ids.update(sid for (s, sid) in self._session_states if s == slot)
            if self._on_disk(q):  # the sessions of disk-only messages, by the store's session index
                assert self._store is not None
                try:
                    ids.update(self._store.session_ids(slot))
                except StoreError as exc:
                    raise self._on_store_failure(exc) from exc
            return sorted(ids)
