"""How large a message is on the wire, and the size check the Python API shares with the AMQP path.

The AMQP path bounds each delivery as it arrives (the sender link advertises the entity's ``max-message-size``);
the Python API (``Namespace.send``, ``submit_send``, ``schedule_messages``) checks the same bounds here,
``check_send_size``, measuring a message as the AMQP encoding a client would send for it (``wire_size``, through
``message_wire``'s one mapping) and a batch as the envelope that carries those, so the same message is refused the
same way (``MessageSizeExceeded``) on either path. Nothing is kept: the measure encodes the small sections and
counts the body without copying it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .amqp import types as t
from .amqp.codec import EncodeError
from .amqp.message import BodyType, Header
from .message_wire import encode_sections
from .model.errors import MessageSizeExceeded
from .model.message import BodyType as CoreBody
from .model.message import Message, datetime_to_ms

__all__ = ["batches_within", "check_send_size", "wire_size"]

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
    try:
        head = len(
            encode_sections(
                m,
                header=Header(ttl=ttl) if ttl else None,
                annotations=annotations or None,
                application_properties=m.application_properties or None,
                body=None,
                body_type=BodyType.NONE,
            )
        )
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


def batches_within(messages: Sequence[Message], batch_largest: int) -> list[list[Message]]:
    """``messages`` cut, in order, into batches that each fit ``batch_largest`` as ``check_send_size`` measures a
    batch (a message too large for any batch goes alone, to be refused on its own)."""
    batches: list[list[Message]] = []
    batch: list[Message] = []
    total = 0
    for m in messages:
        size = wire_size(m)
        carried = _SECTION + _binary_head(size) + size
        if batch and total + carried > batch_largest:
            batches.append(batch)
            batch, total = [], 0
        batch.append(m)
        total += carried
    if batch:
        batches.append(batch)
    return batches
