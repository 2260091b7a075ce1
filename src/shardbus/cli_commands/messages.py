"""Message commands over AMQP with our own client: ``send``, ``peek``, ``receive``, ``purge``,
``dead-letter resubmit``, ``export`` and ``import``.

An entity is named as the SDK names it: ``orders``, ``events/Subscriptions/alerts`` (or ``events -s alerts``),
and ``--dead-letter`` for its dead-letter sub-queue. It is looked up over HTTPS first, so a missing entity is
reported by name (an AMQP link to it is only "refused").
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from ..amqp.transport import AmqpClientError
from ..client import OutgoingMessage, ReceivedMessage
from ..model.entities import EntityKind
from .admin_http import AdminError, EntityInfo
from .context import CliError, Session, connection_options, pass_session
from .manage import DURATION, confirm, parse_pairs
from .output import Column
from .records import RecordError, message_to_record, read_records, record_to_message, resubmission, write_records

DEAD_LETTER = "$DeadLetterQueue"
SEND_CHUNK = 256  # messages per send call: the progress bar moves per chunk
BATCH = 100  # messages per receive or peek request in the long-running commands


@dataclass(slots=True)
class Target:
    """An entity a message command acts on."""

    info: EntityInfo
    path: str  # its AMQP address: queue, topic, or topic/Subscriptions/sub
    topic: str | None = None  # a subscription's topic
    dead_letter: bool = False

    @property
    def address(self) -> str:
        """Where messages are read: the entity or its dead-letter sub-queue."""
        return f"{self.path}/{DEAD_LETTER}" if self.dead_letter else self.path

    @property
    def kind(self) -> EntityKind:
        return self.info.kind


def split_path(name: str, subscription: str | None) -> tuple[str, str | None]:
    """(queue or topic, subscription) from ``name`` and ``--subscription``; ``name`` may be the SDK's path
    ``topic/Subscriptions/sub``."""
    parts = name.strip("/").split("/")
    lowered = [p.lower() for p in parts]
    if len(parts) >= 3 and lowered[-2] == "subscriptions":
        if subscription is not None:
            raise click.UsageError("name the subscription once: in the path or with --subscription")
        return "/".join(parts[:-2]), parts[-1]
    return name, subscription


def resolve(session: Session, name: str, subscription: str | None, dead_letter: bool, *, sending: bool) -> Target:
    """Look the entity up (clear errors for a missing one or the wrong kind for what the command does)."""
    entity, sub = split_path(name, subscription)
    if name.rstrip("/").endswith(DEAD_LETTER):
        raise click.UsageError(f"name the entity without /{DEAD_LETTER} and add --dead-letter")
    try:
        if sub is not None:
            info = session.admin.get_subscription(entity, sub)
        else:
            info = session.admin.get_entity(entity)
    except AdminError as exc:
        if exc.status != 404:
            raise
        if sub is not None:
            raise CliError(f"topic '{entity}' has no subscription '{sub}' (or the topic does not exist)") from None
        raise CliError(f"no queue or topic named '{entity}'") from None
    if sending:
        if sub is not None or dead_letter:
            raise CliError("messages are sent to a queue or a topic, not to a subscription or dead-letter queue")
        return Target(info, entity)
    if info.kind is EntityKind.TOPIC:
        raise CliError(
            f"'{entity}' is a topic: its messages are in its subscriptions; name one with --subscription NAME "
            f"or as {entity}/Subscriptions/NAME"
        )
    if sub is not None:
        return Target(info, f"{entity}/Subscriptions/{sub}", entity, dead_letter)
    return Target(info, entity, None, dead_letter)


def entity_options(f: Any) -> Any:
    """ENTITY, --subscription and --dead-letter (for the commands that read messages)."""
    f = click.option("--dead-letter", is_flag=True, help="the entity's dead-letter sub-queue")(f)
    f = click.option("--subscription", "-s", metavar="NAME", help="a subscription of the topic ENTITY")(f)
    return click.argument("entity")(f)


def message_rows(messages: Iterable[ReceivedMessage]) -> list[dict[str, Any]]:
    rows = []
    for m in messages:
        record = message_to_record(m)
        body = record.get("body")
        preview = f"<{len(m.body)} bytes>" if body is None else body.replace("\n", "\\n")
        row = dict(record)
        row["key"] = record.get("session_id") or record.get("partition_key")
        row["body_preview"] = preview if len(preview) <= 60 else preview[:57] + "..."
        row["enqueued"] = (record.get("enqueued_time") or "").replace("+00:00", "Z")
        rows.append(row)
    return rows


MESSAGE_COLUMNS = [
    Column("sequence_number", "SEQ", True),
    Column("partition", "PART", True),
    Column("enqueued", "ENQUEUED"),
    Column("message_id", "MESSAGE ID"),
    Column("key", "KEY"),
    Column("subject", "SUBJECT"),
    Column("delivery_count", "DELIVERIES", True),
    Column("body_preview", "BODY"),
]


def show_messages(session: Session, messages: list[ReceivedMessage], title: str) -> None:
    """A table of messages; with --json the full records (what export writes), one list."""
    if session.out.json_mode:
        session.out.json([message_to_record(m) for m in messages])
        return
    columns = list(MESSAGE_COLUMNS)
    if any(m.annotation("x-opt-message-state") not in (None, 0) for m in messages):
        columns.insert(3, Column("state", "STATE"))
    if any(message_to_record(m).get("dead_letter_reason") for m in messages):
        columns.append(Column("dead_letter_reason", "DEAD-LETTER REASON"))
    if not messages:
        session.out.note(f"{title}: no messages")
        return
    session.out.table(columns, message_rows(messages), title=title)


def walk_peek(session: Session, address: str, start: int = 0, limit: int | None = None) -> Iterator[ReceivedMessage]:
    """Every message of ``address`` from sequence number ``start`` on, partition by partition, unlocked."""
    seen = 0
    while limit is None or seen < limit:
        page = session.amqp.peek(address, BATCH if limit is None else min(BATCH, limit - seen), start)
        if not page:
            return
        yield from page
        seen += len(page)
        start = page[-1].sequence_number + 1


def readable_count(session: Session, address: str) -> int:
    """How many messages every partition holds (shardbus' range-offsets), for progress bars."""
    return sum(p.count for p in session.amqp.range_offsets(address) if p.healthy)


# ------------------------------------------------------------------------------------------------- send
def _read_input(source: str, fmt: str) -> tuple[Iterator[OutgoingMessage], int | None]:
    """Messages from a file or stdin ('-') in the given format, and how many when that is known up front."""
    if source == "-":
        stream: IO[str] = sys.stdin
        name = "<stdin>"
        total = None
    else:
        path = Path(source)
        if not path.is_file():
            raise CliError(f"{source}: no such file")
        stream = path.open(encoding="utf-8")
        name = source
        total = sum(1 for line in path.open(encoding="utf-8") if line.strip()) if fmt != "raw" else 1
    if fmt == "jsonl":
        return read_records(stream, name), total
    if fmt == "text":
        return (OutgoingMessage(body=line.rstrip("\n").encode("utf-8")) for line in stream if line.strip()), total
    return iter([OutgoingMessage(body=stream.read().encode("utf-8"))]), 1


def send_all(
    session: Session, target: Target, messages: Iterator[OutgoingMessage], total: int | None, what: str
) -> int:
    sent = 0
    with session.out.progress(f"{what} {target.path}", total) as bar:
        while True:
            chunk = list(itertools.islice(messages, SEND_CHUNK))
            if not chunk:
                return sent
            session.amqp.send(target.path, chunk)
            sent += len(chunk)
            bar.advance(len(chunk))


def _apply_defaults(message: OutgoingMessage, defaults: dict[str, Any], properties: dict[str, Any]) -> OutgoingMessage:
    for attr, value in defaults.items():
        if value is not None and getattr(message, attr) is None:
            setattr(message, attr, value)
    if properties:
        message.application_properties = {**properties, **(message.application_properties or {})}
    return message


@click.command("send", help="Send messages to a queue or topic: BODY arguments, or --file (or stdin) as JSON lines.")
@click.argument("entity")
@click.argument("bodies", nargs=-1, metavar="[BODY]...")
@click.option("--file", "-f", "source", metavar="PATH", help="read messages from PATH ('-': stdin)")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "text", "raw"]),
    default="jsonl",
    show_default=True,
    help="input of --file/stdin: JSON lines (records), text lines (a message each), raw (one message)",
)
@click.option("--message-id", help="MessageId (with several messages: each gets it)")
@click.option("--partition-key", help="PartitionKey: which partition")
@click.option("--session-id", help="SessionId (also the partition key)")
@click.option("--correlation-id", help="CorrelationId")
@click.option("--subject", help="Subject (Label)")
@click.option("--content-type", help="ContentType")
@click.option("--to", help="To")
@click.option("--reply-to", help="ReplyTo")
@click.option("--ttl", type=DURATION, help="time to live (30s, 5m, PT1H)")
@click.option("--property", "-p", "properties", multiple=True, metavar="NAME=VALUE", help="application property")
@connection_options
@pass_session
def send(
    session: Session,
    entity: str,
    bodies: tuple[str, ...],
    source: str | None,
    fmt: str,
    ttl: Any,
    properties: tuple[str, ...],
    **fields: Any,
) -> None:
    if bodies and source:
        raise click.UsageError("give BODY arguments or --file, not both")
    if not bodies and source is None:
        if sys.stdin.isatty():
            raise click.UsageError("nothing to send: give BODY arguments, --file PATH, or pipe messages to stdin")
        source = "-"
    props = parse_pairs(properties, "--property")
    defaults = dict(fields)
    if ttl is not None:
        defaults["time_to_live_ms"] = int(ttl.total_seconds() * 1000)
    target = resolve(session, entity, None, False, sending=True)
    if bodies:
        messages: Iterator[OutgoingMessage] = (OutgoingMessage(body=b.encode("utf-8")) for b in bodies)
        total: int | None = len(bodies)
    else:
        messages, total = _read_input(source or "-", fmt)
    prepared = (_apply_defaults(m, defaults, props) for m in messages)
    try:
        sent = send_all(session, target, prepared, total, "sending to")
    except RecordError as exc:
        raise CliError(f"{exc} (messages before it were sent)") from None
    session.out.done(f"sent {sent} message(s) to {target.path}", data={"entity": target.path, "sent": sent})


