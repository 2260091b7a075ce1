"""Declarative entities: the official Azure Service Bus emulator's ``Config.json``, read unchanged.

The emulator (github.com/Azure/azure-service-bus-emulator-installer, ``ServiceBus-Emulator/Config/Config.json``
and ``ServiceBus-Emulator/Schema/Config-schema.json``) describes its entities in this shape::

    {"UserConfig": {
        "Namespaces": [{"Name": "sbemulatorns",
                        "Queues": [{"Name": "queue.1", "Properties": {"LockDuration": "PT1M", ...}}],
                        "Topics": [{"Name": "topic.1", "Properties": {...},
                                    "Subscriptions": [{"Name": "subscription.1", "Properties": {...},
                                                       "Rules": [{"Name": "r", "Properties": {
                                                           "FilterType": "Correlation" | "Sql",
                                                           "CorrelationFilter": {...}, "SqlFilter": {...},
                                                           "Action": {"SqlExpression": "..."}}}]}]}]}],
        "Logging": {"Type": "File"}}}

so that a project's existing emulator file works here as it is. shardbus adds, on queues and topics,
``EnablePartitioning``, ``MaxSizeInMegabytes`` and ``MaxMessageSizeInKilobytes`` (premium); on every entity
``Status``, ``AutoDeleteOnIdle``, ``UserMetadata`` and ``EnableBatchedOperations`` (plus ``SupportOrdering`` on
topics and ``DeadLetteringOnFilterEvaluationExceptions`` on subscriptions, the service's own property names); and on a
namespace ``Sku`` ("Basic", "Standard", "Premium"), ``PremiumMessagingPartitions`` (1, 2, 4) and ``AuthorizationRules``
(shared access policies: ``[{"KeyName", "PrimaryKey", "SecondaryKey", "Rights": ["Send", "Listen", "Manage"]}]``,
beside ``RootManageSharedAccessKey``, whose key is ``serve --key``; see docs/security.md). The emulator's caps
(one namespace, 50 entities, a one-hour TTL) do not apply: ranges are the core's, checked by the descriptions'
own ``validate``.

Choices where the emulator's documentation is silent, and why:

* A property the config leaves out (or sets to ``null``, as some exporters write) gets the service's default on
  creation and is left alone on an existing entity, so re-applying a file never undoes a change an
  application made through the management API to something the file does not mention.
* A subscription whose config lists rules ends up with exactly those rules (its ``$Default`` is removed, other
  rules are replaced); one with no ``Rules`` (or an empty list) is created with ``$Default`` and its rules
  are left alone afterwards. This is what the emulator's sample file relies on ("subscription.3" has no rules
  and receives everything).
* Entities in the namespace that the config does not mention are kept: a config adds and updates, never deletes.
* Property names are matched case-insensitively (the emulator binds them through .NET configuration, which is
  case-insensitive), but a name that matches nothing is an error, with a suggestion, rather than being ignored:
  a typo such as ``LockDurration`` would otherwise silently leave the default in place.

Everything is validated before anything is created, and every error is a :class:`ConfigError` whose message
starts with the JSON path of the offending value (``UserConfig.Namespaces[0].Queues[2].Properties.LockDuration:
'PT10M' is out of range: ...``).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

from .model import durations
from .model.authorization import AuthorizationRule
from .model.entities import (
    EntityStatus,
    QueueDescription,
    SubscriptionDescription,
    TopicDescription,
    check_child_name,
    check_entity_name,
)
from .model.errors import ArgumentError, PartitionUnavailable, ShardbusError
from .model.filters import (
    CORRELATION_FIELDS,
    EmptyRuleAction,
    Rule,
    RuleAction,
    RuleFilter,
    build_action,
    build_filter,
    sql_filter,
)
from .model.tiers import Tier, TierRules
from .namespace import Namespace
from .registry.quotas import quota_breach

__all__ = [
    "Config",
    "ConfigError",
    "NamespaceConfig",
    "QueueConfig",
    "SubscriptionConfig",
    "TopicConfig",
    "apply_config",
    "load_config",
    "open_namespace",
    "parse_duration",
    "read_config",
]

log = logging.getLogger(__name__)


class ConfigError(ArgumentError):
    """A configuration value is wrong. ``path`` locates it (``UserConfig.Namespaces[0].Queues[1].Name``) so the
    user can find it in a file of hundreds of entities; ``reason`` says what is wrong with it."""

    def __init__(self, path: str, reason: str, source: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.source = source
        message = f"{path}: {reason}" if path else reason
        if source:
            message += f" (in {source})"
        super().__init__(message)


# ---------------------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------------------


def parse_duration(text: str) -> timedelta:
    """An ISO-8601 duration (``PT1M``, ``P1D``) or a .NET TimeSpan string (``00:01:00``, ``1.00:00:00``) as a
    timedelta: ``model.durations.parse_duration``, its refusal a ConfigError (and a non-string named in JSON's words).
    """
    if not isinstance(text, str):
        raise ConfigError("", f"a duration must be a string such as 'PT1M', not {_type_name(text)}")
    try:
        return durations.parse_duration(text)
    except ArgumentError as exc:
        raise ConfigError("", str(exc)) from None


# ---------------------------------------------------------------------------------------------------------
# The parsed shape
# ---------------------------------------------------------------------------------------------------------


class Setting(NamedTuple):
    """A property the config sets explicitly: the key as written and its JSON value (for error messages)."""

    key: str
    raw: Any


@dataclass
class QueueConfig:
    """A queue as the config describes it. ``settings`` maps the description fields the config sets to how it
    set them: only those are enforced on an existing queue."""

    description: QueueDescription
    path: str
    settings: dict[str, Setting] = field(default_factory=dict)


@dataclass
class SubscriptionConfig:
    """A subscription and its rules; ``rules`` empty means "a new one gets ``$Default``, an existing one keeps
    whatever rules it has"."""

    description: SubscriptionDescription
    path: str
    settings: dict[str, Setting] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)


