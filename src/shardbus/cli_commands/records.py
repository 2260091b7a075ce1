"""Messages as JSON records: what ``send``/``import`` read and ``peek``/``receive``/``export`` write.

One record per line (JSON lines). The fields a sender may set use the SDK's names::

    {"body": "order 1", "message_id": "m-1", "partition_key": "customer-7", "session_id": null,
     "correlation_id": null, "subject": "created", "content_type": "text/plain", "to": null, "reply_to": null,
     "reply_to_session_id": null, "time_to_live": 3600, "application_properties": {"priority": 3}}

``body`` is text (UTF-8); a body that is not text is written as ``body_base64`` instead, and a JSON object or
list given as ``body`` is sent as its JSON text. ``time_to_live`` is in seconds. What the broker stamps
(``sequence_number``, ``partition``, ``enqueued_time``, ``delivery_count``, ``state``, ``dead_letter_reason``,
``dead_letter_error_description``, ``lock_token``) is written on the way out and ignored on the way in, so an
export imports as it is.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from ..amqp import types as t
from ..amqp.message import AmqpMessage, Header, encode_message
from ..client import OutgoingMessage, ReceivedMessage
from ..message_wire import BROKER_OWNED, DEAD_LETTER_DESCRIPTION, DEAD_LETTER_REASON, PROPERTY_FIELDS
from ..model.routing import decode_sequence_number

# Record fields a sender sets, and the AMQP properties field each comes from on the way out (message_wire's mapping).
SENDER_FIELDS: tuple[tuple[str, str], ...] = PROPERTY_FIELDS
BROKER_FIELDS = frozenset(
    {
        "sequence_number",
        "partition",
        "enqueued_time",
        "delivery_count",
        "state",
        "dead_letter_reason",
        "dead_letter_error_description",
        "lock_token",
    }
)
ACCEPTED = frozenset(
    {name for name, _ in SENDER_FIELDS}
    | {"body", "body_base64", "partition_key", "time_to_live", "application_properties"}
    | BROKER_FIELDS
)
STATES = {0: "active", 1: "deferred", 2: "scheduled"}


class RecordError(ValueError):
    """A record that cannot be sent; says which line."""


# ------------------------------------------------------------------------------------------------- reading
def record_to_message(record: Any, where: str = "record") -> OutgoingMessage:
    """A JSON record (a dict) to the message to send."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(record).__name__}")
    unknown = set(record) - ACCEPTED
    if unknown:
        raise RecordError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if "body" in record and "body_base64" in record:
        raise RecordError(f"{where}: give body or body_base64, not both")
    content_type = record.get("content_type")
    if "body_base64" in record:
        try:
            body = base64.b64decode(str(record["body_base64"]), validate=True)
        except ValueError:
            raise RecordError(f"{where}: body_base64 is not base64") from None
    else:
        value = record.get("body", "")
        if isinstance(value, str):
            body = value.encode("utf-8")
        elif value is None:
            body = b""
        else:  # a JSON value as the body: its JSON text
            body = json.dumps(value, ensure_ascii=False).encode("utf-8")
            content_type = content_type or "application/json"
    message = OutgoingMessage(body=body, content_type=None if content_type is None else str(content_type))
    for name, _ in SENDER_FIELDS:
        if name != "content_type" and record.get(name) is not None:
            setattr(message, name, str(record[name]))
    if record.get("partition_key") is not None:
        message.partition_key = str(record["partition_key"])
    ttl = record.get("time_to_live")
    if ttl is not None:
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
            raise RecordError(f"{where}: time_to_live must be a positive number of seconds")
        message.time_to_live_ms = round(ttl * 1000)
    props = record.get("application_properties")
    if props is not None:
        if not isinstance(props, dict):
            raise RecordError(f"{where}: application_properties must be an object")
        for key, value in props.items():
            if isinstance(value, dict | list):
                raise RecordError(f"{where}: application property {key!r} must be a string, number or boolean")
        message.application_properties = dict(props)
    return message


