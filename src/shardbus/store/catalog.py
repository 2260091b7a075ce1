"""The namespace catalog: which entities and rules exist, with their descriptions (one SQLite file).

Messages never go here; each partition has its own store. The catalog is written last when an entity is
created and first when one is deleted, so a crash in between leaves at worst orphan partition files, which
``Namespace.open`` removes.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
"""


@dataclass(slots=True)
class CatalogEntry:
    id: int
    kind: str
    parent: int | None
    name: str
    description: dict[str, Any]
    created: float
    updated: float


class Catalog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def get_meta(self) -> dict[str, Any]:
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
        rows = self._db.execute("SELECT id, kind, parent, name, description, created, updated FROM entities")
        return [CatalogEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]

    def rules(self) -> dict[int, list[tuple[str, dict[str, Any], float]]]:
        out: dict[int, list[tuple[str, dict[str, Any], float]]] = {}
        for entity, name, rule, created in self._db.execute(
            "SELECT entity, name, rule, created FROM rules ORDER BY created"
        ):
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
    ) -> float:
        now = time.time()
        with self._tx():
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
            self._db.execute(
                "UPDATE entities SET description=?, updated=? WHERE id=?",
                (json.dumps(description), now, entry_id),
            )
        return now

    def delete(self, entry_ids: list[int]) -> None:
        with self._tx():
            for entry_id in entry_ids:
                self._db.execute("DELETE FROM entities WHERE id=?", (entry_id,))
                self._db.execute("DELETE FROM rules WHERE entity=?", (entry_id,))

    def put_rule(self, entity: int, name: str, rule: dict[str, Any]) -> float:
        now = time.time()
        with self._tx():
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
        return _Transaction(self._db)

    def close(self) -> None:
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
