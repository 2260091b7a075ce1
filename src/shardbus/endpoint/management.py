"""The ``$management`` node: one table maps each operation to its handler (SERVICEBUS_AMQP.md §6.3).

A handler takes the request context and the request body (a map with string keys) and returns a
``ManagementReply`` at once, or a ``concurrent.futures.Future`` of one when it waits for a store write.
Errors are raised as domain errors; the caller turns them into ``statusCode``/``errorCondition``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..amqp.types import Array, Long, Timestamp
from ..entity.entity import Target
from ..entity.receiver import Receiver, submit_receive_deferred
from ..entity.sessions import SessionReceiver, list_sessions
from ..model.errors import ArgumentError, SessionLockLost
from ..model.message import Message, SubQueue
from ..model.routing import decode_sequence_number, partition_for_key
from ..namespace import Namespace, hurry
from . import rules
from .conditions import condition_of
from .mapping import decode_to_message, encode_delivery

PREFIX = "com.microsoft:"
PREFIX_OURS = "com.shardbus:"  # operations beyond the service's


@dataclass(slots=True)
class ManagementReply:
    status: int = 200
    description: str = "OK"
    body: dict[str, Any] | None = None
    condition: str | None = None

    @classmethod
    def error(cls, exc: BaseException) -> ManagementReply:
        condition, status = condition_of(exc)
        return cls(status, str(exc) or type(exc).__name__, None, condition)


class ManagementContext:
    """What a handler may use: the namespace, the node's entity, and receivers for settling by lock token."""

    def __init__(
        self,
        namespace: Namespace,
        node: str,
        receivers: Callable[[Target, int], Receiver],
        sessions: Callable[[Target, str], SessionReceiver | None],
        application_properties: dict[str, Any],
    ) -> None:
        self.namespace = namespace
        self.node = node
        self._receivers = receivers
        self._sessions = sessions
        self.application_properties = application_properties
        self.transaction_id: bytes | None = None  # set when the request is part of an AMQP transaction

    def target(self) -> tuple[Target, SubQueue]:
        return self.namespace.resolve(self.node)

    def receiver(self) -> Receiver:
        target, sub_queue = self.target()
        return self._receivers(target, sub_queue)

    def session(self, body: dict[str, Any]) -> SessionReceiver | None:
        """The session this connection holds for the request's ``session-id`` (None when it names none)."""
        session_id = body.get("session-id")
        if session_id is None:
            return None
        if isinstance(session_id, bytes):
            session_id = session_id.decode("utf-8")
        target, _ = self.target()
        held = self._sessions(target, str(session_id))
        if held is None:
            raise SessionLockLost(
                f"The session '{session_id}' is not locked by a receiver on this connection: accept it first."
            )
        return held

    def settler(self, body: dict[str, Any]) -> Receiver | SessionReceiver:
        return self.session(body) or self.receiver()


def _ints(value: Any, key: str) -> list[int]:
    if value is None:
        raise ArgumentError(f"The request needs '{key}'.")
    return [int(v) for v in (value if isinstance(value, list | tuple) else [value])]


def _tokens(body: dict[str, Any]) -> list[uuid.UUID]:
    tokens = body.get("lock-tokens")
    if not tokens:
        raise ArgumentError("The request needs 'lock-tokens'.")
    return [t if isinstance(t, uuid.UUID) else uuid.UUID(bytes=bytes(t)) for t in tokens]


