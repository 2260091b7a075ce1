"""shardbus: Azure Service Bus partitioned queues and topics, self-hosted.

The Python API (no network needed)::

    import shardbus
    with shardbus.Namespace.open("./shardbus-data") as ns:
        ns.create_queue("orders", enable_partitioning=True)
        ns.send("orders", shardbus.Message(b"hello", partition_key="customer-1"))
        with ns.receiver("orders") as receiver:
            for message in receiver.receive(max_count=10, max_wait=5):
                receiver.complete(message)
"""

from .entity.receiver import Receiver
from .entity.sessions import SessionReceiver
from .model.entities import (
    EntityStatus,
    QueueDescription,
    RuntimeProperties,
    SubscriptionDescription,
    TopicDescription,
)
from .model.errors import *  # noqa: F403  (the domain error table is part of the API)
from .model.errors import ALL_ERRORS, ShardbusError
from .model.filters import (
    CorrelationFilter,
    EmptyRuleAction,
    FalseFilter,
    Rule,
    SqlFilter,
    SqlRuleAction,
    TrueFilter,
)
from .model.message import BodyType, Message, MessageState, ReceiveMode, SubQueue
from .model.tiers import Quotas, Tier
from .namespace import Namespace

__version__ = "0.1.0"

__all__ = [
    "ALL_ERRORS",
    "BodyType",
    "CorrelationFilter",
    "EmptyRuleAction",
    "EntityStatus",
    "FalseFilter",
    "Message",
    "MessageState",
    "Namespace",
    "QueueDescription",
    "Quotas",
    "ReceiveMode",
    "Receiver",
    "Rule",
    "SessionReceiver",
    "RuntimeProperties",
    "SqlFilter",
    "SqlRuleAction",
    "SubQueue",
    "SubscriptionDescription",
    "Tier",
    "TopicDescription",
    "TrueFilter",
    *[e.__name__ for e in ALL_ERRORS],
    "ShardbusError",
]
