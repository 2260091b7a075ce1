"""What every link role of a Service Bus connection shares: the addresses of the service's nodes, sender credit,
the AMQP error a refusal carries, and the connection log. Keeps nothing.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from ..amqp.performatives import Accepted, Error
from .conditions import condition_of

log = logging.getLogger("shardbus.amqp")
CBS = "$cbs"
MANAGEMENT_SUFFIX = "/$management"
SENDER_CREDIT = 10_000
_SENDER_CREDIT_LOW = SENDER_CREDIT // 2  # a sender's credit is topped up below this
_ACCEPTED = Accepted()  # fieldless, so one instance serves every echo


def entity_path(address: Any) -> str:
    """``amqps://host:port/q1`` or ``q1`` → ``q1``; node suffixes are kept."""
    # invalid UTF-8 names no entity: replaced, it resolves to none and the link is refused as not found
    text = address.decode("utf-8", "replace") if isinstance(address, bytes) else str(address or "")
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")


def _error(exc: BaseException) -> Error:
    condition, _ = condition_of(exc)
    return Error(condition=condition, description=str(exc) or type(exc).__name__)


def _log_failure(f: Future) -> None:
    exc = f.exception()
    if exc is not None:
        log.warning("settlements' store write failed (their messages will be delivered again): %s", exc)


__all__ = ["CBS", "MANAGEMENT_SUFFIX", "SENDER_CREDIT", "entity_path", "log"]
