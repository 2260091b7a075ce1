"""``Message``: one Service Bus message with its user-set and broker-set (system) properties.

The same class travels in both directions: applications build one to send, and the broker hands out copies with
the system properties filled in (sequence number, enqueued time, lock token, delivery count, dead-letter
reason). Times the broker sets are kept as integer milliseconds since the Unix epoch (cheap to compare and
store) and exposed as aware UTC ``datetime`` objects through properties.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any


class MessageState(enum.IntEnum):
    """The service's message states, as ``x-opt-message-state`` numbers them."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class BodyType(enum.IntEnum):
    """How ``Message.body`` is to be read. The core never looks inside a body.

    DATA is raw bytes (one AMQP ``data`` section). VALUE and SEQUENCE hold an AMQP-encoded ``amqp-value`` or
    ``amqp-sequence`` section produced by a front end, carried through untouched.
    """

    DATA = 0
    VALUE = 1
    SEQUENCE = 2
    NONE = 3  # no body section at all (the SDK's body=None)


class ReceiveMode(enum.Enum):
    PEEK_LOCK = "peek_lock"
    RECEIVE_AND_DELETE = "receive_and_delete"


class SubQueue(enum.IntEnum):
    """The queues inside one queue or subscription."""

    MAIN = 0
    DEAD_LETTER = 1
    TRANSFER_DEAD_LETTER = 2


def ms_to_datetime(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def datetime_to_ms(value: datetime) -> int:
    if value.tzinfo is None:  # naive datetimes are taken as UTC, as the SDK does
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def now_ms(clock_seconds: float) -> int:
    return int(clock_seconds * 1000)


@dataclass(slots=True, eq=False)
class Message:
    """A message. Build one with a body and any user properties; the broker fills in the rest on delivery."""

    body: bytes = b""
    message_id: Any = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: Any = None
    subject: str | None = None
    content_type: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    time_to_live: timedelta | None = None
    scheduled_enqueue_time: datetime | None = None
    application_properties: dict[str, Any] | None = None
    # Message annotations other than the broker's own x-opt-* ones, carried through for AMQP clients.
    annotations: dict[str, Any] | None = None
    body_type: BodyType = BodyType.DATA

    # --- set by the broker -------------------------------------------------------------------------------
    sequence_number: int | None = field(default=None, repr=False)
    enqueued_time_ms: int | None = field(default=None, repr=False)
    expires_at_ms: int | None = field(default=None, repr=False)
    delivery_count: int = field(default=0, repr=False)
    lock_token: uuid.UUID | None = field(default=None, repr=False)
    locked_until_ms: int | None = field(default=None, repr=False)
    state: MessageState = field(default=MessageState.ACTIVE, repr=False)
    dead_letter_reason: str | None = field(default=None, repr=False)
    dead_letter_error_description: str | None = field(default=None, repr=False)
    dead_letter_source: str | None = field(default=None, repr=False)
    partition_id: int | None = field(default=None, repr=False)
    # The sequence number the message had in the entity it was first enqueued into (forwarding keeps it).
    enqueued_sequence_number: int | None = field(default=None, repr=False)
    # Hops taken through auto-forwarding; the service dead-letters after its chain limit.
    forward_hops: int = field(default=0, repr=False)
    # A front end's encoded form of the unchanging part of the message (kept in memory, never stored), so
    # deliveries need not re-encode it; the front end decides its layout (AMQP leaves a data body out of it, as
    # ``body`` holds that already). Anything that changes properties or body must clear it.
    wire_sections: bytes | None = field(default=None, repr=False)
    # Set by auto-forwarding: the destination drops a second arrival with the same id (exactly-once hand-off).
    transfer_id: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")
        elif isinstance(self.body, bytearray | memoryview):
            self.body = bytes(self.body)

    @property
    def enqueued_time(self) -> datetime | None:
        return ms_to_datetime(self.enqueued_time_ms)

    @property
    def expires_at(self) -> datetime | None:
        return ms_to_datetime(self.expires_at_ms)

    @property
    def locked_until(self) -> datetime | None:
        return ms_to_datetime(self.locked_until_ms)

    @property
    def label(self) -> str | None:
        """``Label`` is the older name of ``subject`` (correlation filters still use it)."""
        return self.subject

    def copy(self) -> Message:
        """A shallow copy whose property maps can be changed without touching the original."""
        clone = _copy_message(self)
        if self.application_properties is not None:
            clone.application_properties = dict(self.application_properties)
        if self.annotations is not None:
            clone.annotations = dict(self.annotations)
        return clone


def _make_copier() -> object:
    """A straight-line field copy, generated once: a getattr loop over the slots costs several times more,
    and every sent and delivered message is copied."""
    lines = ["def _copy_message(m):", "    c = _new(Message)"]
    lines += [f"    c.{name} = m.{name}" for name in Message.__slots__]
    lines.append("    return c")
    namespace: dict[str, object] = {"Message": Message, "_new": Message.__new__}
    exec("\n".join(lines), namespace)
    return namespace["_copy_message"]


_copy_message = _make_copier()


def _make_constructor() -> Callable[..., Message]:
    """``new_message``, generated once: the user-set fields as parameters in the dataclass's order (with its
    defaults), the broker-set ones at their defaults, and no ``__post_init__``. A front end builds one message
    per send; copying a blank one and then setting the fields it decoded stored most of them twice."""
    env: dict[str, object] = {"Message": Message, "_new": Message.__new__}
    params, lines = [], []
    for f in fields(Message):
        env[f"_d_{f.name}"] = f.default
        default = repr(f.default) if f.default is None or type(f.default) in (int, bytes) else f"_d_{f.name}"
        if f.repr:  # a user-set field (the broker's are repr=False)
            params.append(f"{f.name}={default}")
            lines.append(f"    m.{f.name} = {f.name}")
        else:
            lines.append(f"    m.{f.name} = {default}")
    source = [f"def new_message({', '.join(params)}):", "    m = _new(Message)", *lines, "    return m"]
    exec("\n".join(source), env)
    return env["new_message"]  # type: ignore[return-value]


new_message = _make_constructor()
new_message.__doc__ = """``Message(...)`` for a body already of type bytes, the other user-set fields positional in the
dataclass's order, without the dataclass constructor (a front end builds one per message it receives)."""