# ------------------------------------------------------------------------------------------------- peek
@click.command("peek", help="Show messages without locking or removing them.")
@entity_options
@click.option("--count", "-n", default=10, show_default=True, help="how many messages")
@click.option("--from-sequence-number", "start", type=int, default=0, help="start here (names the partition too)")
@connection_options
@pass_session
def peek(session: Session, entity: str, subscription: str | None, dead_letter: bool, count: int, start: int) -> None:
    target = resolve(session, entity, subscription, dead_letter, sending=False)
    messages = list(walk_peek(session, target.address, start, count))
    show_messages(session, messages, f"peeked from {target.address}")


# ---------------------------------------------------------------------------------------------- receive
@click.command("receive", help="Receive messages (peek-lock, then complete them; or receive-and-delete).")
@entity_options
@click.option("--count", "-n", default=1, show_default=True, help="at most this many messages")
@click.option("--max-wait", type=float, default=5.0, show_default=True, help="seconds to wait for the first message")
@click.option("--receive-and-delete", is_flag=True, help="remove messages as they are delivered (no lock)")
@click.option(
    "--settle",
    type=click.Choice(["complete", "abandon", "release", "dead-letter"]),
    default="complete",
    show_default=True,
    help="peek-lock: what to do with the received messages (abandon counts a delivery, release does not)",
)
@click.option("--reason", default="ManualDeadLetter", show_default=True, help="with --settle dead-letter: the reason")
@click.option("--session-id", help="session-enabled entity: this session (default: the next available one)")
@connection_options
@pass_session
def receive(
    session: Session,
    entity: str,
    subscription: str | None,
    dead_letter: bool,
    count: int,
    max_wait: float,
    receive_and_delete: bool,
    settle: str,
    reason: str,
    session_id: str | None,
) -> None:
    target = resolve(session, entity, subscription, dead_letter, sending=False)
    sessions = bool(target.info.properties.get("requires_session")) and not dead_letter
    if session_id is not None and not sessions:
        raise click.UsageError(f"{target.address} is not session-enabled: --session-id does not apply")
    try:
        receiver = session.amqp.receiver(
            target.address,
            receive_and_delete=receive_and_delete,
            session_id=session_id,
            any_session=sessions,
            session_wait=max_wait,
        )
    except AmqpClientError:
        if not sessions:
            raise
        # A session receiver's link is refused when no session could be taken (none has messages, or it is held).
        if session_id is not None:
            raise CliError(
                f"{target.address}: session '{session_id}' could not be locked (another receiver holds it)"
            ) from None
        raise CliError(f"{target.address}: no session with messages could be locked within {max_wait:g} s") from None
    with receiver:
        messages: list[ReceivedMessage] = []
        deadline = max_wait
        while len(messages) < count:
            batch = receiver.receive(min(BATCH, count - len(messages)), max_wait=deadline)
            if not batch:
                break
            messages.extend(batch)
            deadline = 0.5  # after the first batch, only what is already on its way
        if not receive_and_delete and messages:
            if settle == "dead-letter":
                receiver.dead_letter(messages, reason, "dead-lettered with `shardbus receive`")
            else:
                getattr(receiver, settle)(messages)
    show_messages(session, messages, f"received from {target.address}")


