"""``stats``: a table per entity with a row per partition (depth, oldest message age, dead letters, health).

Per partition from shardbus' own ``$management`` operations: ``range-offsets`` on the entity (depth, health)
and on its dead-letter queue (dead letters), and ``browse-range`` of one message from the partition's first
readable one (its enqueued time: the age). The entity's totals and availability come from its description over
HTTPS (the runtime counts the admin client shows).
"""

from __future__ import annotations

import time
from typing import Any

import click

from ..model.ages import human_age
from ..model.entities import EntityKind
from .admin_http import EntityInfo
from .context import Session, connection_options, pass_session
from .messages import DEAD_LETTER, resolve, split_path
from .output import Column

PARTITION_COLUMNS = [
    Column("partition", "PARTITION", True),
    Column("depth", "DEPTH", True),
    Column("oldest_age", "OLDEST", True),
    Column("dead_letters", "DEAD LETTERS", True),
    Column("health", "HEALTH"),
]


def entity_stats(session: Session, path: str, info: EntityInfo) -> dict[str, Any]:
    client = session.amqp
    offsets = client.range_offsets(path)
    dead = {p.partition: p for p in client.range_offsets(f"{path}/{DEAD_LETTER}")}
    now_ms = time.time() * 1000
    partitions = []
    for p in offsets:
        age = None
        if p.healthy and p.count:
            page = client.browse_range(path, p.partition, p.first, p.end, 1, ["enqueued-time"])
            times = page.get("enqueued-time") or []
            if times:
                age = max(0.0, (now_ms - int(times[0])) / 1000)
        dl = dead.get(p.partition)
        partitions.append(
            {
                "partition": p.partition,
                "healthy": p.healthy,
                "health": "healthy" if p.healthy else "DOWN",
                "depth": p.count if p.healthy else None,
                "oldest_age_seconds": None if age is None else round(age, 3),
                "oldest_age": human_age(age),
                "dead_letters": dl.count if dl is not None and dl.healthy else None,
            }
        )
    return {
        "entity": path,
        "kind": info.kind.value,
        "availability": info.runtime.get("EntityAvailabilityStatus", "Available"),
        "active_message_count": info.count("ActiveMessageCount"),
        "dead_letter_message_count": info.count("DeadLetterMessageCount"),
        "scheduled_message_count": info.count("ScheduledMessageCount"),
        "size_in_bytes": info.count("SizeInBytes"),
        "partitions": partitions,
    }


def _targets(session: Session, entities: tuple[str, ...], subscription: str | None) -> list[tuple[str, EntityInfo]]:
    """(path, description) of every queue and subscription to show: the ones named (a topic: its
    subscriptions), or all of them."""
    admin = session.admin
    out: list[tuple[str, EntityInfo]] = []
    if not entities:
        out += [(q.name, q) for q in admin.list_entities(EntityKind.QUEUE)]
        for t in admin.list_entities(EntityKind.TOPIC):
            out += [(f"{t.name}/Subscriptions/{s.name}", s) for s in admin.list_subscriptions(t.name)]
        return out
    for name in entities:
        entity, sub = split_path(name, subscription)
        if sub is None:
            target = resolve(session, entity, None, False, sending=True)  # a queue, or a topic
            if target.kind is EntityKind.TOPIC:
                out += [(f"{entity}/Subscriptions/{s.name}", s) for s in admin.list_subscriptions(entity)]
                continue
        else:
            target = resolve(session, name, subscription, False, sending=False)
        out.append((target.path, target.info))
    return out


@click.command("stats", help="Per-partition depth, oldest message age, dead letters and health.")
@click.argument("entities", nargs=-1, metavar="[ENTITY]...")
@click.option("--subscription", "-s", metavar="NAME", help="a subscription of the topic ENTITY")
@connection_options
@pass_session
def stats(session: Session, entities: tuple[str, ...], subscription: str | None) -> None:
    targets = _targets(session, entities, subscription)
    results = []
    with session.out.progress("collecting", len(targets)) as bar:
        for path, info in targets:
            results.append(entity_stats(session, path, info))
            bar.advance()
    out = session.out
    if out.json_mode:
        out.json(results)
        return
    if not results:
        out.note("no queues or subscriptions")
    for i, result in enumerate(results):
        if i and not out.terminal:
            click.echo()
        title = (
            f"{result['kind']} {result['entity']}: {result['availability']}, "
            f"{result['active_message_count']} active, {result['dead_letter_message_count']} dead-lettered, "
            f"{result['scheduled_message_count']} scheduled, {result['size_in_bytes']} bytes"
        )
        out.table(PARTITION_COLUMNS, result["partitions"], title=title)


COMMANDS = (stats,)
