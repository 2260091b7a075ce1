"""The Service Bus ATOM documents: request bodies to description properties and rules, and back to XML.

Shapes are the service's (``SERVICEBUS_AMQP.md`` §10.4). Request descriptions arrive in the SB namespace (often as
the default namespace inherited from the ``entry``); only writable properties are read, read-only ones an update
re-sends (``MessageCount``, ``CreatedAt``, ...) are ignored. Responses put the description element in the SB
namespace (the SDK sees an empty ``content`` otherwise), count details in the 2011/06 namespace, and ``i:`` for
XML-schema-instance types.

The property mapping is a table per entity kind: XML element → description attribute and value codec. The
render order is the SDK's declared order; read-only values come from an ``EntityView`` (runtime counts, times,
availability).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..model.authorization import CLAIM_TYPE, AuthorizationRule
from ..model.entities import DEFAULT_RULE_NAME, EntityKind, EntityStatus, RuntimeProperties
from ..model.errors import ArgumentError
from ..model.filters import (
    CORRELATION_FIELDS,
    CorrelationFilter,
    EmptyRuleAction,
    Rule,
    RuleAction,
    RuleFilter,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
    build_action,
    build_filter,
)
from .xmlvalues import (
    XSD_NS,
    format_bool,
    format_duration,
    format_timestamp,
    format_typed_value,
    parse_bool,
    parse_duration,
    parse_int,
    parse_typed_value,
)

ATOM_NS = "http://www.w3.org/2005/Atom"
SB_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
COUNT_NS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI_TYPE = f"{{{XSI_NS}}}type"
MAX_BODY = 1024 * 1024


# ---------------------------------------------------------------------------------------------------------------
# value codecs: (parse text → value, format value → text)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Codec:
    parse: Callable[[str | None, str], Any]
    format: Callable[[Any], str]


DURATION = Codec(parse_duration, format_duration)
BOOL = Codec(parse_bool, format_bool)
INT = Codec(parse_int, str)
TEXT = Codec(lambda text, what: text or "", str)
STATUS = Codec(lambda text, what: EntityStatus.parse((text or "").strip()), lambda v: EntityStatus.parse(v).value)
# Forwarding targets: the SDK sends sb://<namespace>/<name>; the namespace keeps the name. Empty clears it.
FORWARD = Codec(lambda text, what: (text or "").strip() or None, str)


# Writable properties, by element name: (description attribute, codec).
_COMMON: dict[str, tuple[str, Codec]] = {
    "Status": ("status", STATUS),
    "AutoDeleteOnIdle": ("auto_delete_on_idle", DURATION),
    "UserMetadata": ("user_metadata", TEXT),
    "EnableBatchedOperations": ("enable_batched_operations", BOOL),
    "DefaultMessageTimeToLive": ("default_message_time_to_live", DURATION),
}
_MESSAGING: dict[str, tuple[str, Codec]] = {
    "LockDuration": ("lock_duration", DURATION),
    "RequiresSession": ("requires_session", BOOL),
    "DeadLetteringOnMessageExpiration": ("dead_lettering_on_message_expiration", BOOL),
    "MaxDeliveryCount": ("max_delivery_count", INT),
    "ForwardTo": ("forward_to", FORWARD),
    "ForwardDeadLetteredMessagesTo": ("forward_dead_lettered_messages_to", FORWARD),
}
_SIZE_AND_DEDUP: dict[str, tuple[str, Codec]] = {
    "MaxSizeInMegabytes": ("max_size_in_megabytes", INT),
    "MaxMessageSizeInKilobytes": ("max_message_size_in_kilobytes", INT),
    "RequiresDuplicateDetection": ("requires_duplicate_detection", BOOL),
    "DuplicateDetectionHistoryTimeWindow": ("duplicate_detection_history_time_window", DURATION),
    "EnablePartitioning": ("enable_partitioning", BOOL),
}
WRITABLE: dict[EntityKind, dict[str, tuple[str, Codec]]] = {
    EntityKind.QUEUE: {**_COMMON, **_MESSAGING, **_SIZE_AND_DEDUP},
    EntityKind.TOPIC: {**_COMMON, **_SIZE_AND_DEDUP, "SupportOrdering": ("support_ordering", BOOL)},
    EntityKind.SUBSCRIPTION: {
        **_COMMON,
        **_MESSAGING,
        "DeadLetteringOnFilterEvaluationExceptions": ("dead_lettering_on_filter_evaluation_exceptions", BOOL),
    },
}
RULE_HOLDERS = (EntityKind.QUEUE, EntityKind.TOPIC)  # entities that carry shared access rules
DESCRIPTION_ELEMENTS: dict[str, EntityKind] = {
    "QueueDescription": EntityKind.QUEUE,
    "TopicDescription": EntityKind.TOPIC,
    "SubscriptionDescription": EntityKind.SUBSCRIPTION,
}
ELEMENT_OF_KIND = {kind: element for element, kind in DESCRIPTION_ELEMENTS.items()}

# Element order per kind, as the SDK declares it (the SDK does not depend on it; people reading the XML may).
# fmt: off
ORDER: dict[EntityKind, tuple[str, ...]] = {
    EntityKind.QUEUE: (
        "LockDuration", "MaxSizeInMegabytes", "RequiresDuplicateDetection", "RequiresSession",
        "DefaultMessageTimeToLive", "DeadLetteringOnMessageExpiration", "DuplicateDetectionHistoryTimeWindow",
        "MaxDeliveryCount", "EnableBatchedOperations", "SizeInBytes", "MessageCount", "IsAnonymousAccessible",
        "AuthorizationRules", "Status", "CreatedAt", "UpdatedAt", "AccessedAt", "SupportOrdering", "CountDetails",
        "AutoDeleteOnIdle", "EnablePartitioning", "EntityAvailabilityStatus", "EnableExpress", "ForwardTo",
        "UserMetadata", "ForwardDeadLetteredMessagesTo", "MaxMessageSizeInKilobytes",
    ),
    EntityKind.TOPIC: (
        "DefaultMessageTimeToLive", "MaxSizeInMegabytes", "RequiresDuplicateDetection",
        "DuplicateDetectionHistoryTimeWindow", "EnableBatchedOperations", "SizeInBytes",
        "FilteringMessagesBeforePublishing", "IsAnonymousAccessible", "AuthorizationRules", "Status", "CreatedAt",
        "UpdatedAt", "AccessedAt", "SupportOrdering", "CountDetails", "SubscriptionCount", "SqlFilterCount",
        "CorrelationFilterCount", "AutoDeleteOnIdle", "EnablePartitioning", "EntityAvailabilityStatus",
        "EnableSubscriptionPartitioning", "EnableExpress", "UserMetadata", "MaxMessageSizeInKilobytes",
    ),
    EntityKind.SUBSCRIPTION: (
        "LockDuration", "RequiresSession", "DefaultMessageTimeToLive", "DeadLetteringOnMessageExpiration",
        "DeadLetteringOnFilterEvaluationExceptions", "MessageCount", "MaxDeliveryCount", "EnableBatchedOperations",
        "Status", "ForwardTo", "CreatedAt", "UpdatedAt", "AccessedAt", "CountDetails",
        "ForwardDeadLetteredMessagesTo", "AutoDeleteOnIdle", "EntityAvailabilityStatus", "UserMetadata",
    ),
}
# fmt: on


@dataclass(slots=True)
class EntityView:
    """What a description response shows besides the description itself."""

    description: Any
    runtime: RuntimeProperties
    created: float
    updated: float
    availability: str
    sb_base: str  # sb://host:port, for forwarding targets
    max_message_kb: int  # the entity's effective MaxMessageSizeInKilobytes
    counts: dict[str, int] = field(default_factory=dict)  # SubscriptionCount, SqlFilterCount, ...


def _element(name: str, text: str) -> str:
    return f"<{name}>{escape(text)}</{name}>"


def _count_details(rt: RuntimeProperties) -> str:
    counts = (
        ("ActiveMessageCount", rt.active_message_count),
        ("DeadLetterMessageCount", rt.dead_letter_message_count),
        ("ScheduledMessageCount", rt.scheduled_message_count),
        ("TransferMessageCount", rt.transfer_message_count),
        ("TransferDeadLetterMessageCount", rt.transfer_dead_letter_message_count),
    )
    inner = "".join(f"<d2p1:{name}>{value}</d2p1:{name}>" for name, value in counts)
    return f'<CountDetails xmlns:d2p1="{COUNT_NS}">{inner}</CountDetails>'


# Read-only elements: the whole element from the view ("" leaves it out).
COMPUTED: dict[str, Callable[[EntityView], str]] = {
    "SizeInBytes": lambda v: _element("SizeInBytes", str(v.runtime.size_in_bytes)),
    "MessageCount": lambda v: _element("MessageCount", str(v.runtime.total_message_count)),
    "IsAnonymousAccessible": lambda v: _element("IsAnonymousAccessible", "false"),
    "AuthorizationRules": lambda v: authorization_rules_xml(getattr(v.description, "authorization_rules", ())),
    "CreatedAt": lambda v: _element("CreatedAt", format_timestamp(v.created)),
    "UpdatedAt": lambda v: _element("UpdatedAt", format_timestamp(v.updated)),
    "AccessedAt": lambda v: _element("AccessedAt", format_timestamp(v.updated)),
    "SupportOrdering": lambda v: _element("SupportOrdering", "true"),
    "CountDetails": lambda v: _count_details(v.runtime),
    "EntityAvailabilityStatus": lambda v: _element("EntityAvailabilityStatus", v.availability),
    "EnableExpress": lambda v: _element("EnableExpress", "false"),
    "MaxMessageSizeInKilobytes": lambda v: _element("MaxMessageSizeInKilobytes", str(v.max_message_kb)),
    "FilteringMessagesBeforePublishing": lambda v: _element("FilteringMessagesBeforePublishing", "false"),
    "EnableSubscriptionPartitioning": lambda v: _element("EnableSubscriptionPartitioning", "false"),
    "SubscriptionCount": lambda v: _element("SubscriptionCount", str(v.counts.get("SubscriptionCount", 0))),
    "SqlFilterCount": lambda v: _element("SqlFilterCount", str(v.counts.get("SqlFilterCount", 0))),
    "CorrelationFilterCount": lambda v: _element(
        "CorrelationFilterCount", str(v.counts.get("CorrelationFilterCount", 0))
    ),
}


RULE_TYPE = "SharedAccessAuthorizationRule"


def authorization_rules_xml(rules: Iterable[AuthorizationRule]) -> str:
    """``<AuthorizationRules>`` as the service shows them (keys included: only Manage may read a description)."""
    items = []
    for rule in rules:
        rights = "".join(_element("AccessRights", r) for r in rule.rights)
        items.append(
            f'<AuthorizationRule i:type="{RULE_TYPE}">{_element("ClaimType", CLAIM_TYPE)}'
            f"{_element('ClaimValue', 'None')}<Rights>{rights}</Rights>"
            f"{_element('CreatedTime', format_timestamp(rule.created))}"
            f"{_element('ModifiedTime', format_timestamp(rule.modified))}{_element('KeyName', rule.key_name)}"
            f"{_element('PrimaryKey', rule.primary_key)}{_element('SecondaryKey', rule.secondary_key)}"
            "</AuthorizationRule>"
        )
    return f"<AuthorizationRules>{''.join(items)}</AuthorizationRules>"


def parse_authorization_rules(element: ET.Element) -> list[AuthorizationRule]:
    """``<AuthorizationRules>`` of a request: each ``<AuthorizationRule>`` (the SDK sends no ``i:type``; when one is
    given it must be the shared access kind) to a rule, validated when the description is built."""
    rules = []
    for item in element:
        if _local(item.tag) != "AuthorizationRule":
            raise ArgumentError(f"Unexpected '{_local(item.tag)}' in AuthorizationRules: expected AuthorizationRule.")
        kind = _xsi_type(item)
        if kind not in (None, RULE_TYPE):
            raise ArgumentError(f"Unsupported authorization rule type '{kind}': use {RULE_TYPE}.")
        claim_type = _text(item, "ClaimType")
        if claim_type not in (None, CLAIM_TYPE):
            raise ArgumentError(f"Unsupported authorization rule claim type '{claim_type}': use {CLAIM_TYPE}.")
        rights_element = _child(item, "Rights")
        rights = tuple((r.text or "").strip() for r in rights_element) if rights_element is not None else ()
        rules.append(
            AuthorizationRule(
                key_name=(_text(item, "KeyName") or "").strip(),
                primary_key=_text(item, "PrimaryKey") or "",
                secondary_key=_text(item, "SecondaryKey") or "",
                rights=rights,
            )
        )
    return rules


# Writable properties shown with their effective value (the default when the entity left them unset).
SHOWN_EFFECTIVE = frozenset({"MaxMessageSizeInKilobytes"})


def _render_property(name: str, view: EntityView, kind: EntityKind) -> str:
    if name in SHOWN_EFFECTIVE:
        return COMPUTED[name](view)
    writable = WRITABLE[kind].get(name)
    if writable is None:
        return COMPUTED[name](view)
    attr, codec = writable
    value = getattr(view.description, attr)
    if value is None:
        return ""
    if codec is FORWARD:
        return _element(name, f"{view.sb_base}/{value}")
    return _element(name, codec.format(value))


def description_xml(kind: EntityKind, view: EntityView) -> str:
    """The ``<QueueDescription>`` / ``<TopicDescription>`` / ``<SubscriptionDescription>`` element."""
    element = ELEMENT_OF_KIND[kind]
    body = "".join(_render_property(name, view, kind) for name in ORDER[kind])
    return f'<{element} xmlns="{SB_NS}" xmlns:i="{XSI_NS}">{body}</{element}>'


# ---------------------------------------------------------------------------------------------------------------
# request bodies
# ---------------------------------------------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element: ET.Element, name: str) -> ET.Element | None:
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def _content(body: bytes) -> ET.Element:
    """The element inside an ``<entry><content>`` request body."""
    if len(body) > MAX_BODY:
        raise ArgumentError(f"The request body is larger than {MAX_BODY} bytes.")
    if not body.strip():
        raise ArgumentError("The request has no body: send an ATOM entry with a description.")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise ArgumentError(f"The request body is not well-formed XML: {exc}.") from None
    content = _child(root, "content") if _local(root.tag) == "entry" else None
    if content is None or len(content) == 0:
        raise ArgumentError("The request body must be an ATOM entry whose content holds a description.")
    return content[0]


@dataclass(slots=True)
class ParsedDescription:
    kind: EntityKind
    properties: dict[str, Any]
    default_rule: Rule | None = None


def parse_description(body: bytes) -> ParsedDescription:
    """A PUT body to the entity kind and its writable properties (description attribute names)."""
    element = _content(body)
    kind = DESCRIPTION_ELEMENTS.get(_local(element.tag))
    if kind is None:
        raise ArgumentError(
            f"Unexpected '{_local(element.tag)}': expected QueueDescription, TopicDescription or "
            "SubscriptionDescription."
        )
    table = WRITABLE[kind]
    parsed = ParsedDescription(kind, {})
    for child in element:
        name = _local(child.tag)
        if name == "DefaultRuleDescription" and kind is EntityKind.SUBSCRIPTION:
            parsed.default_rule = rule_from_element(child, DEFAULT_RULE_NAME)
            continue
        if name == "AuthorizationRules" and kind in RULE_HOLDERS:
            parsed.properties["authorization_rules"] = parse_authorization_rules(child)
            continue
        entry = table.get(name)
        if entry is not None:
            attr, codec = entry
            parsed.properties[attr] = codec.parse(child.text, name)
    return parsed


def _key_values(element: ET.Element | None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if element is None:
        return result
    for pair in element:
        key, value = _child(pair, "Key"), _child(pair, "Value")
        if key is None or not key.text:
            raise ArgumentError("A rule parameter or property has no Key.")
        if value is None or value.get(f"{{{XSI_NS}}}nil") == "true":
            result[key.text] = None
        else:
            result[key.text] = parse_typed_value(value.get(XSI_TYPE), value.text)
    return result


def _text(element: ET.Element, name: str) -> str | None:
    child = _child(element, name)
    return None if child is None else (child.text or "")


# The ATOM API's filter and action types (the element's i:type) -> the model's kind, and back.
FILTER_KINDS = {"SqlFilter": "sql", "TrueFilter": "true", "FalseFilter": "false", "CorrelationFilter": "correlation"}
ACTION_KINDS = {"EmptyRuleAction": "empty", "SqlRuleAction": "sql"}
_FILTER_TYPES = {kind: name for name, kind in FILTER_KINDS.items()}
CORRELATION_SERVICE_NAMES = {f.attr: f.service for f in CORRELATION_FIELDS}


def _filter_from_element(element: ET.Element, kind: str) -> RuleFilter:
    if kind == "sql":
        expression = _text(element, "SqlExpression")
        if not expression:
            raise ArgumentError("A SqlFilter needs a SqlExpression.")
        return build_filter(kind, expression, _key_values(_child(element, "Parameters")))
    if kind == "correlation":
        fields = {
            f.attr: _text(element, f.service) for f in CORRELATION_FIELDS if _child(element, f.service) is not None
        }
        return build_filter(kind, fields=fields, properties=_key_values(_child(element, "Properties")))
    return build_filter(kind)


def _action_from_element(element: ET.Element, kind: str) -> RuleAction:
    if kind == "empty":
        return build_action(None)
    expression = _text(element, "SqlExpression")
    if not expression:
        raise ArgumentError("A SqlRuleAction needs a SqlExpression.")
    return build_action(expression, _key_values(_child(element, "Parameters")))


def _xsi_type(element: ET.Element) -> str | None:
    value = element.get(XSI_TYPE)
    return None if value is None else value.rsplit(":", 1)[-1]


def rule_from_element(element: ET.Element, name: str) -> Rule:
    """A ``<RuleDescription>`` (or ``<DefaultRuleDescription>``) element to a Rule named ``name``."""
    filter_element = _child(element, "Filter")
    rule_filter: RuleFilter = TrueFilter()
    if filter_element is not None:
        name_of_type = _xsi_type(filter_element) or (
            "SqlFilter" if _child(filter_element, "SqlExpression") else "TrueFilter"
        )
        kind = FILTER_KINDS.get(name_of_type)
        if kind is None:
            raise ArgumentError(
                f"Unknown filter type '{name_of_type}': use SqlFilter, CorrelationFilter, TrueFilter or FalseFilter."
            )
        rule_filter = _filter_from_element(filter_element, kind)
    action_element = _child(element, "Action")
    action: RuleAction = EmptyRuleAction()
    if action_element is not None and action_element.get(f"{{{XSI_NS}}}nil") != "true":
        name_of_type = _xsi_type(action_element) or "EmptyRuleAction"
        kind = ACTION_KINDS.get(name_of_type)
        if kind is None:
            raise ArgumentError(f"Unknown rule action type '{name_of_type}': use SqlRuleAction or EmptyRuleAction.")
        action = _action_from_element(action_element, kind)
    return Rule(name, rule_filter, action)


def parse_rule(body: bytes, name: str) -> Rule:
    element = _content(body)
    if _local(element.tag) != "RuleDescription":
        raise ArgumentError(f"Unexpected '{_local(element.tag)}': expected RuleDescription.")
    return rule_from_element(element, name)


# ---------------------------------------------------------------------------------------------------------------
# rules to XML
# ---------------------------------------------------------------------------------------------------------------
def _key_values_xml(name: str, values: Mapping[str, Any]) -> str:
    pairs = []
    for key, value in values.items():
        if value is None:
            value_xml = '<Value i:nil="true"/>'
        else:
            type_name, text = format_typed_value(value)
            value_xml = f'<Value xmlns:d6p1="{XSD_NS}" i:type="d6p1:{type_name}">{escape(text)}</Value>'
        pairs.append(f"<KeyValueOfstringanyType>{_element('Key', key)}{value_xml}</KeyValueOfstringanyType>")
    return f"<{name}>{''.join(pairs)}</{name}>"


def _sql_xml(tag: str, type_name: str, expression: str, parameters: Mapping[str, Any] | None) -> str:
    params = _key_values_xml("Parameters", parameters) if parameters else ""
    return (
        f'<{tag} i:type="{type_name}">{_element("SqlExpression", expression)}'
        f"<CompatibilityLevel>20</CompatibilityLevel>{params}</{tag}>"
    )


def filter_xml(rule_filter: RuleFilter) -> str:
    kind = rule_filter.kind
    if kind == "true" or kind == "false":
        return _sql_xml("Filter", _FILTER_TYPES[kind], "1=1" if kind == "true" else "1=0", None)
    if isinstance(rule_filter, SqlFilter):
        return _sql_xml("Filter", "SqlFilter", rule_filter.expression, rule_filter.parameters)
    if not isinstance(rule_filter, CorrelationFilter):
        raise ArgumentError(f"Unknown filter {rule_filter!r}")
    inner = [
        _element(f.service, str(value))
        for f in CORRELATION_FIELDS
        if (value := getattr(rule_filter, f.attr)) is not None
    ]
    inner.append(_key_values_xml("Properties", rule_filter.properties))
    return f'<Filter i:type="CorrelationFilter">{"".join(inner)}</Filter>'


def action_xml(action: RuleAction) -> str:
    if isinstance(action, SqlRuleAction):
        return _sql_xml("Action", "SqlRuleAction", action.expression, action.parameters)
    return '<Action i:type="EmptyRuleAction"/>'


def rule_xml(rule: Rule, created: float, element: str = "RuleDescription") -> str:
    return (
        f'<{element} xmlns="{SB_NS}" xmlns:i="{XSI_NS}">{filter_xml(rule.filter)}{action_xml(rule.action)}'
        f"{_element('CreatedAt', format_timestamp(created))}{_element('Name', rule.name)}</{element}>"
    )


# ---------------------------------------------------------------------------------------------------------------
# namespace, entries, feeds, errors
# ---------------------------------------------------------------------------------------------------------------
def namespace_info_xml(name: str, sku: str, created: float, messaging_units: int | None, partitions: int) -> str:
    units = _element("MessagingUnits", str(messaging_units)) if messaging_units is not None else ""
    return (
        f'<NamespaceInfo xmlns="{SB_NS}" xmlns:i="{XSI_NS}">'
        f"{_element('CreatedTime', format_timestamp(created))}{_element('MessagingSKU', sku)}{units}"
        f"{_element('ModifiedTime', format_timestamp(created))}{_element('Name', name)}"
        f"{_element('NamespaceType', 'Messaging')}"
        f"{_element('PartitionCount', str(partitions))}</NamespaceInfo>"  # ours: partitions of a partitioned entity
    )


def entry_xml(
    title: str, url: str, published: float, updated: float, author: str, content: str, root: bool = True
) -> str:
    xmlns = f' xmlns="{ATOM_NS}"' if root else ""
    return (
        f'<entry{xmlns}><id>{escape(url)}</id><title type="text">{escape(title)}</title>'
        f"<published>{format_timestamp(published)}</published><updated>{format_timestamp(updated)}</updated>"
        f'<author><name>{escape(author)}</name></author><link rel="self" href={quoteattr(url)}/>'
        f'<content type="application/xml">{content}</content></entry>'
    )


def feed_xml(title: str, self_url: str, next_url: str | None, updated: float, entries: Iterable[str]) -> str:
    next_link = f'<link rel="next" href={quoteattr(next_url)}/>' if next_url else ""
    return (
        f'<feed xmlns="{ATOM_NS}"><title type="text">{escape(title)}</title><id>{escape(self_url)}</id>'
        f'<updated>{format_timestamp(updated)}</updated><link rel="self" href={quoteattr(self_url)}/>'
        f"{next_link}{''.join(entries)}</feed>"
    )


def error_xml(code: int, detail: str) -> str:
    return f"<Error><Code>{code}</Code><Detail>{escape(detail)}</Detail></Error>"


def document(xml: str) -> bytes:
    return ('<?xml version="1.0" encoding="utf-8"?>' + xml).encode("utf-8")
