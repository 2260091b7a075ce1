"""AMQP transactions: a coordinator link declares and discharges; transfers and dispositions carry
transactional-state with the txn-id. The work itself is a core ``Transaction``.

``CoordinatorLinks`` is a part of ``ServiceBusConnection`` (connection.py). In memory: one ``_Txn`` per transaction
declared and not yet discharged on this connection (rolled back when the connection goes).
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from typing import Any

from ..amqp import events as ev
from ..amqp.codec import DecodeError
from ..amqp.message import BATCH_MESSAGE_FORMAT, decode_message
from ..amqp.performatives import (
    Accepted,
    Declare,
    Declared,
    Discharge,
    Error,
    InvalidField,
    Modified,
    Rejected,
    TransactionalState,
    decode_composite,
)
from ..amqp.types import Symbol
from ..entity.entity import QueueEntity, TopicEntity
from ..entity.transactions import Transaction
from ..model.errors import InvalidOperation, ShardbusError
from .links import _error
from .mapping import decode_batch_to_messages, decode_to_message

TXN_UNKNOWN = Symbol("amqp:transaction:unknown-id")
TXN_ROLLBACK = Symbol("amqp:transaction:rollback")


class _Txn:
    """A declared AMQP transaction: its core transaction, and the first failure that dooms it."""

    __slots__ = ("failure", "transaction")

    def __init__(self, transaction: Transaction) -> None:
        self.transaction = transaction
        self.failure: str | None = None


class CoordinatorLinks:
    """The transaction-coordinator part of ``ServiceBusConnection`` (its state lives on the connection)."""

    def _on_coordinator(self, e: ev.DeliveryReceived) -> None:
        try:
            body = decode_composite(decode_message(e.payload).body, (Declare, Discharge))
        except (DecodeError, InvalidField) as exc:
            self._settle(e, Rejected(error=Error(condition=Symbol("amqp:decode-error"), description=str(exc))))
            return
        if isinstance(body, Declare):
            txn_id = uuid.uuid4().bytes
            self._transactions[txn_id] = _Txn(self._ns.transaction())
            self._settle(e, Declared(txn_id=txn_id))
            return
        txn = self._transactions.pop(body.txn_id, None)
        if txn is None:
            self._settle(e, Rejected(error=Error(condition=TXN_UNKNOWN, description="Unknown transaction id.")))
            return
        if body.fail:
            txn.transaction.rollback()
            self._settle(e, Accepted())
            return
        if txn.failure is not None:
            txn.transaction.rollback()
            self._settle(e, Rejected(error=Error(condition=TXN_ROLLBACK, description=txn.failure)))
            return
        try:
            future = txn.transaction.submit_commit()
        except ShardbusError as exc:
            self._settle(e, Rejected(error=Error(condition=TXN_ROLLBACK, description=str(exc))))
            return

        def done(f: Future) -> None:
            exc = f.exception()
            outcome = Accepted() if exc is None else Rejected(error=Error(condition=TXN_ROLLBACK, description=str(exc)))
            self._later(lambda: self._settle(e, outcome))

        future.add_done_callback(done)

    def _transaction_of(self, state: TransactionalState) -> _Txn:
        txn = self._transactions.get(state.txn_id)
        if txn is None:
            raise InvalidOperation("The transaction id is unknown (never declared, or already discharged).")
        return txn

    def _on_transactional_send(self, e: ev.DeliveryReceived, entity: QueueEntity | TopicEntity) -> None:
        try:
            txn = self._transaction_of(e.state)
        except ShardbusError as exc:
            self._settle(e, Rejected(error=Error(condition=TXN_UNKNOWN, description=str(exc))))
            return
        try:
            if e.message_format == BATCH_MESSAGE_FORMAT:
                messages = decode_batch_to_messages(e.payload)
            else:
                messages = [decode_to_message(e.payload)]
            txn.transaction.send(entity.path, messages)
        except (DecodeError, ShardbusError) as exc:
            txn.failure = txn.failure or str(exc)  # the discharge will roll everything back
            error = _error(exc) if isinstance(exc, ShardbusError) else Error(condition=Symbol("amqp:decode-error"))
            self._settle(e, TransactionalState(txn_id=e.state.txn_id, outcome=Rejected(error=error)))
            return
        self._settle(e, TransactionalState(txn_id=e.state.txn_id, outcome=Accepted()))

    def _settle_in_transaction(
        self, ref: Any, receiver: Any, token: uuid.UUID, state: TransactionalState, settled: bool
    ) -> None:
        outcome = state.outcome
        try:
            txn = self._transaction_of(state)
            if isinstance(outcome, Accepted):
                txn.transaction.complete(receiver, token)
            elif isinstance(outcome, Modified):
                (txn.transaction.defer if outcome.undeliverable_here else txn.transaction.abandon)(receiver, token)
            elif isinstance(outcome, Rejected):
                info = {str(k): v for k, v in ((outcome.error.info if outcome.error else None) or {}).items()}
                txn.transaction.dead_letter(
                    receiver, token, info.get("DeadLetterReason"), info.get("DeadLetterErrorDescription")
                )
                outcome = Rejected()
            else:
                raise InvalidOperation(f"The outcome {type(outcome).__name__} cannot be part of a transaction.")
        except ShardbusError as exc:
            if state.txn_id in self._transactions:
                self._transactions[state.txn_id].failure = str(exc)
            if not settled:
                self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=Rejected(error=_error(exc)))
            return
        if not settled:
            echo = TransactionalState(txn_id=state.txn_id, outcome=outcome)
            self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=echo)
