"""Namespace tiers and the quotas that come with them (Service Bus quotas page, as of 2026)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ArgumentError, ArgumentOutOfRange

KB = 1024
MB = 1024 * 1024


class Tier(enum.StrEnum):
    BASIC = "basic"
    STANDARD = "standard"
    PREMIUM = "premium"

    @classmethod
    def parse(cls, value: str | Tier) -> Tier:
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ArgumentError(f"Unknown tier '{value}': use basic, standard or premium.") from None


STANDARD_PARTITION_COUNT = 16
PREMIUM_PARTITION_COUNTS = (1, 2, 4)
STANDARD_MAX_SIZES_MB = (1024, 2048, 3072, 4096, 5120)
PREMIUM_MAX_SIZE_MB = 81920
# Premium's per-entity message size (MaxMessageSizeInKilobytes): 1 MB unless the entity asks for more, up to 100 MB.
PREMIUM_MESSAGE_KB_RANGE = (1024, 102400)
PREMIUM_DEFAULT_MESSAGE_KB = 1024
# A premium batch stays at 1 MB whatever the entity's message size (the service's, as the SDK's maintainers put it:
# "the Service Bus service rejects any batch larger than 1MB regardless of the configured maximum message size").
PREMIUM_BATCH_BYTES = 1 * MB
STANDARD_MESSAGE_KB = 256


@dataclass(frozen=True, slots=True)
class Quotas:
    """Limits a namespace enforces; each may be overridden per namespace (tests and on-premises use)."""

    max_entities: int = 10_000
    max_partitioned_entities: int | None = 100  # None: no separate limit (premium)
    max_message_size_bytes: int = 256 * KB  # premium: the ceiling of an entity's MaxMessageSizeInKilobytes
    max_batch_size_bytes: int = 256 * KB  # premium: 1 MB whatever the entity's message size
    max_subscriptions_per_topic: int = 2_000
    max_rules_per_subscription: int = 2_000

    @classmethod
    def for_tier(cls, tier: Tier, **overrides: Any) -> Quotas:
        base = (
            cls(
                max_partitioned_entities=None, max_message_size_bytes=100 * MB, max_batch_size_bytes=PREMIUM_BATCH_BYTES
            )
            if tier is Tier.PREMIUM
            else cls()
        )
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ArgumentError(f"Unknown quota(s): {', '.join(sorted(unknown))}")
        return replace(base, **overrides)


@dataclass(frozen=True, slots=True)
class TierRules:
    """What a tier allows, checked when entities are created or updated."""

    tier: Tier
    premium_partitions: int = 1
    features: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, tier: Tier, premium_partitions: int | None = None) -> TierRules:
        if tier is Tier.PREMIUM:
            count = 1 if premium_partitions is None else premium_partitions
            if count not in PREMIUM_PARTITION_COUNTS:
                raise ArgumentOutOfRange(
                    f"A premium namespace has 1, 2 or 4 messaging partitions, not {premium_partitions}."
                )
            return cls(tier, count)
        if premium_partitions not in (None, 1):
            raise ArgumentError("The partition count is chosen at namespace creation only in the premium tier.")
        return cls(tier)

    @property
    def allows_topics(self) -> bool:
        return self.tier is not Tier.BASIC

    @property
    def allows_advanced_features(self) -> bool:
        """Sessions, duplicate detection, transactions and auto-forwarding are not in the basic tier."""
        return self.tier is not Tier.BASIC

    def partition_count(self, enable_partitioning: bool) -> int:
        if self.tier is Tier.PREMIUM:
            return self.premium_partitions
        return STANDARD_PARTITION_COUNT if enable_partitioning else 1

    def check_max_size(self, max_size_mb: int) -> None:
        if self.tier is Tier.PREMIUM:
            if not (1024 <= max_size_mb <= PREMIUM_MAX_SIZE_MB and max_size_mb % 1024 == 0):
                raise ArgumentOutOfRange(
                    f"MaxSizeInMegabytes {max_size_mb} is invalid: premium allows multiples of 1024 up to "
                    f"{PREMIUM_MAX_SIZE_MB}."
                )
        elif max_size_mb not in STANDARD_MAX_SIZES_MB:
            raise ArgumentOutOfRange(
                f"MaxSizeInMegabytes {max_size_mb} is invalid: the {self.tier.value} tier allows "
                f"{', '.join(map(str, STANDARD_MAX_SIZES_MB))}."
            )

    def check_max_message_size(self, kb: int | None) -> None:
        """``MaxMessageSizeInKilobytes`` of a queue or topic: premium 1,024-102,400; other tiers have 256 KB."""
        if kb is None:
            return
        if not isinstance(kb, int) or isinstance(kb, bool):
            raise ArgumentError(f"MaxMessageSizeInKilobytes must be a whole number, not {kb!r}.")
        if self.tier is Tier.PREMIUM:
            low, high = PREMIUM_MESSAGE_KB_RANGE
            if not low <= kb <= high:
                raise ArgumentOutOfRange(
                    f"MaxMessageSizeInKilobytes {kb} is out of range: premium allows {low} to {high}."
                )
        elif kb != STANDARD_MESSAGE_KB:
            raise ArgumentOutOfRange(
                f"MaxMessageSizeInKilobytes {kb} is invalid: the {self.tier.value} tier has {STANDARD_MESSAGE_KB} KB "
                "messages; larger ones (up to 102400) are a premium feature."
            )

    def message_size_limits(self, kb: int | None, quotas: Quotas) -> tuple[int, int]:
        """(largest message, largest batch) in bytes for an entity whose MaxMessageSizeInKilobytes is ``kb``
        (None: the default), within the namespace's ``max_message_size_bytes`` quota."""
        message = quotas.max_message_size_bytes
        if self.tier is Tier.PREMIUM:
            message = min(message, (kb or PREMIUM_DEFAULT_MESSAGE_KB) * KB)
        return message, min(message, quotas.max_batch_size_bytes)
