"""Management of a namespace's entities: create, read, update and delete of queues, topics, subscriptions and
rules, and their runtime information.

Management follows the seeds: create, update and delete act on every partition of the entity and fail, with
nothing half-done, if any partition is unavailable; runtime counts are sums over partitions, and an entity with an
unavailable partition reports its availability as "Limited". Two processes creating the same name race in the
catalog's write transaction: one wins, the other gets EntityAlreadyExists and removes its partitions.

``Management`` is a part of ``Namespace``; it changes the registry and the catalog together, under the
namespace's lock, and keeps nothing of its own.
"""

from __future__ import annotations

import shutil
from typing import Any

from ..entity.entity import QUEUE_SLOT, QueueEntity, SubscriptionEntity, TopicEntity
from ..model.entities import (
    DEFAULT_RULE_NAME,
    EntityKind,
    QueueDescription,
    RuntimeProperties,
    SubscriptionDescription,
    TopicDescription,
    check_child_name,
    check_entity_name,
)
from ..model.errors import EntityAlreadyExists, EntityNotFound, InvalidOperation, QuotaExceeded
from ..model.filters import EmptyRuleAction, Rule, TrueFilter
from ..model.tiers import Tier
from ..store.catalog import Limit
from .lookups import _strip
from .quotas import quota_breach


class Management:
    """The management part of ``Namespace``."""

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
            if quota_breach(self.quotas, subscriptions=len(topic.subscriptions) + 1):
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
            if quota_breach(self.quotas, rules=len(sub.rules) + 1):
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
