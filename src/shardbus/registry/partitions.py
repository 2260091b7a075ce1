"""The construction of an entity's partitions: a ``PartitionBroker`` over a SQLite store per partition in this
process, or a handle from the partition factory (partitions in worker processes, cluster/), with the partition's
configuration and its sub-queue slots' settings taken from the entity's description.

On disk (``<data_dir>/<namespace name>/entities/<id>/``): one store per partition, ``p<NN>.db``.

``PartitionMaking`` is a part of ``Namespace``; it keeps nothing of its own (the handles belong to the entities).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

from ..entity.entity import QUEUE_SLOT, QueueEntity, TopicEntity
from ..model.entities import QueueDescription, SubscriptionDescription, TopicDescription
from ..model.errors import PartitionUnavailable
from ..model.tiers import MB, Tier
from ..partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from ..partition.handle import PartitionHandle, PartitionSpec
from ..store.base import StoreError
from ..store.sqlite import SqliteStore


def _ms(td: Any) -> int | None:
    return None if td is None else int(td.total_seconds() * 1000)


class PartitionMaking:
    """The partition-construction part of ``Namespace``."""

    def _partition_count(self, enable_partitioning: bool) -> int:
        return self.tier.partition_count(enable_partitioning)

    def _store_path(self, entity_id: int, pid: int) -> Path:
        return self.root / "entities" / str(entity_id) / f"p{pid:02d}.db"

    def _store_factory(self, entity_id: int, name: str, pid: int) -> Callable[[], SqliteStore]:
        path = self._store_path(entity_id, pid)

        def factory() -> SqliteStore:
            if (name.lower(), pid) in self.faults.blocked:
                raise StoreError(f"store {path} is blocked by fault injection")
            return SqliteStore(path)

        return factory

    def _partitions(self, entity_id: int, desc: QueueDescription | TopicDescription) -> list[PartitionHandle]:
        count = self._partition_count(desc.enable_partitioning)
        factory = self._partition_factory
        if factory is None:
            return [
                PartitionBroker(
                    self._partition_config(desc, pid), self._store_factory(entity_id, desc.name, pid), self._clock
                )
                for pid in range(count)
            ]
        return [
            factory(
                PartitionSpec(
                    entity_id=entity_id,
                    config=self._partition_config(desc, pid),
                    store=self._store_path(entity_id, pid),
                    clock=self._clock,
                    precheck=partial(self._check_store_allowed, desc.name, pid),
                )
            )
            for pid in range(count)
        ]

    def _check_store_allowed(self, name: str, pid: int) -> None:
        if (name.lower(), pid) in self.faults.blocked:
            raise PartitionUnavailable(f"Partition {pid} of '{name}' is unavailable (its store is blocked).")

    def _partition_config(self, desc: QueueDescription | TopicDescription, pid: int) -> PartitionConfig:
        ttl = desc.default_message_time_to_live
        return PartitionConfig(
            path=desc.name,
            partition_id=pid,
            max_size_bytes=desc.max_size_in_megabytes * MB,
            max_message_size_bytes=self.quotas.max_message_size_bytes,
            requires_duplicate_detection=desc.requires_duplicate_detection,
            dedup_window_ms=_ms(desc.duplicate_detection_history_time_window),
            entity_default_ttl_ms=None if isinstance(desc, QueueDescription) else _ms(ttl),
        )

    @staticmethod
    def _slot_settings(desc: QueueDescription | SubscriptionDescription, path: str) -> SlotSettings:
        return SlotSettings(
            path=path,
            lock_duration_ms=_ms(desc.lock_duration),
            max_delivery_count=desc.max_delivery_count,
            default_ttl_ms=_ms(desc.default_message_time_to_live),
            dead_letter_on_expiration=desc.dead_lettering_on_message_expiration,
            requires_session=desc.requires_session,
            forwards=bool(desc.forward_to),
        )

    def _open_queue(self, entity_id: int, desc: QueueDescription) -> QueueEntity:
        partitions = self._partitions(entity_id, desc)
        for p in partitions:
            p.configure_slot(QUEUE_SLOT, self._slot_settings(desc, desc.name))
        queue = QueueEntity(self._effective(desc), partitions)
        self._watch(queue)
        self._ids[entity_id] = queue
        queue.entity_id = entity_id
        return queue

    def _open_topic(self, entity_id: int, desc: TopicDescription) -> TopicEntity:
        topic = TopicEntity(self._effective(desc), self._partitions(entity_id, desc))
        self._ids[entity_id] = topic
        topic.entity_id = entity_id
        return topic

    def _effective(self, desc: Any) -> Any:
        """Premium namespaces partition every entity, whatever the request said."""
        if self.tier.tier is Tier.PREMIUM:
            desc.enable_partitioning = True
        return desc

    def _start_all(self, partitions: list[PartitionHandle], what: str) -> None:
        started = []
        try:
            for p in partitions:
                p.start()
                started.append(p)
        except PartitionUnavailable as exc:
            for p in started:
                p.stop("creation failed")
            raise PartitionUnavailable(f"Cannot {what}: {exc}") from exc

    @staticmethod
    def _require_healthy(partitions: list[PartitionHandle], what: str) -> None:
        down = [p.id for p in partitions if not p.healthy]
        if down:
            raise PartitionUnavailable(
                f"Cannot {what}: partition(s) {', '.join(map(str, down))} unavailable. Management operations "
                "act on every partition of an entity; retry when all are available."
            )

    @staticmethod
    def _wait(futures: Iterable[Future]) -> None:
        for f in futures:
            f.result()
