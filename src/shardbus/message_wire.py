"""A Service Bus message on AMQP, written once: its annotation names and its fields as sections, both ways.

Both ends of our wire map a message here: the client (``client.py``, what the Spark connector, the CLI and the
benchmarks send with) and the endpoint (``endpoint/mapping.py``, what the broker decodes and delivers). A field
mapped differently by the two would be a message that changes on its way, so they share this module, which sits
below both: it imports only the AMQP engine (``import shardbus.client`` must load nothing of the broker's core,
``tests/install/test_import_layers.py``). The endpoint's fast paths (``_decode_plain``, ``_delivery_head``) write the
same mapping byte by byte for the usual message; ``tests/endpoint/test_mapping_fast_paths.py`` holds them to this.

The fields (SERVICEBUS_AMQP.md §3.5): message-id, to, subject (the old Label), reply-to, correlation-id and
content-type in ``properties`` as themselves; SessionId is ``group-id`` and ReplyToSessionId ``reply-to-group-id``;
the partition key is the ``x-opt-partition-key`` message annotation; the time to live is ``header.ttl`` (ms).
Nothing is kept in memory.
"""

from __future__ import annotations

from typing import Any, Protocol

from .amqp import types as t
from .amqp.message import AmqpMessage, BodyType, Header, Properties, encode_message

__all__ = [
    "BROKER_OWNED",
    "DEAD_LETTER_DESCRIPTION",
    "DEAD_LETTER_REASON",
    "DEAD_LETTER_SOURCE",
    "ENQUEUED_TIME",
    "ENQUEUE_SEQUENCE",
    "LOCKED_UNTIL",
    "LOCK_TOKEN",
    "MESSAGE_STATE",
    "PARTITION_KEY",
    "PROPERTY_FIELDS",
    "SCHEDULED_TIME",
    "SEQUENCE_NUMBER",
    "MessageFields",
    "encode_sections",
    "properties_of",
    "read_properties",
]

# Message annotations: a sender may set the first two; the broker stamps the others on what it delivers.
PARTITION_KEY = t.Symbol("x-opt-partition-key")
SCHEDULED_TIME = t.Symbol("x-opt-scheduled-enqueue-time")
SEQUENCE_NUMBER = t.Symbol("x-opt-sequence-number")
ENQUEUED_TIME = t.Symbol("x-opt-enqueued-time")
LOCKED_UNTIL = t.Symbol("x-opt-locked-until")
ENQUEUE_SEQUENCE = t.Symbol("x-opt-enqueue-sequence-number")
MESSAGE_STATE = t.Symbol("x-opt-message-state")
DEAD_LETTER_SOURCE = t.Symbol("x-opt-deadletter-source")
LOCK_TOKEN = t.Symbol("x-opt-lock-token")
# What a client may echo back (a re-sent received message keeps them) and the broker drops on the way in.
BROKER_OWNED = frozenset(
    {
        "x-opt-sequence-number",
        "x-opt-enqueued-time",
        "x-opt-locked-until",
        "x-opt-lock-token",
        "x-opt-message-state",
        "x-opt-enqueue-sequence-number",
        "x-opt-deadletter-source",
        "x-opt-partition-id",
        "x-opt-via-partition-key",
    }
)
# A dead-lettered message's reason and description travel as application properties, as the service sends them.
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"


# A message's field -> the ``properties`` field it travels in (content-type as a symbol).
PROPERTY_FIELDS: tuple[tuple[str, str], ...] = (
    ("message_id", "message_id"),
    ("correlation_id", "correlation_id"),
    ("subject", "subject"),
    ("content_type", "content_type"),
    ("to", "to"),
    ("reply_to", "reply_to"),
    ("session_id", "group_id"),
    ("reply_to_session_id", "reply_to_group_id"),
)


class MessageFields(Protocol):
    """The fields a sender sets that travel in ``properties``: the core's ``Message`` and the client's
    ``OutgoingMessage`` both have them, under these names."""

    message_id: Any
    to: Any
    subject: str | None
    reply_to: Any
    correlation_id: Any
    content_type: str | None
    session_id: str | None
    reply_to_session_id: str | None


def properties_of(
    m: MessageFields, absolute_expiry_time: int | None = None, creation_time: int | None = None
) -> Properties:
    """The ``properties`` section of a message (the two times, ms since the epoch, only the broker sets): the
    ``PROPERTY_FIELDS`` mapping, spelled out, as every message the client sends and many deliveries pay for it."""
    ct = m.content_type
    return Properties(
        message_id=m.message_id,
        to=m.to,
        subject=m.subject,
        reply_to=m.reply_to,
        correlation_id=m.correlation_id,
        content_type=None if ct is None else t.Symbol(ct),
        absolute_expiry_time=None if absolute_expiry_time is None else t.Timestamp(absolute_expiry_time),
        creation_time=None if creation_time is None else t.Timestamp(creation_time),
        group_id=m.session_id,
        reply_to_group_id=m.reply_to_session_id,
    )


def read_properties(m: MessageFields, p: Properties) -> None:
    """The inverse of :func:`properties_of`: set ``m``'s fields from a decoded ``properties`` section (spelled out
    too: every message that misses the endpoint's fast path comes here)."""
    m.message_id = p.message_id
    m.correlation_id = p.correlation_id
    m.subject = p.subject
    m.content_type = None if p.content_type is None else str(p.content_type)  # a symbol on the wire
    m.to = p.to
    m.reply_to = p.reply_to
    m.session_id = p.group_id
    m.reply_to_session_id = p.reply_to_group_id


def encode_sections(
    m: MessageFields,
    *,
    header: Header | None,
    annotations: dict[Any, Any] | None,
    application_properties: dict[str, Any] | None,
    body: Any,
    body_type: BodyType = BodyType.DATA,
    absolute_expiry_time: int | None = None,
    creation_time: int | None = None,
) -> bytes:
    """A whole message, encoded: ``header``, message ``annotations``, ``m``'s properties (:func:`properties_of`), its
    application properties and its body (``body_type`` says which sections: a list of data sections by default)."""
    return encode_message(
        AmqpMessage(
            header=header,
            message_annotations=annotations,
            properties=properties_of(m, absolute_expiry_time, creation_time),
            application_properties=application_properties,
            body=body,
            body_type=body_type,
        )
    )
