"""A worker: partition brokers in their own process, served to front ends over a framed TCP stream (``wire.py``,
``stream.py``).

A front end opens a partition (``open``: its settings and where its store lives under the worker's data
directory), starts it, and then calls the operations of the partition interface by name (the table in
``partition/handle.py``: QUERY, WRITE and QUERY_WRITE ones call the partition's broker); the worker runs each call
on its event loop thread (they are in-memory decisions that queue store writes) and answers when the call's store
write, if any, is durable; a settlement whose write lingers for company is answered once applied and its write
reported durable later (``WorkerConnection._applied``). LIFECYCLE operations (start, stop) load or flush a store,
so they run on a thread of their own. A partition's listeners become ``event`` frames to every front end that
opened it, coalesced per loop iteration.

Each front end's connection holds the messages that front end sent and may yet lock (``wire.Held``: bounded by
``wire.HELD_BYTES`` of enqueue frames), so that a lock reply names them instead of carrying them back.

Run one with ``shardbus worker --listen HOST:PORT --data-dir DIR --key KEY``; ``shardbus serve --workers N``
starts N of them itself. The key is the cluster's secret: a front end proves it holds it by answering the
worker's HMAC challenge when it connects (``wire.py``); the key itself never travels.

Cluster mode (``--metadata DSN``, workers on any host): the worker registers in the cluster's metadata store
(``metadata.py``) and keeps every partition's store in PostgreSQL at that DSN, one schema per partition
(``store_schema``). Opening a partition takes its lease first (refused, naming the holder, while another worker
holds it); the heartbeat renews the leases, and a partition whose lease is lost is stopped at once (fencing).
Closing or deleting a partition gives its lease up, so another worker may take it without waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..extras import MissingExtra
from ..model.errors import EntityNotFound, InvalidOperation, ShardbusError
from ..model.message import SubQueue
from ..partition.broker import LEND, PartitionBroker
from ..partition.handle import OPERATIONS, Kind
from ..partition.values import PartitionConfig
from ..store.base import MessageStore, StoreError
from ..store.committer import LingeringWrite
from ..store.sqlite import SqliteStore
from . import wire
from .lifeline import end_with_parent
from .stream import FrameStream

if TYPE_CHECKING:  # cluster mode only: the PostgreSQL modules need the 'postgres' extra
    from .metadata import WorkerMembership

log = logging.getLogger("shardbus.worker")

DEFAULT_LEASE_TTL = 10.0  # seconds a dead worker keeps its partitions (cluster mode)
SELF_TICK_INTERVAL = 0.1  # a worker on its own clock ticks its partitions this often, as one process's upkeep does

# Operations of the partition interface (partition/handle.py) the worker answers by calling the partition's
# broker; the LIFECYCLE ones and the worker's own (``open``, ``tick_all``...) are handlers (``HANDLERS``).
BROKER_CALLS = frozenset(op.name for op in OPERATIONS.values() if op.kind in (Kind.QUERY, Kind.WRITE, Kind.QUERY_WRITE))
# Operations whose items argument travels in the request itself (``wire.ItemsArg``): its position in the arguments.
ITEMS_ARGUMENT = {
    op.name: list(op.signature.parameters)[1:].index(argument)
    for op in OPERATIONS.values()
    for argument, encoding in op.compact
    if encoding == "items"
}
# A handler: (the front end's connection, partition key, *the request's arguments) -> the result to answer.
Handler = Callable[..., Any]


class CallerClock:
    """The time a partition sees: the worker's wall clock, or (``follow=True``, for tests whose front end moves
    a fake clock) the latest time its callers sent."""

    def __init__(self, follow: bool) -> None:
        self.follow = follow
        self.now = 0.0

    def advance(self, now: float) -> None:
        if now > self.now:
            self.now = now

    def __call__(self) -> float:
        return self.now if self.follow else time.time()


_STORE_KEY = re.compile(r"(?P<namespace>[^/]+)/entities/(?P<entity>\d+)/p(?P<partition>\d+)\.db")


def store_schema(key: str, config: PartitionConfig) -> str:
    """The PostgreSQL schema of a partition, from its key (``<namespace>/entities/<id>/p<NN>.db``, the namespace's
    store path): ``partition_schema`` of that entity and partition, so every worker derives the same one."""
    match = _STORE_KEY.fullmatch(key)
    if match is None:
        raise InvalidOperation(f"partition key {key!r} does not name a partition store")
    from ..store.postgres import partition_schema

    return partition_schema(int(match["entity"]), config.path, int(match["partition"]), namespace=match["namespace"])


class PartitionHost:
    """The partition brokers of one worker, by partition key ("<namespace>/entities/<id>/p<NN>.db").

    Stores are SQLite files under the data directory, or (``membership`` and ``dsn`` given: cluster mode)
    PostgreSQL schemas guarded by partition leases.
    """

    def __init__(
        self,
        data_dir: Path,
        follow_caller_clock: bool,
        membership: WorkerMembership | None = None,
        dsn: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.follow_caller_clock = follow_caller_clock
        self.membership = membership
        self.dsn = dsn
        self.partitions: dict[str, PartitionBroker] = {}
        self.clocks: dict[str, CallerClock] = {}
        self.store_paths: dict[str, Path] = {}
        self.schemas: dict[str, str] = {}
        self.on_available: Callable[[str, int], None] = lambda key, slot: None

    def open(self, key: str, config: PartitionConfig) -> None:
        """Serve a partition (idempotent: a second front end, or a reconnecting one, opens it again). ``key`` is
        also its store's path under the data directory (or names its PostgreSQL schema). In cluster mode this
        takes the partition's lease first, and raises PartitionUnavailable while another worker holds it."""
        current = self.partitions.get(key)
        if current is not None and (self.membership is None or key in self.membership.held):
            current.config = config
            return
        if self.membership is not None and self.dsn is not None:
            schema = store_schema(key, config)
            self.membership.acquire(key)
            if current is not None:  # fenced after losing its lease: a new broker reloads the store
                current.stop("its lease was lost")
            from ..store.postgres import PostgresStore

            lease, dsn = (key, self.membership.name), self.dsn
            factory: Callable[[], MessageStore] = lambda: PostgresStore(dsn, schema, lease=lease)  # noqa: E731
            self.schemas[key] = schema
        else:
            path = (self.data_dir / key).resolve()
            if not path.is_relative_to(self.data_dir.resolve()):
                raise InvalidOperation(f"partition {key!r} would leave the worker's data directory")
            factory = lambda: SqliteStore(path)  # noqa: E731
            self.store_paths[key] = path
        clock = self.clocks[key] = CallerClock(self.follow_caller_clock)
        broker = PartitionBroker(config, factory, clock)
        broker.listeners.append(lambda slot: self.on_available(key, slot))
        self.partitions[key] = broker

    def fence(self, key: str) -> None:
        """The partition's lease is lost (from the heartbeat thread): stop serving it at once. It stays listed,
        unhealthy, so front ends see why; opening it again takes the lease again."""
        broker = self.partitions.get(key)
        if broker is not None:
            broker.stop("this worker lost the partition's lease")

    def get(self, key: str) -> PartitionBroker:
        broker = self.partitions.get(key)
        if broker is None:
            raise EntityNotFound(f"partition {key} is not served by this worker (it was not opened)")
        return broker

    def close(self, key: str, reason: str = "the namespace is closed") -> None:
        """Stop serving a partition (its store stays; its lease, if any, is given up once it is flushed)."""
        broker = self.partitions.pop(key, None)
        self.clocks.pop(key, None)
        if broker is not None:
            broker.stop(reason)
        if self.membership is not None and key in self.membership.held:
            self.membership.release(key)

    def delete(self, key: str) -> None:
        """The entity is gone: stop the partition and remove its store."""
        path = self.store_paths.pop(key, None)
        schema = self.schemas.pop(key, None)
        self.close(key, "the entity was deleted")
        if path is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        if schema is not None and self.dsn is not None:
            from ..store.postgres import drop_partition_schema

            drop_partition_schema(self.dsn, schema)

    def health(self) -> dict[str, str | None]:
        return {key: None if p.healthy else (p.failure or "stopped") for key, p in list(self.partitions.items())}

    def tick(self, clocks: dict[str, float]) -> dict[str, str | None]:
        for key, p in list(self.partitions.items()):
            clock = self.clocks.get(key)
            if clock is not None and key in clocks:
                clock.advance(clocks[key])
            try:
                p.tick()  # an unavailable one too: it may be due to reload after a full store
            except ShardbusError:
                pass  # the partition reports its own health
        return self.health()

    def tick_own(self) -> bool:
        """A worker on its own clock ticks its partitions (``Worker._tick_round``): each one's ``tick``, without the
        clocks and the health a front end's ``tick_all`` asks for (they cost the idle worker about 0.4 of the
        partitions' own ticks, ten times a second). False, and nothing ticked, if any partition is unavailable:
        its tick may reload it (file I/O), which ``tick`` then does off the loop."""
        partitions = list(self.partitions.values())
        for p in partitions:
            if not p.healthy:
                return False
        for p in partitions:
            try:
                p.tick()
            except ShardbusError:
                pass  # the partition reports its own health
        return True

    def stop_all(self) -> None:
        for key in list(self.partitions):
            self.close(key, "the worker is stopping")


