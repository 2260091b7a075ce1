"""Subscription rules: filters, actions, and how a topic message becomes a subscription's copies.

Semantics follow Microsoft's "Topic filters and actions" page:

* Rules **without** an action are OR-ed: however many of them match, the subscription gets one copy.
* Each matching rule **with** an action gets its own copy; the action runs on that copy only, and the copy
  carries a ``RuleName`` application property naming the rule.
* A message no rule matches is not delivered to the subscription.

Filters: :class:`TrueFilter`, :class:`FalseFilter` (both SQL filters, ``1=1`` / ``1=0``), :class:`SqlFilter`
and :class:`CorrelationFilter`. Actions: :class:`EmptyRuleAction` and :class:`SqlRuleAction`. Everything
parses and validates at construction (raising ArgumentError), so evaluation is only closure calls.

Rules persist as JSON-safe dicts (``to_dict`` / ``*_from_dict``); parameter and property values that JSON
lacks (datetime, timedelta, UUID, bytes, non-finite floats) are written as ``{"$type": ..., "value": ...}``.

Every outside form of a rule (Config.json in ``config.py``, the ATOM API's XML in ``http/atom.py``, ``$management``'s
AMQP in ``endpoint/rules.py``, the CLI's options in ``cli_commands/manage.py``) translates through what is here, each
with one reader and one writer: a filter's ``kind`` and an action's ``kind`` (what each form dispatches on, instead of
a chain of isinstance checks), ``CORRELATION_FIELDS`` (each correlation field's name in every form), and
:func:`build_filter`, :func:`sql_filter` and :func:`build_action` (parts back to a filter or action, the service's
``1=1`` / ``1=0`` spelling of the true and false filters included).
"""

from __future__ import annotations

import base64
import math
import operator
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from .errors import ArgumentError
from .message import Message
from .sqlfilter import EvaluationError, compile_action, compile_filter, find_user_key, values_equal

__all__ = [
    "CORRELATION_FIELDS",
    "RULE_NAME_PROPERTY",
    "CorrelationField",
    "CorrelationFilter",
    "EmptyRuleAction",
    "EvaluationError",
    "FalseFilter",
    "Routing",
    "Rule",
    "RuleAction",
    "RuleFilter",
    "SqlFilter",
    "SqlRuleAction",
    "TrueFilter",
    "action_from_dict",
    "build_action",
    "build_filter",
    "decode_value",
    "encode_value",
    "filter_from_dict",
    "route",
    "route_detailed",
    "sql_filter",
]

RULE_NAME_PROPERTY = "RuleName"  # set on every copy produced by a rule with an action

_SCALARS = (str, int, float, bool, datetime, timedelta, uuid.UUID, bytes)

# ---------------------------------------------------------------------------------------------------------
# Tagged JSON values
# ---------------------------------------------------------------------------------------------------------


def encode_value(value: Any) -> Any:
    """A JSON-safe form of one parameter or property value; plain JSON types pass through unchanged."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$type": "float", "value": repr(value)}
    if isinstance(value, datetime):
        return {"$type": "datetime", "value": value.isoformat()}
    if isinstance(value, timedelta):  # whole microseconds keep the round trip exact
        micros = (value.days * 86400 + value.seconds) * 10**6 + value.microseconds
        return {"$type": "timedelta", "value": micros}
    if isinstance(value, uuid.UUID):
        return {"$type": "uuid", "value": str(value)}
    if isinstance(value, bytes):
        return {"$type": "bytes", "value": base64.b64encode(value).decode("ascii")}
    raise ArgumentError(f"Unsupported rule value of type {type(value).__name__}: {value!r}")


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value`."""
    if not isinstance(value, dict):
        return value
    kind, raw = value.get("$type"), value.get("value")
    try:
        if kind == "float":
            return float(raw)
        if kind == "datetime":
            return datetime.fromisoformat(raw)
        if kind == "timedelta":
            return timedelta(microseconds=raw)
        if kind == "uuid":
            return uuid.UUID(raw)
        if kind == "bytes":
            return base64.b64decode(raw)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"Malformed tagged rule value {value!r}: {exc}") from None
    raise ArgumentError(f"Unknown tagged rule value {value!r}")


