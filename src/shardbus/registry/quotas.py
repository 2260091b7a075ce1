"""The namespace's quotas on how many queues and topics (and partitioned ones), subscriptions per topic and rules
per subscription it holds: one check, ``quota_breach``, used by the namespace before it creates anything and by
the Config.json importer (config.py) before it applies a config.

The catalog checks the same limits again inside its write transaction (``store/catalog.Limit``), since front ends
sharing it each count from their own view. Keeps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.errors import QuotaExceeded
from ..model.tiers import Quotas
from ..store.catalog import Limit


@dataclass(frozen=True, slots=True)
class QuotaBreach:
    """A quota a count would pass: which one (a ``Quotas`` field), its value, and the count."""

    quota: str
    most: int
    count: int


def quota_breach(
    quotas: Quotas,
    *,
    entities: int = 0,
    partitioned: int = 0,
    subscriptions: int = 0,
    rules: int = 0,
) -> QuotaBreach | None:
    """The first quota that a namespace with ``entities`` queues and topics (``partitioned`` of them partitioned),
    a topic with ``subscriptions`` subscriptions or a subscription with ``rules`` rules would pass, or None."""
    checks = (
        ("max_entities", quotas.max_entities, entities),
        ("max_partitioned_entities", quotas.max_partitioned_entities, partitioned),
        ("max_subscriptions_per_topic", quotas.max_subscriptions_per_topic, subscriptions),
        ("max_rules_per_subscription", quotas.max_rules_per_subscription, rules),
    )
    for quota, most, count in checks:
        if most is not None and count > most:
            return QuotaBreach(quota, most, count)
    return None


class QuotaChecks:
    """The quota part of ``Namespace``: the limits a new queue or topic must fit in."""

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
        partitioned = any(limit.partitioned_only for limit in limits)  # the new entity is a partitioned one
        breach = quota_breach(
            self.quotas,
            entities=len(entities) + 1,
            partitioned=sum(1 for e in entities if e.description.enable_partitioning) + 1 if partitioned else 0,
        )
        if breach is not None:
            by_partitions = breach.quota == "max_partitioned_entities"
            raise QuotaExceeded(next(lim.message for lim in limits if lim.partitioned_only == by_partitions))
