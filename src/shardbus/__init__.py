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

from importlib import import_module
from typing import Any

from .model.errors import *  # noqa: F403  (the domain error table is part of the API)
from .model.errors import ALL_ERRORS, ShardbusError

# The rest of the API is imported on first use (PEP 562), so that ``import shardbus.client`` (the Spark connector,
# the CLI) does not load the broker's core: namespace, entities, partitions, stores.
_LAZY = {
    "Receiver": ".entity.receiver",
    "SessionReceiver": ".entity.sessions",
    "EntityStatus": ".model.entities",
    "QueueDescription": ".model.entities",
    "RuntimeProperties": ".model.entities",
    "SubscriptionDescription": ".model.entities",
    "TopicDescription": ".model.entities",
    "CorrelationFilter": ".model.filters",
    "EmptyRuleAction": ".model.filters",
    "FalseFilter": ".model.filters",
    "Rule": ".model.filters",
    "SqlFilter": ".model.filters",
    "SqlRuleAction": ".model.filters",
    "TrueFilter": ".model.filters",
    "BodyType": ".model.message",
    "Message": ".model.message",
    "MessageState": ".model.message",
    "ReceiveMode": ".model.message",
    "SubQueue": ".model.message",
    "Quotas": ".model.tiers",
    "Tier": ".model.tiers",
    "Namespace": ".namespace",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardbus' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = ["ALL_ERRORS", *_LAZY, *[e.__name__ for e in ALL_ERRORS], "ShardbusError"]
