"""The domain error table.

Every failure the core can report is one of these classes. Front ends map them once: the AMQP endpoint to an
AMQP error condition (``shardbus.amqp.errors``), the HTTP endpoint to a status code. Messages follow the real
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


ALL_ERRORS: tuple[type[ShardbusError], ...] = (
    EntityNotFound,
    EntityAlreadyExists,
    EntityDisabled,
    InvalidOperation,
    ArgumentError,
    ArgumentOutOfRange,
    MessageSizeExceeded,
    QuotaExceeded,
    ServerBusy,
    PartitionUnavailable,
    PartitionFull,
    MessageLockLost,
    MessageNotFound,
    SessionLockLost,
    SessionCannotBeLocked,
    OperationTimeout,
    Unauthorized,
    PreconditionFailed,
    InternalError,
)


# The HTTP status of every domain error, as the service's ATOM API answers it (``shardbus.http`` uses it;
# most specific classes first: lookup walks the exception's MRO). 412 is also what an update of a missing entity
# gets (the SDK sends If-Match: *), which the HTTP layer decides, not this table.
HTTP_STATUS: dict[type[ShardbusError], int] = {
    EntityNotFound: 404,
    EntityAlreadyExists: 409,
    EntityDisabled: 400,
    InvalidOperation: 400,
    ArgumentOutOfRange: 400,
    ArgumentError: 400,
    MessageSizeExceeded: 413,
    QuotaExceeded: 403,
    PartitionFull: 503,
    PartitionUnavailable: 503,
    ServerBusy: 503,
    MessageLockLost: 410,
    MessageNotFound: 404,
    SessionLockLost: 410,
    SessionCannotBeLocked: 409,
    OperationTimeout: 408,
    Unauthorized: 401,
    PreconditionFailed: 412,
    InternalError: 500,
}


def http_status_of(error: BaseException) -> int:
    """The HTTP status for any exception; unknown ones are internal errors (500)."""
    for cls in type(error).__mro__:
        status = HTTP_STATUS.get(cls)  # type: ignore[arg-type]
        if status is not None:
            return status
    return 500
