"""AMQP error conditions and the exceptions of the engine.

``LocalProtocolError`` is the only exception the engine raises to its caller, and only for misuse of the API by
the application itself (sending on a link that is not attached, ...). Everything a *peer* does wrong is turned
into a close/end/detach with an error condition plus an event; the internal ``*Violation`` exceptions carry
those conditions from deep inside frame handling up to the machine that owns the failing endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .types import Symbol

if TYPE_CHECKING:
    from .link import Link

__all__ = ["Condition", "LocalProtocolError"]


class Condition:
    """Standard error conditions (OASIS AMQP 1.0 part 2.8.15-2.8.18)."""

    INTERNAL_ERROR = Symbol("amqp:internal-error")
    NOT_FOUND = Symbol("amqp:not-found")
    UNAUTHORIZED_ACCESS = Symbol("amqp:unauthorized-access")
    DECODE_ERROR = Symbol("amqp:decode-error")
    RESOURCE_LIMIT_EXCEEDED = Symbol("amqp:resource-limit-exceeded")
    NOT_ALLOWED = Symbol("amqp:not-allowed")
    INVALID_FIELD = Symbol("amqp:invalid-field")
    NOT_IMPLEMENTED = Symbol("amqp:not-implemented")
    RESOURCE_LOCKED = Symbol("amqp:resource-locked")
    PRECONDITION_FAILED = Symbol("amqp:precondition-failed")
    RESOURCE_DELETED = Symbol("amqp:resource-deleted")
    ILLEGAL_STATE = Symbol("amqp:illegal-state")
    FRAME_SIZE_TOO_SMALL = Symbol("amqp:frame-size-too-small")
    CONNECTION_FORCED = Symbol("amqp:connection:forced")
    FRAMING_ERROR = Symbol("amqp:connection:framing-error")
    CONNECTION_REDIRECT = Symbol("amqp:connection:redirect")
    WINDOW_VIOLATION = Symbol("amqp:session:window-violation")
    ERRANT_LINK = Symbol("amqp:session:errant-link")
    HANDLE_IN_USE = Symbol("amqp:session:handle-in-use")
    UNATTACHED_HANDLE = Symbol("amqp:session:unattached-handle")
    DETACH_FORCED = Symbol("amqp:link:detach-forced")
    TRANSFER_LIMIT_EXCEEDED = Symbol("amqp:link:transfer-limit-exceeded")
    MESSAGE_SIZE_EXCEEDED = Symbol("amqp:link:message-size-exceeded")
    LINK_REDIRECT = Symbol("amqp:link:redirect")
    STOLEN = Symbol("amqp:link:stolen")


class LocalProtocolError(Exception):
    """The application asked the engine for something the protocol does not allow in the current state."""


class ConnectionViolation(Exception):
    """Peer error that must close the whole connection with ``condition``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class SessionViolation(ConnectionViolation):
    """Peer error that must end the session with ``condition``."""


class LinkViolation(ConnectionViolation):
    """Peer error that must detach the link ``link`` with ``condition``."""

    def __init__(self, link: Link, condition: str, description: str) -> None:
        super().__init__(condition, description)
        self.link = link
