"""The front end's side of the cluster: partitions in worker processes that look exactly like local ones.

``RemotePartition`` has every operation of the partition interface (the table in ``partition/handle.py``): each
one is a request to the worker that serves the partition (``wire.py`` frames on a TCP stream, ``stream.py``) and
waits for
the answer; operations that return a store-write ``Future`` return one here too, completed when the worker's write
is durable. Only the methods with behaviour of their own are written here; the rest are generated from the table.
All connections to workers share one event-loop thread (``ClusterClient``); callers may be on any other thread.

Health: a partition is healthy while its worker's connection is up and the worker says so (every reply and the
periodic ``tick_all`` carry each partition's health). When a connection drops, every partition on it becomes
unavailable at once (calls in flight fail with ``PartitionUnavailable``, so keyless sends move on to other
partitions) and the link reconnects in the background; once it is back, it opens, configures and starts again
every partition it served, which reload from their stores, and they become healthy.

In-doubt sends: a send whose request was in flight when the connection dropped may or may not have been stored
(the worker may have committed it just before it died), and a keyless one is stored on another partition at
once. So every ``enqueue`` carries a batch id the worker stores with it; a partition remembers the ids of its
sends that failed ``PartitionUnavailable`` (``in_doubt``) and is not healthy while it has any. Restoring it ends
with ``revoke_in_doubt``, which removes those batches if they are there; only then is it healthy again.

In-doubt settlements: a worker answers a settlement (complete, defer, dead-letter) once applied, and the front end
echoes it to the client then; its write lingers (20 ms) and is reported durable later (``RemoteSettlement``). If
the connection drops between the two (the worker killed, say), the outcome was promised but may not be stored, and
a restarted worker would deliver a completed message again. So ``_lost`` turns each settlement applied but not
known durable into the partition's ``settles_in_doubt`` (slot, outcome, the messages' local sequence numbers,
which their lock tokens carry: model/routing.py), as does a ``written`` frame that reports the write failed; a
partition with any is not healthy, and restoring it applies them again by sequence number
(``settle_in_doubt``, the partition's ``settle_by_sequence``: idempotent, durable before it answers) before
its sends in doubt are revoked. Abandon and release need nothing: the message comes back anyway. What a front
end keeps of them is bounded: at most the settlements one link had applied and not yet durable when it dropped,
i.e. what 20 ms of settlements (the linger) plus the requests in flight on it hold, a few ints each.

Sent messages held: each link keeps the messages of its successful enqueues (``wire.Held``) so that its
worker's lock replies name those messages instead of carrying them back; bounded by ``wire.HELD_BYTES`` of
enqueue frames (16 MB) per link, dropped with the connection. The worker holds the same, in step (wire.py).

Time: every request carries the front end's clock and the ``tick_all`` upkeep runs from here, so a worker started
with ``--follow-caller-clock`` lives on the front end's (possibly fake) time. A worker on its own clock ticks its
partitions itself; ``serve --workers`` then sends ``tick_all`` only for health (``HEALTH_INTERVAL``).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Any

from ..model.errors import ArgumentError, PartitionFull, PartitionUnavailable, ShardbusError
from ..model.message import Message, SubQueue
from ..model.routing import local_seq_of_lock_key, local_seq_of_lock_token
from ..partition.handle import OPERATIONS, Items, Kind, Operation, PartitionSpec, RemoteVerdict
from ..partition.values import SlotSettings
from ..store import records
from . import wire
from .stream import HANDSHAKE_TIMEOUT, FrameStream

log = logging.getLogger("shardbus.cluster")

CALL_TIMEOUT = 30.0
RECONNECT_DELAY = 0.2
TICK_INTERVAL = 0.1
HEALTH_INTERVAL = 1.0  # ``tick_all`` to workers that tick themselves: only for their partitions' health
REVOKE_ROUNDS = 5


# Operations whose write lingers for company on the worker (settlements, as in one process: broker.py's
# SETTLE_LINGER): the worker answers the verdict as soon as it is applied and says later when the write is durable.
SETTLEMENTS = frozenset({"complete", "settle", "abandon", "defer", "dead_letter"})


class _BatchIds:
    """Batch ids for sends (``RemotePartition.enqueue``): a random prefix drawn once per process, then a counter.
    Unique as ``uuid4().hex`` was (64 random bits tell processes apart, the counter a process's sends), without a
    ``getrandom`` system call and a UUID built per request. A forked child draws a prefix of its own (front ends of
    ``serve --frontends`` are forked and share workers: the same ids there would revoke each other's sends)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex() + "-"
        self._count = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):x}"