def _check_values(values: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """Copy a parameter/property map, refusing types a rule cannot hold or persist."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ArgumentError(f"{what} must be a mapping, not {type(values).__name__}")
    result: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise ArgumentError(f"{what} names must be non-empty strings, not {key!r}")
        if value is not None and not isinstance(value, _SCALARS):
            raise ArgumentError(f"{what} {key!r} has unsupported type {type(value).__name__}")
        result[key] = value
    return result


def _encode_map(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: encode_value(value) for key, value in values.items()}


def _decode_map(values: Any) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ArgumentError(f"Expected a mapping of rule values, got {values!r}")
    return {key: decode_value(value) for key, value in values.items()}


# ---------------------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------------------


class RuleFilter:
    """Base of the filters: ``matches`` never raises, ``evaluate`` raises EvaluationError on failure. ``kind``
    names the filter in every outside form: "sql", "true", "false" or "correlation"."""

    kind = ""

    def matches(self, message: Message) -> bool:
        try:
            return self.evaluate(message)
        except EvaluationError:
            return False

    def evaluate(self, message: Message) -> bool:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuleFilter) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class SqlFilter(RuleFilter):
    """A SQL-92-subset condition over system (``sys.``) and user properties; parsed once, here."""

    kind = "sql"

    def __init__(self, expression: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.parameters = _check_values(parameters, "SQL filter parameter")
        self._evaluate = compile_filter(expression, self.parameters)
        self.expression = expression

    def matches(self, message: Message) -> bool:
        try:
            return self._evaluate(message)
        except EvaluationError:
            return False

    def evaluate(self, message: Message) -> bool:
        return self._evaluate(message)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "sql", "expression": self.expression, "parameters": _encode_map(self.parameters)}


class TrueFilter(SqlFilter):
    """Selects every message (the ``$Default`` rule's filter); the service models it as SQL ``1=1``."""

    kind = "true"

    def __init__(self) -> None:
        super().__init__("1=1")

    def matches(self, message: Message) -> bool:
        return True

    def evaluate(self, message: Message) -> bool:
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"type": "true"}


class FalseFilter(SqlFilter):
    """Selects no message; the service models it as SQL ``1=0``."""

    kind = "false"

    def __init__(self) -> None:
        super().__init__("1=0")

    def matches(self, message: Message) -> bool:
        return False

    def evaluate(self, message: Message) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"type": "false"}


class CorrelationField(NamedTuple):
    """One system field a correlation filter compares, named as each form of a rule names it."""

    attr: str  # the CorrelationFilter keyword, the Message attribute it is matched against, the CLI option
    service: str  # the service's name: Config.json's and the ATOM API's element ("Label" is the old Subject)
    amqp: str  # the $management map key; the position here is its index in the described filter list


# In the service's order (the described correlation filter list's).
CORRELATION_FIELDS: tuple[CorrelationField, ...] = (
    CorrelationField("correlation_id", "CorrelationId", "correlation-id"),
    CorrelationField("message_id", "MessageId", "message-id"),
    CorrelationField("to", "To", "to"),
    CorrelationField("reply_to", "ReplyTo", "reply-to"),
    CorrelationField("subject", "Label", "label"),
    CorrelationField("session_id", "SessionId", "session-id"),
    CorrelationField("reply_to_session_id", "ReplyToSessionId", "reply-to-session-id"),
    CorrelationField("content_type", "ContentType", "content-type"),
)


