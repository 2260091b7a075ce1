"""``$management`` requests whose body fields have the wrong type or shape, over real sockets: each gets a 400
reply with ``com.microsoft:argument-error`` that names the operation, and the connection goes on serving (such a
request used to close it with ``amqp:internal-error``). No SDK sends these; ``AmqpClient`` speaks the wire."""

from __future__ import annotations

import uuid

from management_wire import management
from shardbus import Message
from shardbus.amqp.types import Array, Long, Symbol

PREFIX = "com.microsoft:"
MALFORMED = [
    ("peek-message", {"from-sequence-number": "one", "message-count": 1}),
    ("peek-message", {"from-sequence-number": Long(1), "message-count": [1]}),
    ("renew-lock", {"lock-tokens": [b"short"]}),
    ("receive-by-sequence-number", {"sequence-numbers": ["x"], "receiver-settle-mode": 1}),
    ("cancel-scheduled-message", {"sequence-numbers": [{"a": 1}]}),
    ("schedule-message", {"messages": [uuid.uuid4()]}),
    ("get-message-sessions", {"skip": "none", "top": 10, "last-updated-time": 0}),
    ("update-disposition", {"lock-tokens": Array(Symbol, [Symbol("x")]), "disposition-status": "completed"}),
]


def test_malformed_requests_get_argument_errors_and_the_connection_goes_on(broker, ns, queue):
    q = queue()
    ns.send(q, Message(b"still here"))
    requests = [(PREFIX + op, body) for op, body in MALFORMED]
    requests.append((PREFIX + "peek-message", {"from-sequence-number": Long(0), "message-count": 1}))
    replies = management(broker.server.port, q, requests)
    for (operation, _), reply in zip(MALFORMED, replies, strict=False):
        assert (reply.status, reply.condition) == (400, "com.microsoft:argument-error"), (operation, reply)
        assert f"'{PREFIX}{operation}' is malformed" in reply.description
    assert replies[-1].status == 200  # the same link pair, after every malformed request
    assert len(replies[-1].body["messages"]) == 1