_batch_ids = _BatchIds()


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class RemoteSettlement(RemoteVerdict):
    """A settlement on a worker, answered in two steps: ``verdict`` is done once the worker applied the outcome (or
    refused it), which is when one process echoes it to the client (endpoint/receiving.py); the future itself is
    done once the write is durable, as a local partition's is. A worker lets a settlement's write linger for company
    (20 ms, broker.py's SETTLE_LINGER), since its front end no longer waits for the write to echo: one delete
    transaction for many completes (bench/hop_threads.py --phase receive: see docs/processes.md). Whoever waits for
    the write (``result``, the Python API's ``complete``) ends the linger, as a local ``LingeringWrite`` does."""

    def __init__(
        self, link: WorkerLink, request_id: int, partition: RemotePartition | None, operation: str, args: list[Any]
    ) -> None:
        super().__init__()
        self._verdict: Future = RemoteVerdict()
        self._link = link
        self._request_id = request_id
        # what it asked, kept so that a lost worker's unwritten settlement can be applied again (``_keep_in_doubt``)
        self.partition = partition
        self.operation = operation
        self.args = args

    @property
    def verdict(self) -> Future:
        return self._verdict

    def hurry(self) -> None:
        """Someone waits for the write (``partition.handle.hurry``): the worker ends its linger."""
        if not self.done():
            self._link.hurry(self._request_id)

    def result(self, timeout: float | None = None) -> Any:
        self.hurry()
        return super().result(timeout)


def _settles_of(operation: str, args: list[Any]) -> list[tuple[int, str, list[int], str | None, str | None, int]]:
    """A settlement request's outcomes by local sequence number (its lock tokens carry them), as
    ``settle_by_sequence`` applies them: abandon and release give none (the message comes back anyway)."""
    slot = args[0]
    if operation == "complete":  # its tokens as UUIDs (``Tokens``) or as their ints (``TokenKeys``)
        ints = args[1] if args[1].__class__ is wire.TokenKeys else [t.int for t in args[1]]
        return [(slot, "complete", [local_seq_of_lock_key(k) for k in ints], None, None, 0)]
    if operation == "defer":
        return [(slot, "defer", [local_seq_of_lock_token(args[1])], None, None, 0)]
    if operation == "dead_letter":
        token, reason, description, sub_queue = (*args[1:], SubQueue.DEAD_LETTER)[:4]
        return [(slot, "dead_letter", [local_seq_of_lock_token(token)], reason, description, int(sub_queue))]
    if operation == "settle":
        return [
            (slot, st.outcome, [local_seq_of_lock_token(st.token)], st.reason, st.description, int(st.sub_queue))
            for st in args[1]
            if st.outcome in ("complete", "defer", "dead_letter")
        ]
    return []


def _settle_verdict(future: Future, error: BaseException | None) -> None:
    verdict = future.verdict  # type: ignore[attr-defined]
    try:
        if error is None:
            verdict.set_result(None)
        else:
            verdict.set_exception(error)
    except InvalidStateError:
        pass


def _keep_in_doubt(future: Future) -> None:
    """A settlement echoed to its client whose write may not be stored: its partition applies it again before it is
    healthy (see the header)."""
    partition = getattr(future, "partition", None)
    if partition is not None:
        partition.settles_in_doubt.extend(_settles_of(future.operation, future.args))


def _fail(future: Future, error: BaseException) -> None:
    """Fail a call's future (and its verdict, if apart) unless it is done."""
    for f in (future, getattr(future, "verdict", future)):
        try:
            f.set_exception(error)
        except InvalidStateError:
            pass


