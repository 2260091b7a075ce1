"""The namespace's parts, one concern each; ``shardbus.namespace.Namespace`` puts them together.

Each part is a mixin of ``Namespace``: its state lives on the namespace (listed in ``Namespace.__init__``), and each
module says what it owns.

- ``lookups``: the registry's reads: an entity path (and a sub-queue suffix) to its queue, topic or subscription.
- ``management``: create, read, update and delete of queues, topics, subscriptions and rules; runtime counts.
- ``quotas``: the namespace's quotas on entities, subscriptions and rules, checked in one place.
- ``partitions``: the construction of an entity's partitions and their stores, in this process or in workers.
- ``sync``: keeping the registry in step with the shared catalog other front-end processes write too.
- ``upkeep``: the upkeep thread (lock expiry, scheduled messages, duplicate detection pruning, forwarding).
"""