@dataclass
class TopicConfig:
    description: TopicDescription
    path: str
    settings: dict[str, Setting] = field(default_factory=dict)
    subscriptions: list[SubscriptionConfig] = field(default_factory=list)


@dataclass
class NamespaceConfig:
    """One entry of ``UserConfig.Namespaces``. ``tier`` and ``premium_partitions`` are None when the config does
    not say (the namespace then keeps, or is created with, its own)."""

    name: str
    tier: Tier | None = None
    premium_partitions: int | None = None
    queues: list[QueueConfig] = field(default_factory=list)
    topics: list[TopicConfig] = field(default_factory=list)
    path: str = "UserConfig.Namespaces[0]"
    authorization_rules: list[AuthorizationRule] = field(default_factory=list)  # beside the root key's rule

    @property
    def tier_rules(self) -> TierRules:
        """The rules the config is checked against before a namespace is at hand (standard when unsaid)."""
        return TierRules.of(self.tier or Tier.STANDARD, self.premium_partitions)


@dataclass
class Config:
    """A whole file: its namespaces and its ``Logging.Type`` targets (``("File",)``, ``("Console", "File")``)."""

    namespaces: list[NamespaceConfig]
    logging: tuple[str, ...] = ("File",)
    source: str | None = None


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------


class _Object(dict):
    """A JSON object that remembers keys the file repeated (plain json.loads keeps the last silently)."""

    duplicates: tuple[str, ...] = ()


def _object_pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    repeated = []
    for key, value in pairs:
        if key in obj:
            repeated.append(key)
        obj[key] = value
    obj.duplicates = tuple(repeated)
    return obj


def read_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> Config:
    """Parse and validate a config file (a path) or an already-loaded mapping; raises ConfigError.

    Validation covers everything that does not need the namespace (shapes, types, names, durations, ranges
    for the config's Sku, SQL syntax, duplicates); :func:`apply_config` checks the rest before changing anything.
    """
    where: str | None = None
    if isinstance(source, Mapping):
        data: Any = source
    else:
        where = str(source)
        try:
            text = Path(source).read_text(encoding="utf-8-sig")  # files written by .NET tools often carry a BOM
        except OSError as exc:
            raise ConfigError("", f"cannot read the config file: {exc.strerror or exc}", where) from None
        try:
            data = json.loads(text, object_pairs_hook=_object_pairs)
        except json.JSONDecodeError as exc:
            raise ConfigError("", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", where) from None
    try:
        return _parse_root(data, where)
    except ConfigError as exc:
        if where and not exc.source:
            raise ConfigError(exc.path, exc.reason, where) from None
        raise


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> list[NamespaceConfig]:
    """The namespaces of a config file or mapping (see :func:`read_config`)."""
    return read_config(source).namespaces


def _parse_root(data: Any, where: str | None) -> Config:
    root = _members(data, "", ("UserConfig", "$schema"), "the config root")
    if "UserConfig" not in root:
        raise ConfigError("", "the config has no 'UserConfig' object (the emulator's Config.json format)")
    user_key, user_raw = root["UserConfig"]
    user = _members(user_raw, user_key, ("Namespaces", "Logging"), "UserConfig")
    logging_targets: tuple[str, ...] = ("File",)
    if "Logging" in user and user["Logging"][1] is not None:
        logging_targets = _parse_logging(user["Logging"][1], f"{user_key}.{user['Logging'][0]}")
    if "Namespaces" not in user:
        raise ConfigError(user_key, "'Namespaces' is required: list at least one namespace")
    ns_key, ns_list = user["Namespaces"]
    items = _array(ns_list, f"{user_key}.{ns_key}", required=True)
    if not items:
        raise ConfigError(f"{user_key}.{ns_key}", "list at least one namespace")
    namespaces: list[NamespaceConfig] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(items):
        path = f"{user_key}.{ns_key}[{i}]"
        ns = _parse_namespace(raw, path)
        first = seen.setdefault(ns.name.lower(), path)
        if first != path:
            raise ConfigError(f"{path}.Name", f"namespace '{ns.name}' is already defined at {first}")
        namespaces.append(ns)
    return Config(namespaces, logging_targets, where)


_LOGGING_TARGETS = ("File", "Console")


def _parse_logging(raw: Any, path: str) -> tuple[str, ...]:
    members = _members(raw, path, ("Type",), "Logging")
    if "Type" not in members:
        raise ConfigError(path, "'Type' is required ('File', 'Console' or 'File,Console')")
    key, value = members["Type"]
    text = _string(value, f"{path}.{key}")
    targets = []
    for part in text.split(","):
        match = next((t for t in _LOGGING_TARGETS if t.lower() == part.strip().lower()), None)
        if match is None or match in targets:
            raise ConfigError(
                f"{path}.{key}", f"{text!r} is not a logging type: use 'File', 'Console' or 'File,Console'"
            )
        targets.append(match)
    return tuple(targets)


_NAMESPACE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._\-]{0,48}[A-Za-z0-9])?")