class WorkerConnection:
    """One front end's connection to this worker: its requests in, replies and events out (``stream.py``)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.host = worker.host
        self.stream = FrameStream(worker.key, server=True, on_frame=self._request, on_lost=self.connection_lost)
        self.opened: set[str] = set()  # partition keys this front end opened (it gets their events)
        self._now = 0.0  # the time the request being served carried
        self.closed = False
        # Settlements answered as applied whose lingering writes are not yet durable, by request id (at most what
        # 20 ms of settlements request); and the ids written since the last ``written`` frame went (loop thread).
        self._lingering: dict[int, LingeringWrite] = {}
        self._written_ids: list[int] = []
        # The messages this front end sent that its lock replies may name instead of carrying (``wire.Held``:
        # bounded by wire.HELD_MESSAGES and wire.HELD_BYTES; the front end holds the same, in step).
        self.held = wire.Held()

    def connection_lost(self) -> None:
        if not self.closed:
            self.closed = True
            self.worker.connections.discard(self)

    # --- requests ------------------------------------------------------------------------------------
    def _request(self, frame: list[Any]) -> None:
        request_id, key, now, operation, args = frame
        clock = self.host.clocks.get(key)
        if clock is not None:
            clock.advance(now)
        self._now = now
        handler = self.worker.handlers.get(operation)
        try:
            if handler is not None:
                result = handler(self, key, *args)
                if operation in wire.ONE_WAY:  # nothing waits for an answer
                    return
            elif operation == "enqueue":  # answered as its items are held (``_enqueued``)
                items, held = wire.held_items_of(args[0])
                size = self.stream.frame_bytes
                self._enqueue(request_id, key, held, size, self.host.get(key).enqueue(items, *args[1:]))
                return
            elif operation in BROKER_CALLS:
                at = ITEMS_ARGUMENT.get(operation)
                if at is not None:
                    args[at] = wire.items_of(args[at])
                result = getattr(self.host.get(key), operation)(*args)
            else:
                raise InvalidOperation(f"unknown partition operation {operation!r}")
        except Exception as exc:  # every failure goes back to the caller, the worker keeps serving
            if not isinstance(exc, ShardbusError | StoreError):
                log.exception("partition call %s on %s failed", operation, key)
            if operation in wire.ONE_WAY:
                return
            self._reply(request_id, key, False, wire.encode_error(exc))
            return
        self._answer(request_id, key, result)

    def _answer(self, request_id: int, key: str, result: Any) -> None:
        """Reply now, or when the call's store write is durable (a Future, or a (value, Future) pair); a
        settlement whose write lingers is answered twice: applied now, durable later (``_applied``)."""
        pending: Future | None = None
        if isinstance(result, Future):
            if result.__class__ is LingeringWrite and not result.done():
                self._applied(request_id, key, result)
                return
            pending, value_of = result, lambda f: f.result()
        elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Future):
            value, pending = result
            value_of = lambda f, value=value: [value, None]  # noqa: E731
        if pending is None:
            self._reply(request_id, key, True, result)
            return

        def done(f: Future) -> None:
            try:
                ok, value = True, value_of(f)
            except Exception as exc:
                ok, value = False, wire.encode_error(exc)
            self.worker.call_soon(self._reply, request_id, key, ok, value)

        pending.add_done_callback(done)

    def _enqueue(self, request_id: int, key: str, held: list[Any] | None, size: int, write: Future) -> None:
        """Answer an ``enqueue`` once its write is durable, as ``_answer`` does, and hold its messages (``held``,
        None if it is not held; ``size``: its frame's bytes) for the lock replies to name (``wire.Held``) as its
        reply goes: the front end adds them as it reads that reply."""

        def done(f: Future) -> None:
            try:
                ok, value = True, f.result()
            except Exception as exc:
                ok, value = False, wire.encode_error(exc)
            self.worker.call_soon(self._enqueued, request_id, key, ok, value, held, size)

        write.add_done_callback(done)

    def _enqueued(self, request_id: int, key: str, ok: bool, value: Any, held: list[Any] | None, size: int) -> None:
        if ok and held is not None:
            self.held.add(key, value, held, size)
        self._reply(request_id, key, ok, value)

    def _applied(self, request_id: int, key: str, write: LingeringWrite) -> None:
        """A settlement is applied and its write lingers for company (20 ms at most, as in one process): say so now
        (the front end echoes the outcome to its client, as one process does) and that it is durable later, in one
        ``written`` frame per loop turn for every request written meanwhile (``_written``). Nobody waits for the
        write unless the front end asks (``_hurry``); it ends the linger then, as ``LingeringWrite.result`` does.
        Answering only once the write was durable made the linger 2 ms, so that echoes were not held up: about a
        transaction per request in bench/scale.py's receive phase, 19 against 7.5 us of store threads per message
        (bench/hop_threads.py --phase receive; docs/processes.md)."""
        self._lingering[request_id] = write
        self._reply(request_id, key, True, None, applied=True)
        write.add_done_callback(lambda f: self.worker.call_soon(self._written, request_id, f))

    def _written(self, request_id: int, write: Future) -> None:
        self._lingering.pop(request_id, None)
        exc = write.exception()
        if exc is not None:
            self.send(wire.pack_frame([-1, [request_id], wire.encode_error(exc)]))
            return
        self._written_ids.append(request_id)
        if len(self._written_ids) == 1:
            # packed as the turn's replies are written, in their write: a commit completes the settlements it
            # carried and the enqueues it stored together, and their replies and this frame share one write (a
            # write of its own one callback later was 0.010 writes per message in bench/hop_counts.py)
            self.stream.queue_last(self._written_frame)

    def _written_frame(self) -> bytes:
        ids, self._written_ids = self._written_ids, []
        return wire.pack_frame([-1, ids, None])

    def _hurry(self, _key: str, request_id: int) -> None:
        """The front end waits for a settlement's write (``remote.RemoteSettlement.result``): stop its linger."""
        write = self._lingering.get(request_id)
        if write is not None:
            write.hurry()

    def _reply(self, request_id: int, key: str, ok: bool, value: Any, applied: bool = False) -> None:
        broker = self.host.partitions.get(key)
        if broker is None:  # calls on the whole worker (key "") have no partition to describe
            health = f"partition {key} is not served by this worker" if key else None
        else:
            health = None if broker.healthy else (broker.failure or "stopped")
        if applied:
            self.send(wire.pack_frame([request_id, ok, None, health, wire.APPLIED]))
        else:
            self.send(wire.reply_frame(request_id, ok, value, health))

    def send(self, frame: bytes) -> None:
        """Queue a packed frame (on the loop): what a loop turn queues goes out in one write."""
        self.stream.queue(frame)

    # --- handlers: the life cycle, and the worker's own operations ---------------------------------
    def _open(self, key: str, config: PartitionConfig) -> None:
        self.host.open(key, config)
        self.opened.add(key)
        self.host.clocks[key].advance(self._now)

    def _in_thread(self, key: str, name: str, *args: Any) -> Future:
        """A LIFECYCLE operation of the partition: it loads or flushes the store, so not on the loop."""
        return self.worker.in_thread(getattr(self.host.get(key), name), *args)

    def _delete(self, key: str) -> Future:
        self.opened.discard(key)
        return self.worker.in_thread(self.host.delete, key)

    def _close(self, key: str) -> Future:
        """This front end is done with the partition; it keeps running while another front end uses it."""
        self.opened.discard(key)
        if any(key in c.opened for c in self.worker.connections if c is not self):
            return self.worker.in_thread(lambda: None)
        return self.worker.in_thread(self.host.close, key)

    def _tick(self, _key: str, clocks: dict[str, float]) -> dict[str, str | None] | Future:
        if not self.host.follow_caller_clock:
            # On its own clock the worker ticks its partitions itself, ten times a second (``Worker._tick_round``,
            # which also reloads an unavailable one): the front end's ``tick_all`` (once a second) asks only for
            # their health, and a round of ticks more would only repeat what the last one did.
            return self.host.health()
        # An unavailable partition's tick may reload it (a full store's ``_recover``: stop + start, file I/O):
        # off the loop then, so that the worker's other partitions keep being served meanwhile.
        if all(p.healthy for p in list(self.host.partitions.values())):
            return self.host.tick(clocks)
        # The health it answers is read on the loop once the tick is done, not in its thread: a partition's
        # ``start`` (another thread) may finish meanwhile and answer first, and a snapshot taken before that, sent
        # after it, would mark the partition down again at the front end until the next tick.
        answer: Future = Future()

        def ticked(f: Future) -> None:
            self.worker.call_soon(_settle_with, answer, f, self.host.health)

        self.worker.in_thread(self.host.tick, clocks).add_done_callback(ticked)
        return answer

    def _health(self, _key: str) -> dict[str, str | None]:
        return self.host.health()

    def _complete(self, key: str, slot: int, keys: list[int]) -> Future:
        """The partition interface's ``complete``, its tokens as the wire reads them: their ints (``wire.Tokens``),
        all a partition finds a lock by (``PartitionBroker.complete_keys``)."""
        return self.host.get(key).complete_keys(slot, keys)

    def _lock_messages(self, key: str, slot: int, queue: int, max_count: int) -> wire.Records | wire.Locked:
        """The partition interface's ``lock_messages``, the locked messages made their wire records at once: the
        broker's copies of them would only be read into the records. They are lent (``PartitionBroker.
        lock_messages_as``: a locked message is never changed in place) and made records in one loop
        (``wire.records_of``), a Python call per message fewer than a record made under the lock by each. Of a
        slot's main queue this front end sent messages to, those it still holds go named, not carried
        (``wire.Held``)."""
        messages = self.host.get(key).lock_messages_as(slot, queue, max_count, LEND)
        held = self.held.of(key) if queue == SubQueue.MAIN else None
        if held is None:
            return wire.Records(wire.records_of(messages))
        return wire.Locked(wire.named_records_of(messages, held))


def _settle_with(answer: Future, done: Future, value: Callable[[], Any]) -> None:
    """Complete ``answer`` as ``done`` ended: its exception, or else ``value()`` read now (on the loop)."""
    exc = done.exception()
    if exc is not None:
        answer.set_exception(exc)
    else:
        answer.set_result(value())


def _lifecycle(name: str) -> Handler:
    return lambda conn, key, *args: conn._in_thread(key, name, *args)


HANDLERS: dict[str, Handler] = {
    **{op.name: _lifecycle(op.name) for op in OPERATIONS.values() if op.kind is Kind.LIFECYCLE},
    "open": WorkerConnection._open,
    "delete": WorkerConnection._delete,  # the host's: it also removes the store
    "close": WorkerConnection._close,  # the host's: other front ends may still use the partition
    "tick_all": WorkerConnection._tick,
    "health": WorkerConnection._health,
    "hurry": WorkerConnection._hurry,
    "lock_messages": WorkerConnection._lock_messages,  # a broker call, answered as records (no copy first)
    "complete": WorkerConnection._complete,  # a broker call, its tokens read as ints (``wire.Tokens``)
}


class Worker:
    """Serves a ``PartitionHost`` on one port (``stream.py``); runs its loop in the calling thread (``run``)."""

    def __init__(
        self,
        data_dir: Path | str,
        key: str,
        *,
        follow_caller_clock: bool = False,
        membership: WorkerMembership | None = None,
        dsn: str | None = None,
        handlers: dict[str, Handler] | None = None,
    ) -> None:
        """``handlers``: operations this worker answers besides the partition interface's (test support serves
        its fault plans this way, ``tests/support/faulty_worker.py``); they cannot replace one of ``HANDLERS``."""
        self.data_dir = Path(data_dir)
        if membership is None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self.key = key
        self.membership = membership
        if membership is not None:
            membership.on_lost = lambda partition_key: self.host.fence(partition_key)
        self.host = PartitionHost(self.data_dir, follow_caller_clock, membership, dsn)
        self.host.on_available = self._on_available
        clash = set(handlers or ()) & (set(HANDLERS) | BROKER_CALLS)
        if clash:
            raise ValueError(f"the worker already answers {sorted(clash)}")
        self.handlers = {**HANDLERS, **(handlers or {})}
        self.connections: set[WorkerConnection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._threads = ThreadPoolExecutor(4, thread_name_prefix="shardbus-worker-store")
        self._events: set[tuple[str, int]] = set()
        self._soon: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []  # for the loop, from any thread
        self._soon_lock = threading.Lock()
        self._ticker: asyncio.TimerHandle | None = None  # the next round of its own ticks (on its own clock)
        self._reload: Future | None = None  # a round of ticks in a thread (a partition unavailable), if any

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread. A group commit completes many writes at once: their
        replies share one wake-up of the loop (one ``call_soon_threadsafe`` per burst) and, in order, one turn."""
        assert self.loop is not None
        with self._soon_lock:
            self._soon.append((fn, args))
            if len(self._soon) > 1:
                return
        try:
            self.loop.call_soon_threadsafe(self._run_soon)
        except RuntimeError:  # the loop closed: the worker is stopping
            pass

    def _run_soon(self) -> None:
        with self._soon_lock:
            calls, self._soon = self._soon, []
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:  # one failed reply must not drop the others of its burst
                log.exception("worker callback %r failed", fn)

    def in_thread(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._threads.submit(fn, *args)

    def _on_available(self, key: str, slot: int) -> None:
        """From any thread: tell the front ends that opened ``key`` that ``slot`` gained messages."""
        first = not self._events
        self._events.add((key, slot))
        if first:
            self.call_soon(self._send_events)

    def _send_events(self) -> None:
        events, self._events = self._events, set()
        for key, slot in events:
            frame = wire.pack_frame([0, key, slot])
            for conn in list(self.connections):
                if key in conn.opened:
                    conn.send(frame)

    async def serve(self, host: str, port: int, ready: Callable[[int], None] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def make() -> FrameStream:
            conn = WorkerConnection(self)
            self.connections.add(conn)
            return conn.stream

        server = await self.loop.create_server(make, host, port)
        for sig in (signal.SIGINT, signal.SIGTERM):
            if threading.current_thread() is threading.main_thread():
                self.loop.add_signal_handler(sig, stop.set)
        self._stop_event = stop
        # On its own clock a worker ticks its partitions itself (lock expiry, scheduled messages, TTL), as one
        # process's upkeep does: a front end's ``tick_all`` every 0.1 s cost a round trip each (about 0.3 ms of the
        # worker's CPU and as much of the front end's, idle or not), so ``serve --workers`` front ends send it
        # only for health, once a second. On the caller's clock (tests' fake time) the front end's ticks drive it.
        if not self.host.follow_caller_clock:
            self._ticker = self.loop.call_later(SELF_TICK_INTERVAL, self._tick_round)
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        await stop.wait()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        server.close()
        for conn in list(self.connections):
            conn.stream.close()  # after what is written: the front ends see the connection end
        await self.loop.run_in_executor(None, self.host.stop_all)
        if self.membership is not None:
            await self.loop.run_in_executor(None, self.membership.stop)
        self._threads.shutdown(wait=True)

    def _tick_round(self) -> None:
        """One round of the worker's own ticks, then the next one ``SELF_TICK_INTERVAL`` later (a timer, not a task
        asleep: no future and no task step per round)."""
        try:
            if not self.host.tick_own() and (self._reload is None or self._reload.done()):
                # an unavailable partition's tick may reload it (file I/O): off the loop, one at a time
                self._reload = self.in_thread(self.host.tick, {})
        except Exception:  # upkeep must never stop; each partition reports its own health
            log.exception("ticking the partitions failed")
        if self._ticker is not None:  # not stopped meanwhile
            self._ticker = self.loop.call_later(SELF_TICK_INTERVAL, self._tick_round)  # type: ignore[union-attr]

    def stop(self) -> None:
        self.call_soon(self._stop_event.set)


def _exit_with_parent(worker: Worker) -> None:
    """A worker of ``serve --workers`` stops when its front end is gone, however it went: at once on Linux (the
    kernel's SIGTERM, handled as a clean stop), else within 0.1 s (lifeline.py)."""

    def stop() -> None:
        if worker.loop is not None:
            worker.stop()
        else:  # not serving yet: nothing to flush
            os._exit(0)

    end_with_parent(stop)


def _advertised_host(listen_host: str) -> str:
    """The address to give front ends when ``--advertise`` is not set: the listen address unless it is a
    wildcard, else this host's name resolved."""
    if listen_host in ("", "0.0.0.0", "::"):
        return socket.gethostbyname(socket.gethostname())
    return listen_host


def main(argv: list[str] | None = None, handlers: dict[str, Handler] | None = None) -> int:
    """``shardbus worker``: serve partition brokers to front ends (``handlers``: see ``Worker``)."""
    parser = argparse.ArgumentParser(prog="shardbus worker", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free port)")
    parser.add_argument("--data-dir", default="./shardbus-data", help="where this worker's partition stores live")
    parser.add_argument("--key", default=os.environ.get("SHARDBUS_CLUSTER_KEY", "SAS_KEY_VALUE"))
    parser.add_argument(
        "--metadata",
        default=None,
        metavar="DSN",
        help="join the cluster whose metadata store (and partition stores) is this PostgreSQL database",
    )
    parser.add_argument("--name", default=None, help="this worker's unique name in the cluster (default: host-pid)")
    parser.add_argument("--advertise", default=None, metavar="HOST:PORT", help="where front ends reach this worker")
    parser.add_argument(
        "--lease-ttl", type=float, default=DEFAULT_LEASE_TTL, help="seconds a dead worker keeps its partitions"
    )
    parser.add_argument("--follow-caller-clock", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)  # serve --workers
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    from ..runtime import new_event_loop, tune_garbage_collector
    from ..store.amqp_values import register_stored_types

    register_stored_types()  # the AMQP value types messages may carry, before any store opens
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s worker %(levelname)s %(message)s")
    tune_garbage_collector()
    membership = None
    if args.metadata:
        name = args.name or f"{socket.gethostname()}-{os.getpid()}"
        try:
            from .metadata import ClusterMetadata, WorkerMembership

            metadata = ClusterMetadata(args.metadata)
        except (StoreError, MissingExtra) as exc:
            print(f"shardbus worker: cannot join the cluster: {exc}", file=sys.stderr)
            return 2
        membership = WorkerMembership(metadata, name, "", args.lease_ttl, lambda key: None)
    worker = Worker(
        args.data_dir,
        args.key,
        follow_caller_clock=args.follow_caller_clock,
        membership=membership,
        dsn=args.metadata,
        handlers=handlers,
    )

    def ready(bound: int) -> None:
        if membership is not None:
            membership.address = args.advertise or f"{_advertised_host(host)}:{bound}"
            membership.start()  # front ends find it from now on
        # the supervisor (cluster/supervisor.py) reads this line to learn the port
        print(f"READY {host or '127.0.0.1'}:{bound}", flush=True)

    if args.exit_with_parent:
        _exit_with_parent(worker)
    loop = new_event_loop()
    try:
        loop.run_until_complete(worker.serve(host or "127.0.0.1", int(port or 0), ready))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
