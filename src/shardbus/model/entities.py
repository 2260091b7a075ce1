"""Entity descriptions (queues, topics, subscriptions) and the rules their properties obey.

Property names follow the Python SDK's ``QueueProperties``/``TopicProperties``/``SubscriptionProperties``;
defaults and ranges follow the real service. Validation here is pure: whatever needs the namespace (does a
forwarding target exist, is a quota reached) is checked by the namespace.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, ClassVar

from .authorization import AuthorizationRule, prepare_rules
from .errors import ArgumentError, ArgumentOutOfRange, InvalidOperation
from .tiers import TierRules

# .NET TimeSpan.MaxValue, the service's "never" for TTL and auto-delete-on-idle.
TIMESPAN_MAX = timedelta(days=10675199, seconds=10085, microseconds=477580)


class EntityStatus(enum.StrEnum):
    ACTIVE = "Active"
    DISABLED = "Disabled"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"

    @classmethod
    def parse(cls, value: str | EntityStatus) -> EntityStatus:
        for status in cls:
            if str(value).lower() == status.value.lower():
                return status
        raise ArgumentError(f"Unknown entity status '{value}': use Active, Disabled, SendDisabled or ReceiveDisabled.")

    @property
    def can_send(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.RECEIVE_DISABLED)

    @property
    def can_receive(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.SEND_DISABLED)


class EntityKind(enum.StrEnum):
    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"


# Queue and topic names: letters, digits, '.', '-', '_' and '/', starting and ending with a letter or digit,
# at most 260 characters. Subscription and rule names: the same without '/', at most 50 characters.
_ENTITY_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._\-/]*[A-Za-z0-9])?")
_CHILD_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._\-]*[A-Za-z0-9])?")
DEFAULT_RULE_NAME = "$Default"


def check_entity_name(name: str, kind: str = "queue or topic") -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 260 or not _ENTITY_NAME.fullmatch(name) or "//" in name:
        raise ArgumentError(
            f"The {kind} name '{name}' is invalid: use 1-260 letters, digits, periods, hyphens, underscores and "
            "slashes, starting and ending with a letter or digit."
        )
    return name


def check_child_name(name: str, kind: str) -> str:
    if name == DEFAULT_RULE_NAME and kind == "rule":
        return name
    if not isinstance(name, str) or not 1 <= len(name) <= 50 or not _CHILD_NAME.fullmatch(name):
        raise ArgumentError(
            f"The {kind} name '{name}' is invalid: use 1-50 letters, digits, periods, hyphens and underscores, "
            "starting and ending with a letter or digit."
        )
    return name


def _check_range(label: str, value: timedelta, low: timedelta, high: timedelta) -> None:
    if not isinstance(value, timedelta):
        raise ArgumentError(f"{label} must be a duration (timedelta), not {type(value).__name__}.")
    if not low <= value <= high:
        raise ArgumentOutOfRange(f"{label} {value} is out of range: it must be between {low} and {high}.")


@dataclass
class _Description:
    """Fields shared by queue, topic and subscription descriptions."""

    name: str
    status: EntityStatus = EntityStatus.ACTIVE
    auto_delete_on_idle: timedelta = TIMESPAN_MAX
    user_metadata: str | None = None
    enable_batched_operations: bool = True

    kind: ClassVar[EntityKind]
    # Properties an update may not change, with the service's wording for why.
    immutable: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, timedelta):
                data[key] = {"us": value // timedelta(microseconds=1)}
            elif isinstance(value, enum.Enum):
                data[key] = value.value
        if "authorization_rules" in data:
            data["authorization_rules"] = [r.to_dict() for r in self.authorization_rules]  # type: ignore[attr-defined]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        known = {f.name for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in known:
                continue
            if isinstance(value, dict) and set(value) == {"us"}:
                value = timedelta(microseconds=value["us"])
            elif key == "authorization_rules":
                value = [AuthorizationRule.from_dict(r) for r in value or ()]
            values[key] = value
        obj = cls(**values)
        obj.status = EntityStatus.parse(obj.status)
        return obj

    @classmethod
    def _reject_unknown(cls, properties: dict[str, Any]) -> None:
        unknown = set(properties) - {f.name for f in fields(cls)}
        if unknown:
            raise ArgumentError(
                f"Unknown {cls.kind.value} propert{'ies' if len(unknown) > 1 else 'y'}: {', '.join(sorted(unknown))}"
            )

    @classmethod
    def build(cls, name: str, properties: dict[str, Any]) -> Any:
        """A new description from keyword properties (unknown ones are an ArgumentError)."""
        cls._reject_unknown(properties)
        desc = cls(name=name, **properties)
        if "authorization_rules" in properties:
            desc.authorization_rules = prepare_rules(properties["authorization_rules"] or ())  # type: ignore[attr-defined]
        return desc

    def updated(self, changes: dict[str, Any]) -> Any:
        """A copy with ``changes`` applied; changing an immutable property is an InvalidOperation."""
        self._reject_unknown(changes)
        for prop in self.immutable:
            if prop in changes and changes[prop] != getattr(self, prop):
                raise InvalidOperation(
                    f"The value for the '{prop}' property of an existing {self.kind.value} cannot be changed: "
                    "it can only be set when the entity is created."
                )
        if "name" in changes and changes["name"].lower() != self.name.lower():
            raise InvalidOperation("An entity cannot be renamed.")
        if "authorization_rules" in changes:  # times kept, keys generated, as the service does
            previous = getattr(self, "authorization_rules", [])
            changes = {**changes, "authorization_rules": prepare_rules(changes["authorization_rules"] or (), previous)}
        return replace(self, **changes)

    def validate(self, tier: TierRules) -> None:
        self.status = EntityStatus.parse(self.status)
        _check_range("AutoDeleteOnIdle", self.auto_delete_on_idle, timedelta(minutes=5), TIMESPAN_MAX)
        if self.user_metadata is not None and len(self.user_metadata) > 1024:
            raise ArgumentOutOfRange("UserMetadata is limited to 1024 characters.")


@dataclass
class _MessagingOptions:
    """Properties of entities that hold messages (queues and subscriptions)."""

    lock_duration: timedelta = timedelta(minutes=1)
    requires_session: bool = False
    default_message_time_to_live: timedelta = TIMESPAN_MAX
    dead_lettering_on_message_expiration: bool = False
    max_delivery_count: int = 10
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None


def _validate_messaging(desc: Any, tier: TierRules) -> None:
    _check_range("LockDuration", desc.lock_duration, timedelta(seconds=5), timedelta(minutes=5))
    _check_range("DefaultMessageTimeToLive", desc.default_message_time_to_live, timedelta(seconds=1), TIMESPAN_MAX)
    if not isinstance(desc.max_delivery_count, int) or desc.max_delivery_count < 1:
        raise ArgumentOutOfRange(f"MaxDeliveryCount must be at least 1, not {desc.max_delivery_count}.")
    if not tier.allows_advanced_features:
        if desc.requires_session:
            raise InvalidOperation("Sessions are not available in the basic tier.")
        if desc.forward_to or desc.forward_dead_lettered_messages_to:
            raise InvalidOperation("Auto-forwarding is not available in the basic tier.")


def _validate_size_and_dedup(desc: Any, tier: TierRules) -> None:
    tier.check_max_size(desc.max_size_in_megabytes)
    tier.check_max_message_size(desc.max_message_size_in_kilobytes)
    _check_range(
        "DuplicateDetectionHistoryTimeWindow",
        desc.duplicate_detection_history_time_window,
        timedelta(seconds=20),
        timedelta(days=7),
    )
    if desc.requires_duplicate_detection and not tier.allows_advanced_features:
        raise InvalidOperation("Duplicate detection is not available in the basic tier.")


@dataclass
class QueueDescription(_MessagingOptions, _Description):
    max_size_in_megabytes: int = 1024
    max_message_size_in_kilobytes: int | None = None  # None: the tier's default (premium 1024; others 256)
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    enable_partitioning: bool = False
    authorization_rules: list[AuthorizationRule] = field(default_factory=list)

    kind: ClassVar[EntityKind] = EntityKind.QUEUE
    immutable: ClassVar[tuple[str, ...]] = (
        "enable_partitioning",
        "requires_session",
        "requires_duplicate_detection",
    )

    def validate(self, tier: TierRules) -> None:
        check_entity_name(self.name, "queue")
        _Description.validate(self, tier)
        _validate_messaging(self, tier)
        _validate_size_and_dedup(self, tier)


@dataclass
class TopicDescription(_Description):
    default_message_time_to_live: timedelta = TIMESPAN_MAX
    max_size_in_megabytes: int = 1024
    max_message_size_in_kilobytes: int | None = None  # None: the tier's default (premium 1024; others 256)
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    enable_partitioning: bool = False
    support_ordering: bool = True
    authorization_rules: list[AuthorizationRule] = field(default_factory=list)

    kind: ClassVar[EntityKind] = EntityKind.TOPIC
    immutable: ClassVar[tuple[str, ...]] = ("enable_partitioning", "requires_duplicate_detection")

    def validate(self, tier: TierRules) -> None:
        check_entity_name(self.name, "topic")
        _Description.validate(self, tier)
        if not tier.allows_topics:
            raise InvalidOperation("Topics are not available in the basic tier: use the standard or premium tier.")
        _check_range("DefaultMessageTimeToLive", self.default_message_time_to_live, timedelta(seconds=1), TIMESPAN_MAX)
        _validate_size_and_dedup(self, tier)


@dataclass
class SubscriptionDescription(_MessagingOptions, _Description):
    topic_name: str = ""
    dead_lettering_on_filter_evaluation_exceptions: bool = True

    kind: ClassVar[EntityKind] = EntityKind.SUBSCRIPTION
    immutable: ClassVar[tuple[str, ...]] = ("requires_session",)

    def validate(self, tier: TierRules) -> None:
        check_child_name(self.name, "subscription")
        _Description.validate(self, tier)
        _validate_messaging(self, tier)

    @property
    def path(self) -> str:
        return f"{self.topic_name}/Subscriptions/{self.name}"


@dataclass(slots=True)
class RuntimeProperties:
    """Counts summed over an entity's partitions, and whether every partition answered."""

    active_message_count: int = 0
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    size_in_bytes: int = 0
    availability: str = "Available"  # "Limited" when any partition is unavailable
    partitions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_message_count(self) -> int:
        return (
            self.active_message_count
            + self.dead_letter_message_count
            + self.scheduled_message_count
            + self.transfer_message_count
            + self.transfer_dead_letter_message_count
        )

    def add(self, other: RuntimeProperties) -> None:
        self.active_message_count += other.active_message_count
        self.dead_letter_message_count += other.dead_letter_message_count
        self.scheduled_message_count += other.scheduled_message_count
        self.transfer_message_count += other.transfer_message_count
        self.transfer_dead_letter_message_count += other.transfer_dead_letter_message_count
        self.size_in_bytes += other.size_in_bytes


DESCRIPTION_TYPES: dict[EntityKind, type[_Description]] = {
    EntityKind.QUEUE: QueueDescription,
    EntityKind.TOPIC: TopicDescription,
    EntityKind.SUBSCRIPTION: SubscriptionDescription,
}
