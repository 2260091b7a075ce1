"""``queue``, ``topic``, ``subscription`` and ``rule`` commands: create, list, show, update, delete over the
HTTPS management API.

The property options come from the broker's ATOM mapping (``atom.WRITABLE``): one option per writable property
of each kind, named as the SDK names the property (``--lock-duration``, ``--max-delivery-count``,
``--enable-partitioning/--no-enable-partitioning``, ...), so the command offers exactly what the service accepts.
An update reads the entity, changes what was given and writes it back whole, because the service replaces a
description on update (what an update leaves out goes back to its default).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import click

from ..http import atom
from ..model.durations import format_duration, parse_duration
from ..model.entities import DEFAULT_RULE_NAME, TIMESPAN_MAX, EntityKind, EntityStatus
from ..model.errors import ShardbusError
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
)
from .admin_http import AdminError, EntityInfo
from .context import CliError, Session, connection_options, pass_session
from .output import Column

# Short help for the properties people set most; the others get their ATOM element name.
PROPERTY_HELP = {
    "lock_duration": "how long a peek-lock holds (PT1M, 30s, 5m)",
    "max_delivery_count": "deliveries before a message is dead-lettered",
    "enable_partitioning": "spread the entity over 16 partitions (fixed at creation)",
    "requires_session": "session-aware (fixed at creation)",
    "requires_duplicate_detection": "drop repeated message ids (fixed at creation)",
    "duplicate_detection_history_time_window": "how long message ids are remembered",
    "default_message_time_to_live": "TTL of messages that set none ('never' for no limit)",
    "dead_lettering_on_message_expiration": "dead-letter expired messages instead of dropping them",
    "max_size_in_megabytes": "size limit (per partition on a partitioned entity)",
    "forward_to": "forward every message to this queue or topic",
    "forward_dead_lettered_messages_to": "forward dead-lettered messages to this queue or topic",
    "status": "Active, Disabled, SendDisabled or ReceiveDisabled",
    "auto_delete_on_idle": "delete the entity after this long unused",
    "user_metadata": "free text kept with the entity",
}
# Read-only values of a description (element → JSON name), in the order `show` lists them.
RUNTIME_FIELDS: tuple[tuple[str, str], ...] = (
    ("ActiveMessageCount", "active_message_count"),
    ("DeadLetterMessageCount", "dead_letter_message_count"),
    ("ScheduledMessageCount", "scheduled_message_count"),
    ("TransferMessageCount", "transfer_message_count"),
    ("TransferDeadLetterMessageCount", "transfer_dead_letter_message_count"),
    ("MessageCount", "total_message_count"),
    ("SizeInBytes", "size_in_bytes"),
    ("SubscriptionCount", "subscription_count"),
    ("EntityAvailabilityStatus", "availability_status"),
    ("CreatedAt", "created_at"),
    ("UpdatedAt", "updated_at"),
    ("AccessedAt", "accessed_at"),
)
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class DurationType(click.ParamType):
    """ISO-8601 (``PT30S``, ``P1D``), a number with a unit (``30s``, ``5m``, ``2h``, ``7d``; plain numbers are
    seconds), or ``never``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        text = str(value).strip()
        if text.lower() in ("never", "max", "infinite"):
            return TIMESPAN_MAX
        match = _NUMBER.fullmatch(text.lower())
        if match:
            return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])
        try:
            return parse_duration(text, f"'{text}'")
        except ShardbusError:
            self.fail(f"'{text}' is not a duration: use 30s, 5m, 2h, 7d, PT30S or never", param, ctx)


DURATION = DurationType()