def _parse_namespace(raw: Any, path: str) -> NamespaceConfig:
    allowed = ("Name", "Queues", "Topics", "Sku", "PremiumMessagingPartitions", "AuthorizationRules")
    members = _members(raw, path, allowed, "a namespace")
    name = _required_name(members, path, "namespace")
    if not _NAMESPACE_NAME.fullmatch(name):
        raise ConfigError(
            f"{path}.{members['Name'][0]}",
            f"{name!r} is not a valid namespace name: use 1-50 letters, digits, periods, hyphens and underscores, "
            "starting and ending with a letter or digit (it names the namespace's data folder)",
        )
    tier: Tier | None = None
    if "Sku" in members and members["Sku"][1] is not None:
        key, value = members["Sku"]
        text = _string(value, f"{path}.{key}")
        try:
            tier = Tier.parse(text)
        except ArgumentError:
            raise ConfigError(f"{path}.{key}", f"{text!r} is not a Sku: use 'Basic', 'Standard' or 'Premium'") from None
    partitions: int | None = None
    if "PremiumMessagingPartitions" in members and members["PremiumMessagingPartitions"][1] is not None:
        key, value = members["PremiumMessagingPartitions"]
        partitions = _integer(value, f"{path}.{key}")
        try:
            TierRules.of(tier or Tier.STANDARD, partitions)
        except ArgumentError as exc:
            reason = (
                f"{partitions} is not a partition count: a premium namespace has 1, 2 or 4"
                if tier is Tier.PREMIUM
                else f"{partitions}: messaging partitions are chosen only for a premium namespace "
                '(set "Sku": "Premium")'
            )
            raise ConfigError(f"{path}.{key}", reason) from exc
    ns = NamespaceConfig(name, tier, partitions, path=path)
    if "AuthorizationRules" in members and members["AuthorizationRules"][1] is not None:
        key, value = members["AuthorizationRules"]
        ns.authorization_rules = _parse_authorization_rules(value, f"{path}.{key}")
    rules = ns.tier_rules
    names: dict[str, str] = {}  # queues and topics share one name space in a namespace

    def claim(entity_name: str, entity_path: str, kind: str) -> None:
        first = names.setdefault(entity_name.lower(), entity_path)
        if first != entity_path:
            raise ConfigError(
                f"{entity_path}.Name",
                f"{kind} name '{entity_name}' is already used at {first} (queue and topic names are "
                "case-insensitive and share one namespace)",
            )

    if "Queues" in members:
        key, value = members["Queues"]
        for i, item in enumerate(_array(value, f"{path}.{key}")):
            queue = _parse_queue(item, f"{path}.{key}[{i}]", rules)
            claim(queue.description.name, queue.path, "queue")
            ns.queues.append(queue)
    if "Topics" in members:
        key, value = members["Topics"]
        for i, item in enumerate(_array(value, f"{path}.{key}")):
            topic = _parse_topic(item, f"{path}.{key}[{i}]", rules)
            claim(topic.description.name, topic.path, "topic")
            ns.topics.append(topic)
    return ns


ROOT_KEY_NAME = "RootManageSharedAccessKey"


def _parse_authorization_rules(raw: Any, path: str) -> list[AuthorizationRule]:
    """A namespace's shared access policies; the root one is ``serve --key``'s and cannot be redefined here."""
    rules: list[AuthorizationRule] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(_array(raw, path)):
        item_path = f"{path}[{i}]"
        fields_allowed = ("KeyName", "PrimaryKey", "SecondaryKey", "Rights")
        members = _members(item, item_path, fields_allowed, "an authorization rule")
        for required in ("KeyName", "PrimaryKey", "Rights"):
            if required not in members or members[required][1] is None:
                raise ConfigError(item_path, f"'{required}' is required")
        name_key, name_raw = members["KeyName"]
        key_name = _string(name_raw, f"{item_path}.{name_key}")
        if key_name.lower() == ROOT_KEY_NAME.lower():
            raise ConfigError(
                f"{item_path}.{name_key}",
                f"{ROOT_KEY_NAME} is the root rule, whose key is given with `shardbus serve --key`: use another name",
            )
        first = seen.setdefault(key_name.lower(), item_path)
        if first != item_path:
            raise ConfigError(f"{item_path}.{name_key}", f"'{key_name}' is already defined at {first}")
        keys = {}
        for field_name in ("PrimaryKey", "SecondaryKey"):
            if field_name in members and members[field_name][1] is not None:
                k, v = members[field_name]
                keys[field_name] = _string(v, f"{item_path}.{k}")
                if not keys[field_name]:
                    raise ConfigError(f"{item_path}.{k}", "a key cannot be empty")
        rights_key, rights_raw = members["Rights"]
        rights_path = f"{item_path}.{rights_key}"
        rights = tuple(_string(r, f"{rights_path}[{j}]") for j, r in enumerate(_array(rights_raw, rights_path)))
        try:
            rule = AuthorizationRule(key_name, keys["PrimaryKey"], keys.get("SecondaryKey", ""), rights).validate()
        except ArgumentError as exc:
            raise ConfigError(item_path, str(exc)) from None
        rules.append(rule)
    return rules


# --- properties ------------------------------------------------------------------------------------------


def _forward_target(value: Any, path: str) -> str | None:
    text = _string(value, path)
    if text == "":
        return None  # the emulator's sample writes "" for "no forwarding"
    try:
        return check_entity_name(text, "forwarding destination")
    except ArgumentError as exc:
        raise ConfigError(path, f"{text!r} is not a queue or topic name: {exc}") from None


def _status(value: Any, path: str) -> EntityStatus:
    text = _string(value, path)
    try:
        return EntityStatus.parse(text)
    except ArgumentError:
        raise ConfigError(
            path, f"{text!r} is not a status: use 'Active', 'Disabled', 'SendDisabled' or 'ReceiveDisabled'"
        ) from None


