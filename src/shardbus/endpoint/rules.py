"""Subscription rules on the wire: ``com.microsoft:add-rule``, ``remove-rule`` and ``enumerate-rules``.

The formats are the real service's, as its official clients speak them. Sources: Microsoft's "AMQP 1.0 in
Azure Service Bus: request-response operations" page (Rule operations), Azure.Messaging.ServiceBus
``Amqp/AmqpRuleManager.cs``, ``AmqpMessageConverter.GetRuleDescriptionMap`` and ``Amqp/Framing/*Codec.cs``,
azure-messaging-servicebus ``ManagementChannel`` / ``MessageUtils`` / ``ServiceBusConstants``:

Filters and actions are told apart by their ``kind`` and built from their parts by ``model.filters`` (the one
translation every form of a rule shares, correlation field names included); this module holds the AMQP form.

**add-rule request** (amqp-value map): ``rule-name`` (string) and ``rule-description``, a *map* holding exactly
one of ``sql-filter`` (map ``{expression}``) or ``correlation-filter`` (map ``{correlation-id, message-id, to,
reply-to, label, session-id, reply-to-session-id, content-type, properties}``), plus ``sql-rule-action``
(map ``{expression}``, or null / an empty map for no action) and, from .NET and Java, ``rule-name`` again.
Clients have no way to send a true or false filter other than ``sql-filter`` ``1=1`` / ``1=0``; those come
back as :class:`TrueFilter` / :class:`FalseFilter` (what the .NET TrueRuleFilter / FalseRuleFilter mean).

**enumerate-rules response**: ``{"rules": [ {"rule-description": <described list>}, ... ]}`` (an AMQP *list*
of maps; .NET casts it to ``List<object>``). The described types and their ulong codes:

==========================================  ======================  ==========================================
descriptor                                  code                    list fields
==========================================  ======================  ==========================================
``com.microsoft:rule-description:list``     0x0000013700000004      filter, action, name, created-at
``com.microsoft:sql-filter:list``           0x000001370000006       expression, compatibility-level (20)
``com.microsoft:true-filter:list``          0x000001370000007       (none)
``com.microsoft:false-filter:list``         0x000001370000008       (none)
``com.microsoft:correlation-filter:list``   0x000001370000009       correlation-id, message-id, to, reply-to,
                                                                    label, session-id, reply-to-session-id,
                                                                    content-type, properties
``com.microsoft:empty-rule-action:list``    0x0000013700000005      (none)
``com.microsoft:sql-rule-action:list``      0x0000013700000006      expression, compatibility-level (20)
==========================================  ======================  ==========================================

The filter codes really are one hex digit shorter than the others (0x00000013:70000006, not
0x00000137:00000006): Microsoft's page, the .NET and Java clients and the Rust crate all carry them that
way and compare numerically, so that is what the service sends. Decoding also accepts the descriptor names
and, in the filter position, the "long" 0x00000137:0000000N spelling.

**Extension (not in any official client):** SQL parameters travel as a ``parameters`` map in the add-rule
``sql-filter`` / ``sql-rule-action`` maps and as a trailing third list field of the described SQL filter and
action, written only when there are parameters. Clients that know only two fields skip it
(Microsoft.Azure.Amqp ``DescribedList.DecodeValue`` ignores extra fields; Java reads index 0).

Values in correlation properties and SQL parameters map as the .NET client maps application properties:
``datetime`` ⇄ timestamp (ms, UTC), ``timedelta`` ⇄ ``com.microsoft:timespan`` (described long ticks);
``com.microsoft:datetime-offset`` decodes to a UTC datetime and ``com.microsoft:uri`` to its string.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..amqp.types import Decimal32, Decimal64, Decimal128, Described, Int, Long, Symbol, Timestamp
from ..entity.entity import SubscriptionEntity
from ..model.errors import ArgumentError, ArgumentOutOfRange, EntityNotFound, InvalidOperation
from ..model.filters import (
    CORRELATION_FIELDS,
    CorrelationFilter,
    EmptyRuleAction,
    Rule,
    RuleAction,
    RuleFilter,
    SqlFilter,
    SqlRuleAction,
    build_action,
    build_filter,
    sql_filter,
)
from ..model.message import SubQueue

__all__ = [
    "CORRELATION_FILTER_CODE",
    "EMPTY_RULE_ACTION_CODE",
    "FALSE_FILTER_CODE",
    "RULE_DESCRIPTION_CODE",
    "SQL_FILTER_CODE",
    "SQL_RULE_ACTION_CODE",
    "TRUE_FILTER_CODE",
    "decode_action",
    "decode_filter",
    "decode_rule",
    "encode_action",
    "encode_filter",
    "encode_rule",
    "encode_rule_map",
    "page_of",
    "refuse_in_transaction",
    "rule_created_times",
    "rule_from_request",
    "rule_name_of",
    "subscription_of",
]

RULE_DESCRIPTION_CODE = 0x0000013700000004
EMPTY_RULE_ACTION_CODE = 0x0000013700000005
SQL_RULE_ACTION_CODE = 0x0000013700000006
SQL_FILTER_CODE = 0x000001370000006  # sic: 0x00000013_70000006, as the service and every client have it
TRUE_FILTER_CODE = 0x000001370000007
FALSE_FILTER_CODE = 0x000001370000008
CORRELATION_FILTER_CODE = 0x000001370000009

RULE_DESCRIPTION_NAME = "com.microsoft:rule-description:list"
SQL_FILTER_NAME = "com.microsoft:sql-filter:list"
TRUE_FILTER_NAME = "com.microsoft:true-filter:list"
FALSE_FILTER_NAME = "com.microsoft:false-filter:list"
CORRELATION_FILTER_NAME = "com.microsoft:correlation-filter:list"
EMPTY_RULE_ACTION_NAME = "com.microsoft:empty-rule-action:list"
SQL_RULE_ACTION_NAME = "com.microsoft:sql-rule-action:list"

SQL_COMPATIBILITY_LEVEL = 20  # what the service reports for SQL filters and actions

TIMESPAN = "com.microsoft:timespan"  # .NET TimeSpan: described long, 100 ns ticks
DATETIME_OFFSET = "com.microsoft:datetime-offset"  # .NET DateTimeOffset: described long, UTC ticks since 0001
URI = "com.microsoft:uri"

# descriptor (code or name) -> filter kind; the filter position also accepts the 0x00000137:0000000N spelling.
_FILTER_KINDS: dict[int | str, str] = {
    SQL_FILTER_CODE: "sql",
    TRUE_FILTER_CODE: "true",
    FALSE_FILTER_CODE: "false",
    CORRELATION_FILTER_CODE: "correlation",
    0x0000013700000006: "sql",
    0x0000013700000007: "true",
    0x0000013700000008: "false",
    0x0000013700000009: "correlation",
    SQL_FILTER_NAME: "sql",
    TRUE_FILTER_NAME: "true",
    FALSE_FILTER_NAME: "false",
    CORRELATION_FILTER_NAME: "correlation",
}
_FILTER_CODES = {"sql": SQL_FILTER_CODE, "true": TRUE_FILTER_CODE, "false": FALSE_FILTER_CODE}
_ACTION_KINDS: dict[int | str, str] = {
    EMPTY_RULE_ACTION_CODE: "empty",
    SQL_RULE_ACTION_CODE: "sql",
    EMPTY_RULE_ACTION_NAME: "empty",
    SQL_RULE_ACTION_NAME: "sql",
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_TICKS_AT_EPOCH = 621355968000000000  # .NET ticks of 1970-01-01T00:00:00Z


# ---------------------------------------------------------------------------------------------------------
# Values (correlation properties, SQL parameters, correlation system fields)
# ---------------------------------------------------------------------------------------------------------


def _to_wire(value: Any) -> Any:
    """A rule value as the AMQP value the .NET client would send for it."""
    if isinstance(value, datetime):
        aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value
        return Timestamp((aware - _EPOCH) // _MS)
    if isinstance(value, timedelta):
        return Described(Symbol(TIMESPAN), Long(value // timedelta(microseconds=1) * 10))
    return value


def _from_wire(value: Any, what: str) -> Any:
    """An AMQP value as a rule value the model accepts; anything else is an ArgumentError naming ``what``."""
    if value is None or isinstance(value, bool | uuid.UUID | float):
        return value
    if isinstance(value, Timestamp):
        return _EPOCH + int(value) * _MS
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return value if type(value) is str else str(value)  # symbol / char -> string
    if isinstance(value, bytes) and not isinstance(value, Decimal32 | Decimal64 | Decimal128):
        return bytes(value)
    if isinstance(value, Described) and isinstance(value.descriptor, str):
        kind, raw = str(value.descriptor), value.value
        if kind == TIMESPAN and isinstance(raw, int):
            return timedelta(microseconds=int(raw) // 10)
        if kind == DATETIME_OFFSET and isinstance(raw, int):
            return _EPOCH + timedelta(microseconds=(int(raw) - _TICKS_AT_EPOCH) // 10)
        if kind == URI and isinstance(raw, str):
            return str(raw)
    raise ArgumentError(f"The {what} has a value of an unsupported AMQP type: {value!r}.")


def _values_to_wire(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _to_wire(value) for key, value in values.items()}


def _values_from_wire(values: Any, what: str) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ArgumentError(f"The {what} must be a map, not {type(values).__name__}.")
    result: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise ArgumentError(f"The {what} names must be non-empty strings, not {key!r}.")
        result[str(key)] = _from_wire(value, f"{what} '{key}'")
    return result


def _string(value: Any, what: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ArgumentError(f"The {what} must be a string, not {value!r}.")
    return str(value)


def _fields(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ArgumentError(f"The {what} must be a described list, not {value!r}.")
    return list(value)


def _field(fields: list[Any], index: int) -> Any:
    return fields[index] if index < len(fields) else None  # trailing nulls may be omitted


def _descriptor_key(descriptor: int | str) -> int | str:
    return str(descriptor) if isinstance(descriptor, str) else int(descriptor)


# ---------------------------------------------------------------------------------------------------------
# Model -> wire (the enumerate-rules response)
# ---------------------------------------------------------------------------------------------------------


def encode_filter(rule_filter: RuleFilter) -> Described:
    """The described list the service sends for a filter."""
    kind = rule_filter.kind
    if kind == "true" or kind == "false":
        return Described(_FILTER_CODES[kind], [])
    if isinstance(rule_filter, SqlFilter):
        fields: list[Any] = [rule_filter.expression, Int(SQL_COMPATIBILITY_LEVEL)]
        if rule_filter.parameters:
            fields.append(_values_to_wire(rule_filter.parameters))
        return Described(SQL_FILTER_CODE, fields)
    if isinstance(rule_filter, CorrelationFilter):
        fields = [_to_wire(getattr(rule_filter, f.attr)) for f in CORRELATION_FIELDS]
        fields.append(_values_to_wire(rule_filter.properties))
        return Described(CORRELATION_FILTER_CODE, fields)
    raise ArgumentError(f"Cannot describe a rule filter of type {type(rule_filter).__name__} on the wire.")


def encode_action(action: RuleAction | None) -> Described:
    """The described list the service sends for an action."""
    if action is None or action.kind == "empty":
        return Described(EMPTY_RULE_ACTION_CODE, [])
    if isinstance(action, SqlRuleAction):
        fields: list[Any] = [action.expression, Int(SQL_COMPATIBILITY_LEVEL)]
        if action.parameters:
            fields.append(_values_to_wire(action.parameters))
        return Described(SQL_RULE_ACTION_CODE, fields)
    raise ArgumentError(f"Cannot describe a rule action of type {type(action).__name__} on the wire.")


def encode_rule(rule: Rule, created_at: datetime | float | None = None) -> Described:
    """``com.microsoft:rule-description:list``: filter, action, name and (when known) created-at.

    ``created_at`` is a datetime or Unix seconds.
    """
    fields: list[Any] = [encode_filter(rule.filter), encode_action(rule.action), rule.name]
    if created_at is not None:
        if not isinstance(created_at, datetime):
            created_at = datetime.fromtimestamp(created_at, UTC)
        fields.append(_to_wire(created_at))
    return Described(RULE_DESCRIPTION_CODE, fields)


def encode_rule_map(rule: Rule) -> dict[str, Any]:
    """The add-rule ``rule-description`` map as the .NET and Java clients build it (plus ``parameters``).

    True and false filters go as ``sql-filter`` ``1=1`` / ``1=0``, the only way a client can say them.
    """
    description: dict[str, Any] = {}
    f = rule.filter
    if f.kind == "true" or f.kind == "false":
        description["sql-filter"] = {"expression": "1=1" if f.kind == "true" else "1=0"}
    elif isinstance(f, SqlFilter):
        sql: dict[str, Any] = {"expression": f.expression}
        if f.parameters:
            sql["parameters"] = _values_to_wire(f.parameters)
        description["sql-filter"] = sql
    elif isinstance(f, CorrelationFilter):
        correlation = {c.amqp: _to_wire(getattr(f, c.attr)) for c in CORRELATION_FIELDS}
        correlation["properties"] = _values_to_wire(f.properties)
        description["correlation-filter"] = correlation
    else:
        raise ArgumentError(f"Cannot send a rule filter of type {type(f).__name__}.")
    action = rule.action
    if isinstance(action, SqlRuleAction):
        sql_action: dict[str, Any] = {"expression": action.expression}
        if action.parameters:
            sql_action["parameters"] = _values_to_wire(action.parameters)
        description["sql-rule-action"] = sql_action
    else:
        description["sql-rule-action"] = None
    description["rule-name"] = rule.name
    return description


# ---------------------------------------------------------------------------------------------------------
# Wire -> model
# ---------------------------------------------------------------------------------------------------------


def decode_filter(value: Any) -> RuleFilter:
    """A described filter list (``com.microsoft:*-filter:list``) as the model's filter."""
    if not isinstance(value, Described):
        raise ArgumentError(f"A rule filter must be a described list, not {value!r}.")
    kind = _FILTER_KINDS.get(_descriptor_key(value.descriptor))
    if kind is None:
        raise ArgumentError(
            f"Unknown rule filter type {value.descriptor!r}: expected com.microsoft:sql-filter:list, "
            "correlation-filter:list, true-filter:list or false-filter:list."
        )
    if kind == "true" or kind == "false":
        return build_filter(kind)
    fields = _fields(value.value, f"{kind} filter")
    if kind == "sql":
        expression = _string(_field(fields, 0), "SQL filter expression")
        return build_filter(kind, expression, _values_from_wire(_field(fields, 2), "SQL filter parameter"))
    system = {
        f.attr: _from_wire(_field(fields, i), f"correlation filter {f.amqp}") for i, f in enumerate(CORRELATION_FIELDS)
    }
    properties = _values_from_wire(_field(fields, len(CORRELATION_FIELDS)), "correlation filter property")
    return build_filter(kind, fields=system, properties=properties)