def parse_value(text: str) -> Any:
    """A NAME=VALUE option's value: JSON when it parses (3, 2.5, true, "007"), else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, str | int | float | bool) else text


def parse_pairs(pairs: tuple[str, ...], what: str) -> dict[str, Any]:
    result = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"'{pair}' is not NAME=VALUE", param_hint=what)
        result[name] = parse_value(value)
    return result


# ------------------------------------------------------------------------------------------- properties
def property_options(kind: EntityKind) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per writable property of ``kind`` (default None: not given, not sent)."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for element, (attr, codec) in reversed(list(atom.WRITABLE[kind].items())):
            flag = attr.replace("_", "-")
            text = PROPERTY_HELP.get(attr, element)
            if codec is atom.BOOL:
                option = click.option(f"--{flag}/--no-{flag}", attr, default=None, help=text)
            elif codec is atom.INT:
                option = click.option(f"--{flag}", attr, type=int, default=None, help=text)
            elif codec is atom.DURATION:
                option = click.option(f"--{flag}", attr, type=DURATION, default=None, help=text)
            elif codec is atom.STATUS:
                choices = click.Choice([s.value for s in EntityStatus], case_sensitive=False)
                option = click.option(f"--{flag}", attr, type=choices, default=None, help=text)
            else:
                option = click.option(f"--{flag}", attr, default=None, help=text)
            f = option(f)
        return f

    return decorate


def given_properties(kind: EntityKind, options: dict[str, Any]) -> dict[str, Any]:
    attrs = {attr for attr, _ in atom.WRITABLE[kind].values()}
    return {k: v for k, v in options.items() if k in attrs and v is not None}


def display_value(attr: str, value: Any) -> Any:
    """A property as a person reads it (and as --json writes it)."""
    if isinstance(value, timedelta):
        return "never" if value >= TIMESPAN_MAX else format_duration(value)
    if isinstance(value, EntityStatus):
        return value.value
    if attr.startswith("forward") and isinstance(value, str) and "://" in value:
        return urlsplit(value).path.strip("/") or None  # sb://host:port/name → name
    return value


def entity_data(info: EntityInfo) -> dict[str, Any]:
    data: dict[str, Any] = {"name": info.name, "kind": info.kind.value}
    for attr, value in sorted(info.properties.items()):
        data[attr] = display_value(attr, value)
    for element, key in RUNTIME_FIELDS:
        if element in info.runtime:
            value = info.runtime[element]
            data[key] = int(value) if value.isdigit() else value
    return data


def fetch(session: Session, kind: EntityKind, name: str, topic: str | None = None) -> EntityInfo:
    """The entity, or a clear error when it is missing or of another kind."""
    try:
        info = session.admin.get_subscription(topic, name) if topic else session.admin.get_entity(name)
    except AdminError as exc:
        if exc.status == 404:
            where = (
                f"topic '{topic}' has no subscription '{name}'" if topic else f"{kind.value} '{name}' does not exist"
            )
            raise CliError(where) from None
        raise
    if info.kind is not kind:
        raise CliError(f"'{name}' is a {info.kind.value}, not a {kind.value}")
    return info


def confirm(yes: bool, action: str) -> None:
    """Destructive commands ask first on a terminal; elsewhere they need --yes."""
    if yes:
        return
    if sys.stdin.isatty():
        click.confirm(f"{action}?", abort=True)
        return
    raise CliError(f"not confirmed: pass --yes to {action} without a prompt")


LIST_COLUMNS = [
    Column("name", "NAME"),
    Column("status", "STATUS"),
    Column("availability_status", "AVAILABILITY"),
    Column("active_message_count", "ACTIVE", True),
    Column("dead_letter_message_count", "DEAD-LETTER", True),
    Column("scheduled_message_count", "SCHEDULED", True),
    Column("size_in_bytes", "BYTES", True),
]


def show_entity(session: Session, info: EntityInfo, title: str) -> None:
    data = entity_data(info)
    session.out.record([(k, v) for k, v in data.items() if k != "kind"], title=title, data=data)


# ------------------------------------------------------------------------------------- queues and topics
def entity_group(kind: EntityKind) -> click.Group:
    """``queue`` or ``topic``: the same five commands over HTTPS."""
    noun = kind.value

    @click.group(name=noun, help=f"Manage {noun}s: create, list, show, update, delete.")
    def group() -> None:
        pass

    @group.command("create", help=f"Create a {noun}.")
    @click.argument("name")
    @property_options(kind)
    @connection_options
    @pass_session
    def create(session: Session, name: str, **options: Any) -> None:
        info = session.admin.put_entity(kind, name, given_properties(kind, options))
        session.out.done(f"created {noun} {name}", data=entity_data(info))

    @group.command("list", help=f"List the {noun}s with their message counts.")
    @connection_options
    @pass_session
    def list_(session: Session) -> None:
        items = session.admin.list_entities(kind)
        columns = LIST_COLUMNS
        if kind is EntityKind.TOPIC:
            columns = [*LIST_COLUMNS[:3], Column("subscription_count", "SUBSCRIPTIONS", True), LIST_COLUMNS[-1]]
        columns = [columns[0], Column("enable_partitioning", "PARTITIONED"), *columns[1:]]
        session.out.table(columns, [entity_data(i) for i in items])

    @group.command("show", help=f"Show a {noun}'s properties and message counts.")
    @click.argument("name")
    @connection_options
    @pass_session
    def show(session: Session, name: str) -> None:
        show_entity(session, fetch(session, kind, name), f"{noun} {name}")

    @group.command("update", help=f"Change properties of a {noun} (the others keep their values).")
    @click.argument("name")
    @property_options(kind)
    @connection_options
    @pass_session
    def update(session: Session, name: str, **options: Any) -> None:
        changes = given_properties(kind, options)
        if not changes:
            raise click.UsageError("nothing to change: give at least one property option (see --help)")
        current = fetch(session, kind, name)
        info = session.admin.put_entity(kind, name, {**current.properties, **changes}, update=True)
        session.out.done(f"updated {noun} {name}", data=entity_data(info))

    @group.command("delete", help=f"Delete a {noun} and its messages.")
    @click.argument("name")
    @click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
    @connection_options
    @pass_session
    def delete(session: Session, name: str, yes: bool) -> None:
        fetch(session, kind, name)  # a queue command must not delete a topic of that name, nor the reverse
        confirm(yes, f"delete {noun} {name} and its messages")
        session.admin.delete_entity(name)
        session.out.done(f"deleted {noun} {name}", data={"deleted": name, "kind": noun})

    return group


# ---------------------------------------------------------------------------------------- subscriptions
subscription = click.Group("subscription", help="Manage a topic's subscriptions: create, list, show, update, delete.")
SUB = EntityKind.SUBSCRIPTION


@subscription.command("create", help="Create a subscription of TOPIC.")
@click.argument("topic")
@click.argument("name")
@click.option("--default-filter", metavar="SQL", help="SQL filter of the $Default rule instead of 'true'")
@property_options(SUB)
@connection_options
@pass_session
def subscription_create(session: Session, topic: str, name: str, default_filter: str | None, **options: Any) -> None:
    default_rule = None
    if default_filter is not None:
        default_rule = Rule(DEFAULT_RULE_NAME, _sql_filter(default_filter, {}), EmptyRuleAction())
    info = session.admin.put_subscription(topic, name, given_properties(SUB, options), default_rule=default_rule)
    session.out.done(f"created subscription {topic}/{name}", data=entity_data(info))


@subscription.command("list", help="List TOPIC's subscriptions with their message counts.")
@click.argument("topic")
@connection_options
@pass_session
def subscription_list(session: Session, topic: str) -> None:
    fetch(session, EntityKind.TOPIC, topic)
    items = session.admin.list_subscriptions(topic)
    session.out.table(LIST_COLUMNS, [entity_data(i) for i in items])


@subscription.command("show", help="Show a subscription's properties and message counts.")
@click.argument("topic")
@click.argument("name")
@connection_options
@pass_session
def subscription_show(session: Session, topic: str, name: str) -> None:
    show_entity(session, fetch(session, SUB, name, topic), f"subscription {topic}/{name}")


@subscription.command("update", help="Change properties of a subscription (the others keep their values).")
@click.argument("topic")
@click.argument("name")
@property_options(SUB)
@connection_options
@pass_session
def subscription_update(session: Session, topic: str, name: str, **options: Any) -> None:
    changes = given_properties(SUB, options)
    if not changes:
        raise click.UsageError("nothing to change: give at least one property option (see --help)")
    current = fetch(session, SUB, name, topic)
    info = session.admin.put_subscription(topic, name, {**current.properties, **changes}, update=True)
    session.out.done(f"updated subscription {topic}/{name}", data=entity_data(info))


@subscription.command("delete", help="Delete a subscription and its messages.")
@click.argument("topic")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@connection_options
@pass_session
def subscription_delete(session: Session, topic: str, name: str, yes: bool) -> None:
    fetch(session, SUB, name, topic)
    confirm(yes, f"delete subscription {topic}/{name} and its messages")
    session.admin.delete_subscription(topic, name)
    session.out.done(
        f"deleted subscription {topic}/{name}", data={"deleted": f"{topic}/{name}", "kind": "subscription"}
    )


# ------------------------------------------------------------------------------------------------- rules
rule = click.Group("rule", help="Manage a subscription's rules: create, list, show, update, delete.")


def filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """A SQL filter, a correlation filter (any of its fields), --true or --false; plus an optional action."""
    options = [
        click.option("--sql", metavar="EXPR", help="SQL filter, e.g. \"severity > 3 AND sys.Label = 'x'\""),
        click.option("--param", multiple=True, metavar="NAME=VALUE", help="SQL filter parameter (repeatable)"),
        click.option("--true", "true_", is_flag=True, help="match every message"),
        click.option("--false", "false_", is_flag=True, help="match no message"),
        click.option("--correlation-id", help="correlation filter: CorrelationId equals"),
        click.option("--message-id", help="correlation filter: MessageId equals"),
        click.option("--subject", help="correlation filter: Subject (Label) equals"),
        click.option("--session-id", help="correlation filter: SessionId equals"),
        click.option("--to", help="correlation filter: To equals"),
        click.option("--reply-to", help="correlation filter: ReplyTo equals"),
        click.option("--reply-to-session-id", help="correlation filter: ReplyToSessionId equals"),
        click.option("--content-type", help="correlation filter: ContentType equals"),
        click.option(
            "--property", "properties", multiple=True, metavar="NAME=VALUE", help="correlation filter: property equals"
        ),
        click.option("--action", metavar="SQL", help='SQL action run on matched messages, e.g. "SET x = 1"'),
        click.option("--action-param", multiple=True, metavar="NAME=VALUE", help="SQL action parameter"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


CORRELATION_OPTIONS = tuple(f.attr for f in CORRELATION_FIELDS)  # the options are named as the model's fields


def _sql_filter(expression: str, parameters: dict[str, Any]) -> RuleFilter:
    try:
        # compiled here: a syntax error is reported before any request
        return build_filter("sql", expression, parameters)
    except ShardbusError as exc:
        raise click.BadParameter(str(exc), param_hint="--sql") from None


def build_rule(name: str, o: dict[str, Any]) -> Rule:
    correlation = {k: o[k] for k in CORRELATION_OPTIONS if o.get(k) is not None}
    properties = parse_pairs(o["properties"], "--property")
    kinds = [bool(o["sql"]), bool(correlation or properties), o["true_"], o["false_"]]
    if sum(kinds) > 1:
        raise click.UsageError("give one filter: --sql, correlation options, --true or --false")
    rule_filter: RuleFilter
    if o["sql"]:
        rule_filter = _sql_filter(o["sql"], parse_pairs(o["param"], "--param"))
    elif correlation or properties:
        try:
            rule_filter = build_filter("correlation", fields=correlation, properties=properties)
        except ShardbusError as exc:
            raise click.UsageError(str(exc)) from None
    else:
        rule_filter = build_filter("false" if o["false_"] else "true")
    action: RuleAction = EmptyRuleAction()
    if o["action"]:
        try:
            action = build_action(o["action"], parse_pairs(o["action_param"], "--action-param"))
        except ShardbusError as exc:
            raise click.BadParameter(str(exc), param_hint="--action") from None
    return Rule(name, rule_filter, action)


def describe_filter(rule_filter: RuleFilter) -> str:
    kind = rule_filter.kind
    if kind == "true" or kind == "false":
        return kind
    if isinstance(rule_filter, SqlFilter):
        params = f"  {json.dumps(rule_filter.parameters, default=str)}" if rule_filter.parameters else ""
        return f"sql: {rule_filter.expression}{params}"
    if isinstance(rule_filter, CorrelationFilter):
        parts = [f"{k}={v}" for k, v in rule_filter.fields().items()]
        parts += [f"{k}={v}" for k, v in rule_filter.properties.items()]
        return "correlation: " + ", ".join(parts)
    return repr(rule_filter)


def describe_action(action: RuleAction) -> str | None:
    return f"sql: {action.expression}" if isinstance(action, SqlRuleAction) else None


def rule_data(r: Rule) -> dict[str, Any]:
    return {
        "name": r.name,
        "filter": describe_filter(r.filter),
        "action": describe_action(r.action),
        "filter_definition": r.filter.to_dict(),
        "action_definition": r.action.to_dict(),
    }


def _rule_call(session: Session, topic: str, sub: str, call: Callable[[], Any], rule_name: str | None = None) -> Any:
    """``call()``; when something is missing, say what: the topic, the subscription, or (given ``rule_name``)
    the rule. 412 is how an update says "missing"."""
    try:
        return call()
    except AdminError as exc:
        if exc.status not in (404, 412):
            raise
        fetch(session, SUB, sub, topic)  # raises when the topic or subscription is what is missing
        if rule_name is None:
            raise
        raise CliError(f"subscription {topic}/{sub} has no rule '{rule_name}'") from None


@rule.command("create", help="Create a rule on subscription TOPIC/SUBSCRIPTION (no filter: --true).")
@click.argument("topic")
@click.argument("subscription_name", metavar="SUBSCRIPTION")
@click.argument("name")
@filter_options
@connection_options
@pass_session
def rule_create(session: Session, topic: str, subscription_name: str, name: str, **options: Any) -> None:
    new = build_rule(name, options)
    created = _rule_call(
        session, topic, subscription_name, lambda: session.admin.put_rule(topic, subscription_name, new)
    )
    session.out.done(f"created rule {name} on {topic}/{subscription_name}", data=rule_data(created))


@rule.command("list", help="List the rules of subscription TOPIC/SUBSCRIPTION.")
@click.argument("topic")
@click.argument("subscription_name", metavar="SUBSCRIPTION")
@connection_options
@pass_session
def rule_list(session: Session, topic: str, subscription_name: str) -> None:
    rules = _rule_call(session, topic, subscription_name, lambda: session.admin.list_rules(topic, subscription_name))
    columns = [Column("name", "NAME"), Column("filter", "FILTER"), Column("action", "ACTION")]
    session.out.table(columns, [rule_data(r) for r in rules])


@rule.command("show", help="Show one rule.")
@click.argument("topic")
@click.argument("subscription_name", metavar="SUBSCRIPTION")
@click.argument("name")
@connection_options
@pass_session
def rule_show(session: Session, topic: str, subscription_name: str, name: str) -> None:
    found = _rule_call(
        session, topic, subscription_name, lambda: session.admin.get_rule(topic, subscription_name, name), name
    )
    data = rule_data(found)
    fields = [(k, data[k]) for k in ("name", "filter", "action")]
    session.out.record(fields, title=f"rule {name} on {topic}/{subscription_name}", data=data)


@rule.command("update", help="Replace a rule's filter and action.")
@click.argument("topic")
@click.argument("subscription_name", metavar="SUBSCRIPTION")
@click.argument("name")
@filter_options
@connection_options
@pass_session
def rule_update(session: Session, topic: str, subscription_name: str, name: str, **options: Any) -> None:
    new = build_rule(name, options)
    updated = _rule_call(
        session,
        topic,
        subscription_name,
        lambda: session.admin.put_rule(topic, subscription_name, new, update=True),
        name,
    )
    session.out.done(f"updated rule {name} on {topic}/{subscription_name}", data=rule_data(updated))


@rule.command("delete", help="Delete a rule.")
@click.argument("topic")
@click.argument("subscription_name", metavar="SUBSCRIPTION")
@click.argument("name")
@connection_options
@pass_session
def rule_delete(session: Session, topic: str, subscription_name: str, name: str) -> None:
    _rule_call(
        session, topic, subscription_name, lambda: session.admin.delete_rule(topic, subscription_name, name), name
    )
    session.out.done(f"deleted rule {name} on {topic}/{subscription_name}", data={"deleted": name, "kind": "rule"})


queue = entity_group(EntityKind.QUEUE)
topic = entity_group(EntityKind.TOPIC)
COMMANDS = (queue, topic, subscription, rule)