class WorkerLink:
    """One connection to one worker (a ``FrameStream``), with the partitions it serves there."""

    def __init__(self, client: ClusterClient, name: str, address: tuple[str, int] | None) -> None:
        self.client = client
        self.name = name
        self.address = address
        self.partitions: dict[str, RemotePartition] = {}
        self.connected = False
        self.failure = f"worker {name} is not connected yet"
        self._stream: FrameStream | None = None
        self._pending: dict[int, tuple[Future, RemotePartition | None]] = {}
        self._writing: dict[int, Future] = {}  # settlements applied, their writes not yet durable (loop thread)
        # Enqueues in flight, by request id: their partition key, messages to hold once stored (``held``) and
        # frame's length
        self._enqueues: dict[int, tuple[str, list[Message], int]] = {}
        # What this front end sent that the worker's lock replies name instead of carrying back (``wire.Held``:
        # bounded by wire.HELD_MESSAGES and wire.HELD_BYTES; the worker holds the same, in step); loop thread
        self.held = wire.Held()
        # Requests from any thread wait in the outbox; the first one of a burst wakes the loop (one
        # call_soon_threadsafe per burst), which writes them all in one call.
        self._lock = threading.Lock()
        self._outbox: list[bytes] = []  # packed frames
        self._flush_scheduled = False
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None

    # --- calls (any thread) --------------------------------------------------------------------------
    def call(
        self,
        partition: RemotePartition | None,
        key: str,
        operation: str,
        args: list[Any],
        now: float,
        held: list[Message] | None = None,
    ) -> Future:
        """Send a request; ``held``: an enqueue's messages, held once it is stored (``wire.Held``)."""
        request_id = next(self._ids)
        future: Future = (
            RemoteSettlement(self, request_id, partition, operation, args)
            if operation in SETTLEMENTS
            else RemoteVerdict()
        )
        if not self.connected:
            _fail(future, PartitionUnavailable(self._down_text(partition)))
            return future
        try:
            frame = wire.pack_frame([request_id, key, now, operation, args])
        except records.PACK_ERRORS as exc:  # as an in-process partition refuses to store it
            raise ArgumentError(f"A value in the request cannot be stored: {exc}.") from exc
        self._pending[request_id] = (future, partition)
        if held is not None:
            self._enqueues[request_id] = (key, held, len(frame))
        with self._lock:  # ``_queue``, in line: one call fewer per request
            self._outbox.append(frame)
            if self._flush_scheduled:
                return future
            self._flush_scheduled = True
        if threading.get_ident() == self.client.thread_id:  # a tick, a restore: no need to wake the loop
            self.client.loop.call_soon(self._flush)
        else:
            self.client.loop.call_soon_threadsafe(self._flush)
        return future

    def hurry(self, request_id: int) -> None:
        """Someone waits for settlement ``request_id``'s write (``RemoteSettlement.result``): the worker ends its
        linger (``worker.WorkerConnection._hurry``); requests on the stream arrive in order, so after it. One way
        (``wire.ONE_WAY``): the worker answers nothing, so no future waits here and no reply crosses back (the
        Python API's ``complete`` waits for every write: a round trip per settlement fewer)."""
        if self.connected:
            self._queue(wire.pack_frame([next(self._ids), "", self.client.clock(), "hurry", [request_id]]))

    def _queue(self, frame: bytes) -> None:
        """Write a packed request with the others of its burst (``call`` does the same, in line)."""
        with self._lock:
            self._outbox.append(frame)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        if threading.get_ident() == self.client.thread_id:
            self.client.loop.call_soon(self._flush)
        else:
            self.client.loop.call_soon_threadsafe(self._flush)

    def _down_text(self, partition: RemotePartition | None) -> str:
        what = f"Partition {partition.id} of '{partition.config.path}'" if partition is not None else "A partition"
        return (
            f"{what} is unavailable ({self.failure}). Messages with a partition key that maps to it cannot be "
            "processed now; retry later."
        )

    # --- the loop thread ---------------------------------------------------------------------------
    def _flush(self) -> None:
        with self._lock:
            self._flush_scheduled = False
            frames, self._outbox = self._outbox, []
        stream = self._stream
        if stream is not None and self.connected:
            stream.write(frames)  # one write for the burst

    async def run(self) -> None:
        """Keep the connection up: connect, serve replies until it drops, fail what was in flight, repeat."""
        while not self.client.closing:
            if self.address is None:
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            try:
                await self._connect()
            except Exception as exc:  # not reachable (yet): try again shortly
                self.failure = f"worker {self.name} at {self.address[0]}:{self.address[1]} is unreachable: {exc}"
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            restore = asyncio.get_running_loop().create_task(self._restore())  # its replies arrive in _serve
            try:
                await self._serve()
            except Exception as exc:
                log.warning("connection to worker %s lost: %s", self.name, exc)
            restore.cancel()
            self._lost(f"the connection to worker {self.name} was lost")
            await asyncio.sleep(RECONNECT_DELAY)

    async def _connect(self) -> None:
        assert self.address is not None
        host, port = self.address
        loop = asyncio.get_running_loop()
        _, stream = await asyncio.wait_for(
            loop.create_connection(
                lambda: FrameStream(self.client.key, server=False, on_frame=self._frame), host, port
            ),
            HANDSHAKE_TIMEOUT,
        )
        try:
            await asyncio.wait_for(asyncio.shield(stream.opened), HANDSHAKE_TIMEOUT)
        except BaseException:
            stream.close()
            raise
        self._stream = stream
        self.connected = True
        self.failure = ""
        log.info("connected to worker %s at %s:%s", self.name, host, port)

    async def _restore(self) -> None:
        """Open (again) every partition this link serves, as after a worker restart."""
        for p in list(self.partitions.values()):
            await self.restore_partition(p)

    async def restore_partition(self, p: RemotePartition) -> None:
        """The steps that (re)establish one partition on this link's worker: settings, slots, start. Used after a
        reconnect and when a partition moves here from another worker (``RemotePartition.move_to``)."""
        loop = asyncio.get_running_loop()
        now = p.clock()
        calls = [self.call(p, p.key, "open", [p.config], now)]
        calls += [self.call(p, p.key, "configure_slot", [slot, s], now) for slot, s in p.slots.items()]
        if p.wanted:
            calls.append(self.call(p, p.key, "start", [], now))
        first_error: str | None = None
        for f in calls:
            try:
                await asyncio.wait_for(asyncio.wrap_future(f, loop=loop), CALL_TIMEOUT)
            except ShardbusError as exc:
                first_error = first_error or str(exc)  # the later calls fail because the first did
                p.failure = first_error
            except TimeoutError:
                # A reply that never comes would leave the partition down for good: drop the connection instead,
                # so the link reconnects and restores everything again.
                p.failure = f"worker {self.name} did not answer while restoring partition {p.key}"
                self._abort(p.failure)
                return
        # It stays unhealthy until this is done: first the settlements echoed but maybe not stored, then the sends
        # in doubt. Sends refused while it was starting add ids (harmless ones: they were never stored), so repeat
        # until none is left.
        if p.wanted and first_error is None and p.settles_in_doubt:
            try:
                await asyncio.wrap_future(p.settle_in_doubt(), loop=loop)
            except ShardbusError as exc:
                p.failure = str(exc)
                return
        for _ in range(REVOKE_ROUNDS):
            if not (p.wanted and first_error is None and p.in_doubt):
                break
            try:
                await asyncio.wrap_future(p.revoke_in_doubt(), loop=loop)
            except ShardbusError as exc:
                p.failure = str(exc)
                break

    async def _serve(self) -> None:
        """Until the connection ends (replies arrive through ``_frame``)."""
        stream = self._stream
        assert stream is not None
        await asyncio.shield(stream.closed)

    def _frame(self, frame: list[Any]) -> None:
        """A reply or event, as the stream reads it (on the loop thread)."""
        request_id = frame[0]
        if request_id <= 0:
            if request_id == 0:  # event: a slot gained messages
                p = self.partitions.get(frame[1])
                if p is not None:
                    p._available(frame[2])
            else:  # written: settlements applied earlier are durable now (or their write failed)
                self._written(frame[1], frame[2])
            return
        if len(frame) >= 5:
            if frame[4] == wire.APPLIED:  # a settlement's verdict, its write durable later (a written frame)
                self._applied(request_id, frame[3])
                return
            ok, records, health = frame[1], frame[2], frame[3]  # a list of messages (MESSAGES, LOCKED): a lock reply
            if frame[4] == wire.LOCKED:  # a lock reply naming messages this front end holds
                future, partition = self._pending.get(request_id, (None, None))
                held = self.held.of(partition.key) if partition is not None else None
                if held is None:  # the worker names only what is held here: a peer out of step
                    raise ValueError("a lock reply names messages this front end does not hold")
                value = wire.locked_of(frame[5], records, held)  # a KeyError there too: the stream closes
            else:
                value = wire.messages_of(records)
        else:
            _, ok, value, health = frame
            if self._enqueues:
                sent = self._enqueues.pop(request_id, None)
                if sent is not None and ok:  # stored: held as the worker holds it, at the same point of the stream
                    self.held.add(sent[0], value, sent[1], sent[2])
        future, partition = self._pending.pop(request_id, (None, None))
        if partition is not None:
            partition.failure = health
        if future is None:
            return
        try:  # no done() first: it takes the future's lock once more, and a cancelled one is rare
            if ok:
                future.set_result(value)
            else:
                future.set_exception(wire.decode_error(value))
        except InvalidStateError:  # its caller cancelled it
            pass
        if future.__class__ is RemoteSettlement:  # its verdict and its write came together
            _settle_verdict(future, None if ok else wire.decode_error(value))

    def _applied(self, request_id: int, health: str | None) -> None:
        future, partition = self._pending.pop(request_id, (None, None))
        if partition is not None:
            partition.failure = health
        if future is None:
            return
        self._writing[request_id] = future
        _settle_verdict(future, None)

    def _written(self, request_ids: list[int], error: list[str] | None) -> None:
        writing = self._writing
        for request_id in request_ids:
            future = writing.pop(request_id, None)
            if future is None:
                continue
            if error is not None:  # echoed, not stored: the partition reloads; apply it again first
                _keep_in_doubt(future)
            try:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(wire.decode_error(error))
            except InvalidStateError:  # its caller cancelled it
                pass

    def _lost(self, reason: str) -> None:
        self.connected = False
        self.failure = reason
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        for p in self.partitions.values():
            p.failure = reason
        pending, self._pending = self._pending, {}
        writing, self._writing = self._writing, {}
        self._enqueues = {}
        self.held.clear()  # the next connection's worker side starts with nothing held either
        with self._lock:
            self._outbox.clear()
        for future, partition in pending.values():
            _fail(future, PartitionUnavailable(self._down_text(partition)))
        # Applied and echoed, not known to be durable: the worker may have written them or not. The partition
        # applies them again before it is used (``settle_in_doubt``), so a completed message never comes back.
        for future in writing.values():
            _keep_in_doubt(future)
            _fail(future, PartitionUnavailable(f"{reason}; a settlement's write may not be stored"))

    def _abort(self, reason: str) -> None:
        """Close the connection (the run loop then fails what is in flight, reconnects and restores)."""
        log.warning("dropping the connection to worker %s: %s", self.name, reason)
        if self._stream is not None:
            self._stream.close()

    def health(self, states: dict[str, str | None]) -> None:
        for key, failure in states.items():
            p = self.partitions.get(key)
            if p is not None:
                p.failure = failure
                # A partition the worker brought back by itself (a full store's reload) was never restarted from
                # here: take back its sends in doubt now, as a restore would, or it stays unhealthy for good.
                if failure is None and p.wanted and p.settles_in_doubt:
                    p.settle_in_doubt()
                elif failure is None and p.wanted and p.in_doubt:
                    p.revoke_in_doubt()


