"""The domain error table mapped once to AMQP: error condition and ``$management`` status code.

Conditions are the ones the real service sends, so the official SDK raises the matching exception
(``SERVICEBUS_AMQP.md`` §8): e.g. ``com.microsoft:server-busy`` → ServiceBusServerBusyError,
``amqp:not-allowed`` → the service's InvalidOperationException.
"""

from __future__ import annotations

from ..amqp.types import Symbol
from ..metrics import count_error
from ..model import errors as e

# Most specific classes first: lookup walks the exception's MRO.
AMQP_CONDITIONS: dict[type[e.ShardbusError], tuple[str, int]] = {
    e.EntityNotFound: ("amqp:not-found", 404),
    e.EntityAlreadyExists: ("com.microsoft:entity-already-exists", 409),
    e.EntityDisabled: ("com.microsoft:entity-disabled", 400),
    e.InvalidOperation: ("amqp:not-allowed", 400),
    e.ArgumentOutOfRange: ("com.microsoft:argument-out-of-range", 400),
    e.ArgumentError: ("com.microsoft:argument-error", 400),
    e.MessageSizeExceeded: ("amqp:link:message-size-exceeded", 413),
    e.QuotaExceeded: ("amqp:resource-limit-exceeded", 403),
    e.PartitionFull: ("com.microsoft:server-busy", 503),
    e.PartitionUnavailable: ("com.microsoft:server-busy", 503),
    e.ServerBusy: ("com.microsoft:server-busy", 503),
    e.MessageLockLost: ("com.microsoft:message-lock-lost", 410),
    e.MessageNotFound: ("com.microsoft:message-not-found", 404),
    e.SessionLockLost: ("com.microsoft:session-lock-lost", 410),
    e.SessionCannotBeLocked: ("com.microsoft:session-cannot-be-locked", 409),
    e.OperationTimeout: ("com.microsoft:timeout", 408),
    e.Unauthorized: ("amqp:unauthorized-access", 401),
    e.PreconditionFailed: ("com.microsoft:precondition-failed", 412),
    e.InternalError: ("amqp:internal-error", 500),
}
INTERNAL = ("amqp:internal-error", 500)


def condition_of(error: BaseException) -> tuple[Symbol, int]:
    """(AMQP condition, management status code) for any exception; unknown ones are internal errors.
    Every error the endpoint returns passes here once, so this is also where errors are counted."""
    found = INTERNAL
    for cls in type(error).__mro__:
        mapped = AMQP_CONDITIONS.get(cls)  # type: ignore[arg-type]
        if mapped is not None:
            found = mapped
            break
    count_error(found[0])
    return Symbol(found[0]), found[1]
