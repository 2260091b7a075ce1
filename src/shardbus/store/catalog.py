"""The namespace catalog: which entities and rules exist, with their descriptions (one SQLite file).

Messages never go here; each partition has its own store. The catalog is written last when an entity is
created and first when one is deleted, so a crash in between leaves at worst orphan partition files, which
``Namespace.open`` removes.

Several front-end processes may open the same catalog (``shardbus serve --frontends M``). Every write is one
``BEGIN IMMEDIATE`` transaction (waiting up to ``BUSY_TIMEOUT`` for another process's), so ids from ``next_id``
stay unique and a name can be inserted once: the second insert of a name raises ``EntityAlreadyExists``.
``changed`` tells, with SQLite's ``PRAGMA data_version`` (it moves only when another connection commits), whether
another process wrote since the last ``snapshot``; it costs one statement, no read of the tables.

A write that finds the disk full (SQLITE_FULL) changes nothing and raises ``ServerBusy``: retriable, as the
partitions' stores treat a full disk (docs/operations.md).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.errors import EntityAlreadyExists, EntityNotFound, QuotaExceeded, ServerBusy

BUSY_TIMEOUT = 30.0  # seconds a write waits for another process's write transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entities (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    parent INTEGER,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rules (
    entity INTEGER NOT NULL,
    name TEXT NOT NULL,
    rule TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (entity, name)
);
CREATE UNIQUE INDEX IF NOT EXISTS entities_unique_name ON entities (IFNULL(parent, 0), lower(name));
"""


@dataclass(frozen=True, slots=True)
class Limit:
    """A quota on how many entities (or rules) one parent may have, checked inside the write transaction that
    would exceed it: front ends sharing the catalog each count from their own view, which may be a moment old,
    so only the transaction can stop two simultaneous creates from overshooting together."""

    most: int
    message: str
    partitioned_only: bool = False  # count only entities whose description enables partitioning


@dataclass(slots=True)
class CatalogEntry:
    id: int
    kind: str
    parent: int | None
    name: str
    description: dict[str, Any]
    created: float
    updated: float


@dataclass(slots=True)
class CatalogSnapshot:
    """Everything the catalog lists, read in one transaction; ``version`` is its ``data_version`` then."""

    entries: list[CatalogEntry]
    rules: dict[int, list[tuple[str, dict[str, Any], float]]]
    version: int


