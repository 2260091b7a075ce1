"""What clients may hold of the broker: connections, sessions and links per connection, and silence.

Every limit is announced where AMQP lets a peer learn it, and enforced where the spec says how:

* connections: at most ``max_connections`` AMQP connections per listener process. One more is served just long
  enough to be refused politely: its ``open`` is answered with ``open`` then ``close`` carrying
  ``amqp:resource-limit-exceeded`` (RabbitMQ refuses the same way). Sockets beyond ``max_connections +
  ACCEPT_SLACK`` (connections nobody has identified yet included) are dropped at once, unread: a flood of bare TCP
  connections costs a file descriptor each for a moment, never a connection's state.
* sessions: ``open.channel-max`` is ``max_sessions - 1``; a ``begin`` on a higher channel closes the connection
  with ``amqp:connection:framing-error`` (AMQP 1.0, 2.7.1).
* links: ``begin.handle-max`` is ``max_links_per_session - 1``; an ``attach`` with a higher handle closes the
  connection with ``amqp:connection:framing-error`` (2.7.2). Across all its sessions a connection holds at most
  ``max_links``; one more is refused alone (the link is detached with ``amqp:resource-limit-exceeded``, which the
  SDK raises as ``ServiceBusQuotaExceededError``) and the connection goes on.
* silence: ``open.idle-time-out`` announces ``idle_timeout``; a connection that sends nothing (not even an empty
  frame) for twice that long is closed with ``amqp:resource-limit-exceeded``, as 2.4.5 advises (announce half the
  real threshold). Empty frames go out to honour the peer's own idle-time-out. A socket that has not sent its
  ``open`` within ``handshake_timeout`` is dropped.

The defaults fit the SDK: it opens one session per connection and a few links, sends empty frames at half the
announced idle time-out from its keep-alive loop, and is told to expect at least two minutes (SERVICEBUS_AMQP.md).

Message sizes are the entity's (``Namespace.message_size_limits``: its largest message and largest batch). Over
AMQP the engine bounds each delivery as it arrives (endpoint/connection.py); the Python API (``Namespace.send``)
checks the same bounds with ``message_size.check_send_size``, so a message is refused the same way on either path.
"""

from __future__ import annotations

from dataclasses import dataclass

ACCEPT_SLACK = 1024  # sockets accepted beyond max_connections, to be refused politely (or timed out)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 10_000
    max_sessions: int = 256  # per connection: channel-max 255
    max_links_per_session: int = 256  # handle-max 255
    max_links: int = 1_000  # per connection, over all its sessions
    idle_timeout: float | None = 120.0  # seconds announced in open; the broker closes after twice as long
    handshake_timeout: float = 30.0  # seconds from accept to the client's open

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not 1 <= self.max_sessions <= 65536:
            raise ValueError("max_sessions must be between 1 and 65536")
        if self.max_links_per_session < 1 or self.max_links < 1:
            raise ValueError("link limits must be at least 1")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive (None: never)")

    @property
    def channel_max(self) -> int:
        return self.max_sessions - 1

    @property
    def handle_max(self) -> int:
        return self.max_links_per_session - 1

    @property
    def silence_allowed(self) -> float | None:
        """How long a peer may stay silent before the broker closes its connection."""
        return None if self.idle_timeout is None else 2 * self.idle_timeout


DEFAULT_LIMITS = ConnectionLimits()