def peek_message(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    target, sub_queue = ctx.target()
    start = int(body.get("from-sequence-number") or 0)
    count = int(body.get("message-count") or 1)
    session_id = body.get("session-id")
    if session_id is not None:
        session_id = session_id.decode() if isinstance(session_id, bytes) else str(session_id)
        partition = target.partitions[partition_for_key(session_id, len(target.partitions))]
        local = max(decode_sequence_number(start)[1], 1)
        messages = partition.peek(target.slot, sub_queue, local, count, session_id)
    else:
        messages = target.peek(start, count, sub_queue)
    if not messages:
        return ManagementReply(204, "No Content")
    return ManagementReply(body={"messages": [{"message": encode_delivery(m, peek=True)} for m in messages]})


def renew_lock(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    receiver = ctx.receiver()
    expirations = [Timestamp(receiver.renew_lock(token)) for token in _tokens(body)]
    return ManagementReply(body={"expirations": Array(Timestamp, expirations)})


def receive_by_sequence_number(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply | Future:
    target, sub_queue = ctx.target()
    seqs = _ints(body.get("sequence-numbers"), "sequence-numbers")
    peek_lock = int(body.get("receiver-settle-mode", 1)) == 1
    session = ctx.session(body)
    held = None if session is None else (session.session_id, session.token)
    messages, removals = submit_receive_deferred(target, sub_queue, seqs, peek_lock, held)
    entries = []
    for m in messages:
        entry: dict[str, Any] = {"message": encode_delivery(m)}
        if m.lock_token is not None:
            entry["lock-token"] = m.lock_token
        entries.append(entry)
    reply = ManagementReply(body={"messages": entries})
    # Receive-and-delete answers once the removals are stored, from their commit, without blocking the loop.
    return _after(removals, lambda: reply) if removals else reply


_OUTCOMES = {
    "completed": "complete",
    "abandoned": "abandon",
    "defered": "defer",  # sic: the SDK's spelling
    "deferred": "defer",
    "suspended": "dead_letter",
}


def update_disposition(ctx: ManagementContext, body: dict[str, Any]) -> Future:
    status = str(body.get("disposition-status", "")).lower()
    outcome = _OUTCOMES.get(status)
    if outcome is None:
        raise ArgumentError(f"Unknown disposition-status '{status}'.")
    settler = ctx.settler(body)
    reason = body.get("deadletter-reason") or None
    description = body.get("deadletter-description") or None
    futures = [settler.submit_settle(outcome, token, reason, description) for token in _tokens(body)]
    return _after([f for f in futures if f is not None], lambda: ManagementReply())


def renew_session_lock(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    session = _required_session(ctx, body)
    return ManagementReply(body={"expiration": Timestamp(session.renew_session_lock())})


def get_session_state(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    session = _required_session(ctx, body)
    return ManagementReply(body={"session-state": session.get_state()})


def set_session_state(ctx: ManagementContext, body: dict[str, Any]) -> Future:
    session = _required_session(ctx, body)
    state = body.get("session-state")
    if isinstance(state, str):
        state = state.encode("utf-8")
    return _after(
        [session.partition.set_session_state(session.slot, session.session_id, session.token, state)],
        lambda: ManagementReply(),
    )


# The SDK's "all sessions" marker: .NET DateTime.MaxValue in ms.
ALL_SESSIONS = 253402300800000


def get_message_sessions(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    target, _ = ctx.target()
    last_updated = body.get("last-updated-time")
    updated_after = None if last_updated in (None, ALL_SESSIONS) else int(last_updated)
    skip = int(body.get("skip") or 0)
    top = int(body.get("top") or 100)
    page = list_sessions(target, updated_after)[skip : skip + top]
    if not page:
        return ManagementReply(204, "No Content")
    return ManagementReply(body={"sessions-ids": Array(str, page)})


def _required_session(ctx: ManagementContext, body: dict[str, Any]) -> SessionReceiver:
    session = ctx.session(body)
    if session is None:
        raise ArgumentError("The request needs 'session-id'.")
    return session


def schedule_message(ctx: ManagementContext, body: dict[str, Any]) -> Future:
    entity = ctx.namespace._sender_entity(ctx.node)
    entries = body.get("messages") or []
    futures = []
    for entry in entries:
        entry = {str(k): v for k, v in entry.items()}
        message = decode_to_message(bytes(entry["message"]))
        if message.scheduled_enqueue_time is None:
            raise ArgumentError("A scheduled message needs x-opt-scheduled-enqueue-time.")
        futures.append(entity.submit_send([message]))
    return _after(
        futures,
        lambda: ManagementReply(body={"sequence-numbers": Array(Long, [Long(f.result()[0] or 0) for f in futures])}),
    )


def cancel_scheduled_message(ctx: ManagementContext, body: dict[str, Any]) -> Future:
    entity = ctx.namespace._sender_entity(ctx.node)
    futures = entity.submit_cancel_scheduled(_ints(body.get("sequence-numbers"), "sequence-numbers"))
    return _after(futures, lambda: ManagementReply())


def _after(futures: list[Future], reply: Callable[[], ManagementReply]) -> Future:
    """A future of ``reply()`` once every future is done (the first failure wins)."""
    result: Future = Future()
    remaining = [len(futures)]
    if not futures:
        result.set_result(reply())
        return result
    # Let go of ``reply`` once answered: a future keeps its callbacks, and a reply that reads the futures (as
    # schedule_message's does) would otherwise leave a reference cycle per request for the garbage collector.
    pending = [reply]

    def one_done(f: Future) -> None:
        exc = f.exception()
        if exc is not None and not result.done():
            pending.clear()
            result.set_exception(exc)
            return
        remaining[0] -= 1
        if remaining[0] == 0 and not result.done():
            make = pending.pop()
            try:
                result.set_result(make())
            except BaseException as e:
                result.set_exception(e)

    for f in futures:
        hurry(f)  # the client waits for the reply: a settlement's write need not wait for company
        f.add_done_callback(one_done)
    return result


# --- rules: com.microsoft:add-rule / remove-rule / enumerate-rules on '<topic>/Subscriptions/<sub>' (rules.py)
# A transactional request carries its txn-id as the request transfer's transactional-state (.NET
# RequestResponseAmqpLink.RequestAsync(message, txnId), Java sendWithAck(message, TransactionalState));
# the connection exposes it as ``ManagementContext.transaction_id`` (bytes, None outside a transaction).


def add_rule(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    topic, subscription = rules.subscription_of(ctx.namespace, ctx.node)
    rules.refuse_in_transaction(getattr(ctx, "transaction_id", None), "added", rules.rule_name_of(body))
    ctx.namespace.create_rule(topic, subscription, rules.rule_from_request(body))
    return ManagementReply()


def remove_rule(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    topic, subscription = rules.subscription_of(ctx.namespace, ctx.node)
    name = rules.rule_name_of(body)
    rules.refuse_in_transaction(getattr(ctx, "transaction_id", None), "removed", name)
    ctx.namespace.delete_rule(topic, subscription, name)
    return ManagementReply()


def enumerate_rules(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    topic, subscription = rules.subscription_of(ctx.namespace, ctx.node)
    skip, top = rules.page_of(body)
    listed = ctx.namespace.list_rules(topic, subscription)
    page = listed[skip:] if top is None else listed[skip : skip + top]
    if not page:
        return ManagementReply(204, "No Content")
    created = rules.rule_created_times(ctx.namespace, topic, subscription)
    entries = [{"rule-description": rules.encode_rule(rule, created.get(rule.name))} for rule in page]
    return ManagementReply(body={"rules": entries})


# --- sequence-range reads (ours, PREFIX_OURS): a stream processor's replayable reads and cumulative completion.
# Sequence numbers here are partition-relative; replies are columnar (one list per field) so a reader can build
# column batches (Arrow) without a per-message decode. The Spark connector (shardbus.spark) is the client.

# (column name, how a message gives it) in the order browse-range replies carry them
RANGE_COLUMNS: tuple[tuple[str, Callable[[Message], Any]], ...] = (
    ("sequence-number", lambda m: Long(m.sequence_number)),
    ("body", lambda m: m.body),
    ("body-type", lambda m: int(m.body_type)),
    ("message-id", lambda m: m.message_id),
    ("partition-key", lambda m: m.partition_key),
    ("session-id", lambda m: m.session_id),
    ("correlation-id", lambda m: m.correlation_id),
    ("subject", lambda m: m.subject),
    ("content-type", lambda m: m.content_type),
    ("to", lambda m: m.to),
    ("reply-to", lambda m: m.reply_to),
    ("application-properties", lambda m: m.application_properties),
    ("enqueued-time", lambda m: Long(m.enqueued_time_ms)),
    ("expires-at", lambda m: None if m.expires_at_ms is None else Long(m.expires_at_ms)),
    ("delivery-count", lambda m: m.delivery_count),
    ("state", lambda m: int(m.state)),
)


def range_offsets(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    """Per partition: first readable, end, completed mark, and the readable count from ``from[partition]``."""
    target, sub_queue = ctx.target()
    count_from = {int(k): int(v) for k, v in (body.get("from") or {}).items()}
    partitions = []
    for pid, offsets in enumerate(target.range_offsets(sub_queue, count_from)):
        if offsets is None:
            partitions.append({"partition": pid, "healthy": False})
        else:
            first, end, mark, count = offsets
            partitions.append(
                {
                    "partition": pid,
                    "healthy": True,
                    "first": Long(first),
                    "end": Long(end),
                    "mark": Long(mark),
                    "count": Long(count),
                }
            )
    return ManagementReply(body={"partitions": partitions})


def browse_range(ctx: ManagementContext, body: dict[str, Any]) -> ManagementReply:
    """Columns of the readable messages of one partition in [from, to), at most ``message-count`` of them
    (only the ``columns`` named, when given), and the partition's completed mark."""
    target, sub_queue = ctx.target()
    partition = _ints(body.get("partition"), "partition")[0]
    start = _ints(body.get("from-sequence-number"), "from-sequence-number")[0]
    end = _ints(body.get("to-sequence-number"), "to-sequence-number")[0]
    count = int(body.get("message-count") or 1000)
    wanted = {str(c) for c in body.get("columns") or ()}
    columns = [c for c in RANGE_COLUMNS if c[0] in wanted] if wanted else RANGE_COLUMNS
    messages = target.browse_range(partition, start, end, count, sub_queue)
    mark = target.completed_mark(partition, sub_queue)
    reply: dict[str, Any] = {"partition": partition, "count": len(messages), "mark": Long(mark)}
    for name, get in columns:
        reply[name] = [get(m) for m in messages]
    return ManagementReply(body=reply)


def complete_below(ctx: ManagementContext, body: dict[str, Any]) -> Future:
    target, sub_queue = ctx.target()
    marks = body.get("marks")
    if not isinstance(marks, dict) or not marks:
        raise ArgumentError("The request needs 'marks': a map of partition to sequence number.")
    futures = target.complete_below({int(k): int(v) for k, v in marks.items()}, sub_queue)
    return _after(futures, lambda: ManagementReply())


Handler = Callable[[ManagementContext, dict[str, Any]], "ManagementReply | Future"]

OPERATIONS: dict[str, Handler] = {
    PREFIX + "peek-message": peek_message,
    PREFIX + "renew-lock": renew_lock,
    PREFIX + "receive-by-sequence-number": receive_by_sequence_number,
    PREFIX + "update-disposition": update_disposition,
    PREFIX + "schedule-message": schedule_message,
    PREFIX + "cancel-scheduled-message": cancel_scheduled_message,
    PREFIX + "renew-session-lock": renew_session_lock,
    PREFIX + "get-session-state": get_session_state,
    PREFIX + "set-session-state": set_session_state,
    PREFIX + "get-message-sessions": get_message_sessions,
    PREFIX + "add-rule": add_rule,
    PREFIX + "remove-rule": remove_rule,
    PREFIX + "enumerate-rules": enumerate_rules,
    PREFIX_OURS + "range-offsets": range_offsets,
    PREFIX_OURS + "browse-range": browse_range,
    PREFIX_OURS + "complete-below": complete_below,
}
