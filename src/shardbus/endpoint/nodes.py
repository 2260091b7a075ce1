"""The service's nodes on a connection: ``$cbs`` (put-token: a SAS token's claims, checked by the namespace's
authority) and ``<entity>/$management`` (request/response pairs dispatched through ``management.OPERATIONS``,
each checked against the right it needs).

``NodeLinks`` is a part of ``ServiceBusConnection`` (connection.py). In memory: the connection's tokens (at most
MAX_TOKENS), its reply links (one per session and node) and one core receiver per entity and sub-queue that
``$management`` settled through (bounded by the entities the connection names).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from typing import Any

from ..access import sas
from ..access.authority import management_right
from ..amqp.message import AmqpMessage, Properties
from ..amqp.message import BodyType as WireBody
from ..amqp.types import Int, Symbol
from ..entity.entity import Target
from ..entity.receiver import Receiver
from ..model.errors import ArgumentError, InvalidOperation, ShardbusError, Unauthorized
from ..model.message import ReceiveMode
from .conditions import condition_of
from .links import MANAGEMENT_SUFFIX, entity_path, log
from .management import OPERATIONS, ManagementContext, ManagementReply

MAX_TOKENS = 1000  # tokens a connection holds at once (one per audience is the SDK's use; older ones go first)
# What a $management handler raises reading a request body whose fields have the wrong type or shape
_MALFORMED = (TypeError, ValueError, AttributeError, IndexError, KeyError, OverflowError)


class NodeLinks:
    """The ``$cbs`` and ``$management`` part of ``ServiceBusConnection`` (its state lives on the connection)."""

    def _resolve_management_target(self, node: str) -> Any:
        lower = node.lower()
        entity = self._ns._entities.get(lower)
        if entity is not None:
            return entity
        return self._ns.resolve(node)[0]

    def _on_put_token(self, link: Any, request: AmqpMessage) -> None:
        app = {str(k): v for k, v in (request.application_properties or {}).items()}
        token = request.body if request.body_type == WireBody.VALUE else None
        if isinstance(token, bytes):
            token = token.decode("utf-8", "replace")
        try:
            if str(app.get("operation")) != "put-token":
                raise InvalidOperation(f"Unsupported $cbs operation '{app.get('operation')}'.")
            claims = self._authority.validate(token)
            audience = str(app.get("name") or claims.resource)
            if not sas.covers(claims, audience):
                raise Unauthorized(f"The token for '{claims.resource}' does not cover '{audience}'.")
            now = time.time()  # expired tokens go, and a connection keeps at most MAX_TOKENS (refreshes add one each)
            live = [c for c in self.authorized if c.expiry > now]
            self.authorized = [*live[len(live) - MAX_TOKENS + 1 :], claims]
            status, description = 202, "Accepted"
        except ShardbusError as exc:
            status, description = condition_of(exc)[1], str(exc)
        reply_link = self._cbs_out.get(link.session)
        if reply_link is None:
            return
        message_id = request.properties.message_id if request.properties else None
        response = AmqpMessage(
            properties=Properties(correlation_id=message_id),
            application_properties={"status-code": Int(status), "status-description": description},
        )
        self._send_reply(reply_link, response)

    def _send_reply(self, link: Any, message: AmqpMessage) -> None:
        if not link.attached or not link.session.mapped or self.amqp.closing:
            return  # the client took its reply link away (or closed) before the answer: nobody to tell
        self.amqp.send_transfer(link, uuid.uuid4().bytes, message.encode(), settled=True, ignore_credit=True)

    def _on_management(self, link: Any, path: str, request: AmqpMessage, txn_id: bytes | None = None) -> None:
        app = {str(k): v for k, v in (request.application_properties or {}).items()}
        operation = str(app.get("operation", ""))
        node = path[: -len(MANAGEMENT_SUFFIX)]
        reply_to = request.properties.reply_to if request.properties else None
        reply_key = (link.session, (entity_path(reply_to) if reply_to else path).lower())
        message_id = request.properties.message_id if request.properties else None
        body = request.body if request.body_type == WireBody.VALUE and isinstance(request.body, dict) else {}
        body = {str(k): v for k, v in body.items()}
        context = ManagementContext(
            self._ns, node, self._management_receiver, lambda t, sid: self._sessions.get((id(t), sid)), app
        )
        context.transaction_id = txn_id

        def respond(reply: ManagementReply) -> None:
            out = self._mgmt_out.get(reply_key) or self._mgmt_out.get((link.session, path.lower()))
            if out is None:
                return
            app_props: dict[str, Any] = {"statusCode": Int(reply.status), "statusDescription": reply.description}
            if reply.condition is not None:
                app_props["errorCondition"] = Symbol(reply.condition)
            response = AmqpMessage(
                properties=Properties(correlation_id=message_id),
                application_properties=app_props,
                body=reply.body,
                body_type=WireBody.VALUE if reply.body is not None else WireBody.NONE,
            )
            self._send_reply(out, response)

        handler = OPERATIONS.get(operation)
        if handler is None:
            respond(ManagementReply.error(InvalidOperation(f"The operation '{operation}' is not supported.")))
            return
        try:
            self._check_access(node, management_right(operation))
            result = handler(context, body)
        except ShardbusError as exc:
            respond(ManagementReply.error(exc))
            return
        except _MALFORMED as exc:  # a field of the wrong type or shape: the handlers read the body as they go
            log.info("malformed $management request: %r", exc, extra=self._context(link))
            respond(ManagementReply.error(ArgumentError(f"The request for '{operation}' is malformed: {exc}.")))
            return
        if isinstance(result, ManagementReply):
            respond(result)
            return

        def done(f: Future) -> None:
            exc = f.exception()
            reply = ManagementReply.error(exc) if exc is not None else f.result()
            self._later(lambda: respond(reply))

        result.add_done_callback(done)

    def _management_receiver(self, target: Target, sub_queue: int) -> Receiver:
        key = (id(target), int(sub_queue))
        receiver = self._mgmt_receivers.get(key)
        if receiver is None or receiver.target is not target:
            receiver = Receiver(target, ReceiveMode.PEEK_LOCK, sub_queue, self._ns._clock)
            self._mgmt_receivers[key] = receiver
        return receiver
