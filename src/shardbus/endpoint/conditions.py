"""Domain errors as the AMQP endpoint answers them: ``model.errors.ERROR_TABLE``'s condition as a symbol, and its
status code for ``$management`` responses. Every error the endpoint returns passes here once, so this is also where
errors are counted.
"""

from __future__ import annotations

from ..amqp.types import Symbol
from ..metrics import count_error
from ..model.errors import error_mapping_of


def condition_of(error: BaseException) -> tuple[Symbol, int]:
    """(AMQP condition, management status code) for any exception; unknown ones are internal errors."""
    condition, status = error_mapping_of(error)
    count_error(condition)
    return Symbol(condition), status
