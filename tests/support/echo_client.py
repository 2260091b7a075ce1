"""An AMQP client for settlement tests: it records the settled dispositions the broker echoes back."""

from __future__ import annotations

from typing import Any

from shardbus.amqp import events as E
from shardbus.amqp.transport import AmqpClient, AmqpProtocol


class EchoRecordingClient(AmqpClient):
    """Records the settled dispositions the broker sends for deliveries we received: delivery id -> state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.echoes: dict[int, Any] = {}

    def handle_event(self, protocol: AmqpProtocol, ev: E.Event) -> None:
        if type(ev) is E.DispositionReceived and not ev.role and ev.settled:
            for did in range(ev.first, ev.last + 1):
                self.echoes[did] = ev.state
            return
        super().handle_event(protocol, ev)