class CorrelationFilter(RuleFilter):
    """Equality on a set of system fields and user properties, AND-ed: the cheap filter the docs recommend.

    String values compare case-sensitively; user property names match case-insensitively (as in SQL
    filters); a field left as None is not checked. At least one condition is required.
    """

    kind = "correlation"

    def __init__(
        self,
        correlation_id: Any = None,
        message_id: Any = None,
        to: str | None = None,
        reply_to: str | None = None,
        subject: str | None = None,
        session_id: str | None = None,
        reply_to_session_id: str | None = None,
        content_type: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        self.correlation_id = correlation_id
        self.message_id = message_id
        self.to = to
        self.reply_to = reply_to
        self.subject = subject
        self.session_id = session_id
        self.reply_to_session_id = reply_to_session_id
        self.content_type = content_type
        self.properties = _check_values(properties, "Correlation filter property")
        checks: list[tuple[Callable[[Message], Any], Any]] = []
        for name, _service, _amqp in CORRELATION_FIELDS:
            want = getattr(self, name)
            if want is None:
                continue
            if not isinstance(want, _SCALARS):
                raise ArgumentError(f"Correlation filter {name} has unsupported type {type(want).__name__}")
            checks.append((operator.attrgetter(name), want))
        if not checks and not self.properties:
            raise ArgumentError("A correlation filter needs at least one system property or user property")
        self._checks = tuple(checks)
        self._props = tuple(self.properties.items())

    def evaluate(self, message: Message) -> bool:
        for get, want in self._checks:
            value = get(message)
            if value is None or not (value == want if type(value) is str else values_equal(value, want)):
                return False
        if self._props:
            props = message.application_properties
            if not props:
                return False
            for name, want in self._props:
                value = props.get(name, props)  # the dict itself is a cheap "missing" marker
                if value is props:
                    key = find_user_key(props, name)
                    if not isinstance(key, str):
                        return False
                    value = props[key]
                if want is None:
                    if value is not None:
                        return False
                elif value is None or not values_equal(value, want):
                    return False
        return True

    matches = evaluate  # cannot fail, so skip the error guard

    def fields(self) -> dict[str, Any]:
        """The system fields this filter checks (attr -> value), in ``CORRELATION_FIELDS`` order."""
        return {f.attr: value for f in CORRELATION_FIELDS if (value := getattr(self, f.attr)) is not None}

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"type": "correlation"}
        result.update((name, encode_value(value)) for name, value in self.fields().items())
        result["properties"] = _encode_map(self.properties)
        return result


_TRUE_SQL = re.compile(r"\s*1\s*=\s*1\s*")
_FALSE_SQL = re.compile(r"\s*1\s*=\s*0\s*")


def sql_filter(expression: str, parameters: Mapping[str, Any] | None = None) -> RuleFilter:
    """A SQL filter, or the true or false filter when it is the service's own spelling of one (``1=1`` / ``1=0``,
    spaces allowed, no parameters): both route without evaluating anything."""
    if not parameters and isinstance(expression, str):
        if _TRUE_SQL.fullmatch(expression):
            return TrueFilter()
        if _FALSE_SQL.fullmatch(expression):
            return FalseFilter()
    return SqlFilter(expression, parameters)


def build_filter(
    kind: str,
    expression: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    properties: Mapping[str, Any] | None = None,
) -> RuleFilter:
    """A filter from its parts: ``kind`` ("sql", "true", "false", "correlation"); a SQL filter's ``expression`` and
    ``parameters`` (taken as written: :func:`sql_filter` recognises ``1=1``); a correlation filter's system
    ``fields`` (``CorrelationField.attr`` -> value) and user ``properties``."""
    if kind == "true":
        return TrueFilter()
    if kind == "false":
        return FalseFilter()
    if kind == "sql":
        return SqlFilter(expression, parameters)  # type: ignore[arg-type]
    if kind == "correlation":
        return CorrelationFilter(**(fields or {}), properties=properties)
    raise ArgumentError(f"Unknown rule filter type {kind!r}: use sql, correlation, true or false")


def filter_from_dict(data: Mapping[str, Any]) -> RuleFilter:
    """Rebuild a filter from :meth:`RuleFilter.to_dict` output."""
    kind = data.get("type") if isinstance(data, Mapping) else None
    if kind not in ("true", "false", "sql", "correlation"):
        raise ArgumentError(f"Unknown rule filter {data!r}")
    return build_filter(
        kind,  # type: ignore[arg-type]
        data.get("expression"),
        _decode_map(data.get("parameters")) if kind == "sql" else None,
        {f.attr: decode_value(data[f.attr]) for f in CORRELATION_FIELDS if f.attr in data},
        _decode_map(data.get("properties")),
    )


# ---------------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------------


class RuleAction:
    """Base of the actions; ``apply`` mutates the copy it is given (never the topic's original). ``kind`` names
    the action in every outside form: "empty" or "sql"."""

    kind = ""

    def apply(self, message: Message) -> None:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuleAction) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class EmptyRuleAction(RuleAction):
    """No action: the rule joins the OR-ed group that yields a single shared copy."""

    kind = "empty"

    def apply(self, message: Message) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"type": "empty"}


