"""Keeping the registry in step with the catalog, which several front-end processes may share.

Several front-end processes (``shardbus serve --frontends M``) each open a ``Namespace`` over the same directory,
their partitions in the same workers. The catalog (``catalog.db``: entities and rules) is the truth; each
namespace's registry is a copy it keeps in step (``_refresh``): management calls and entity lookups first ask the
catalog whether another process committed since the last look (one ``PRAGMA data_version``), and the upkeep thread
asks every tick. When it did, the catalog is read again and the difference applied (``_apply``): new entities are
opened (a worker already serving a partition just adds this front end to it), deleted ones are dropped here (their
handles closed; the deleting front end removed their stores), changed descriptions and rules replace ours.

``CatalogSync`` is a part of ``Namespace``. In memory: the registry it fills (``_entities``, ``_ids``,
``_created``: one entry per entity, as many as the catalog lists).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..entity.entity import QUEUE_SLOT, QueueEntity, SubscriptionEntity, TopicEntity
from ..model.entities import EntityKind, QueueDescription, SubscriptionDescription, TopicDescription
from ..model.errors import PartitionUnavailable, ShardbusError
from ..model.filters import Rule
from ..store.catalog import Catalog, CatalogSnapshot


class CatalogSync:
    """The catalog-sync part of ``Namespace``."""

    def _load(self, remove_orphans: bool) -> None:
        snapshot = self.catalog.snapshot()
        self._apply(snapshot)
        self.catalog.seen(snapshot)
        if remove_orphans:
            _remove_orphans(self.root, snapshot)

    def _refresh(self) -> None:
        """Catch up with what other processes changed in the catalog (see the module docstring). Cheap when
        nothing changed: one pragma."""
        if self._closed or not self.catalog.changed():
            return
        with self._lock:  # a lookup that finds a change waits here while another thread applies it
            if not self._closed and self.catalog.changed():
                snapshot = self.catalog.snapshot()
                self._apply(snapshot)
                self.catalog.seen(snapshot)

    def _apply(self, snapshot: CatalogSnapshot) -> None:
        """Make the registry list what ``snapshot`` lists: drop what is gone, open what is new (starting its
        partitions), take descriptions and rules that changed."""
        listed = {e.id: e for e in snapshot.entries}
        for entity_id, known in list(self._ids.items()):
            if entity_id in listed:
                continue
            if isinstance(known, SubscriptionEntity):
                if known.topic.entity_id in listed:  # else it goes with its topic
                    self._forget_subscription(known)
            else:
                self._forget_sender_entity(known)
        opened: list[QueueEntity | TopicEntity] = []
        for e in snapshot.entries:
            if e.kind not in (EntityKind.QUEUE, EntityKind.TOPIC):
                continue
            known = self._ids.get(e.id)
            if known is None:
                if e.kind == EntityKind.QUEUE:
                    entity: QueueEntity | TopicEntity = self._open_queue(
                        e.id, QueueDescription.from_dict(e.description)
                    )
                else:
                    entity = self._open_topic(e.id, TopicDescription.from_dict(e.description))
                self._entities[entity.path.lower()] = entity
                opened.append(entity)
            elif self._created.get(e.id) != (e.created, e.updated):
                self._describe_sender_entity(known, e.description)
            self._created[e.id] = (e.created, e.updated)
        for e in snapshot.entries:
            if e.kind != EntityKind.SUBSCRIPTION:
                continue
            topic = self._ids.get(e.parent)
            if not isinstance(topic, TopicEntity):
                continue
            rules = [Rule.from_dict(r) for _, r, _ in snapshot.rules.get(e.id, [])]
            sub = self._ids.get(e.id)
            if sub is None:
                sub_desc = SubscriptionDescription.from_dict(e.description)
                sub = SubscriptionEntity(sub_desc, topic, e.id, rules)
                for p in topic.partitions:
                    p.configure_slot(e.id, self._slot_settings(sub_desc, sub.path))
                topic.add_subscription(sub)
                self._watch(sub)
                self._ids[e.id] = sub
            else:
                if self._created.get(e.id) != (e.created, e.updated):
                    sub_desc = SubscriptionDescription.from_dict(e.description)
                    sub.description = sub_desc
                    for p in sub.partitions:
                        p.configure_slot(sub.slot, self._slot_settings(sub_desc, sub_desc.path))
                sub.rules = rules
            self._created[e.id] = (e.created, e.updated)
        for entity in opened:
            for p in entity.partitions:
                try:
                    p.start()  # a worker already running it (another front end's) keeps it as it is
                except PartitionUnavailable:
                    pass  # stays unavailable; the entity reports Limited

    def _describe_sender_entity(self, entity: QueueEntity | TopicEntity, stored: dict[str, Any]) -> None:
        kind = QueueDescription if isinstance(entity, QueueEntity) else TopicDescription
        desc = self._effective(kind.from_dict(stored))
        entity.description = desc
        for p in entity.partitions:
            p.config = self._partition_config(desc, p.id)
            if isinstance(desc, QueueDescription):
                p.configure_slot(QUEUE_SLOT, self._slot_settings(desc, desc.name))

    def _forget_sender_entity(self, entity: QueueEntity | TopicEntity) -> None:
        """Another process deleted the entity: stop serving it here (it removed the stores)."""
        if self._entities.get(entity.path.lower()) is entity:
            del self._entities[entity.path.lower()]
        self._ids.pop(entity.entity_id, None)
        self._created.pop(entity.entity_id, None)
        self._forwarder.forget(entity)
        for sub in list(getattr(entity, "subscriptions", {}).values()):
            self._forget_subscription(sub)
        for p in entity.partitions:
            try:
                p.close()
            except ShardbusError:
                pass  # its worker is gone or never had it: nothing to close

    def _forget_subscription(self, sub: SubscriptionEntity) -> None:
        sub.topic.remove_subscription(sub.description.name)
        self._forwarder.forget(sub)
        self._ids.pop(sub.slot, None)
        self._created.pop(sub.slot, None)


def remove_orphan_partitions(data_dir: Path | str) -> None:
    """Remove every namespace's partition folders its catalog does not list (creations a crash cut short), as
    ``Namespace.open`` does; for a supervisor, before it starts front ends that open with ``remove_orphans=False``."""
    for catalog_path in Path(data_dir).glob("*/catalog.db"):
        catalog = Catalog(catalog_path)
        try:
            _remove_orphans(catalog_path.parent, catalog.snapshot())
        finally:
            catalog.close()


def _remove_orphans(root: Path, snapshot: CatalogSnapshot) -> None:
    known = {str(e.id) for e in snapshot.entries if e.kind in (EntityKind.QUEUE, EntityKind.TOPIC)}
    entities_dir = root / "entities"
    if entities_dir.exists():
        for child in entities_dir.iterdir():
            if child.name not in known:
                shutil.rmtree(child, ignore_errors=True)
