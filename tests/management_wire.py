"""A ``$management`` client speaking the wire with our own ``AmqpClient``: for the operations the SDK never sends
over AMQP (rules) and for requests no SDK would make (malformed bodies). Imported by the endpoint tests."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from shardbus.amqp.message import AmqpMessage, Properties, decode_message
from shardbus.amqp.message import BodyType as WireBody
from shardbus.amqp.transport import AmqpClient


class Reply:
    def __init__(self, message: AmqpMessage) -> None:
        app = {str(k): v for k, v in (message.application_properties or {}).items()}
        self.status: int = app["statusCode"]
        self.description: str = app["statusDescription"]
        self.condition = app.get("errorCondition")
        self.correlation_id = message.properties.correlation_id
        self.body = message.body if message.body_type == WireBody.VALUE else None

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.condition}, {self.description!r})"


def management(
    port: int,
    node: str,
    requests: list[tuple[str, dict[str, Any]]],
    username: str = "RootManageSharedAccessKey",
    password: str = "SAS_KEY_VALUE",
) -> list[Reply]:
    """Send each (operation, body) to ``<node>/$management`` over one link pair (SASL PLAIN with ``username`` and
    ``password``, a rule's key name and key); the replies in order."""

    async def run() -> list[Reply]:
        client = await AmqpClient.connect(
            "127.0.0.1",
            port,
            timeout=10,
            sasl_mechanism="PLAIN",
            username=username,
            password=password,
        )
        address = f"{node}/$management"
        try:
            session = await client.session()
            receiver = await session.receiver(address, credit=100)  # the SDK attaches the receiver first
            sender = await session.sender(address)
            replies = []
            for operation, body in requests:
                message_id = uuid.uuid4()
                request = AmqpMessage(
                    properties=Properties(message_id=message_id, reply_to=address),
                    application_properties={
                        "operation": operation,
                        "com.microsoft:server-timeout": 60000,
                        "type": "entity-mgmt",
                    },
                    body=body,
                    body_type=WireBody.VALUE,
                )
                outcome = await sender.send(request.encode())
                assert type(outcome).__name__ == "Accepted"
                delivery = await receiver.receive(timeout=10)
                reply = Reply(decode_message(delivery.payload))
                assert reply.correlation_id == message_id
                replies.append(reply)
            return replies
        finally:
            await client.close()

    return asyncio.run(run())