def decode_action(value: Any) -> RuleAction:
    """A described action list (or null) as the model's action."""
    if value is None:
        return EmptyRuleAction()
    if not isinstance(value, Described):
        raise ArgumentError(f"A rule action must be a described list, not {value!r}.")
    kind = _ACTION_KINDS.get(_descriptor_key(value.descriptor))
    if kind is None:
        raise ArgumentError(
            f"Unknown rule action type {value.descriptor!r}: expected com.microsoft:empty-rule-action:list "
            "or sql-rule-action:list."
        )
    if kind == "empty":
        return EmptyRuleAction()
    fields = _fields(value.value, "SQL rule action")
    expression = _string(_field(fields, 0), "SQL rule action expression")
    return build_action(expression, _values_from_wire(_field(fields, 2), "SQL rule action parameter"))


def _sql_filter_from_map(value: Any) -> RuleFilter:
    if isinstance(value, Described):
        return decode_filter(value)
    sql = _string_keys(value, "sql-filter")
    expression = _string(sql.get("expression"), "sql-filter expression")
    parameters = _values_from_wire(sql.get("parameters"), "SQL filter parameter")
    return sql_filter(expression, parameters)  # type: ignore[arg-type]


def _correlation_filter_from_map(value: Any) -> RuleFilter:
    if isinstance(value, Described):
        return decode_filter(value)
    correlation = _string_keys(value, "correlation-filter")
    system = {f.attr: _from_wire(correlation.get(f.amqp), f"correlation filter {f.amqp}") for f in CORRELATION_FIELDS}
    properties = _values_from_wire(correlation.get("properties"), "correlation filter property")
    return build_filter("correlation", fields=system, properties=properties)