# ------------------------------------------------------------------------------------------------ purge
@click.command("purge", help="Remove every message from a queue, subscription or dead-letter queue.")
@entity_options
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@connection_options
@pass_session
def purge(session: Session, entity: str, subscription: str | None, dead_letter: bool, yes: bool) -> None:
    target = resolve(session, entity, subscription, dead_letter, sending=False)
    confirm(yes, f"remove every message from {target.address}")
    # complete-below each partition's end: one request per partition, whatever the number of messages;
    # messages that arrive meanwhile get sequence numbers at or above the end and stay.
    offsets = session.amqp.range_offsets(target.address)
    purged = 0
    down = [p.partition for p in offsets if not p.healthy]
    with session.out.progress(f"purging {target.address}", len(offsets)) as bar:
        for p in offsets:
            if p.healthy and p.count:
                session.amqp.complete_below(target.address, {p.partition: p.end})
                purged += p.count
            bar.advance()
    if down:
        session.out.note(f"partitions {', '.join(map(str, down))} are down: their messages were not purged")
    session.out.done(
        f"purged {purged} message(s) from {target.address}",
        data={"entity": target.address, "purged": purged, "unavailable_partitions": down},
    )


# ------------------------------------------------------------------------------------------ dead letters
@click.group("dead-letter", help="Work with dead-lettered messages.")
def dead_letter() -> None:
    pass