def _duration(value: Any, path: str) -> timedelta:
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise ConfigError(path, exc.reason) from None


Converter = Callable[[Any, str], Any]
# JSON property name -> (description field, converter), per entity kind.
_COMMON: dict[str, tuple[str, Converter]] = {
    "Status": ("status", _status),
    "AutoDeleteOnIdle": ("auto_delete_on_idle", _duration),
    "UserMetadata": ("user_metadata", lambda v, p: _string(v, p)),
    "EnableBatchedOperations": ("enable_batched_operations", lambda v, p: _boolean(v, p)),
}
_MESSAGING: dict[str, tuple[str, Converter]] = {
    "DeadLetteringOnMessageExpiration": ("dead_lettering_on_message_expiration", lambda v, p: _boolean(v, p)),
    "DefaultMessageTimeToLive": ("default_message_time_to_live", _duration),
    "ForwardDeadLetteredMessagesTo": ("forward_dead_lettered_messages_to", _forward_target),
    "ForwardTo": ("forward_to", _forward_target),
    "LockDuration": ("lock_duration", _duration),
    "MaxDeliveryCount": ("max_delivery_count", lambda v, p: _integer(v, p)),
    "RequiresSession": ("requires_session", lambda v, p: _boolean(v, p)),
}
_SENDER: dict[str, tuple[str, Converter]] = {
    "DefaultMessageTimeToLive": ("default_message_time_to_live", _duration),
    "DuplicateDetectionHistoryTimeWindow": ("duplicate_detection_history_time_window", _duration),
    "RequiresDuplicateDetection": ("requires_duplicate_detection", lambda v, p: _boolean(v, p)),
    "EnablePartitioning": ("enable_partitioning", lambda v, p: _boolean(v, p)),
    "MaxSizeInMegabytes": ("max_size_in_megabytes", lambda v, p: _integer(v, p)),
    "MaxMessageSizeInKilobytes": ("max_message_size_in_kilobytes", lambda v, p: _integer(v, p)),
}
_QUEUE_PROPERTIES = {**_MESSAGING, **_SENDER, **_COMMON}
_TOPIC_PROPERTIES = {
    **_SENDER,
    "SupportOrdering": ("support_ordering", lambda v, p: _boolean(v, p)),
    **_COMMON,
}
_SUBSCRIPTION_PROPERTIES = {
    **_MESSAGING,
    "DeadLetteringOnFilterEvaluationExceptions": (
        "dead_lettering_on_filter_evaluation_exceptions",
        lambda v, p: _boolean(v, p),
    ),
    **_COMMON,
}


def _parse_properties(
    raw: Any, path: str, table: dict[str, tuple[str, Converter]], kind: str
) -> tuple[dict[str, Any], dict[str, Setting]]:
    values: dict[str, Any] = {}
    settings: dict[str, Setting] = {}
    if raw is None:
        return values, settings
    for canonical, (key, value) in _members(raw, path, tuple(table), f"{kind} Properties").items():
        if value is None:
            continue  # null: not set (exporters write nulls for what the source entity lacks)
        field_name, convert = table[canonical]
        values[field_name] = convert(value, f"{path}.{key}")
        settings[field_name] = Setting(key, value)
    return values, settings


def _check_description(desc: Any, settings: dict[str, Setting], path: str, tier: TierRules) -> None:
    """Validate with the core's own rules, blaming the property at fault rather than the whole entity.

    The entity with only its name is checked first (a topic in a basic namespace is the topic's fault), then
    each set property alone on top of the defaults, then the whole description (for combinations).
    """
    cls = type(desc)
    try:
        cls(name=desc.name).validate(tier)
    except ShardbusError as exc:
        raise ConfigError(path, str(exc)) from None
    for field_name, setting in settings.items():
        try:
            cls(name=desc.name, **{field_name: getattr(desc, field_name)}).validate(tier)
        except ShardbusError as exc:
            raise ConfigError(f"{path}.Properties.{setting.key}", _value_reason(setting.raw, str(exc))) from None
    try:
        desc.validate(tier)
    except ShardbusError as exc:
        raise ConfigError(f"{path}.Properties", str(exc)) from None


def _value_reason(raw: Any, message: str) -> str:
    """``"LockDuration 0:10:00 is out of range: ..."`` -> ``"'PT10M' is out of range: ..."``: the value as the
    user wrote it, the core's explanation."""
    shown = _show(raw)
    for marker in (" is out of range", " is invalid"):
        at = message.find(marker)
        if at >= 0:
            return shown + message[at:]
    return f"{shown} is not allowed: {message}"


def _parse_queue(raw: Any, path: str, tier: TierRules) -> QueueConfig:
    members = _members(raw, path, ("Name", "Properties"), "a queue")
    name = _entity_name(members, path, "queue")
    props_key, props_raw = members.get("Properties", ("Properties", None))
    values, settings = _parse_properties(props_raw, f"{path}.{props_key}", _QUEUE_PROPERTIES, "queue")
    desc = QueueDescription(name=name, **values)
    _check_description(desc, settings, path, tier)
    _check_self_forwarding(desc, settings, path, name)
    return QueueConfig(desc, path, settings)


