"""The domain error table.

Every failure the core can report is one of these classes, and ``ERROR_TABLE`` gives each its AMQP error condition and
its status code side by side: both front ends read that one table (no protocol is imported here: a condition is a
string). Messages follow the real
service's wording where users are likely to search for it.
"""

from __future__ import annotations


class ShardbusError(Exception):
    """Base of every domain error. ``retriable`` tells clients whether trying again may succeed."""

    retriable = False


class EntityNotFound(ShardbusError):
    """The queue, topic, subscription or rule does not exist."""


class EntityAlreadyExists(ShardbusError):
    """An entity of that name already exists (names compare case-insensitively)."""


class EntityDisabled(ShardbusError):
    """The entity's status forbids the operation (Disabled, SendDisabled, ReceiveDisabled)."""


class InvalidOperation(ShardbusError):
    """The operation is not allowed in the current state (the service's InvalidOperationException)."""


class ArgumentError(ShardbusError):
    """A property or argument has an invalid value or shape."""


class ArgumentOutOfRange(ArgumentError):
    """A numeric or duration property is outside its allowed range."""


class MessageSizeExceeded(ShardbusError):
    """A message is larger than the namespace tier allows."""


class QuotaExceeded(ShardbusError):
    """An entity count or size quota would be exceeded."""


class ServerBusy(ShardbusError):
    """The broker cannot take the operation now; try again later."""

    retriable = True


class PartitionUnavailable(ServerBusy):
    """The partition that must serve this operation is unavailable (store error or broker stopped)."""


class PartitionFull(PartitionUnavailable):
    """The partition's store has no space left: it refuses sends (nothing of them is stored; keyless ones try
    another partition) while receives and settlements go on, until space returns. ServerBusy on the wire."""


class MessageLockLost(ShardbusError):
    """The lock token is unknown or its lock expired."""


class MessageNotFound(ShardbusError):
    """No message with the given sequence number is in the state the operation needs."""


class SessionLockLost(ShardbusError):
    """The session lock expired or is held by someone else."""


class SessionCannotBeLocked(ShardbusError):
    """The requested session is locked by another receiver."""

    retriable = True


class OperationTimeout(ShardbusError):
    """The operation did not finish within its time limit."""

    retriable = True


class Unauthorized(ShardbusError):
    """Credentials are missing, invalid or expired, or lack the right claim."""


class PreconditionFailed(ShardbusError):
    """A precondition of the operation does not hold (e.g. optimistic concurrency)."""


class InternalError(ShardbusError):
    """An unexpected failure inside the broker."""


# The one error table: each domain error's AMQP error condition (what the real service sends, so the official SDK
# raises the matching exception, SERVICEBUS_AMQP.md §8: ``com.microsoft:server-busy`` → ServiceBusServerBusyError,
# ``amqp:not-allowed`` → the service's InvalidOperationException) beside its status code, which is both the ATOM
# API's HTTP status and the ``$management`` status-code. Conditions are plain strings: the AMQP endpoint makes them
# symbols (``endpoint/conditions.py``), the HTTP endpoint reads the status (``http_status_of``). Most specific
# classes first: lookup walks the exception's MRO. 412 is also what an update of a missing entity gets (the SDK
# sends If-Match: *), which the HTTP layer decides, not this table. A new error is one class and one row here.
ERROR_TABLE: dict[type[ShardbusError], tuple[str, int]] = {
    EntityNotFound: ("amqp:not-found", 404),
    EntityAlreadyExists: ("com.microsoft:entity-already-exists", 409),
    EntityDisabled: ("com.microsoft:entity-disabled", 400),
    InvalidOperation: ("amqp:not-allowed", 400),
    ArgumentOutOfRange: ("com.microsoft:argument-out-of-range", 400),
    ArgumentError: ("com.microsoft:argument-error", 400),
    MessageSizeExceeded: ("amqp:link:message-size-exceeded", 413),
    QuotaExceeded: ("amqp:resource-limit-exceeded", 403),
    PartitionFull: ("com.microsoft:server-busy", 503),
    PartitionUnavailable: ("com.microsoft:server-busy", 503),
    ServerBusy: ("com.microsoft:server-busy", 503),
    MessageLockLost: ("com.microsoft:message-lock-lost", 410),
    MessageNotFound: ("com.microsoft:message-not-found", 404),
    SessionLockLost: ("com.microsoft:session-lock-lost", 410),
    SessionCannotBeLocked: ("com.microsoft:session-cannot-be-locked", 409),
    OperationTimeout: ("com.microsoft:timeout", 408),
    Unauthorized: ("amqp:unauthorized-access", 401),
    PreconditionFailed: ("com.microsoft:precondition-failed", 412),
    InternalError: ("amqp:internal-error", 500),
}
INTERNAL_ERROR: tuple[str, int] = ERROR_TABLE[InternalError]  # what any exception outside the table maps to

ALL_ERRORS: tuple[type[ShardbusError], ...] = tuple(ERROR_TABLE)
HTTP_STATUS: dict[type[ShardbusError], int] = {cls: status for cls, (_condition, status) in ERROR_TABLE.items()}


def error_mapping_of(error: BaseException) -> tuple[str, int]:
    """(AMQP condition, status code) for any exception; unknown ones are internal errors."""
    table = ERROR_TABLE
    for cls in type(error).__mro__:
        mapped = table.get(cls)  # type: ignore[arg-type]
        if mapped is not None:
            return mapped
    return INTERNAL_ERROR


def http_status_of(error: BaseException) -> int:
    """The HTTP status for any exception; unknown ones are internal errors (500)."""
    return error_mapping_of(error)[1]
