"""The AMQP value types a stored message may carry, registered with the store's packer where a process starts.

Application properties keep their exact AMQP types (symbol, long, timestamp, char, array, described, ...) across
storage and the wire between processes. The store's packer (``records.register_type``) knows none of them until
``register_stored_types()`` is called: ``server.Broker``, every ``Namespace`` (the Python API's too), the
partition worker and the test process call it where they start, not as an import's side effect. Keeps nothing
beyond the packer's registry (one entry per type below).
"""

from __future__ import annotations

import uuid
from typing import Any

from ..amqp import types as t
from .records import register_type

__all__ = ["STORED_TYPES", "register_stored_types"]

# AMQP value types without a Python counterpart, as the store keeps them: (tag, class, to plain, from plain). A tag is
# part of the stored format: never reuse one. Tags 1-11 are the numeric and symbol types; a described value (the
# service's own uri, datetime-offset and timespan among them) is kept as it came, its descriptor and value stored like
# any other values; an array keeps its element type, by name.
_TYPES = (t.Symbol, t.UByte, t.UShort, t.UInt, t.ULong, t.Byte, t.Short, t.Int, t.Long, t.Timestamp, t.Float)
_ARRAY_ITEM_TYPES = (*_TYPES, t.Char, t.Decimal32, t.Decimal64, t.Decimal128, t.Described, t.Array, uuid.UUID)
_ARRAY_TYPES = {cls.__name__: cls for cls in (*_ARRAY_ITEM_TYPES, str, bytes, int, float, bool, list, dict)}
STORED_TYPES: tuple[tuple[int, type, Any, Any], ...] = (
    *(
        (tag, cls, (float if cls is t.Float else str if cls is t.Symbol else int), cls)
        for tag, cls in enumerate(_TYPES, start=1)
    ),
    (12, t.Described, lambda d: [d.descriptor, d.value], lambda plain: t.Described(*plain)),
    (13, t.Char, str, t.Char),
    *((tag, cls, bytes, cls) for tag, cls in enumerate((t.Decimal32, t.Decimal64, t.Decimal128), start=14)),
    (
        17,
        t.Array,
        lambda a: [a.element_type.__name__, list(a)],
        lambda plain: t.Array(_ARRAY_TYPES[plain[0]], plain[1]),
    ),
)


def register_stored_types() -> None:
    """Let the store keep the AMQP value types messages may carry (``STORED_TYPES``). Calling it again changes
    nothing."""
    for tag, cls, to_plain, from_plain in STORED_TYPES:
        register_type(tag, cls, to_plain, from_plain)