def _parse_topic(raw: Any, path: str, tier: TierRules) -> TopicConfig:
    members = _members(raw, path, ("Name", "Properties", "Subscriptions"), "a topic")
    name = _entity_name(members, path, "topic")
    props_key, props_raw = members.get("Properties", ("Properties", None))
    values, settings = _parse_properties(props_raw, f"{path}.{props_key}", _TOPIC_PROPERTIES, "topic")
    desc = TopicDescription(name=name, **values)
    _check_description(desc, settings, path, tier)
    topic = TopicConfig(desc, path, settings)
    if "Subscriptions" in members:
        key, value = members["Subscriptions"]
        seen: dict[str, str] = {}
        for i, item in enumerate(_array(value, f"{path}.{key}")):
            sub = _parse_subscription(item, f"{path}.{key}[{i}]", tier, name)
            first = seen.setdefault(sub.description.name.lower(), sub.path)
            if first != sub.path:
                raise ConfigError(
                    f"{sub.path}.Name", f"subscription '{sub.description.name}' is already defined at {first}"
                )
            topic.subscriptions.append(sub)
    return topic


def _parse_subscription(raw: Any, path: str, tier: TierRules, topic: str) -> SubscriptionConfig:
    members = _members(raw, path, ("Name", "Properties", "Rules"), "a subscription")
    name = _child_name(members, path, "subscription")
    props_key, props_raw = members.get("Properties", ("Properties", None))
    values, settings = _parse_properties(props_raw, f"{path}.{props_key}", _SUBSCRIPTION_PROPERTIES, "subscription")
    desc = SubscriptionDescription(name=name, topic_name=topic, **values)
    _check_description(desc, settings, path, tier)
    sub = SubscriptionConfig(desc, path, settings)
    if "Rules" in members:
        key, value = members["Rules"]
        seen: dict[str, str] = {}
        for i, item in enumerate(_array(value, f"{path}.{key}")):
            rule_path = f"{path}.{key}[{i}]"
            rule = _parse_rule(item, rule_path)
            first = seen.setdefault(rule.name.lower(), rule_path)
            if first != rule_path:
                raise ConfigError(f"{rule_path}.Name", f"rule '{rule.name}' is already defined at {first}")
            sub.rules.append(rule)
    return sub


def _check_self_forwarding(desc: Any, settings: dict[str, Setting], path: str, own: str) -> None:
    for field_name in ("forward_to", "forward_dead_lettered_messages_to"):
        target = getattr(desc, field_name, None)
        if target and target.lower() == own.lower():
            setting = settings[field_name]
            raise ConfigError(
                f"{path}.Properties.{setting.key}", f"{_show(setting.raw)}: an entity cannot forward to itself"
            )


# --- rules -------------------------------------------------------------------------------------------------

# CorrelationFilter JSON name -> CorrelationFilter argument, in alphabetical order (as error messages list them).
_CORRELATION_FIELDS = {f.service: f.attr for f in sorted(CORRELATION_FIELDS, key=lambda f: f.service)}


def _parse_rule(raw: Any, path: str) -> Rule:
    members = _members(raw, path, ("Name", "Properties"), "a rule")
    name = _child_name(members, path, "rule")
    if "Properties" not in members or members["Properties"][1] is None:
        raise ConfigError(path, "'Properties' is required: a rule needs a FilterType and its filter")
    props_key, props_raw = members["Properties"]
    ppath = f"{path}.{props_key}"
    props = _members(props_raw, ppath, ("FilterType", "CorrelationFilter", "SqlFilter", "Action"), "rule Properties")
    if "FilterType" not in props or props["FilterType"][1] is None:
        raise ConfigError(ppath, "'FilterType' is required: 'Correlation' or 'Sql'")
    type_key, type_raw = props["FilterType"]
    filter_type = _string(type_raw, f"{ppath}.{type_key}").lower()
    if filter_type not in ("correlation", "sql"):
        raise ConfigError(f"{ppath}.{type_key}", f"{type_raw!r} is not a filter type: use 'Correlation' or 'Sql'")
    wanted, other = (
        ("CorrelationFilter", "SqlFilter") if filter_type == "correlation" else ("SqlFilter", "CorrelationFilter")
    )
    if other in props and props[other][1] is not None:
        raise ConfigError(
            f"{ppath}.{props[other][0]}", f"FilterType is {type_raw!r}, so a {other} does not belong here"
        )
    if wanted not in props or props[wanted][1] is None:
        raise ConfigError(ppath, f"FilterType is {type_raw!r}, so '{wanted}' is required")
    filter_key, filter_raw = props[wanted]
    fpath = f"{ppath}.{filter_key}"
    rule_filter = (
        _correlation_filter(filter_raw, fpath) if filter_type == "correlation" else _sql_filter(filter_raw, fpath)
    )
    action: RuleAction = EmptyRuleAction()
    if "Action" in props and props["Action"][1] is not None:
        action_key, action_raw = props["Action"]
        action = _sql_action(action_raw, f"{ppath}.{action_key}")
    return Rule(name, rule_filter, action)


def _correlation_filter(raw: Any, path: str) -> RuleFilter:
    members = _members(raw, path, (*_CORRELATION_FIELDS, "Properties"), "CorrelationFilter")
    fields: dict[str, Any] = {}
    properties = None
    for canonical, (key, value) in members.items():
        if value is None:
            continue
        if canonical == "Properties":
            properties = _user_properties(value, f"{path}.{key}")
        else:
            fields[_CORRELATION_FIELDS[canonical]] = _string(value, f"{path}.{key}")
    try:
        return build_filter("correlation", fields=fields, properties=properties)
    except ArgumentError as exc:
        raise ConfigError(path, str(exc)) from None


