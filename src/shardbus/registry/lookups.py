"""The registry's reads: an entity path (with an optional sub-queue suffix, case-insensitive, with or without the
``sb://host/`` form the SDK may send) to its queue, topic or subscription, and the shared access rules around it.

``Lookups`` is a part of ``Namespace``. It reads the registry (``_entities``: queues and topics by lower-cased
name; subscriptions under their topic) and keeps nothing of its own; each lookup first asks the catalog whether
another process changed it (``_refresh``, sync.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..entity.entity import QueueEntity, SubscriptionEntity, Target, TopicEntity
from ..model.authorization import AuthorizationRule
from ..model.errors import EntityNotFound
from ..model.message import SubQueue

_SUBQUEUE_SUFFIXES = (
    ("/$transfer/$deadletterqueue", SubQueue.TRANSFER_DEAD_LETTER),
    ("/$deadletterqueue", SubQueue.DEAD_LETTER),
)


def _strip(name: str) -> str:
    """Accept 'sb://host/name' and 'amqps://host:port/name' forms for entity names, as the SDK may send them."""
    for scheme in ("sb://", "amqps://", "amqp://", "https://", "http://"):
        if name.lower().startswith(scheme):
            rest = name[len(scheme) :]
            return rest.split("/", 1)[1] if "/" in rest else ""
    return name.strip("/")


class Lookups:
    """The registry-reading part of ``Namespace``."""

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

    def send_size_limits(self, entity: str) -> tuple[int, int]:
        """(largest message, largest batch) in bytes a sender to the queue or topic ``entity`` may send."""
        return self.message_size_limits(self._sender_entity(entity).description)

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