@dead_letter.command("resubmit", help="Send dead-lettered messages back to their entity, then remove them.")
@click.argument("entity")
@click.option("--subscription", "-s", metavar="NAME", help="a subscription of the topic ENTITY")
@click.option("--count", "-n", type=int, default=None, help="at most this many (default: all)")
@click.option("--to", "destination", metavar="ENTITY", help="send to this queue or topic instead")
@connection_options
@pass_session
def resubmit(
    session: Session, entity: str, subscription: str | None, count: int | None, destination: str | None
) -> None:
    source = resolve(session, entity, subscription, True, sending=False)
    # A subscription's messages go back through its topic (the service has no way to address one subscription).
    to = resolve(session, destination or source.topic or source.path, None, False, sending=True)
    if to.kind is EntityKind.TOPIC and destination is None:
        session.out.note(f"resubmitting to topic {to.path}: every subscription whose rules match gets a copy")
    total = readable_count(session, source.address)
    total = total if count is None else min(count, total)
    done = 0
    with (
        session.out.progress(f"resubmitting to {to.path}", total) as bar,
        session.amqp.receiver(source.address) as receiver,
    ):
        while count is None or done < count:
            batch = receiver.receive(BATCH if count is None else min(BATCH, count - done), max_wait=1.0)
            if not batch:
                break
            session.amqp.send(to.path, [resubmission(m) for m in batch])
            receiver.complete(batch)  # only once the copies are stored: at worst a message is sent twice
            done += len(batch)
            bar.advance(len(batch))
    session.out.done(
        f"resubmitted {done} message(s) from {source.address} to {to.path}",
        data={"from": source.address, "to": to.path, "resubmitted": done},
    )


# ------------------------------------------------------------------------------------------ export/import
@click.command("export", help="Write an entity's messages as JSON lines (without removing them).")
@entity_options
@click.option("--output", "-o", "output_path", metavar="PATH", default="-", help="file to write ('-': stdout)")
@connection_options
@pass_session
def export(session: Session, entity: str, subscription: str | None, dead_letter: bool, output_path: str) -> None:
    target = resolve(session, entity, subscription, dead_letter, sending=False)
    total = readable_count(session, target.address)
    to_stdout = output_path == "-"
    stream: IO[str] = sys.stdout if to_stdout else open(output_path, "w", encoding="utf-8")  # noqa: SIM115
    try:
        with session.out.progress(f"exporting {target.address}", total) as bar:

            def counted() -> Iterator[ReceivedMessage]:
                for m in walk_peek(session, target.address):
                    bar.advance()
                    yield m

            written = write_records(stream, counted())
    finally:
        if not to_stdout:
            stream.close()
    text = f"exported {written} message(s) from {target.address}"
    if to_stdout:
        session.out.note(text)  # stdout carries the messages
    else:
        session.out.done(f"{text} to {output_path}", data={"entity": target.address, "exported": written})


@click.command("import", help="Send the messages of a JSON lines file (an export) to a queue or topic.")
@click.argument("entity")
@click.argument("source", metavar="FILE")
@connection_options
@pass_session
def import_(session: Session, entity: str, source: str) -> None:
    target = resolve(session, entity, None, False, sending=True)
    messages, total = _read_input(source, "jsonl")
    try:
        sent = send_all(session, target, messages, total, "importing into")
    except RecordError as exc:
        raise CliError(f"{exc} (messages before it were imported)") from None
    session.out.done(f"imported {sent} message(s) into {target.path}", data={"entity": target.path, "imported": sent})


COMMANDS = (send, peek, receive, purge, dead_letter, export, import_)
__all__ = ["COMMANDS", "Target", "readable_count", "record_to_message", "resolve"]