def _user_properties(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected an object of application property values, not {_type_name(raw)}")
    _no_duplicates(raw, path)
    result: dict[str, Any] = {}
    for key, value in raw.items():
        item = _join(path, key)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ConfigError(
                item, f"a correlation filter compares with a string, number, boolean or null, not {_type_name(value)}"
            )
        result[key] = value
    return result


def _sql_filter(raw: Any, path: str) -> RuleFilter:
    members = _members(raw, path, ("SqlExpression",), "SqlFilter")
    if "SqlExpression" not in members or members["SqlExpression"][1] is None:
        raise ConfigError(path, "'SqlExpression' is required")
    key, value = members["SqlExpression"]
    expression = _string(value, f"{path}.{key}")
    try:
        return sql_filter(expression)  # "1=1" / "1=0" are the true and false filters: both route faster
    except ArgumentError as exc:
        raise ConfigError(f"{path}.{key}", f"{expression!r} is not a valid SQL filter: {exc}") from None


def _sql_action(raw: Any, path: str) -> RuleAction:
    members = _members(raw, path, ("SqlExpression",), "Action")
    if "SqlExpression" not in members or members["SqlExpression"][1] is None:
        return EmptyRuleAction()  # "Action": {} is how exporters write "no action"
    key, value = members["SqlExpression"]
    expression = _string(value, f"{path}.{key}")
    if not expression.strip():
        return EmptyRuleAction()
    try:
        return build_action(expression)
    except ArgumentError as exc:
        raise ConfigError(f"{path}.{key}", f"{expression!r} is not a valid SQL rule action: {exc}") from None


# --- JSON shape helpers ------------------------------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _join(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def _show(raw: Any) -> str:
    """A value as the user wrote it, short enough for one line of a message."""
    text = repr(raw) if isinstance(raw, str) else json.dumps(raw, default=str)
    return text if len(text) <= 80 else f"{text[:60]}...{text[-10:]} ({len(text)} characters)"


def _no_duplicates(obj: Mapping[str, Any], path: str) -> None:
    for key in getattr(obj, "duplicates", ()):
        raise ConfigError(_join(path, key), "is given more than once")
    for key in obj:
        if not isinstance(key, str):
            raise ConfigError(path, f"property names must be strings, not {key!r}")


def _members(raw: Any, path: str, allowed: tuple[str, ...], what: str) -> dict[str, tuple[str, Any]]:
    """An object's members as ``{canonical name: (name as written, value)}``: names match case-insensitively,
    an unknown name is an error with a suggestion."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected an object, not {_type_name(raw)}")
    _no_duplicates(raw, path)
    canonical = {name.lower(): name for name in allowed}
    result: dict[str, tuple[str, Any]] = {}
    for key, value in raw.items():
        name = canonical.get(key.lower())
        if name is None:
            close = difflib.get_close_matches(key.lower(), list(canonical), n=1, cutoff=0.75)
            hint = f"; did you mean '{canonical[close[0]]}'?" if close else ""
            raise ConfigError(
                _join(path, key), f"unknown property of {what}{hint} (known: {', '.join(sorted(allowed))})"
            )
        if name in result:
            raise ConfigError(_join(path, key), f"repeats '{result[name][0]}' (names are case-insensitive)")
        result[name] = (key, value)
    return result


def _array(raw: Any, path: str, required: bool = False) -> list[Any]:
    if raw is None and not required:
        return []  # exporters write null for an empty list
    if not isinstance(raw, list | tuple):
        raise ConfigError(path, f"expected an array, not {_type_name(raw)}")
    return list(raw)


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, f"expected a string, not {_type_name(value)} ({_show(value)})")
    return value


def _boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"expected true or false, not {_type_name(value)} ({_show(value)})")
    return value


def _integer(value: Any, path: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"expected a whole number, not {_type_name(value)} ({_show(value)})")
    if not -(2**31) <= value < 2**31:
        raise ConfigError(path, f"{value} is out of range: it must fit in a 32-bit integer")
    return value


def _required_name(members: dict[str, tuple[str, Any]], path: str, kind: str) -> str:
    if "Name" not in members or members["Name"][1] is None:
        raise ConfigError(path, f"'Name' is required: every {kind} needs a name")
    key, value = members["Name"]
    return _string(value, f"{path}.{key}")


def _entity_name(members: dict[str, tuple[str, Any]], path: str, kind: str) -> str:
    name = _required_name(members, path, kind)
    try:
        return check_entity_name(name, kind)
    except ArgumentError as exc:
        raise ConfigError(f"{path}.{members['Name'][0]}", str(exc)) from None


def _child_name(members: dict[str, tuple[str, Any]], path: str, kind: str) -> str:
    name = _required_name(members, path, kind)
    try:
        return check_child_name(name, kind)
    except ArgumentError as exc:
        raise ConfigError(f"{path}.{members['Name'][0]}", str(exc)) from None


# ---------------------------------------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------------------------------------

_FORWARDING = ("forward_to", "forward_dead_lettered_messages_to")


@dataclass
class _SenderStep:
    """Create or update one queue or topic; forwarding to entities that do not exist yet waits for phase 2."""

    item: QueueConfig | TopicConfig
    create: bool
    changes: dict[str, Any]
    deferred: dict[str, Any] = field(default_factory=dict)


@dataclass
class _SubscriptionStep:
    topic: str
    item: SubscriptionConfig
    create: bool
    changes: dict[str, Any]
    add_rules: list[Rule] = field(default_factory=list)
    drop_rules: list[str] = field(default_factory=list)  # existing rule names, removed after the additions


def apply_config(namespace: Namespace, config: NamespaceConfig) -> None:
    """Make ``namespace`` contain what ``config`` describes: create what is missing, update what differs.

    The whole config is checked against the namespace first (its tier, names already taken by the other kind
    of entity, properties that cannot change once created, forwarding destinations, quotas, partitions that are
    down), so a config that cannot be applied changes nothing. Applying the same config again changes nothing.
    Entities the config does not mention are left as they are.
    """
    with namespace._lock:  # no management call interleaves between the check and the changes
        senders, subscriptions = _plan(namespace, config)
        _execute(namespace, senders, subscriptions)


def open_namespace(data_dir: str | os.PathLike[str], config: NamespaceConfig, **options: Any) -> Namespace:
    """Open (or create) the namespace a config entry names, with its Sku and partitions, and apply it.

    ``options`` go to :meth:`Namespace.open` (``quotas``, ``clock``...). The namespace is closed again if the
    config cannot be applied.
    """
    if config.tier is not None:
        options.setdefault("tier", config.tier)
    if config.premium_partitions is not None:
        options.setdefault("premium_partitions", config.premium_partitions)
    try:
        namespace = Namespace.open(data_dir, name=config.name, **options)
    except ArgumentError as exc:  # an existing namespace of another tier or partition count
        raise ConfigError(config.path, str(exc)) from None
    try:
        apply_config(namespace, config)
    except BaseException:
        namespace.close()
        raise
    return namespace


def _plan(namespace: Namespace, config: NamespaceConfig) -> tuple[list[_SenderStep], list[_SubscriptionStep]]:
    path = config.path
    if config.name.lower() != namespace.name.lower():
        raise ConfigError(f"{path}.Name", f"'{config.name}' is not the namespace it is applied to ('{namespace.name}')")
    tier = namespace.tier
    if config.tier is not None and config.tier is not tier.tier:
        raise ConfigError(
            f"{path}.Sku",
            f"'{config.tier.value}' does not match namespace '{namespace.name}', which is {tier.tier.value}: "
            "a namespace's tier is fixed when it is created",
        )
    if config.premium_partitions is not None and config.premium_partitions != tier.premium_partitions:
        raise ConfigError(
            f"{path}.PremiumMessagingPartitions",
            f"{config.premium_partitions} does not match namespace '{namespace.name}', which has "
            f"{tier.premium_partitions}: the partition count is fixed when the namespace is created",
        )
    premium = tier.tier is Tier.PREMIUM
    queues = {q.name.lower(): q for q in namespace.list_queues()}
    topics = {t.name.lower(): t for t in namespace.list_topics()}
    existing_names = set(queues) | set(topics)
    all_names = existing_names | {q.description.name.lower() for q in config.queues}
    all_names |= {t.description.name.lower() for t in config.topics}

    senders: list[_SenderStep] = []
    subscriptions: list[_SubscriptionStep] = []
    for item in [*config.queues, *config.topics]:
        desc = item.description
        own, other = (queues, topics) if isinstance(item, QueueConfig) else (topics, queues)
        _check_description(desc, item.settings, item.path, tier)
        key = desc.name.lower()
        if key in other:
            raise ConfigError(
                f"{item.path}.Name",
                f"'{desc.name}' already exists in namespace '{namespace.name}' as a {other[key].kind.value}, "
                f"not a {desc.kind.value}",
            )
        _check_forward_targets(item, all_names, namespace.name)
        current = own.get(key)
        if current is None:
            step = _SenderStep(item, True, {f: getattr(desc, f) for f in item.settings})
        else:
            skip = ("enable_partitioning",) if premium else ()  # premium partitions everything anyway
            step = _SenderStep(item, False, _changes(current, item, skip))
        for name in _FORWARDING:
            target = step.changes.get(name)
            if target and target.lower() not in existing_names:
                step.deferred[name] = step.changes.pop(name)
        if step.create or step.changes or step.deferred:
            senders.append(step)
        if isinstance(item, TopicConfig):
            subscriptions.extend(_plan_subscriptions(namespace, item, current is not None, all_names))

    _check_quotas(namespace, config, senders, subscriptions)
    touched = {s.item.description.name for s in senders} | {s.topic for s in subscriptions}
    for path_name in sorted(n for n in touched if n.lower() in existing_names):
        if namespace.availability(path_name) != "Available":
            raise PartitionUnavailable(
                f"Cannot apply the config to namespace '{namespace.name}': '{path_name}' has partitions that are "
                "unavailable, and every change acts on all of them. Nothing was changed; retry when they are back."
            )
    return senders, subscriptions


def _plan_subscriptions(
    namespace: Namespace, topic: TopicConfig, topic_exists: bool, all_names: set[str]
) -> list[_SubscriptionStep]:
    topic_name = topic.description.name
    existing = {s.name.lower(): s for s in namespace.list_subscriptions(topic_name)} if topic_exists else {}
    steps = []
    for item in topic.subscriptions:
        desc = item.description
        _check_description(desc, item.settings, item.path, namespace.tier)
        _check_forward_targets(item, all_names, namespace.name)
        current = existing.get(desc.name.lower())
        if current is None:
            changes = {f: getattr(desc, f) for f in item.settings}
            steps.append(_SubscriptionStep(topic_name, item, True, changes, add_rules=list(item.rules)))
            continue
        step = _SubscriptionStep(topic_name, item, False, _changes(current, item, ()))
        if item.rules:
            rules = {r.name.lower(): r for r in namespace.list_rules(topic_name, desc.name)}
            wanted = {r.name.lower() for r in item.rules}
            for rule in item.rules:
                have = rules.get(rule.name.lower())
                if have is None:
                    step.add_rules.append(rule)
                elif have.name != rule.name or have.filter != rule.filter or have.action != rule.action:
                    step.drop_rules.append(have.name)  # no in-place rule update: replace it
                    step.add_rules.append(rule)
            step.drop_rules.extend(r.name for k, r in rules.items() if k not in wanted)
        if step.changes or step.add_rules or step.drop_rules:
            steps.append(step)
    return steps


def _changes(
    current: Any, item: QueueConfig | TopicConfig | SubscriptionConfig, skip: tuple[str, ...]
) -> dict[str, Any]:
    """The set properties whose value differs from the entity's; refuses changes to immutable ones."""
    changes = {}
    for name, setting in item.settings.items():
        if name in skip:
            continue
        old, new = getattr(current, name), getattr(item.description, name)
        if name in _FORWARDING:
            same = (old or "").lower() == (new or "").lower()  # entity names are case-insensitive
        else:
            same = old == new
        if same:
            continue
        if name in type(current).immutable:
            kind = current.kind.value
            raise ConfigError(
                f"{item.path}.Properties.{setting.key}",
                f"{_show(setting.raw)} differs from the existing {kind} '{current.name}' ({_show(_as_json(old))}), "
                f"and {setting.key} can only be set when a {kind} is created: delete the {kind} or change the config",
            )
        changes[name] = new
    return changes


def _as_json(value: Any) -> Any:
    if isinstance(value, timedelta):
        return str(value)
    return value


def _check_forward_targets(item: QueueConfig | SubscriptionConfig | TopicConfig, names: set[str], ns: str) -> None:
    for name in _FORWARDING:
        target = getattr(item.description, name, None)
        if name in item.settings and target and target.lower() not in names:
            setting = item.settings[name]
            raise ConfigError(
                f"{item.path}.Properties.{setting.key}",
                f"{_show(setting.raw)} is neither a queue or topic of namespace '{ns}' nor defined in this config",
            )


def _check_quotas(
    namespace: Namespace,
    config: NamespaceConfig,
    senders: list[_SenderStep],
    subscriptions: list[_SubscriptionStep],
) -> None:
    """The namespace's quotas, checked up front so that the last entity of a config cannot fail half-way."""
    quotas = namespace.quotas
    created = [s for s in senders if s.create]
    total = len(namespace.list_queues()) + len(namespace.list_topics()) + len(created)
    if quota_breach(quotas, entities=total):
        raise ConfigError(
            config.path,
            f"the config would bring namespace '{namespace.name}' to {total} queues and topics; its quota is "
            f"{quotas.max_entities}",
        )
    if quotas.max_partitioned_entities is not None:
        partitioned = sum(
            1 for d in [*namespace.list_queues(), *namespace.list_topics()] if d.enable_partitioning
        ) + sum(1 for s in created if s.item.description.enable_partitioning)
        if quota_breach(quotas, partitioned=partitioned):
            raise ConfigError(
                config.path,
                f"the config would bring namespace '{namespace.name}' to {partitioned} partitioned queues and "
                f"topics; its quota is {quotas.max_partitioned_entities}",
            )
    for topic in config.topics:
        name = topic.description.name
        exists = any(t.name.lower() == name.lower() for t in namespace.list_topics())
        have = {s.name.lower() for s in namespace.list_subscriptions(name)} if exists else set()
        count = len(have | {s.description.name.lower() for s in topic.subscriptions})
        if quota_breach(quotas, subscriptions=count):
            raise ConfigError(
                topic.path,
                f"topic '{name}' would have {count} subscriptions; the quota is {quotas.max_subscriptions_per_topic}",
            )
        for sub in topic.subscriptions:
            if quota_breach(quotas, rules=len(sub.rules)):
                raise ConfigError(
                    f"{sub.path}.Rules",
                    f"{len(sub.rules)} rules; the quota is {quotas.max_rules_per_subscription} per subscription",
                )


def _execute(namespace: Namespace, senders: list[_SenderStep], subscriptions: list[_SubscriptionStep]) -> None:
    for step in senders:  # phase 1: queues and topics
        desc = step.item.description
        is_queue = isinstance(step.item, QueueConfig)
        if step.create:
            log.info("config: creating %s '%s'", desc.kind.value, desc.name)
            create = namespace.create_queue if is_queue else namespace.create_topic
            create(desc.name, **step.changes)
        elif step.changes:
            log.info("config: updating %s '%s': %s", desc.kind.value, desc.name, ", ".join(step.changes))
            update = namespace.update_queue if is_queue else namespace.update_topic
            update(desc.name, **step.changes)
    for step in senders:  # phase 2: forwarding to entities phase 1 created
        if step.deferred:
            log.info("config: forwarding %s '%s'", step.item.description.kind.value, step.item.description.name)
            update = namespace.update_queue if isinstance(step.item, QueueConfig) else namespace.update_topic
            update(step.item.description.name, **step.deferred)
    for sub in subscriptions:  # phase 3: subscriptions and their rules
        name = sub.item.description.name
        if sub.create:
            log.info("config: creating subscription '%s/%s'", sub.topic, name)
            first = sub.add_rules[0] if sub.add_rules else None  # never a moment with $Default when rules are listed
            namespace.create_subscription(sub.topic, name, default_rule=first, **sub.changes)
            for rule in sub.add_rules[1:]:
                namespace.create_rule(sub.topic, name, rule)
            continue
        if sub.changes:
            log.info("config: updating subscription '%s/%s': %s", sub.topic, name, ", ".join(sub.changes))
            namespace.update_subscription(sub.topic, name, **sub.changes)
        replaced = {r.lower() for r in sub.drop_rules}
        for rule in sub.add_rules:  # new names first, so the subscription never goes without its rules
            if rule.name.lower() not in replaced:
                namespace.create_rule(sub.topic, name, rule)
        for rule_name in sub.drop_rules:
            namespace.delete_rule(sub.topic, name, rule_name)
        for rule in sub.add_rules:
            if rule.name.lower() in replaced:
                namespace.create_rule(sub.topic, name, rule)