class SqlRuleAction(RuleAction):
    """``SET prop = expr`` / ``REMOVE prop`` statements (';' optional) run on a matched message's copy.

    A statement whose value has no implicit conversion to the target system property, or whose expression
    fails to evaluate, leaves the property as it was; the other statements still run.
    """

    kind = "sql"

    def __init__(self, expression: str, parameters: Mapping[str, Any] | None = None) -> None:
        self.parameters = _check_values(parameters, "SQL rule action parameter")
        self._apply = compile_action(expression, self.parameters)
        self.expression = expression

    def apply(self, message: Message) -> None:
        self._apply(message)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "sql", "expression": self.expression, "parameters": _encode_map(self.parameters)}


def build_action(expression: str | None, parameters: Mapping[str, Any] | None = None) -> RuleAction:
    """An action from its parts: a SQL rule action, or no action when there is no ``expression``."""
    if expression is None:
        return EmptyRuleAction()
    return SqlRuleAction(expression, parameters)


def action_from_dict(data: Mapping[str, Any] | None) -> RuleAction:
    """Rebuild an action from :meth:`RuleAction.to_dict` output (None means no action)."""
    if data is None:
        return EmptyRuleAction()
    kind = data.get("type") if isinstance(data, Mapping) else None
    if kind == "empty":
        return EmptyRuleAction()
    if kind == "sql":
        return SqlRuleAction(data.get("expression"), _decode_map(data.get("parameters")))  # type: ignore[arg-type]
    raise ArgumentError(f"Unknown rule action {data!r}")


# ---------------------------------------------------------------------------------------------------------
# Rules and routing
# ---------------------------------------------------------------------------------------------------------


@dataclass(eq=True)
class Rule:
    """A named filter plus an optional action. Name validation (length, characters) is the entity layer's."""

    name: str
    filter: RuleFilter = field(default_factory=TrueFilter)
    action: RuleAction = field(default_factory=EmptyRuleAction)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError(f"A rule name must be a non-empty string, not {self.name!r}")
        if self.action is None:
            self.action = EmptyRuleAction()
        if not isinstance(self.filter, RuleFilter):
            raise ArgumentError(f"Rule {self.name!r}: filter must be a RuleFilter, not {self.filter!r}")
        if not isinstance(self.action, RuleAction):
            raise ArgumentError(f"Rule {self.name!r}: action must be a RuleAction, not {self.action!r}")

    @property
    def has_action(self) -> bool:
        return not isinstance(self.action, EmptyRuleAction)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "filter": self.filter.to_dict(), "action": self.action.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        if not isinstance(data, Mapping) or "name" not in data:
            raise ArgumentError(f"Malformed rule {data!r}")
        return cls(
            name=data["name"],
            filter=filter_from_dict(data.get("filter") or {"type": "true"}),
            action=action_from_dict(data.get("action")),
        )


@dataclass
class Routing:
    """What a subscription gets for one message: its copies, and the rules whose filter failed to evaluate.

    ``errors`` lets the broker honour a subscription's DeadLetteringOnFilterEvaluationExceptions.
    """

    copies: list[Message] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (rule name, error description)


def route_detailed(rules: Iterable[Rule], message: Message) -> Routing:
    """Evaluate every rule: one shared copy for the action-less matches, one copy per matching action rule.

    The shared copy (if any) comes first, then the action copies in rule order. A filter that fails to
    evaluate counts as not matching and is reported in ``errors``.
    """
    result = Routing()
    plain_matched = False
    action_rules: list[Rule] = []
    for rule in rules:
        has_action = not isinstance(rule.action, EmptyRuleAction)
        if plain_matched and not has_action:
            continue  # the OR-ed group already matched; its other filters cannot add anything
        try:
            matched = rule.filter.evaluate(message)
        except EvaluationError as exc:
            result.errors.append((rule.name, str(exc)))
            continue
        if not matched:
            continue
        if has_action:
            action_rules.append(rule)
        else:
            plain_matched = True
    if plain_matched:
        result.copies.append(message.copy())
    for rule in action_rules:
        copy = message.copy()
        copy.wire_sections = None  # the action changes it: a cached encoding would be stale
        rule.action.apply(copy)
        if copy.application_properties is None:
            copy.application_properties = {}
        copy.application_properties[RULE_NAME_PROPERTY] = rule.name
        result.copies.append(copy)
    return result


def route(rules: Iterable[Rule], message: Message) -> list[Message]:
    """The copies of ``message`` a subscription with ``rules`` receives ([] when no rule matches)."""
    return route_detailed(rules, message).copies