def read_records(stream: IO[str], name: str) -> Iterator[OutgoingMessage]:
    """JSON lines to messages; blank lines are skipped, a bad line stops with its line number."""
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{name}:{number}: not JSON ({exc.msg})") from None
        yield record_to_message(record, f"{name}:{number}")


# ------------------------------------------------------------------------------------------------- writing
def message_to_record(m: ReceivedMessage) -> dict[str, Any]:
    """A peeked or received message as a record (sender fields first, then what the broker stamped)."""
    amqp = m.message
    record: dict[str, Any] = {}
    body = m.body
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    props = amqp.properties
    for name, attr in SENDER_FIELDS:
        value = None if props is None else getattr(props, attr)
        if value is not None:
            record[name] = _plain(value)
    partition_key = m.annotation("x-opt-partition-key")
    if partition_key is not None and partition_key != record.get("session_id"):
        record["partition_key"] = str(partition_key)
    if amqp.header is not None and amqp.header.ttl:
        ttl = int(amqp.header.ttl)
        record["time_to_live"] = ttl // 1000 if ttl % 1000 == 0 else ttl / 1000
    app = {str(k): v for k, v in (amqp.application_properties or {}).items()}
    reason = app.pop(DEAD_LETTER_REASON, None)
    description = app.pop(DEAD_LETTER_DESCRIPTION, None)
    if app:
        record["application_properties"] = {k: _plain(v) for k, v in app.items()}
    sequence = m.sequence_number
    record["sequence_number"] = sequence
    record["partition"] = decode_sequence_number(sequence)[0]
    enqueued = m.enqueued_time_ms
    if enqueued is not None:
        record["enqueued_time"] = datetime.fromtimestamp(enqueued / 1000, UTC).isoformat(timespec="milliseconds")
    if amqp.header is not None:
        record["delivery_count"] = int(amqp.header.delivery_count)
    state = m.annotation("x-opt-message-state")
    if state is not None:
        record["state"] = STATES.get(int(state), str(state))
    if reason is not None or description is not None:
        record["dead_letter_reason"] = reason
        record["dead_letter_error_description"] = description
    if m.lock_token is not None:
        record["lock_token"] = str(m.lock_token)
    return record


def write_records(stream: IO[str], messages: Iterable[ReceivedMessage]) -> int:
    count = 0
    for m in messages:
        stream.write(json.dumps(message_to_record(m), ensure_ascii=False) + "\n")
        count += 1
    return count


def _plain(value: Any) -> Any:
    """An AMQP value as JSON can carry it (types without a JSON counterpart become text)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, t.Symbol):
        return str(value)
    if isinstance(value, int | float):
        return value if type(value) in (int, float) else (int(value) if isinstance(value, int) else float(value))
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


# ------------------------------------------------------------------------------------------------ resubmit
def resubmission(m: ReceivedMessage) -> bytes:
    """A dead-lettered message as a new send: every section as received, less what the broker stamped
    (sequence number, enqueued time, lock, dead-letter source) and the dead-letter reason and description;
    the delivery count starts again."""
    amqp = m.message
    annotations = {k: v for k, v in (amqp.message_annotations or {}).items() if str(k) not in BROKER_OWNED}
    app = {
        k: v
        for k, v in (amqp.application_properties or {}).items()
        if str(k) not in (DEAD_LETTER_REASON, DEAD_LETTER_DESCRIPTION)
    }
    header = None if amqp.header is None else Header(ttl=amqp.header.ttl)
    properties = amqp.properties
    if properties is not None:  # the broker's creation and expiry times of the old message do not carry over
        properties = dataclasses.replace(properties, creation_time=None, absolute_expiry_time=None)
    return encode_message(
        AmqpMessage(
            header=header,
            message_annotations=annotations or None,
            properties=properties,
            application_properties=app or None,
            body=amqp.body,
            body_type=amqp.body_type,
        )
    )
