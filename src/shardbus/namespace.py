"""The namespace: the registry of entities, their management, and the Python API's front door.

Management follows the seeds: create, update and delete act on every partition of the entity and fail, with
nothing half-done, if any partition is unavailable; runtime counts are sums over partitions, and an entity with
an unavailable partition reports its availability as "Limited".

On disk (``<data_dir>/<namespace name>/``): ``catalog.db`` lists entities and rules; every queue and topic has
a folder ``entities/<id>/`` with one store per partition, ``p<NN>.db``.

Shared catalog: several front-end processes (``shardbus serve --frontends M``) each open a ``Namespace`` over the
same directory, their partitions in the same workers. The catalog is the truth; each namespace's registry is a
copy it keeps in step (``_refresh``): management calls and entity lookups first ask the catalog whether another
process committed since the last look (one ``PRAGMA data_version``), and the upkeep thread asks every tick. When
it did, the catalog is read again and the difference applied: new entities are opened (a worker already serving
a partition just adds this front end to it), deleted ones are dropped here (their handles closed; the deleting
front end removed their stores), changed descriptions and rules replace ours. AMQP senders and receivers look
their entity up once per link, so messages never pay for the check. Two processes creating the same name race
in the catalog's write transaction: one wins, the other gets EntityAlreadyExists and removes its partitions.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from .endpoint.limits import check_send_size
from .entity.entity import QUEUE_SLOT, QueueEntity, SubscriptionEntity, Target, TopicEntity
from .entity.forwarding import Forwarder
from .entity.receiver import Receiver
from .entity.sessions import SessionReceiver, list_sessions
from .entity.transactions import Transaction
from .model.authorization import AuthorizationRule
from .model.entities import (
    DEFAULT_RULE_NAME,
    EntityKind,
    QueueDescription,
    RuntimeProperties,
    SubscriptionDescription,
    TopicDescription,
    check_child_name,
    check_entity_name,
)
from .model.errors import (
    ArgumentError,
    EntityAlreadyExists,
    EntityNotFound,
    InvalidOperation,
    PartitionUnavailable,
    QuotaExceeded,
    ShardbusError,
)
from .model.filters import EmptyRuleAction, Rule, TrueFilter
from .model.message import Message, ReceiveMode, SubQueue, datetime_to_ms
from .model.tiers import MB, Quotas, Tier, TierRules
from .partition.broker import PartitionBroker, PartitionConfig, SlotSettings
from .partition.handle import PartitionFactory, PartitionHandle, PartitionSpec
from .store.base import StoreError
from .store.catalog import Catalog, CatalogSnapshot, Limit
from .store.sqlite import SqliteStore

DEFAULT_NAMESPACE = "sbemulatorns"
_SUBQUEUE_SUFFIXES = (
    ("/$transfer/$deadletterqueue", SubQueue.TRANSFER_DEAD_LETTER),
    ("/$deadletterqueue", SubQueue.DEAD_LETTER),
)
MAINTENANCE_INTERVAL = 0.1
log = logging.getLogger("shardbus.namespace")


def _ms(td: Any) -> int | None:
    return None if td is None else int(td.total_seconds() * 1000)


class FaultInjector:
    """Test hooks that make partitions unavailable the ways real ones become so."""

    def __init__(self, namespace: Namespace) -> None:
        self._ns = namespace
        self.blocked: set[tuple[str, int]] = set()  # (lower-cased entity name, partition): store cannot open

    def _partition(self, entity: str, partition: int) -> PartitionHandle:
        return self._ns._sender_entity(entity).partitions[partition]

    def block_store(self, entity: str, partition: int) -> None:
        """The partition's store cannot be opened (also affects entities not created yet)."""
        self.blocked.add((entity.lower(), partition))

    def unblock_store(self, entity: str, partition: int) -> None:
        self.blocked.discard((entity.lower(), partition))

    def stop_partition(self, entity: str, partition: int) -> None:
        """The partition broker stops: everything it held stays in its store."""
        self._partition(entity, partition).stop("the partition broker was stopped")

    def fail_next_write(self, entity: str, partition: int) -> None:
        """The partition's next store write fails like a disk error, making the partition unavailable."""
        self._partition(entity, partition).inject_store_failure()

    def fill_store(self, entity: str, partition: int, writes: int) -> None:
        """The partition's next ``writes`` store writes find its store full (as SQLITE_FULL: nothing written)."""
        self._partition(entity, partition).inject_store_full(writes)

    def busy_sends(self, entity: str, partition: int, count: int = 1) -> None:
        """The partition's next ``count`` sends are refused with ServerBusy; it stays healthy."""
        self._partition(entity, partition).inject_busy_sends(count)

    def fail_reads(self, entity: str, partition: int, count: int = 1) -> None:
        """The partition's next ``count`` range reads (``browse_range``) fail as if it were briefly down."""
        self._partition(entity, partition).inject_read_failures(count)

    def restore_partition(self, entity: str, partition: int) -> None:
        """Bring a stopped or failed partition back: it reloads from its store (locks are lost)."""
        self.blocked.discard((entity.lower(), partition))
        p = self._partition(entity, partition)
        if p.healthy:
            return
        p.stop(p.failure or "restarting")
        p.start()


