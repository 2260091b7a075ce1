"""What the explorer's pages show, read from a namespace through its own operations (the ones the AMQP and HTTPS
front ends use): descriptions and runtime counts, availability, range offsets, peeks (which never lock), session
lists, and each partition's counters (as ``/metrics`` reads them).

Nothing here is kept between requests except what ``history.RateHistory`` holds; a page reads only what it shows
(a page of messages is at most ``PAGE_SIZE`` peeked messages, a filtered page scans at most ``SCAN_LIMIT``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...model.entities import EntityKind
from ...model.errors import EntityNotFound, ShardbusError
from ...model.message import BodyType, Message, MessageState
from ...model.routing import decode_sequence_number, partition_for_key
from ...namespace import Namespace
from .history import RateHistory, Rates

PAGE_SIZE = 25
SCAN_LIMIT = 2000  # messages a filtered page (scheduled, deferred) looks at before offering "continue"
BODY_LIMIT = 64 * 1024  # bytes of a body shown

# What a messages page shows: address suffix, and the message state it keeps (None: all)
SUB_QUEUES: dict[str, tuple[str, MessageState | None, str]] = {
    "active": ("", None, "Main"),
    "scheduled": ("", MessageState.SCHEDULED, "Scheduled"),
    "deferred": ("", MessageState.DEFERRED, "Deferred"),
    "deadletter": ("/$DeadLetterQueue", None, "Dead-letter"),
    "transferdeadletter": ("/$Transfer/$DeadLetterQueue", None, "Transfer dead-letter"),
}


@dataclass(slots=True)
class EntityRow:
    """A queue, topic or subscription in the overview."""

    path: str
    name: str
    kind: str  # queue, topic, subscription
    status: str
    partitions: int
    availability: str
    active: int
    dead_letter: int
    scheduled: int
    transfer_dead_letter: int
    size_bytes: int
    max_size_mb: int | None
    requires_session: bool = False
    down: list[int] = field(default_factory=list)
    children: list[EntityRow] = field(default_factory=list)

    @property
    def size_fraction(self) -> float:
        return 0.0 if not self.max_size_mb else self.size_bytes / (self.max_size_mb * 1024 * 1024)


def _row(ns: Namespace, path: str, name: str, kind: str, desc: Any, max_size_mb: int | None) -> EntityRow:
    runtime = ns.get_runtime_properties(path)
    down = [p["partition"] for p in runtime.partitions if not p.get("healthy", True)]
    availability = "Limited" if down or runtime.availability == "Limited" else ns.availability(path)
    return EntityRow(
        path=path,
        name=name,
        kind=kind,
        status=str(desc.status.value if hasattr(desc.status, "value") else desc.status),
        partitions=len(runtime.partitions),
        availability=availability,
        active=runtime.active_message_count + runtime.transfer_message_count,
        dead_letter=runtime.dead_letter_message_count,
        scheduled=runtime.scheduled_message_count,
        transfer_dead_letter=runtime.transfer_dead_letter_message_count,
        size_bytes=runtime.size_in_bytes,
        max_size_mb=max_size_mb,
        requires_session=bool(getattr(desc, "requires_session", False)),
        down=down,
    )


def overview(ns: Namespace) -> dict[str, Any]:
    """The namespace: tier, premium partitions, and every queue and topic (with its subscriptions)."""
    queues, topics = [], []
    for q in sorted(ns.list_queues(), key=lambda d: d.name.lower()):
        try:
            queues.append(_row(ns, q.name, q.name, "queue", q, q.max_size_in_megabytes))
        except EntityNotFound:
            continue  # deleted while we looked
    for t in sorted(ns.list_topics(), key=lambda d: d.name.lower()):
        try:
            row = _row(ns, t.name, t.name, "topic", t, t.max_size_in_megabytes)
            for s in sorted(ns.list_subscriptions(t.name), key=lambda d: d.name.lower()):
                row.children.append(_row(ns, f"{t.name}/Subscriptions/{s.name}", s.name, "subscription", s, None))
        except EntityNotFound:
            continue
        topics.append(row)
    tier = ns.tier.tier.value
    return {
        "name": ns.name,
        "tier": tier.capitalize(),
        "premium_partitions": ns.tier.premium_partitions if tier == "premium" else None,
        "queues": queues,
        "topics": topics,
    }


# ------------------------------------------------------------------------------------------------- entity
@dataclass(slots=True)
class Located:
    """What an entity path names."""

    path: str
    kind: EntityKind
    description: Any
    topic: str | None = None  # a subscription's topic

    @property
    def receivable(self) -> bool:
        return self.kind is not EntityKind.TOPIC

    @property
    def send_to(self) -> str:
        """Where messages for it are sent (a subscription's go through its topic)."""
        return self.topic or self.path


def locate(ns: Namespace, path: str) -> Located:
    path = path.strip("/")
    lower = path.lower()
    idx = lower.rfind("/subscriptions/")
    if idx > 0:
        topic, sub = path[:idx], path[idx + len("/subscriptions/") :]
        desc = ns.get_subscription(topic, sub)
        return Located(f"{topic}/Subscriptions/{desc.name}", EntityKind.SUBSCRIPTION, desc, topic)
    try:
        desc = ns.get_queue(path)
        return Located(desc.name, EntityKind.QUEUE, desc)
    except EntityNotFound:
        desc = ns.get_topic(path)
        return Located(desc.name, EntityKind.TOPIC, desc)


@dataclass(slots=True)
class PartitionRow:
    id: int
    healthy: bool
    failure: str | None = None
    active: int | None = None
    dead_letter: int | None = None
    scheduled: int | None = None
    size_bytes: int | None = None
    oldest_age: float | None = None  # seconds
    incoming_total: int = 0
    delivered_total: int = 0
    rates: Rates = field(default_factory=lambda: Rates([], []))


def _receive_paths(ns: Namespace, located: Located) -> list[str]:
    if located.kind is EntityKind.TOPIC:
        return [f"{located.path}/Subscriptions/{s.name}" for s in ns.list_subscriptions(located.path)]
    return [located.path]


def _oldest_enqueued_ms(ns: Namespace, path: str, offsets: list[Any]) -> dict[int, int]:
    """Per partition, the enqueued time of its first readable message (shardbus' range reads, as `stats` does)."""
    out: dict[int, int] = {}
    for pid, found in enumerate(offsets):
        if found is None:
            continue
        first, end, _mark, count = found
        if not count:
            continue
        try:
            page = ns.browse_range(path, pid, first, end, 1)
        except ShardbusError:
            continue
        if page and page[0].enqueued_time_ms is not None:
            out[pid] = page[0].enqueued_time_ms
    return out


def partition_rows(ns: Namespace, located: Located, history: RateHistory) -> list[PartitionRow]:
    """One row per partition: health, counts, oldest message age, and in/out rates (summed over a topic's
    subscriptions)."""
    if located.kind is EntityKind.TOPIC:
        health = ns.get_runtime_properties(located.path).partitions
        rows = [PartitionRow(h["partition"], h.get("healthy", True), h.get("failure")) for h in health]
    else:
        target, _ = ns.resolve(located.path)
        rows = [PartitionRow(p.id, p.healthy, None if p.healthy else p.failure) for p in target.partitions]
    now_ms = time.time() * 1000
    for path in _receive_paths(ns, located):
        try:
            target, _ = ns.resolve(path)
            runtime = ns.get_runtime_properties(path)
            offsets = ns.range_offsets(path)
        except EntityNotFound:
            continue
        oldest = _oldest_enqueued_ms(ns, path, offsets)
        for part in runtime.partitions:
            row = rows[part["partition"]]
            if not part.get("healthy", True):
                row.healthy = False
                row.failure = row.failure or part.get("failure")
                continue
            row.active = (row.active or 0) + part["active"]
            row.dead_letter = (row.dead_letter or 0) + part["dead_letter"]
            row.scheduled = (row.scheduled or 0) + part["scheduled"]
            row.size_bytes = (row.size_bytes or 0) + part["size_in_bytes"]
            if row.id in oldest:
                age = max(0.0, (now_ms - oldest[row.id]) / 1000)
                row.oldest_age = age if row.oldest_age is None else max(row.oldest_age, age)
        for p in target.partitions:
            stats = p.stats(target.slot)  # the counters /metrics exports
            rows[p.id].incoming_total += stats.incoming
            rows[p.id].delivered_total += stats.delivered
    for row in rows:
        if not row.healthy:
            row.active = row.dead_letter = row.scheduled = row.size_bytes = row.oldest_age = None
    rates = history.record((ns.name, located.path.lower()), [(r.incoming_total, r.delivered_total) for r in rows])
    for row, rate in zip(rows, rates, strict=True):
        row.rates = rate
    return rows


@dataclass(slots=True)
class SessionRow:
    id: str
    partition: int
    locked_until: float | None  # Unix seconds, when a receiver holds it
    state_bytes: int | None
    state_preview: str = ""


def sessions(ns: Namespace, located: Located, limit: int = 200) -> tuple[list[SessionRow], bool]:
    """A session-enabled queue's or subscription's sessions (at most ``limit``) and their state; and whether
    there were more."""
    if not located.receivable or not getattr(located.description, "requires_session", False):
        return [], False
    target, _ = ns.resolve(located.path)
    ids = ns.list_sessions(located.path)
    out = []
    for sid in ids[:limit]:
        pid = partition_for_key(sid, len(target.partitions))
        p = target.partitions[pid]
        try:
            holder = p.session_lock_holder(target.slot, sid)
            state = p.get_session_state(target.slot, sid)
        except ShardbusError:
            out.append(SessionRow(sid, pid, None, None))
            continue
        locked = None if holder is None else holder[1] / 1000
        preview = "" if not state else state[:80].decode("utf-8", "replace") + ("…" if len(state) > 80 else "")
        out.append(SessionRow(sid, pid, locked, None if state is None else len(state), preview))
    return out, len(ids) > limit


def subscriptions(ns: Namespace, located: Located) -> list[dict[str, Any]]:
    """A topic's subscriptions with their rules (filter and action as text)."""
    if located.kind is not EntityKind.TOPIC:
        return []
    out = []
    for s in sorted(ns.list_subscriptions(located.path), key=lambda d: d.name.lower()):
        rules = [describe_rule(r) for r in ns.list_rules(located.path, s.name)]
        out.append(
            {
                "name": s.name,
                "path": f"{located.path}/Subscriptions/{s.name}",
                "rules": rules,
                "requires_session": s.requires_session,
            }
        )
    return out


def describe_rule(rule: Any) -> dict[str, str]:
    data = rule.filter.to_dict()
    kind = data.get("type", "")
    if kind == "sql":
        text = data.get("expression", "")
    elif kind == "correlation":
        text = ", ".join(f"{k}={v}" for k, v in data.items() if k != "type" and v not in (None, {}, ""))
    else:
        text = {"true": "1=1", "false": "1=0"}.get(kind, json.dumps(data))
    action = rule.action.to_dict()
    return {
        "name": rule.name,
        "filter_type": kind,
        "filter": text,
        "action": action.get("expression", "") if action.get("type") == "sql" else "",
    }


# ----------------------------------------------------------------------------------------------- messages
@dataclass(slots=True)
class MessagePage:
    messages: list[Message]
    next_from: int | None  # where the next page starts (None: no more)
    scanned_out: bool = False  # a filtered page stopped at SCAN_LIMIT


def address(path: str, queue: str) -> str:
    if queue not in SUB_QUEUES:
        raise EntityNotFound(f"No sub-queue '{queue}': use {', '.join(SUB_QUEUES)}.")
    return path + SUB_QUEUES[queue][0]


def peek_page(ns: Namespace, path: str, queue: str, start: int = 0, size: int = PAGE_SIZE) -> MessagePage:
    """Messages by sequence number from ``start``, partition after partition (the service's peek, which never
    locks), kept to the sub-queue's state."""
    where = address(path, queue)
    state = SUB_QUEUES[queue][1]
    out: list[Message] = []
    scanned = 0
    while len(out) < size:
        if scanned >= SCAN_LIMIT:
            return MessagePage(out, start, True)
        batch = ns.peek_messages(where, min(100, max(size - len(out), 1) if state is None else 100), start)
        if not batch:
            return MessagePage(out, None)
        for m in batch:
            scanned += 1
            start = (m.sequence_number or 0) + 1
            if state is None or m.state is state:
                out.append(m)
                if len(out) == size:
                    break
    return MessagePage(out, start)


def find_message(ns: Namespace, path: str, queue: str, sequence_number: int) -> Message:
    found = ns.peek_messages(address(path, queue), 1, sequence_number)
    if not found or found[0].sequence_number != sequence_number:
        raise EntityNotFound(f"No message with sequence number {sequence_number} (received, expired or purged).")
    return found[0]


def split_sequence(sequence_number: int | None) -> tuple[int, int]:
    return decode_sequence_number(sequence_number or 0)


def _when(ms: int | None) -> datetime | str | None:
    """A broker time; "never" beyond what a datetime holds (the default TTL is TimeSpan.MaxValue)."""
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return "never"


def system_properties(m: Message) -> list[tuple[str, Any]]:
    partition, local = split_sequence(m.sequence_number)
    ttl = m.time_to_live
    rows = [
        ("SequenceNumber", m.sequence_number),
        ("Partition", partition),
        ("Partition sequence number", local),
        ("State", m.state.name.capitalize()),
        ("MessageId", m.message_id),
        ("EnqueuedTimeUtc", _when(m.enqueued_time_ms)),
        ("ScheduledEnqueueTimeUtc", m.scheduled_enqueue_time),
        ("ExpiresAtUtc", _when(m.expires_at_ms)),
        ("TimeToLive", ttl),
        ("DeliveryCount", m.delivery_count),
        ("SessionId", m.session_id),
        ("PartitionKey", m.partition_key),
        ("CorrelationId", m.correlation_id),
        ("Subject", m.subject),
        ("ContentType", m.content_type),
        ("To", m.to),
        ("ReplyTo", m.reply_to),
        ("ReplyToSessionId", m.reply_to_session_id),
        ("DeadLetterReason", m.dead_letter_reason),
        ("DeadLetterErrorDescription", m.dead_letter_error_description),
        ("DeadLetterSource", m.dead_letter_source),
        ("EnqueuedSequenceNumber", m.enqueued_sequence_number),
        ("Size (body bytes)", len(m.body)),
    ]
    return [(k, v) for k, v in rows if v is not None]


def body_views(m: Message) -> dict[str, Any]:
    """The body as text, as pretty-printed JSON, and as hex (the parts that apply)."""
    body = m.body[:BODY_LIMIT]
    views: dict[str, Any] = {
        "truncated": len(m.body) > BODY_LIMIT,
        "length": len(m.body),
        "text": None,
        "json": None,
        "amqp": m.body_type is not BodyType.DATA,
    }
    if m.body_type is BodyType.DATA:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        views["text"] = text
        if text is not None and not views["truncated"]:
            try:
                views["json"] = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                pass
    lines = []
    for offset in range(0, len(body), 16):
        chunk = body[offset : offset + 16]
        hexed = " ".join(f"{b:02x}" for b in chunk)
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexed:<47}  {printable}")
    views["hex"] = "\n".join(lines)
    return views
