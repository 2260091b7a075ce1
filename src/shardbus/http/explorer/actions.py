"""What the explorer's forms change, each through the namespace operations the AMQP and HTTPS front ends use:
``send`` and ``schedule_messages`` (routing, quotas and durability as for any sender), peek-lock receivers on the
dead-letter queue for a resubmit, ``range_offsets``/``complete_below`` for a purge (as ``shardbus purge`` does),
``cancel_scheduled_messages``, and the management calls. A form's values are parsed here; a bad one raises
``ArgumentError`` with what to fix.
"""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from ...message_size import batches_within
from ...model.errors import ArgumentError
from ...model.filters import CorrelationFilter, EmptyRuleAction, Rule, SqlFilter, SqlRuleAction
from ...model.message import Message, new_message
from ...namespace import Namespace
from .readings import Located, address

RESUBMIT_BATCH = 100
RESUBMIT_LIMIT = 10_000  # messages one "resubmit all" moves; the page says when more remain
SELECT_SCAN_LIMIT = 5_000  # dead letters a "resubmit selected" looks through for the selected ones
# Application properties the broker adds to a dead-lettered message (dropped when it is resubmitted)
DEAD_LETTER_PROPERTIES = ("DeadLetterReason", "DeadLetterErrorDescription")


def _text(form: dict[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0].strip()


def _optional(form: dict[str, list[str]], name: str) -> str | None:
    return _text(form, name) or None


def _int(form: dict[str, list[str]], name: str) -> int | None:
    text = _text(form, name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"{name} must be a whole number, not '{text}'.") from None


def _flag(form: dict[str, list[str]], name: str) -> bool:
    return _text(form, name).lower() in ("on", "true", "1", "yes")


def property_value(text: str) -> Any:
    """A property's value: JSON when it parses to a scalar (3, 2.5, true, "007"), else the text (as the CLI's
    ``--property NAME=VALUE``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, str | int | float | bool) else text


def parse_properties(text: str) -> dict[str, Any]:
    """``name=value`` lines."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ArgumentError(f"Application property '{line.strip()}' is not name=value.")
        out[name.strip()] = property_value(value.strip())
    return out


def parse_time(text: str) -> datetime:
    """An HTML datetime-local value (or ISO 8601), taken as UTC when it names no zone."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ArgumentError(f"'{text}' is not a date and time (YYYY-MM-DDTHH:MM, UTC).") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------------------- send
def send(ns: Namespace, located: Located, form: dict[str, list[str]]) -> str:
    """Send (or schedule) one message to a queue or topic; returns what happened, for the page."""
    ttl = _int(form, "ttl_seconds")
    message = Message(
        body=(form.get("body") or [""])[0].encode("utf-8"),
        message_id=_optional(form, "message_id"),
        content_type=_optional(form, "content_type"),
        correlation_id=_optional(form, "correlation_id"),
        subject=_optional(form, "subject"),
        partition_key=_optional(form, "partition_key"),
        session_id=_optional(form, "session_id"),
        time_to_live=None if ttl is None else timedelta(seconds=ttl),
        application_properties=parse_properties((form.get("properties") or [""])[0]) or None,
    )
    when = _text(form, "scheduled")
    if when:
        seqs = ns.schedule_messages(located.send_to, message, parse_time(when))
        return f"Scheduled a message on {located.send_to} for {parse_time(when).isoformat()} (sequence {seqs[0]})."
    ns.send(located.send_to, message)
    return f"Sent a message to {located.send_to}."


# --------------------------------------------------------------------------------------------- resubmit
def resubmission(m: Message) -> Message:
    """A dead-lettered message as a new send: what its sender set (body, properties, keys, TTL), less the dead-
    letter reason and description; the broker stamps the rest again (sequence number, times, delivery count)."""
    user = {f.name: getattr(m, f.name) for f in fields(Message) if f.repr}
    user["scheduled_enqueue_time"] = None
    fresh = new_message(**user)
    if m.application_properties:
        kept = {k: v for k, v in m.application_properties.items() if k not in DEAD_LETTER_PROPERTIES}
        fresh.application_properties = kept or None
    if m.annotations:
        fresh.annotations = dict(m.annotations)
    return fresh


def resubmit(ns: Namespace, located: Located, selected: list[int] | None) -> tuple[int, int]:
    """Move dead letters back to their entity (a subscription's go through its topic), as the portal does: each
    is sent as a new message, and only once that send is durable is the dead letter completed; a failure in
    between leaves it where it was (at worst it is sent twice). ``selected``: those sequence numbers only, else
    all (up to RESUBMIT_LIMIT). Returns (resubmitted, still to do)."""
    wanted = None if selected is None else set(selected)
    done = scanned = 0
    held: list[Message] = []  # dead letters locked while looking for the selected ones, released at the end
    with ns.receiver(address(located.path, "deadletter")) as receiver:
        try:
            while True:
                if wanted is not None and (not wanted or scanned >= SELECT_SCAN_LIMIT):
                    break
                if wanted is None and done >= RESUBMIT_LIMIT:
                    break
                batch = receiver.receive(RESUBMIT_BATCH, max_wait=0.5)
                if not batch:
                    break
                scanned += len(batch)
                if wanted is None:
                    take = batch
                else:
                    take = [m for m in batch if m.sequence_number in wanted]
                    held.extend(m for m in batch if m.sequence_number not in wanted)
                    wanted.difference_update(m.sequence_number for m in take)
                # Sent in batches the entity's batch size allows; each batch's dead letters are completed once
                # it is durable.
                _, batch_largest = ns.send_size_limits(located.send_to)
                start = 0
                for part in batches_within([resubmission(m) for m in take], batch_largest):
                    sent = take[start : start + len(part)]
                    try:
                        ns.send(located.send_to, part)  # returns once durable
                    except BaseException:
                        held.extend(take[start:])  # not sent: they stay dead letters, unlocked at once
                        raise
                    receiver.complete(*sent)
                    start += len(part)
                    done += len(part)
        finally:
            for m in held:
                receiver.release(m)  # no delivery counted
    if wanted is not None:
        return done, len(wanted)
    left = ns.get_runtime_properties(located.path).dead_letter_message_count
    return done, left


# ------------------------------------------------------------------------------------------------ purge
def purge(ns: Namespace, located: Located, queue: str) -> tuple[int, list[int]]:
    """Remove every message of a sub-queue (main, dead-letter or transfer dead-letter): one cumulative completion
    per partition up to its end, as ``shardbus purge`` does, so messages that arrive meanwhile stay. Scheduled
    messages stay (cancel them). Returns (purged, partitions that were down)."""
    if queue not in ("active", "deadletter", "transferdeadletter"):
        raise ArgumentError("Purge the main queue, the dead-letter queue or the transfer dead-letter queue.")
    where = address(located.path, queue)
    purged, down = 0, []
    for pid, found in enumerate(ns.range_offsets(where)):
        if found is None:
            down.append(pid)
            continue
        _first, end, _mark, count = found
        if count:
            ns.complete_below(where, {pid: end})
            purged += count
    return purged, down


def cancel_scheduled(ns: Namespace, located: Located, sequence_numbers: list[int]) -> str:
    """Cancel scheduled messages (a subscription's belong to its topic, where they were scheduled)."""
    ns.cancel_scheduled_messages(located.send_to, sequence_numbers)
    return f"Cancelled {len(sequence_numbers)} scheduled message(s) on {located.send_to}."


# ------------------------------------------------------------------------------------------- management
def create(ns: Namespace, form: dict[str, list[str]]) -> str:
    kind = _text(form, "kind")
    name = _text(form, "name")
    if not name:
        raise ArgumentError("Give the new entity a name.")
    props: dict[str, Any] = {}
    size = _int(form, "max_size_in_megabytes")
    if size is not None:
        props["max_size_in_megabytes"] = size
    deliveries = _int(form, "max_delivery_count")
    if deliveries is not None:
        props["max_delivery_count"] = deliveries
    if kind == "queue":
        ns.create_queue(
            name,
            enable_partitioning=_flag(form, "enable_partitioning"),
            requires_session=_flag(form, "requires_session"),
            **props,
        )
        return f"Created queue {name}."
    if kind == "topic":
        props.pop("max_delivery_count", None)
        ns.create_topic(name, enable_partitioning=_flag(form, "enable_partitioning"), **props)
        return f"Created topic {name}."
    if kind == "subscription":
        topic = _text(form, "topic")
        props.pop("max_size_in_megabytes", None)
        ns.create_subscription(topic, name, requires_session=_flag(form, "requires_session"), **props)
        return f"Created subscription {topic}/Subscriptions/{name}."
    if kind == "rule":
        topic, sub = _text(form, "topic"), _text(form, "subscription")
        ns.create_rule(topic, sub, parse_rule(name, form))
        return f"Created rule {name} on {topic}/Subscriptions/{sub}."
    raise ArgumentError(f"Cannot create a '{kind}': use queue, topic, subscription or rule.")


def parse_rule(name: str, form: dict[str, list[str]]) -> Rule:
    sql = _text(form, "sql_filter")
    correlation = _text(form, "correlation_id")
    subject = _text(form, "filter_subject")
    if sql and (correlation or subject):
        raise ArgumentError("Give a SQL filter or correlation filter fields, not both.")
    if correlation or subject:
        rule_filter: Any = CorrelationFilter(correlation_id=correlation or None, subject=subject or None)
    else:
        rule_filter = SqlFilter(sql or "1=1")
    action_text = _text(form, "sql_action")
    action = SqlRuleAction(action_text) if action_text else EmptyRuleAction()
    return Rule(name, rule_filter, action)


def delete(ns: Namespace, form: dict[str, list[str]]) -> str:
    kind = _text(form, "kind")
    if kind == "queue":
        ns.delete_queue(_text(form, "name"))
    elif kind == "topic":
        ns.delete_topic(_text(form, "name"))
    elif kind == "subscription":
        ns.delete_subscription(_text(form, "topic"), _text(form, "name"))
    elif kind == "rule":
        ns.delete_rule(_text(form, "topic"), _text(form, "subscription"), _text(form, "name"))
    else:
        raise ArgumentError(f"Cannot delete a '{kind}': use queue, topic, subscription or rule.")
    return f"Deleted {kind} {_text(form, 'name')}."


def sequence_numbers(form: dict[str, list[str]], name: str = "seq") -> list[int]:
    out = []
    for text in form.get(name, []):
        try:
            out.append(int(text))
        except ValueError:
            raise ArgumentError(f"'{text}' is not a sequence number.") from None
    return out