class ClusterClient:
    """A front end's connections to its workers, on one event-loop thread."""

    def __init__(self, key: str, clock: Callable[[], float], tick_interval: float = TICK_INTERVAL) -> None:
        """``tick_interval``: how often each worker gets ``tick_all``; ``HEALTH_INTERVAL`` for workers that tick
        their partitions themselves (on their own clock, ``worker.Worker``), where it only brings health."""
        self.key = key
        self.clock = clock
        self.tick_interval = tick_interval
        self.links: dict[str, WorkerLink] = {}
        self.closing = False
        from ..runtime import new_event_loop

        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="shardbus-cluster", daemon=True)
        self._thread.start()
        self.thread_id = self._thread.ident
        self._ticker = asyncio.run_coroutine_threadsafe(self._tick_forever(), self.loop)

    def link(self, name: str, address: tuple[str, int] | None) -> WorkerLink:
        """The link to worker ``name`` (created on first use); ``address`` updates where it is."""
        link = self.links.get(name)
        if link is None:

            def create() -> WorkerLink:
                new = WorkerLink(self, name, address)
                new._task = self.loop.create_task(new.run())
                return new

            link = self.links[name] = asyncio.run_coroutine_threadsafe(_value(create), self.loop).result()
        elif address is not None:
            link.address = address
        return link

    def wait_connected(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(link.connected for link in self.links.values()):
                return True
            time.sleep(0.02)
        return False

    async def _tick_forever(self) -> None:
        """Each worker's ``tick_all``: its partitions' health, and on the caller's clock also their lock expiry,
        scheduled messages and TTL (a worker on its own clock ticks them itself)."""
        while not self.closing:
            await asyncio.sleep(self.tick_interval)
            for link in list(self.links.values()):
                if link.connected and link.partitions:
                    # each partition ticks on its own namespace's clock (tests move fake ones)
                    clocks = {key: p.clock() for key, p in list(link.partitions.items())}
                    f = link.call(None, "", "tick_all", [clocks], self.clock())
                    f.add_done_callback(lambda f, link=link: _apply_health(link, f))

    def close(self) -> None:
        self.closing = True

        async def shutdown() -> None:
            self._ticker.cancel()
            tasks = [link._task for link in self.links.values() if link._task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for link in self.links.values():
                if link._stream is not None:
                    link._stream.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def _value(fn: Callable[[], Any]) -> Any:
    return fn()


def _apply_health(link: WorkerLink, f: Future) -> None:
    if not f.cancelled() and f.exception() is None:
        link.health(f.result())


class RemotePartition:
    """A partition served by a worker: the partition interface (``partition/handle.py``), one request per call.
    The methods below have behaviour of their own; every other operation is derived from the table
    (``_derive_calls``)."""

    answers_at_once = False

    def __init__(self, link: WorkerLink, key: str, spec: PartitionSpec) -> None:
        self.link = link
        self.key = key  # also where its store lives, relative to the worker's data directory
        self.config = spec.config
        self.id = spec.config.partition_id
        self.clock = spec.clock
        self.listeners: list[Callable[[int], None]] = []
        self.slots: dict[int, SlotSettings] = {}
        self.wanted = False  # started by the front end (so restarted after a worker restart)
        self.failure: str | None = "not started"
        self.in_doubt: set[str] = set()  # batch ids of sends that failed in flight: maybe stored (see above)
        # settlements echoed whose writes may not be stored (see above): (slot, outcome, seqs, reason, description,
        # sub-queue); changed on the cluster loop only
        self.settles_in_doubt: list[tuple[int, str, list[int], str | None, str | None, int]] = []
        self._settling: Future | None = None  # the ``settle_by_sequence`` call in flight, if any
        self._precheck = spec.precheck
        link.partitions[self.key] = self
        if link.connected:  # else the link opens it when it connects (WorkerLink._restore)
            self._wait(self._call("open", self.config))

    # --- plumbing -----------------------------------------------------------------------------------
    def _call(self, operation: str, *args: Any) -> Future:
        return self.link.call(self, self.key, operation, list(args), self.clock())

    @staticmethod
    def _wait(future: Future) -> Any:
        try:
            return future.result(CALL_TIMEOUT)
        except TimeoutError:
            raise PartitionUnavailable("the partition's worker did not answer in time; retry later") from None

    def _sync(self, operation: str, *args: Any) -> Any:
        return self._wait(self._call(operation, *args))

    def _available(self, slot: int) -> None:
        for listener in self.listeners:
            listener(slot)

    # --- life cycle and health ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.link.connected and self.failure is None and not self.in_doubt and not self.settles_in_doubt

    def move_to(self, link: WorkerLink) -> Future:
        """Serve this partition from ``link``'s worker from now on (its own died, or lost the partition's lease;
        ``cluster/placement.py`` decides). The new worker restores it as after a reconnect
        (``WorkerLink.restore_partition``); until that is done it is unavailable. The future is done when it is."""
        if link is not self.link:
            self.link.partitions.pop(self.key, None)
            self.link = link
        link.partitions[self.key] = self
        self.failure = f"moving to worker {link.name}"
        return asyncio.run_coroutine_threadsafe(link.restore_partition(self), link.client.loop)

    def start(self) -> None:
        if self._precheck is not None:
            self._precheck()
        self.wanted = True
        self._sync("start")
        if self.settles_in_doubt:  # see WorkerLink.restore_partition
            self._wait(self.settle_in_doubt())
        for _ in range(REVOKE_ROUNDS):  # see WorkerLink.restore_partition
            if not self.in_doubt:
                break
            self._wait(self.revoke_in_doubt())

    def revoke_in_doubt(self) -> Future:
        """Remove from the partition the sends this front end saw fail in flight (``in_doubt``), if its worker
        stored them: a step of restoring a partition (after a reconnect, a restart, a move), after ``start`` and
        before the partition is used. Never blocks; the future's result is how many messages went."""
        batches = sorted(self.in_doubt)
        if not batches:
            return _done(0)
        future = self._call("revoke_batches", batches)

        def done(f: Future) -> None:
            if f.exception() is None:
                self.in_doubt.difference_update(batches)
                if f.result():
                    log.info("partition %s: revoked %s in-doubt message(s)", self.key, f.result())

        future.add_done_callback(done)
        return future

    def settle_in_doubt(self) -> Future:
        """Apply again, by sequence number, the settlements this front end echoed but may not be stored
        (``settles_in_doubt``): a step of restoring a partition, before ``revoke_in_doubt``. Never blocks; the
        future's result is how many messages changed (those the worker had stored already are skipped)."""
        settling = self._settling
        if settling is not None and not settling.done():  # the health tick may ask again meanwhile
            return settling
        settles = list(self.settles_in_doubt)
        if not settles:
            return _done(0)
        future = self._settling = self._call("settle_by_sequence", settles)

        def done(f: Future) -> None:
            if f.exception() is None:
                remaining = self.settles_in_doubt
                del remaining[: len(settles)]  # only appended to meanwhile (by a later loss)
                total = sum(len(seqs) for _, _, seqs, *_ in settles)
                log.info(
                    "partition %s: in-doubt settlements of %d message(s): %d applied again (the rest were stored)",
                    self.key,
                    total,
                    f.result(),
                )

        future.add_done_callback(done)
        return future

    def _unavailable_text(self) -> str:
        if not self.link.connected:
            return self.link._down_text(self)
        reason = self.failure or "its settlements and sends in doubt are being taken care of"
        return (
            f"Partition {self.id} of '{self.config.path}' is unavailable ({reason}). Messages with a partition key "
            "that maps to it cannot be processed now; retry later."
        )

    def _check_readable(self) -> None:
        """Nobody reads a message that may yet be taken back, or one a client was told is settled: a partition with
        sends or settlements in doubt refuses reads."""
        if self.in_doubt or self.settles_in_doubt:
            raise PartitionUnavailable(self._unavailable_text())

    def _note_in_doubt(self, batch_id: str, future: Future) -> None:
        """A send that failed for want of its partition may have been stored all the same (see the docstring)."""
        exc = None if future.cancelled() else future.exception()
        # A full store's refusal is not in doubt: nothing of it was stored (partition/broker.py, "Health").
        if isinstance(exc, PartitionUnavailable) and not isinstance(exc, PartitionFull):
            self.in_doubt.add(batch_id)

    def stop(self, reason: str = "the partition broker is stopped") -> None:
        self.wanted = False
        try:
            self._sync("stop", reason)
        except PartitionUnavailable:
            pass  # its worker is gone: it is stopped anyway
        self.failure = reason

    def delete(self) -> None:
        """The entity was deleted: the worker stops the partition and removes its store."""
        self.wanted = False
        try:
            self._sync("delete")
        except PartitionUnavailable:
            pass
        self.link.partitions.pop(self.key, None)
        self.failure = "the entity was deleted"

    def close(self) -> None:
        """The namespace closes: the worker stops the partition (flushing its store) and forgets it."""
        self.wanted = False
        try:
            self._sync("close")
        except PartitionUnavailable:
            pass
        self.link.partitions.pop(self.key, None)
        self.failure = "the namespace is closed"

    # --- slots ---------------------------------------------------------------------------------------
    def configure_slot(self, slot: int, settings: SlotSettings) -> None:
        self.slots[slot] = settings
        if self.link.connected:
            self._sync("configure_slot", slot, settings)

    def create_slot(self, slot: int, settings: SlotSettings) -> Future:
        self.slots[slot] = settings
        return self._call("create_slot", slot, settings)

    def drop_slot(self, slot: int) -> Future:
        self.slots.pop(slot, None)
        return self._call("drop_slot", slot)

    # --- messages -----------------------------------------------------------------------------------
    def enqueue(self, items: Items, batch_id: str | None = None) -> Future:
        if not self.healthy:  # down, or not restored yet (its worker may not even have opened it again)
            refused: Future = RemoteVerdict()
            refused.set_exception(PartitionUnavailable(self._unavailable_text()))
            return refused
        batch_id = batch_id or _batch_ids.next()  # what ``revoke_in_doubt`` names if the send fails in flight
        # its item arrays made here, and its messages to hold once stored (``wire.Held``): packed as they are
        arrays, held = wire.held_item_arrays(items)
        future = self.link.call(self, self.key, "enqueue", [arrays, batch_id], self.clock(), held)
        # registered first, so the partition is unhealthy before a keyless sender's callback picks another
        future.add_done_callback(partial(self._note_in_doubt, batch_id))
        return future

    def complete_keys(self, slot: int, keys: list[int]) -> Future:
        """``complete`` of tokens given as their ints: the same request, its tokens packed from the ints
        (``wire.TokenKeys``), no UUID made per token (the worker reads them as ints anyway)."""
        return self.link.call(self, self.key, "complete", [slot, wire.TokenKeys(keys)], self.clock())

    def submit_lock_messages(self, slot: int, queue: int, max_count: int, lend: bool = False) -> Future:
        """``lock_messages`` without waiting: the future completes (on the cluster loop) with the reply (messages
        made from its records, or those this front end sent and held, locked: the caller's own either way, whatever
        ``lend`` says)."""
        return self._call("lock_messages", slot, queue, max_count)

    def tick(self) -> None:
        """Nothing to do: the cluster client ticks every worker once per interval (``tick_all``)."""


def _derive_calls(cls: type) -> type:
    """Give ``cls`` a method for every operation of the partition interface it does not define itself: one
    request named for the operation, its arguments in order (``handle.py`` says how each one travels and is
    answered). Generated as source, as ``dataclasses`` does, so a call costs what a hand-written one would."""
    for op in OPERATIONS.values():
        if op.name in cls.__dict__:
            continue  # behaviour of its own, written above
        if op.kind in (Kind.LOCAL, Kind.LIFECYCLE):
            raise TypeError(f"RemotePartition must define {op.name} itself (a {op.kind.value} operation)")
        setattr(cls, op.name, _remote_call(op))
    return cls


def _remote_call(op: Operation) -> Callable[..., Any]:
    params = list(op.signature.parameters.values())[1:]  # without self
    env: dict[str, Any] = {"_done": _done, "_wait": RemotePartition._wait}
    signature, values = [], []
    for i, param in enumerate(params):
        if param.default is inspect.Parameter.empty:
            signature.append(param.name)
        else:
            env[f"_d{i}"] = param.default
            signature.append(f"{param.name}=_d{i}")
        values.append(param.name)
    for i, (argument, encoding) in enumerate(op.compact):
        env[f"_c{i}"] = wire.COMPACT[encoding]
        values[values.index(argument)] = f"_c{i}({argument})"
    request = f"self.link.call(self, self.key, {op.name!r}, [{', '.join(values)}], self.clock())"
    body = ["    self._check_readable()"] if op.reads else []
    if op.kind is Kind.WRITE:
        body.append(f"    return {request}")
    elif op.kind is Kind.QUERY_WRITE:  # the worker answers once the write is durable
        body += [f"    value, _ = _wait({request})", "    return value, _done(None)"]
    elif op.result is not None:
        env["_result"] = op.result
        body += [f"    found = _wait({request})", "    return None if found is None else _result(found)"]
    else:
        body.append(f"    return _wait({request})")
    source = f"def {op.name}(self, {', '.join(signature)}):\n" + "\n".join(body) + "\n"
    exec(source, env)
    method = env[op.name]
    method.__qualname__ = f"RemotePartition.{op.name}"
    method.__doc__ = f"``{op.name}`` on the partition's worker (a {op.kind.value} operation, ``handle.py``)."
    return method


_derive_calls(RemotePartition)
