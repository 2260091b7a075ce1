"""The values that cross the partition interface (``handle.py``): a partition's settings, a slot's settings, a
settlement, a slot's counters, and the id prefix of auto-forwarded messages.

They live apart from the broker so that whoever talks to a partition (``entity/``, ``cluster/``) depends on the
interface only, never on ``broker.py``. Plain dataclasses: the cluster wire sends them as their field values
(``cluster/wire.py``), the broker keeps them as they are. Nothing here holds state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ..model.message import SubQueue

# Ids of auto-forwarded messages (see entity/forwarding.py) are always de-duplicated, whatever the entity's
# settings, and remembered for a day: long enough for a forwarder to retry after any restart.
TRANSFER_ID_PREFIX = "\x00transfer:"
TRANSFER_ID_RETENTION_MS = 24 * 3600 * 1000


@dataclass(slots=True)
class SlotSettings:
    """What a partition needs to know about the queue or subscription a slot holds."""

    path: str
    lock_duration_ms: int = 60_000
    max_delivery_count: int = 10
    default_ttl_ms: int | None = None
    dead_letter_on_expiration: bool = False
    requires_session: bool = False
    forwards: bool = False  # auto-forwarding moves its messages on


SETTLE_OUTCOMES = frozenset({"complete", "abandon", "release", "defer", "dead_letter"})


@dataclass(frozen=True, slots=True)
class Settle:
    """One settlement: what happens to the message a lock token holds."""

    outcome: str  # one of SETTLE_OUTCOMES
    token: uuid.UUID
    reason: str | None = None
    description: str | None = None
    sub_queue: SubQueue = SubQueue.DEAD_LETTER  # where dead-lettering goes (transfer DLQ for forwarding)


@dataclass(slots=True)
class PartitionConfig:
    """Entity-wide settings each partition enforces on its own share."""

    path: str
    partition_id: int
    max_size_bytes: int
    max_message_size_bytes: int
    requires_duplicate_detection: bool = False
    dedup_window_ms: int = 600_000
    entity_default_ttl_ms: int | None = None


@dataclass(slots=True)
class SlotStats:
    """Counters of one slot since the partition started (for metrics): what arrived, what was handed to
    receivers (each lock or receive counts), and locks that expired unsettled."""

    incoming: int = 0
    delivered: int = 0
    lock_expired: int = 0
