"""What clients may hold of the broker: connections, sessions and links per connection, and silence.

Every limit is announced where AMQP lets a peer learn it, and enforced where the spec says how:

* connections: at most ``max_connections`` AMQP connections per listener process. One more is served just long
  enough to be refused politely: its ``open`` is answered with ``open`` then ``close`` carrying
  ``amqp:resource-limit-exceeded`` (RabbitMQ refuses the same way). Sockets beyond ``max_connections +
  ACCEPT_SLACK`` (connections nobody has identified yet included) are dropped at once, unread: a flood of bare TCP
  connections costs a file descriptor each for a moment, never a connection's state.
* sessions: ``open.channel-max`` is ``max_sessions - 1``; a ``begin`` on a higher channel closes the connection
  with ``amqp:connection:framing-error`` (AMQP 1.0, 2.7.1).
* links: ``begin.handle-max`` is ``max_links_per_session - 1``; an ``attach`` with a higher handle closes the
  connection with ``amqp:connection:framing-error`` (2.7.2). Across all its sessions a connection holds at most
  ``max_links``; one more is refused alone (the link is detached with ``amqp:resource-limit-exceeded``, which the
  SDK raises as ``ServiceBusQuotaExceededError``) and the connection goes on.
* silence: ``open.idle-time-out`` announces ``idle_timeout``; a connection that sends nothing (not even an empty
  frame) for twice that long is closed with ``amqp:resource-limit-exceeded``, as 2.4.5 advises (announce half the
  real threshold). Empty frames go out to honour the peer's own idle-time-out. A socket that has not sent its
  ``open`` within ``handshake_timeout`` is dropped.

The defaults fit the SDK: it opens one session per connection and a few links, sends empty frames at half the
announced idle time-out from its keep-alive loop, and is told to expect at least two minutes (SERVICEBUS_AMQP.md).

Message sizes are the entity's (``Namespace.message_size_limits``: its largest message and largest batch). Over
AMQP the engine bounds each delivery as it arrives (endpoint/connection.py); the Python API (``Namespace.send``)
checks the same bounds here, ``check_send_size``, measuring a message as the AMQP encoding a client would send for
it (``wire_size``) and a batch as the envelope that carries those, so the same message is refused the same way
(``MessageSizeExceeded``) on either path. Nothing is kept: the measure encodes the small sections and counts the
body without copying it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..amqp import types as t
from ..amqp.codec import EncodeError
from ..amqp.message import AmqpMessage, BodyType, Header, Properties, encode_message
from ..model.errors import MessageSizeExceeded
from ..model.message import BodyType as CoreBody
from ..model.message import Message, datetime_to_ms

ACCEPT_SLACK = 1024  # sockets accepted beyond max_connections, to be refused politely (or timed out)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 10_000
    max_sessions: int = 256  # per connection: channel-max 255
    max_links_per_session: int = 256  # handle-max 255
    max_links: int = 1_000  # per connection, over all its sessions
    idle_timeout: float | None = 120.0  # seconds announced in open; the broker closes after twice as long
    handshake_timeout: float = 30.0  # seconds from accept to the client's open

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not 1 <= self.max_sessions <= 65536:
            raise ValueError("max_sessions must be between 1 and 65536")
        if self.max_links_per_session < 1 or self.max_links < 1:
            raise ValueError("link limits must be at least 1")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive (None: never)")

    @property
    def channel_max(self) -> int:
        return self.max_sessions - 1

    @property
    def handle_max(self) -> int:
        return self.max_links_per_session - 1

    @property
    def silence_allowed(self) -> float | None:
        """How long a peer may stay silent before the broker closes its connection."""
        return None if self.idle_timeout is None else 2 * self.idle_timeout


DEFAULT_LIMITS = ConnectionLimits()


_SECTION = 3  # a section's descriptor: 0x00 0x53 code


def _binary_head(n: int) -> int:
    """Bytes an AMQP binary of ``n`` bytes takes beyond its content (vbin8 or vbin32)."""
    return 2 if n < 256 else 5


def wire_size(m: Message) -> int:
    """The size of ``m`` as the AMQP message a client sends for it (header with its time-to-live, the partition
    key and scheduled time annotations, properties, application properties, body), without copying the body."""
    annotations: dict[t.Symbol, object] = {}
    if m.annotations:
        annotations.update((t.Symbol(k), v) for k, v in m.annotations.items())
    if m.partition_key is not None:
        annotations[t.Symbol("x-opt-partition-key")] = m.partition_key
    if m.scheduled_enqueue_time is not None:
        annotations[t.Symbol("x-opt-scheduled-enqueue-time")] = t.Timestamp(datetime_to_ms(m.scheduled_enqueue_time))
    ttl = None if m.time_to_live is None else int(m.time_to_live.total_seconds() * 1000)
    sections = AmqpMessage(
        header=Header(ttl=ttl) if ttl else None,
        message_annotations=annotations or None,
        properties=Properties(
            message_id=m.message_id,
            to=m.to,
            subject=m.subject,
            reply_to=m.reply_to,
            correlation_id=m.correlation_id,
            content_type=None if m.content_type is None else t.Symbol(m.content_type),
            group_id=m.session_id,
            reply_to_group_id=m.reply_to_session_id,
        ),
        application_properties=m.application_properties or None,
        body_type=BodyType.NONE,
    )
    try:
        head = len(encode_message(sections))
    except (EncodeError, TypeError, ValueError, OverflowError):
        head = 0  # a value AMQP cannot carry: the store refuses it (ArgumentError); the body alone counts here
    n = len(m.body)
    if m.body_type is CoreBody.DATA:
        return head + _SECTION + _binary_head(n) + n
    return head + (_SECTION + n if n else 0)  # value and sequence bodies are kept encoded already


def check_send_size(messages: Sequence[Message], largest: int, batch_largest: int, entity: str) -> None:
    """Refuse, as the AMQP path does, a message over ``largest`` bytes or a batch (more than one message, sent as
    one) over ``batch_largest``; ``MessageSizeExceeded`` names the size and the bound."""
    total = 0
    for m in messages:
        size = wire_size(m)
        if size > largest:
            raise MessageSizeExceeded(
                f"The message (size: {size} bytes) exceeds the limit ({largest} bytes) currently allowed for "
                f"'{entity}'."
            )
        total += _SECTION + _binary_head(size) + size  # the batch carries each message as a data section
    if len(messages) > 1 and total > batch_largest:
        raise MessageSizeExceeded(
            f"The batch of {len(messages)} messages (size: {total} bytes) exceeds the limit ({batch_largest} bytes) "
            f"currently allowed for '{entity}'."
        )