class Namespace:
    """A Service Bus namespace backed by a data directory. Thread-safe.

    Open one with ``Namespace.open(data_dir)``; close it with ``close()`` (or use it as a context manager).
    """

    def __init__(
        self,
        data_dir: Path | str,
        name: str = DEFAULT_NAMESPACE,
        tier: str | Tier | None = None,
        premium_partitions: int | None = None,
        quotas: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        maintenance: bool = True,
        partition_factory: PartitionFactory | None = None,
        remove_orphans: bool = True,
    ) -> None:
        """``remove_orphans``: delete partition folders the catalog does not list (creations a crash cut short);
        a front end that starts while others may be creating entities passes False."""
        self.name = name
        self.root = Path(data_dir) / name
        self._clock = clock
        self._partition_factory = partition_factory  # None: partition brokers in this process
        self._lock = threading.RLock()
        self.catalog = Catalog(self.root / "catalog.db")
        meta = self.catalog.get_meta()
        stored_tier = meta.get("tier")
        tier_value = Tier.parse(tier) if tier is not None else Tier(stored_tier or "standard")
        if stored_tier is not None and stored_tier != tier_value.value:
            raise ArgumentError(f"Namespace '{name}' was created in the {stored_tier} tier; it cannot change.")
        stored_partitions = meta.get("premium_partitions")
        if stored_partitions is not None and premium_partitions not in (None, stored_partitions):
            raise ArgumentError(
                f"Namespace '{name}' was created with {stored_partitions} partitions; the count cannot change."
            )
        self.tier = TierRules.of(tier_value, premium_partitions or stored_partitions)
        quota_values = dict(meta.get("quotas", {}))
        quota_values.update(quotas or {})
        self.quotas = Quotas.for_tier(tier_value, **quota_values)
        self.catalog.set_meta(
            {
                "tier": tier_value.value,
                "premium_partitions": self.tier.premium_partitions,
                "quotas": quota_values,
            }
        )
        self.faults = FaultInjector(self)
        self._wake = threading.Event()  # set when a target gains messages: the upkeep thread forwards them
        self._forwarder = Forwarder(self._sender_entity, clock)
        self._entities: dict[str, QueueEntity | TopicEntity] = {}  # queues and topics by lower-cased name
        self._ids: dict[int, Any] = {}
        self._created: dict[int, tuple[float, float]] = {}
        self._closed = False
        self._load(remove_orphans)
        self._maintenance_stop = threading.Event()
        self._maintenance: threading.Thread | None = None
        if maintenance:
            self._maintenance = threading.Thread(target=self._maintain, name="shardbus-maintenance", daemon=True)
            self._maintenance.start()

    @classmethod
    def open(cls, data_dir: Path | str, **options: Any) -> Namespace:
        """Open (creating if needed) the namespace stored under ``data_dir``. Options: ``name``, ``tier``
        (basic/standard/premium), ``premium_partitions`` (1, 2 or 4), ``quotas`` (a dict of Quotas fields)."""
        return cls(data_dir, **options)

    # ------------------------------------------------------------------------------------------------------
    # start-up and shutdown
    # ------------------------------------------------------------------------------------------------------
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

    def close(self) -> None:
        """Stop every partition (waiting for queued writes) and the catalog."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._maintenance_stop.set()
        self._wake.set()
        if self._maintenance is not None:
            self._maintenance.join(5)
        for entity in self._entities.values():
            for p in entity.partitions:
                p.close()
        self.catalog.close()

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _maintain(self) -> None:
        """Upkeep thread: lock expiry, scheduled messages, duplicate-detection pruning, auto-forwarding."""
        last_prune = 0.0
        while not self._maintenance_stop.is_set():
            self._wake.wait(MAINTENANCE_INTERVAL)
            self._wake.clear()
            if self._maintenance_stop.is_set():
                return
            try:
                self._refresh()  # another front end's deletions stop here within a tick
            except Exception:  # upkeep must never stop; the next lookup tries again
                log.exception("reading the catalog failed")
            now = time.monotonic()
            prune = now - last_prune > 60
            for entity in list(self._entities.values()):
                for p in entity.partitions:
                    try:
                        p.tick()
                        if prune:
                            p.prune_dedup()
                    except Exception:  # upkeep must never stop; the partition reports its own health
                        pass
            if prune:
                last_prune = now
            self._forward_all()

    def _forwarding_sources(self) -> list[tuple[int, Target, SubQueue, str]]:
        sources = []
        for entity in list(self._entities.values()):
            targets = [entity] if isinstance(entity, QueueEntity) else list(entity.subscriptions.values())
            for target in targets:
                desc = target.description
                source_id = target.entity_id if isinstance(target, QueueEntity) else target.slot
                if desc.forward_to:
                    sources.append((source_id, target, SubQueue.MAIN, desc.forward_to))
                if desc.forward_dead_lettered_messages_to:
                    sources.append((source_id, target, SubQueue.DEAD_LETTER, desc.forward_dead_lettered_messages_to))
        return sources

    def _forward_all(self, rounds: int = 8) -> None:
        for _ in range(rounds):
            moved = 0
            for source_id, target, sub_queue, destination in self._forwarding_sources():
                if not all(p.healthy for p in target.partitions):
                    continue  # an unavailable partition forwards once it is back
                try:
                    moved += self._forwarder.forward(source_id, target, sub_queue, destination)
                except ShardbusError as exc:
                    log.debug("forwarding from '%s' paused: %s", target.path, exc)
                except Exception:  # forwarding must never stop the upkeep thread
                    log.exception("forwarding from '%s' failed", target.path)
            if not moved:
                return

    def _watch(self, target: Target) -> None:
        """Wake the upkeep thread when a target gains messages (forwarding acts at once, not on the next tick)."""
        target.add_listener(self._wake.set)

    # ------------------------------------------------------------------------------------------------------
    # partitions
    # ------------------------------------------------------------------------------------------------------
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

    # ------------------------------------------------------------------------------------------------------
    # lookups
    # ------------------------------------------------------------------------------------------------------
    def _sender_entity(self, name: str) -> QueueEntity | TopicEntity:
        self._refresh()
        entity = self._entities.get(_strip(name).lower())
        if entity is None:
            raise EntityNotFound(f"The messaging entity '{self.name}/{name}' could not be found.")
        return entity

    def message_size_limits(self, description: Any) -> tuple[int, int]:
        """(largest message, largest batch) in bytes that a sender to the entity ``description`` describes may
        send: its MaxMessageSizeInKilobytes on premium, the tier's otherwise (model/tiers.py)."""
        kb = getattr(description, "max_message_size_in_kilobytes", None)
        return self.tier.message_size_limits(kb, self.quotas)

    def _queue(self, name: str) -> QueueEntity:
        self._refresh()
        entity = self._entities.get(name.lower())
        if not isinstance(entity, QueueEntity):
            raise EntityNotFound(f"The messaging entity '{self.name}/{name}' could not be found (queue).")
        return entity

    def _topic(self, name: str) -> TopicEntity:
        self._refresh()
        entity = self._entities.get(name.lower())
        if not isinstance(entity, TopicEntity):
            raise EntityNotFound(f"The messaging entity '{self.name}/{name}' could not be found (topic).")
        return entity

    def _subscription(self, topic: str, name: str) -> SubscriptionEntity:
        sub = self._topic(topic).subscriptions.get(name.lower())
        if sub is None:
            raise EntityNotFound(f"The messaging entity '{self.name}/{topic}/Subscriptions/{name}' could not be found.")
        return sub

    def resolve(self, path: str) -> tuple[Target, SubQueue]:
        """A receive path (``queue``, ``topic/Subscriptions/sub``, with an optional ``/$DeadLetterQueue`` or
        ``/$Transfer/$DeadLetterQueue``) to its target and sub-queue. Case-insensitive, like the service."""
        self._refresh()
        path = _strip(path)
        lower = path.lower()
        sub_queue = SubQueue.MAIN
        for suffix, kind in _SUBQUEUE_SUFFIXES:
            if lower.endswith(suffix):
                path, lower, sub_queue = path[: -len(suffix)], lower[: -len(suffix)], kind
                break
        marker = "/subscriptions/"
        idx = lower.rfind(marker)
        if idx > 0 and isinstance(self._entities.get(lower[:idx]), TopicEntity):
            return self._subscription(path[:idx], path[idx + len(marker) :]), sub_queue
        entity = self._entities.get(lower)
        if isinstance(entity, QueueEntity):
            return entity, sub_queue
        raise EntityNotFound(f"The messaging entity '{self.name}/{path}' could not be found.")

    def authorization_scope(self, path: str) -> tuple[str, list[AuthorizationRule]] | None:
        """The queue or topic ``path`` names or lies below (a subscription, a sub-queue) and its shared access
        rules, or None. The longest matching name wins (entity names may contain slashes)."""
        self._refresh()
        segments = path.strip("/").split("/")
        for i in range(len(segments), 0, -1):
            entity = self._entities.get("/".join(segments[:i]).lower())
            if entity is not None:
                return entity.path, list(entity.description.authorization_rules)
        return None

    def entity_authorization_rules(self) -> Iterator[tuple[str, AuthorizationRule]]:
        """Every queue's and topic's shared access rules, with the entity's path."""
        self._refresh()
        for entity in list(self._entities.values()):
            for rule in entity.description.authorization_rules:
                yield entity.path, rule

    def exists(self, path: str) -> bool:
        try:
            self.resolve(path)
        except EntityNotFound:
            return _strip(path).lower() in self._entities
        return True

    # ------------------------------------------------------------------------------------------------------
    # queues and topics
    # ------------------------------------------------------------------------------------------------------
    def _check_forwarding(self, desc: QueueDescription | SubscriptionDescription, own_path: str) -> None:
        for attr in ("forward_to", "forward_dead_lettered_messages_to"):
            target = getattr(desc, attr)
            if not target:
                continue
            target = _strip(target)
            setattr(desc, attr, target)
            if target.lower() == own_path.lower():
                raise InvalidOperation(f"The entity '{own_path}' cannot forward to itself.")
            if target.lower() not in self._entities:
                raise EntityNotFound(
                    f"The forwarding destination '{target}' of '{own_path}' does not exist: create it first."
                )

    def _entity_limits(self, partitioned: bool) -> list[Limit]:
        """The quotas a new queue or topic must fit in (checked here and again in the catalog's transaction)."""
        limits = [
            Limit(
                self.quotas.max_entities,
                f"The maximum number of queues and topics ({self.quotas.max_entities}) in namespace "
                f"'{self.name}' has been reached.",
            )
        ]
        most = self.quotas.max_partitioned_entities
        if partitioned and most is not None:
            limits.append(
                Limit(
                    most,
                    f"The maximum number of partitioned queues and topics ({most}) in namespace '{self.name}' "
                    f"has been reached ({self.tier.tier.value} tier).",
                    partitioned_only=True,
                )
            )
        return limits

    def _check_quotas(self, limits: list[Limit]) -> None:
        """Refuse early, before any partition is made, by this front end's count (the catalog has the last word)."""
        entities = self._entities.values()
        for limit in limits:
            count = (
                sum(1 for e in entities if e.description.enable_partitioning)
                if limit.partitioned_only
                else len(entities)
            )
            if count >= limit.most:
                raise QuotaExceeded(limit.message)

    def _create_sender_entity(self, desc: QueueDescription | TopicDescription) -> Any:
        with self._lock:
            self._refresh()  # a name another front end just took is refused before any partition is made
            desc = self._effective(desc)
            desc.validate(self.tier)
            if isinstance(desc, QueueDescription):
                self._check_forwarding(desc, desc.name)
            if desc.name.lower() in self._entities:
                raise EntityAlreadyExists(f"The messaging entity '{self.name}/{desc.name}' already exists.")
            limits = self._entity_limits(desc.enable_partitioning)
            self._check_quotas(limits)
            entity_id = self.catalog.next_id()
            if isinstance(desc, QueueDescription):
                entity: Any = self._open_queue(entity_id, desc)
            else:
                entity = self._open_topic(entity_id, desc)
            folder = self.root / "entities" / str(entity_id)
            try:
                self._start_all(entity.partitions, f"create '{desc.name}'")
                if isinstance(entity, QueueEntity):
                    self._wait(
                        [p.create_slot(QUEUE_SLOT, self._slot_settings(desc, desc.name)) for p in entity.partitions]
                    )
                created = self.catalog.insert(
                    entity_id, desc.kind.value, None, desc.name, desc.to_dict(), limits=limits
                )
            except BaseException as exc:
                for p in entity.partitions:
                    p.stop("creation failed")
                    if self._partition_factory is not None:
                        p.delete()  # its worker forgets it (and its store)
                self._ids.pop(entity_id, None)
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(exc, EntityAlreadyExists):  # another front end created it a moment ago
                    raise EntityAlreadyExists(
                        f"The messaging entity '{self.name}/{desc.name}' already exists."
                    ) from None
                raise
            self._created[entity_id] = (created, created)
            self._entities[desc.name.lower()] = entity
            return desc

    def create_queue(self, name: str, **properties: Any) -> QueueDescription:
        """Create a queue. Properties are those of ``QueueDescription`` (lock_duration, max_delivery_count,
        enable_partitioning, requires_session, requires_duplicate_detection, ...)."""
        return self._create_sender_entity(QueueDescription.build(check_entity_name(name, "queue"), properties))

    def create_topic(self, name: str, **properties: Any) -> TopicDescription:
        return self._create_sender_entity(TopicDescription.build(check_entity_name(name, "topic"), properties))

    def get_queue(self, name: str) -> QueueDescription:
        return self._queue(name).description

    def get_topic(self, name: str) -> TopicDescription:
        return self._topic(name).description

    def list_queues(self) -> list[QueueDescription]:
        self._refresh()
        return [e.description for e in self._entities.values() if isinstance(e, QueueEntity)]

    def list_topics(self) -> list[TopicDescription]:
        self._refresh()
        return [e.description for e in self._entities.values() if isinstance(e, TopicEntity)]

    def update_queue(self, name: str, **changes: Any) -> QueueDescription:
        return self._update_sender_entity(self._queue(name), changes)

    def update_topic(self, name: str, **changes: Any) -> TopicDescription:
        return self._update_sender_entity(self._topic(name), changes)

    def _update_sender_entity(self, entity: QueueEntity | TopicEntity, changes: dict[str, Any]) -> Any:
        with self._lock:
            old = entity.description
            if self.tier.tier is Tier.PREMIUM:  # every premium entity is partitioned; nothing to change
                changes.pop("enable_partitioning", None)
            desc = old.updated(changes)
            desc.validate(self.tier)
            if isinstance(desc, QueueDescription):
                self._check_forwarding(desc, desc.name)
            self._require_healthy(entity.partitions, f"update '{old.name}'")
            updated = self.catalog.update(entity.entity_id, desc.to_dict())
            entity.description = desc
            for p in entity.partitions:
                p.config = self._partition_config(desc, p.id)
                if isinstance(desc, QueueDescription):
                    p.configure_slot(QUEUE_SLOT, self._slot_settings(desc, desc.name))
            created, _ = self._created[entity.entity_id]
            self._created[entity.entity_id] = (created, updated)
            return desc

    def delete_queue(self, name: str) -> None:
        self._delete_sender_entity(self._queue(name))

    def delete_topic(self, name: str) -> None:
        self._delete_sender_entity(self._topic(name))

    def _delete_sender_entity(self, entity: QueueEntity | TopicEntity) -> None:
        with self._lock:
            self._require_healthy(entity.partitions, f"delete '{entity.path}'")
            ids = [entity.entity_id]
            if isinstance(entity, TopicEntity):
                ids.extend(s.slot for s in entity.subscriptions.values())
            self.catalog.delete(ids)
            del self._entities[entity.path.lower()]
            for entity_id in ids:
                self._ids.pop(entity_id, None)
            self._forwarder.forget(entity)
            for sub in getattr(entity, "subscriptions", {}).values():
                self._forwarder.forget(sub)
            for p in entity.partitions:
                p.delete()
            shutil.rmtree(self.root / "entities" / str(entity.entity_id), ignore_errors=True)

    # ------------------------------------------------------------------------------------------------------
    # subscriptions and rules
    # ------------------------------------------------------------------------------------------------------
    def create_subscription(
        self, topic_name: str, name: str, default_rule: Rule | None = None, **properties: Any
    ) -> SubscriptionDescription:
        """Create a subscription; it gets the ``$Default`` rule (a true filter) unless ``default_rule`` says
        otherwise."""
        with self._lock:
            topic = self._topic(topic_name)
            desc = SubscriptionDescription.build(name, properties)
            desc.topic_name = topic.path
            desc.validate(self.tier)
            self._check_forwarding(desc, desc.path)
            if name.lower() in topic.subscriptions:
                raise EntityAlreadyExists(f"The messaging entity '{self.name}/{desc.path}' already exists.")
            limit = Limit(
                self.quotas.max_subscriptions_per_topic,
                f"The maximum number of subscriptions ({self.quotas.max_subscriptions_per_topic}) of topic "
                f"'{topic.path}' has been reached.",
            )
            if len(topic.subscriptions) >= limit.most:
                raise QuotaExceeded(limit.message)
            self._require_healthy(topic.partitions, f"create subscription '{desc.path}'")
            rule = default_rule or Rule(DEFAULT_RULE_NAME, TrueFilter(), EmptyRuleAction())
            check_child_name(rule.name, "rule")
            slot = self.catalog.next_id()
            settings = self._slot_settings(desc, desc.path)
            self._wait([p.create_slot(slot, settings) for p in topic.partitions])
            try:
                created = self.catalog.insert(
                    slot,
                    EntityKind.SUBSCRIPTION.value,
                    topic.entity_id,
                    desc.name,
                    desc.to_dict(),
                    [(rule.name, rule.to_dict())],
                    limits=[limit],
                )
            except EntityAlreadyExists:  # another front end created it a moment ago
                self._wait([p.drop_slot(slot) for p in topic.partitions])
                raise EntityAlreadyExists(f"The messaging entity '{self.name}/{desc.path}' already exists.") from None
            except QuotaExceeded:  # another front end took the last place a moment ago
                self._wait([p.drop_slot(slot) for p in topic.partitions])
                raise
            self._created[slot] = (created, created)
            sub = SubscriptionEntity(desc, topic, slot, [rule])
            topic.add_subscription(sub)
            self._watch(sub)
            self._ids[slot] = sub
            return desc

    def get_subscription(self, topic_name: str, name: str) -> SubscriptionDescription:
        return self._subscription(topic_name, name).description

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionDescription]:
        return [s.description for s in self._topic(topic_name).subscriptions.values()]

    def update_subscription(self, topic_name: str, name: str, **changes: Any) -> SubscriptionDescription:
        with self._lock:
            sub = self._subscription(topic_name, name)
            changes.pop("topic_name", None)
            desc = sub.description.updated(changes)
            desc.validate(self.tier)
            self._check_forwarding(desc, desc.path)
            self._require_healthy(sub.partitions, f"update '{desc.path}'")
            updated = self.catalog.update(sub.slot, desc.to_dict())
            sub.description = desc
            for p in sub.partitions:
                p.configure_slot(sub.slot, self._slot_settings(desc, desc.path))
            created, _ = self._created[sub.slot]
            self._created[sub.slot] = (created, updated)
            return desc

    def delete_subscription(self, topic_name: str, name: str) -> None:
        with self._lock:
            sub = self._subscription(topic_name, name)
            self._require_healthy(sub.partitions, f"delete '{sub.path}'")
            self._wait([p.drop_slot(sub.slot) for p in sub.partitions])
            self.catalog.delete([sub.slot])
            sub.topic.remove_subscription(name)
            self._forwarder.forget(sub)
            self._ids.pop(sub.slot, None)

    def create_rule(self, topic_name: str, subscription_name: str, rule: Rule) -> Rule:
        with self._lock:
            sub = self._subscription(topic_name, subscription_name)
            check_child_name(rule.name, "rule")
            if any(r.name.lower() == rule.name.lower() for r in sub.rules):
                raise EntityAlreadyExists(f"The rule '{rule.name}' already exists in '{sub.path}'.")
            limit = Limit(
                self.quotas.max_rules_per_subscription, f"The maximum number of rules of '{sub.path}' has been reached."
            )
            if len(sub.rules) >= limit.most:
                raise QuotaExceeded(limit.message)
            self._require_healthy(sub.partitions, f"add a rule to '{sub.path}'")
            self.catalog.put_rule(sub.slot, rule.name, rule.to_dict(), limit)
            sub.rules = [*sub.rules, rule]
            return rule

    def get_rule(self, topic_name: str, subscription_name: str, name: str) -> Rule:
        for rule in self._subscription(topic_name, subscription_name).rules:
            if rule.name.lower() == name.lower():
                return rule
        raise EntityNotFound(
            f"The rule '{name}' could not be found in '{topic_name}/Subscriptions/{subscription_name}'."
        )

    def list_rules(self, topic_name: str, subscription_name: str) -> list[Rule]:
        return list(self._subscription(topic_name, subscription_name).rules)

    def update_rule(self, topic_name: str, subscription_name: str, rule: Rule) -> Rule:
        """Replace the filter and action of the existing rule named ``rule.name`` (case-insensitive), in place:
        the rule keeps its stored name and its position among the subscription's rules. Raises EntityNotFound
        when the subscription or the rule does not exist. Returns the rule as stored."""
        with self._lock:
            sub = self._subscription(topic_name, subscription_name)
            old = self.get_rule(topic_name, subscription_name, rule.name)
            self._require_healthy(sub.partitions, f"update a rule of '{sub.path}'")
            new = Rule(old.name, rule.filter, rule.action)
            self.catalog.update_rule(sub.slot, old.name, new.to_dict())
            sub.rules = [new if r is old else r for r in sub.rules]
            return new

    def delete_rule(self, topic_name: str, subscription_name: str, name: str) -> None:
        with self._lock:
            sub = self._subscription(topic_name, subscription_name)
            rule = self.get_rule(topic_name, subscription_name, name)
            self._require_healthy(sub.partitions, f"remove a rule from '{sub.path}'")
            self.catalog.delete_rule(sub.slot, rule.name)
            sub.rules = [r for r in sub.rules if r is not rule]

    # ------------------------------------------------------------------------------------------------------
    # runtime information
    # ------------------------------------------------------------------------------------------------------
    def get_runtime_properties(self, path: str) -> RuntimeProperties:
        """Counts summed over partitions for a queue, topic or subscription path; availability is "Limited"
        when any partition is unavailable."""
        self._refresh()
        lower = _strip(path).lower()
        entity = self._entities.get(lower)
        if isinstance(entity, TopicEntity):
            return entity.runtime()
        target, _ = self.resolve(path)
        return target.runtime()

    def availability(self, path: str) -> str:
        self._refresh()
        lower = _strip(path).lower()
        entity = self._entities.get(lower)
        partitions = entity.partitions if entity is not None else self.resolve(path)[0].partitions
        return "Available" if all(p.healthy for p in partitions) else "Limited"

    def created_updated(self, path: str) -> tuple[float, float]:
        self._refresh()
        entity = self._entities.get(_strip(path).lower()) or self.resolve(path)[0]
        key = entity.entity_id if hasattr(entity, "entity_id") else entity.slot
        return self._created[key]

    # ------------------------------------------------------------------------------------------------------
    # data plane
    # ------------------------------------------------------------------------------------------------------
    def submit_send(self, entity: str, messages: Message | list[Message]) -> Future:
        """Route and store messages without waiting; the future resolves once they are durable."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        target = self._sender_entity(entity)
        check_send_size(batch, *self.message_size_limits(target.description), entity)  # as over AMQP
        return target.submit_send(batch)

    def send(self, entity: str, messages: Message | list[Message]) -> None:
        """Send one message or a batch (all-or-nothing) to a queue or topic; returns once stored durably."""
        self.submit_send(entity, messages).result()

    def schedule_messages(self, entity: str, messages: Message | list[Message], enqueue_time: datetime) -> list[int]:
        """Schedule messages for ``enqueue_time``; returns their sequence numbers (for cancelling)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        result = []
        target = self._sender_entity(entity)
        check_send_size(batch, *self.message_size_limits(target.description), entity)
        for m in batch:
            m = m.copy()
            m.scheduled_enqueue_time = enqueue_time
            result.extend(target.submit_send([m]).result())
        return result

    def cancel_scheduled_messages(self, entity: str, sequence_numbers: int | list[int]) -> None:
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        self._wait(self._sender_entity(entity).submit_cancel_scheduled(seqs))

    def receiver(
        self, path: str, mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK, sub_queue: SubQueue | None = None
    ) -> Receiver:
        """A receiver on a queue or subscription path (sub-queues by suffix or ``sub_queue``)."""
        target, suffix_queue = self.resolve(path)
        return Receiver(target, ReceiveMode(mode), sub_queue if sub_queue is not None else suffix_queue, self._clock)

    def transaction(self) -> Transaction:
        """Operations that commit together or not at all: ``with ns.transaction() as tx: tx.send(...);
        tx.complete(receiver, message)``. The seeds' rules for partitioned entities apply (see
        ``shardbus.entity.transactions``)."""
        return Transaction(self._sender_entity)

    def session_receiver(
        self,
        path: str,
        session_id: str | None = None,
        mode: ReceiveMode | str = ReceiveMode.PEEK_LOCK,
        max_wait: float | None = None,
    ) -> SessionReceiver:
        """Accept a session of a session-enabled queue or subscription: ``session_id``, or the next available
        one (waiting up to ``max_wait`` s, then OperationTimeout). The session is locked until closed."""
        target, _ = self.resolve(path)
        return SessionReceiver(target, session_id, ReceiveMode(mode), max_wait, self._clock)

    def list_sessions(self, path: str, updated_after: datetime | None = None) -> list[str]:
        """Session ids with messages or state (with ``updated_after``: whose state changed since)."""
        target, _ = self.resolve(path)
        return list_sessions(target, None if updated_after is None else datetime_to_ms(updated_after))

    def peek_messages(self, path: str, max_count: int = 1, from_sequence_number: int | None = None) -> list[Message]:
        """The service's peek (see ``Target.peek``): may return fewer than asked on a partitioned entity."""
        target, sub_queue = self.resolve(path)
        return target.peek(from_sequence_number, max_count, sub_queue)

    def browse(self, path: str, **ranges: Any) -> Iterator[Message]:
        """Every message of a queue or subscription, partition by partition, without locking (ours)."""
        target, sub_queue = self.resolve(path)
        return target.browse(sub_queue, **ranges)

    # Sequence-range reads (ours): what a stream processor needs to read a queue or subscription replayably and
    # complete what it has processed with one cumulative operation per partition. Partition-relative numbers.
    def range_offsets(
        self, path: str, count_from: dict[int, int] | None = None
    ) -> list[tuple[int, int, int, int] | None]:
        """Per partition (first readable, end, completed mark, readable count from ``count_from[partition]``);
        None where the partition is unavailable."""
        target, sub_queue = self.resolve(path)
        return target.range_offsets(sub_queue, count_from)

    def browse_range(self, path: str, partition: int, start: int, end: int, max_count: int) -> list[Message]:
        """Readable messages of one partition with ``start <= partition-relative sequence number < end``."""
        target, sub_queue = self.resolve(path)
        return target.browse_range(partition, start, end, max_count, sub_queue)

    def submit_complete_below(self, path: str, marks: dict[int, int]) -> list[Future]:
        """Complete every readable message below ``marks[partition]`` in each partition (idempotent)."""
        target, sub_queue = self.resolve(path)
        return target.complete_below(marks, sub_queue)

    def complete_below(self, path: str, marks: dict[int, int]) -> None:
        self._wait(self.submit_complete_below(path, marks))


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


def _strip(name: str) -> str:
    """Accept 'sb://host/name' and 'amqps://host:port/name' forms for entity names, as the SDK may send them."""
    for scheme in ("sb://", "amqps://", "amqp://", "https://", "http://"):
        if name.lower().startswith(scheme):
            rest = name[len(scheme) :]
            return rest.split("/", 1)[1] if "/" in rest else ""
    return name.strip("/")