def _action_from_map(value: Any) -> RuleAction:
    if value is None or isinstance(value, Described):
        return decode_action(value)
    action = _string_keys(value, "sql-rule-action")
    expression = action.get("expression")
    if isinstance(expression, Described) and isinstance(expression.value, list):
        expression = _field(expression.value, 0)  # the Rust crate wraps it in the described action
    if expression is None:
        return EmptyRuleAction()  # null or {} is "no action" (the Rust crate sends {})
    expression = _string(expression, "sql-rule-action expression")
    return build_action(expression, _values_from_wire(action.get("parameters"), "SQL rule action parameter"))


def _string_keys(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ArgumentError(f"The {what} must be a map, not {value!r}.")
    return {str(k) if isinstance(k, str) else k: v for k, v in value.items()}


_MAP_FILTERS = {"sql-filter": _sql_filter_from_map, "correlation-filter": _correlation_filter_from_map}


def decode_rule(value: Any, name: str | None = None) -> Rule:
    """A rule description as a ``Rule``: the described ``com.microsoft:rule-description:list`` (what
    enumerate-rules returns) or the add-rule ``rule-description`` map. ``name`` overrides the name inside."""
    if isinstance(value, Described):
        if _descriptor_key(value.descriptor) not in (RULE_DESCRIPTION_CODE, RULE_DESCRIPTION_NAME):
            raise ArgumentError(f"Expected com.microsoft:rule-description:list, not descriptor {value.descriptor!r}.")
        fields = _fields(value.value, "rule description")
        rule_filter = _field(fields, 0)
        if rule_filter is None:
            raise ArgumentError("The rule description has no filter.")
        rule_name = name if name is not None else _string(_field(fields, 2), "rule name")
        return Rule(rule_name, decode_filter(rule_filter), decode_action(_field(fields, 1)))  # type: ignore[arg-type]
    description = _string_keys(value, "rule-description")
    found = [key for key in description if isinstance(key, str) and key.endswith("-filter")]
    unknown = [key for key in found if key not in _MAP_FILTERS]
    if unknown:
        raise ArgumentError(
            f"Unknown rule filter type '{unknown[0]}': the rule-description takes sql-filter or correlation-filter."
        )
    present = [key for key in found if description[key] is not None]
    if len(present) != 1:
        raise ArgumentError(
            "The rule-description needs exactly one of sql-filter and correlation-filter"
            + (f", not both ({', '.join(present)})." if present else ".")
        )
    rule_filter = _MAP_FILTERS[present[0]](description[present[0]])
    rule_name = name if name is not None else _string(description.get("rule-name"), "rule-name")
    return Rule(rule_name, rule_filter, _action_from_map(description.get("sql-rule-action")))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Request helpers for the $management handlers
# ---------------------------------------------------------------------------------------------------------


def rule_name_of(body: Mapping[str, Any]) -> str:
    """The request's ``rule-name`` (add-rule clients repeat it inside ``rule-description``)."""
    name = body.get("rule-name")
    if name is None and isinstance(body.get("rule-description"), Mapping):
        name = _string_keys(body["rule-description"], "rule-description").get("rule-name")
    if name is None:
        raise ArgumentError("The request needs 'rule-name'.")
    return _string(name, "rule-name")  # type: ignore[return-value]


def rule_from_request(body: Mapping[str, Any]) -> Rule:
    """The rule an add-rule request body describes."""
    description = body.get("rule-description")
    if description is None:
        raise ArgumentError("The request needs 'rule-description'.")
    return decode_rule(description, rule_name_of(body))


def subscription_of(namespace: Any, node: str) -> tuple[str, str]:
    """(topic, subscription) of a subscription's management node (``<topic>/Subscriptions/<sub>``),
    matched case-insensitively; rules live on no other node."""
    try:
        target, sub_queue = namespace.resolve(node)
    except EntityNotFound:
        if namespace.exists(node):  # a topic: its node has no rules of its own
            target, sub_queue = None, SubQueue.MAIN
        else:
            raise
    if not isinstance(target, SubscriptionEntity) or sub_queue != SubQueue.MAIN:
        raise InvalidOperation(
            f"Rules are managed on a subscription's $management node ('<topic>/Subscriptions/<subscription>"
            f"/$management'), not on '{node}/$management'."
        )
    return target.topic.path, target.description.name


def refuse_in_transaction(transaction_id: Any, verb: str, rule_name: str) -> None:
    """Rule changes cannot join a transaction (the service's InvalidOperationException → amqp:not-allowed)."""
    if transaction_id is not None:
        raise InvalidOperation(
            f"The rule '{rule_name}' cannot be {verb} within a transaction: rule operations are not transactional."
        )


def page_of(body: Mapping[str, Any]) -> tuple[int, int | None]:
    """enumerate-rules ``skip`` (default 0) and ``top`` (default: all), both non-negative integers."""
    bounds: list[int | None] = []
    for key, default in (("skip", 0), ("top", None)):
        value = body.get(key)
        if value is None:
            bounds.append(default)
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ArgumentError(f"'{key}' must be an integer, not {value!r}.")
        elif value < 0:
            raise ArgumentOutOfRange(f"'{key}' must not be negative, not {value}.")
        else:
            bounds.append(int(value))
    return bounds[0] or 0, bounds[1]


def rule_created_times(namespace: Any, topic: str, subscription: str) -> dict[str, float]:
    """When each rule of a subscription was created (Unix seconds), from the catalog."""
    sub = namespace._subscription(topic, subscription)
    with namespace._lock:
        rows = namespace.catalog.rules().get(sub.slot, [])
    return {name: created for name, _rule, created in rows}