class Catalog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one connection shared by the namespace's threads: statements and transactions take turns
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        self._enter_wal()
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)  # IF NOT EXISTS: front ends opening it together each wait their turn
        self._seen_version = self._data_version()

    def _enter_wal(self) -> None:
        """Switch to WAL, trying again while another process holds the file: front ends opening a new catalog at
        once can get "database is locked" here despite the busy timeout (seen once in CI, in tests/cluster)."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _data_version(self) -> int:
        with self._lock:
            return self._db.execute("PRAGMA data_version").fetchone()[0]

    def changed(self) -> bool:
        """Whether another process committed to the catalog since the snapshot last passed to ``seen`` (cheap:
        one pragma)."""
        return self._data_version() != self._seen_version

    def snapshot(self) -> CatalogSnapshot:
        """Every entry and rule, consistently."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                version = self._db.execute("PRAGMA data_version").fetchone()[0]
                return CatalogSnapshot(self.entries(), self.rules(), version)
            finally:
                self._db.execute("COMMIT")

    def seen(self, snapshot: CatalogSnapshot) -> None:
        """The reader has applied ``snapshot``: ``changed`` compares with it from now on. (Marked only once
        applied, so that a lookup on another thread never takes a half-applied registry for an up-to-date one.)"""
        self._seen_version = snapshot.version

    def get_meta(self) -> dict[str, Any]:
        with self._lock:
            return {k: json.loads(v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    def set_meta(self, values: dict[str, Any]) -> None:
        with self._tx():
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in values.items()]
            )

    def next_id(self) -> int:
        """Reserve an entity id (ids are never reused, so a recreated entity never meets old files)."""
        with self._tx():
            row = self._db.execute("SELECT value FROM meta WHERE key='next_entity_id'").fetchone()
            value = json.loads(row[0]) if row else 1
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('next_entity_id', ?)", (json.dumps(value + 1),))
        return value

    def entries(self) -> list[CatalogEntry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, parent, name, description, created, updated FROM entities"
            ).fetchall()
        return [CatalogEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]

    def rules(self) -> dict[int, list[tuple[str, dict[str, Any], float]]]:
        out: dict[int, list[tuple[str, dict[str, Any], float]]] = {}
        with self._lock:
            rows = self._db.execute("SELECT entity, name, rule, created FROM rules ORDER BY created").fetchall()
        for entity, name, rule, created in rows:
            out.setdefault(entity, []).append((name, json.loads(rule), created))
        return out

    def insert(
        self,
        entry_id: int,
        kind: str,
        parent: int | None,
        name: str,
        description: dict[str, Any],
        rules: list[tuple[str, dict[str, Any]]] = (),
        limits: Sequence[Limit] = (),
    ) -> float:
        """Add an entity; EntityAlreadyExists when the name is taken (maybe by another process, a moment ago),
        EntityNotFound when the parent is gone, QuotaExceeded when the parent already has a limit's most."""
        now = time.time()
        with self._tx():
            taken = self._db.execute(
                "SELECT 1 FROM entities WHERE IFNULL(parent, 0) = ? AND lower(name) = lower(?)", (parent or 0, name)
            ).fetchone()
            if taken:
                raise EntityAlreadyExists(f"The messaging entity '{name}' already exists.")
            if parent is not None and not self._db.execute("SELECT 1 FROM entities WHERE id=?", (parent,)).fetchone():
                raise EntityNotFound(f"The parent entity of '{name}' was deleted.")
            for limit in limits:
                sql = "SELECT COUNT(*) FROM entities WHERE IFNULL(parent, 0) = ?"
                if limit.partitioned_only:
                    sql += " AND json_extract(description, '$.enable_partitioning')"
                if self._db.execute(sql, (parent or 0,)).fetchone()[0] >= limit.most:
                    raise QuotaExceeded(limit.message)
            self._db.execute(
                "INSERT INTO entities VALUES (?, ?, ?, ?, ?, ?, ?)",
                (entry_id, kind, parent, name, json.dumps(description), now, now),
            )
            for rule_name, rule in rules:
                self._db.execute("INSERT INTO rules VALUES (?, ?, ?, ?)", (entry_id, rule_name, json.dumps(rule), now))
        return now

    def update(self, entry_id: int, description: dict[str, Any]) -> float:
        now = time.time()
        with self._tx():
            cursor = self._db.execute(
                "UPDATE entities SET description=?, updated=? WHERE id=?",
                (json.dumps(description), now, entry_id),
            )
            if cursor.rowcount != 1:
                raise EntityNotFound(f"The messaging entity {entry_id} was deleted.")
        return now

    def delete(self, entry_ids: list[int]) -> None:
        with self._tx():
            for entry_id in entry_ids:
                self._db.execute("DELETE FROM entities WHERE id=?", (entry_id,))
                self._db.execute("DELETE FROM rules WHERE entity=?", (entry_id,))

    def put_rule(self, entity: int, name: str, rule: dict[str, Any], limit: Limit | None = None) -> float:
        now = time.time()
        with self._tx():
            taken = self._db.execute(
                "SELECT 1 FROM rules WHERE entity=? AND lower(name)=lower(?)", (entity, name)
            ).fetchone()
            if taken:
                raise EntityAlreadyExists(f"The rule '{name}' already exists.")
            if not self._db.execute("SELECT 1 FROM entities WHERE id=?", (entity,)).fetchone():
                raise EntityNotFound(f"The subscription of rule '{name}' was deleted.")
            if limit is not None:
                count = self._db.execute("SELECT COUNT(*) FROM rules WHERE entity=?", (entity,)).fetchone()[0]
                if count >= limit.most:
                    raise QuotaExceeded(limit.message)
            self._db.execute("INSERT INTO rules VALUES (?, ?, ?, ?)", (entity, name, json.dumps(rule), now))
        return now

    def update_rule(self, entity: int, name: str, rule: dict[str, Any]) -> None:
        """Replace a stored rule's definition; its creation time (its position among the rules) is kept."""
        with self._tx():
            cursor = self._db.execute(
                "UPDATE rules SET rule=? WHERE entity=? AND name=?", (json.dumps(rule), entity, name)
            )
            if cursor.rowcount != 1:
                raise KeyError(f"no rule {name!r} for entity {entity}")

    def delete_rule(self, entity: int, name: str) -> None:
        with self._tx():
            self._db.execute("DELETE FROM rules WHERE entity=? AND name=?", (entity, name))

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """A write transaction: this process's other threads wait on the lock, other processes on SQLite's."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, exc_type: object, exc: BaseException | None, _tb: object) -> None:
        try:
            if exc_type is None:
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error as failed:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    _refuse_if_full(failed)
                    raise
            elif self._db.in_transaction:  # SQLite may have rolled back already (a full disk does)
                self._db.execute("ROLLBACK")
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error):
            _refuse_if_full(exc)


def _refuse_if_full(exc: sqlite3.Error) -> None:
    """A write that ran out of space stored nothing: the caller may retry once space returns (ServerBusy)."""
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        raise ServerBusy(
            "The namespace's catalog cannot be written now: its disk is full. Nothing was changed; retry later."
        ) from exc
