"""Client receivers: messages delivered from a queue or subscription (or one of its sessions), and settled.

``ReceiveLinks`` is a part of ``ServiceBusConnection`` (connection.py): it owns a receiver link from its attach
(a core ``Receiver``, or a ``SessionReceiver`` for a session filter, waiting for a next-available session when
asked) through its deliveries (``_pump`` on credit: lock messages and transfer them, tag = lock token in .NET byte
order; each chunk a take brings is encoded in one pass and written in one, ``encode_deliveries`` and the
engine's ``send_deliveries``) to the client's dispositions (settled in the core and echoed settled with the same
outcome; completes are gathered per socket read and per partition, ``_flush_completes``). In memory: one
``_ReceiveLink`` per attached receiver link (bounded by the links a connection may hold) and the completes of the
socket read being handled.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
import uuid
from concurrent.futures import Future
from functools import partial
from itertools import groupby, repeat
from typing import Any

from ..amqp import events as ev
from ..amqp.link import LinkState
from ..amqp.performatives import Accepted, Modified, Rejected, Released, SndSettleMode, TransactionalState
from ..amqp.session import SessionState
from ..amqp.types import Long, Symbol
from ..entity.entity import Target
from ..entity.receiver import Receiver
from ..entity.sessions import SessionReceiver, accept_session
from ..metrics import RECEIVE_SECONDS
from ..model.errors import ArgumentError, OperationTimeout, ShardbusError
from ..model.message import Message, ReceiveMode
from ..model.routing import TAG_ORDER, UUID_ORDER, uuid_of_bytes_le, uuid_of_int
from ..namespace import RemoteVerdict
from .links import _ACCEPTED, _error
from .mapping import encode_deliveries

SESSION_FILTER = "com.microsoft:session-filter"
DEFAULT_SESSION_WAIT_MS = 60_000  # how long a next-available session attach waits when the client names no limit
DOTNET_EPOCH_TICKS = 621355968000000000  # .NET ticks at the Unix epoch
_RECEIVE_AND_DELETE = ReceiveMode.RECEIVE_AND_DELETE  # a module constant: an Enum member off its class is slow
_LINK_ATTACHED = LinkState.ATTACHED
_PARTITION_OF_KEY = (0xFFFF).__and__  # a lock token's int -> its partition, as a C call (``itertools.groupby``)
_token_of = uuid_of_int  # a gathered complete's lock token (kept as its ``int``) as a UUID, where one is settled alone
_from_bytes = int.from_bytes
_tag_pack, _tag_unpack = TAG_ORDER.pack, TAG_ORDER.unpack  # a lock token's delivery tag and back
_uuid_pack, _uuid_unpack = UUID_ORDER.pack, UUID_ORDER.unpack
_SESSION_MAPPED = SessionState.MAPPED
# A large answer to a flow is taken and written in chunks that grow threefold from FIRST_CHUNK (CHUNK_GROWTH), so
# the client decodes the first deliveries while this loop locks and encodes the next ones, and each chunk is ready
# before the client has eaten the one before (the SDK decodes a delivery about three times slower than we make one,
# so three times the chunk it eats is what we make meanwhile). Doubling made a flow of 100 four chunks (8, 16, 32,
# 44), each a take, a write and a client's read; threefold makes it three (8, 24, 68). The SDK's
# ``receive_messages(max_message_count=100)`` in receive-and-delete mode took about 700 us longer against shardbus
# than against bench/amqp.py's null endpoint when all 100 were taken at once and the first 8 written early, and
# as long with chunks (a median call of 3.8-4.0 ms against both).
FIRST_CHUNK = 8
CHUNK_GROWTH = 3
MAX_PUMP = 256  # deliveries produced per pump before yielding to other connections


def _session_filter(value: Any) -> str | None:
    """The session a receiver's ``com.microsoft:session-filter`` names: a string (or UTF-8 binary), or None
    for the next available one; any other value is refused."""
    if value is None:
        return None
    if isinstance(value, str):
        return str(value)  # a symbol too
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise ArgumentError(f"The session filter must be a session id (a string), not {type(value).__name__}.")


def _observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (>= 0), one update per bucket instead of per value: every
    send and delivery is observed, and ``observe`` takes a lock per call. Uses the histogram's own bounds and
    value cells (prometheus_client, pinned), so the exposition is the same as with ``observe``."""
    if not values:
        return
    bounds = histogram._upper_bounds
    bisect_left = bisect.bisect_left
    first = bisect_left(bounds, min(values))
    if first == bisect_left(bounds, max(values)):  # the usual chunk: all in one bucket (they are decades apart)
        histogram._sum.inc(sum(values))
        histogram._buckets[first].inc(len(values))
        return
    counts: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)  # the first bound >= v, as ``observe`` picks it
        counts[i] = counts.get(i, 0) + 1
    histogram._sum.inc(sum(values))
    buckets = histogram._buckets
    for i, n in counts.items():
        buckets[i].inc(n)


def _observe_ages(histogram: Any, enqueued: list[int | None], now_ms: float) -> None:
    """``_observe_all`` of the delivered messages' ages in seconds (0 for one enqueued at ``now_ms`` or later, or
    with no enqueued time), from their enqueued times (ms): the usual chunk, all enqueued before now, takes no
    age per message (its bounds are those of the times, its sum the times' sum's; rounding aside the same)."""
    if not enqueued:
        return
    try:
        first, last = min(enqueued), max(enqueued)  # type: ignore[type-var]
    except TypeError:  # some without an enqueued time
        first = last = None
    if first is None or last is None or last >= now_ms:
        _observe_all(histogram, [0.0 if e is None or e >= now_ms else (now_ms - e) / 1000 for e in enqueued])
        return
    bounds = histogram._upper_bounds
    low = bisect.bisect_left(bounds, (now_ms - last) / 1000)
    if low != bisect.bisect_left(bounds, (now_ms - first) / 1000):  # decades apart: each to its bucket
        _observe_all(histogram, [(now_ms - e) / 1000 for e in enqueued])
        return
    histogram._sum.inc((now_ms * len(enqueued) - sum(enqueued)) / 1000)
    histogram._buckets[low].inc(len(enqueued))


class _ReceiveLink:
    """State of a client receiver link: the core receiver and the wake-up hook."""

    __slots__ = ("address", "first_chunk", "listening", "receiver", "timer")

    def __init__(self, receiver: Receiver, address: Any) -> None:
        self.receiver = receiver
        self.address = address
        self.listening = False
        self.timer: Any = None
        # Chunks only where taking them costs no more: a take asks a remote partition for about twice what it
        # wants, so in chunks a flow of 100 needed several round trips to a worker instead of one (and, in a trial
        # with the SDK, twice the front end's loop CPU per message).
        at_once = all(p.answers_at_once for p in receiver.target.partitions)
        self.first_chunk = FIRST_CHUNK if at_once else MAX_PUMP


class ReceiveLinks:
    """The receiver-link part of ``ServiceBusConnection`` (its state lives on the connection)."""

    def _attach_receiver(self, link: Any, attach: Any, path: str) -> None:
        source = attach.source
        filters = {str(k): v for k, v in (getattr(source, "filter", None) or {}).items()}
        target, sub_queue = self._ns.resolve(path)
        settled = attach.snd_settle_mode == SndSettleMode.SETTLED
        mode = ReceiveMode.RECEIVE_AND_DELETE if settled else ReceiveMode.PEEK_LOCK
        if SESSION_FILTER not in filters:
            # ``lend``: deliveries are only encoded and their tokens read, so the partitions' own messages do
            receiver = Receiver(target, mode, sub_queue, self._ns._clock, lend=True)
            self._reply_receiver(link, attach, receiver)
            return
        session_id = _session_filter(filters[SESSION_FILTER])
        if session_id is not None:
            self._reply_session(link, attach, SessionReceiver(target, session_id, mode, 0, self._ns._clock))
            return
        properties = {str(k): v for k, v in (attach.properties or {}).items()}
        timeout_ms = properties.get("com.microsoft:timeout")
        if not isinstance(timeout_ms, int | float) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            timeout_ms = DEFAULT_SESSION_WAIT_MS  # none, or not a number of milliseconds
        self._await_session(link, attach, target, mode, time.monotonic() + timeout_ms / 1000)

    def _await_session(self, link: Any, attach: Any, target: Target, mode: ReceiveMode, deadline: float) -> None:
        """Next-available session: accept the first free one, or keep the attach waiting until the deadline."""
        if link.state is not LinkState.ATTACH_RCVD or self.closed:
            return
        try:
            accepted = accept_session(target, None)
        except ShardbusError as exc:
            self._refuse(link, exc)
            return
        if accepted is not None:
            self._reply_session(link, attach, SessionReceiver.holding(target, accepted, mode, self._ns._clock))
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._refuse(link, OperationTimeout(f"No session with messages is available in '{target.path}'."))
            return
        retry = lambda: self._later(lambda: self._await_session(link, attach, target, mode, deadline))  # noqa: E731
        target.add_listener(retry)
        self.loop.call_later(min(remaining, 0.5), lambda: (target.remove_listener(retry), retry()))

    def _reply_receiver(self, link: Any, attach: Any, receiver: Any, **reply: Any) -> None:
        self.amqp.attach_reply(
            link,
            snd_settle_mode=attach.snd_settle_mode,
            rcv_settle_mode=attach.rcv_settle_mode,
            initial_delivery_count=0,
            max_message_size=attach.max_message_size or 0,
            **reply,
        )
        self._receivers[link] = _ReceiveLink(receiver, attach.source.address)

    def _reply_session(self, link: Any, attach: Any, receiver: SessionReceiver) -> None:
        # The SDK needs the source echoed byte for byte, the session id in the filter, and a properties map.
        source = dataclasses.replace(attach.source, filter={Symbol(SESSION_FILTER): receiver.session_id})
        ticks = Long(receiver.locked_until_ms * 10_000 + DOTNET_EPOCH_TICKS)
        self._reply_receiver(
            link, attach, receiver, source=source, properties={Symbol("com.microsoft:locked-until-utc"): ticks}
        )
        self._sessions[(id(receiver.target), receiver.session_id)] = receiver

    def _drop_receiver(self, link: Any) -> None:
        state = self._receivers.pop(link, None)
        if state is None:
            return
        if state.listening:
            state.receiver.target.remove_listener(state.listening)
        if state.timer is not None:
            state.timer.cancel()
        if isinstance(state.receiver, SessionReceiver):
            self._sessions.pop((id(state.receiver.target), state.receiver.session_id), None)
        state.receiver.close()

    def _on_flow(self, e: ev.FlowReceived) -> None:
        if e.link is not None:
            if e.link in self._receivers:
                self._pump(e.link)
            return
        for link in [lk for lk in self._receivers if lk.session is e.session]:  # the session window reopened
            self._pump(link)

    def _pump(self, link: Any) -> None:
        """Deliver while the link has credit and the client's session window has room."""
        state = self._receivers.get(link)
        if state is None or link.state is not _LINK_ATTACHED or link.session.state is not _SESSION_MAPPED:
            return  # gone, or going: the client's detach/end is handled next (and drops the receiver)
        if self.amqp.close_sent or self.amqp.is_done:
            return
        receiver = state.receiver
        session = link.session
        sent = 0
        chunk = state.first_chunk

        def more() -> None:  # partitions answer on other threads: never wait for them on this loop
            self._later(lambda: self._pump(link))

        try:
            while link.link_credit > 0 and session.remote_incoming_window > 0 and sent < MAX_PUMP:
                room = min(link.link_credit, session.remote_incoming_window, MAX_PUMP - sent, chunk)
                messages = receiver.take(room, more)
                if not messages:
                    break
                sent += self._transfer(link, receiver, messages)
                if self.protocol is not None and link.link_credit > 0:
                    self.protocol.flush_now()  # not the last chunk: its write follows the event's handling
                chunk *= CHUNK_GROWTH
        except ShardbusError as exc:
            self.amqp.detach(link, closed=True, error=_error(exc))
            self._drop_receiver(link)
            return
        if link.link_credit <= 0 or session.remote_incoming_window <= 0:
            return  # the client's next flow (link credit or session window) pumps again
        if sent < MAX_PUMP:
            if link.drain:
                self.amqp.drained(link)
            else:
                self._wait_for_messages(link, state)
        else:
            self._later(lambda: self._pump(link))  # more to send: yield to other connections first

    def _transfer(self, link: Any, receiver: Receiver | SessionReceiver, messages: list[Message]) -> int:
        """Send what fits in the client's session window; give the rest back. Returns how many were sent. The
        deliveries are encoded in one pass and put on the wire in another (``send_deliveries``)."""
        settled = receiver.mode is _RECEIVE_AND_DELETE
        max_frame = self.amqp.remote_max_frame_size
        room = link.session.remote_incoming_window
        now_ms = time.time() * 1000
        payloads = encode_deliveries(messages)
        sent = len(messages)
        if sent > room or max(map(len, payloads)) >= max_frame:  # else each takes one frame, and all fit
            frames = 0
            for i, payload in enumerate(payloads):
                frames += len(payload) // max_frame + 1  # what a multi-frame transfer takes of the window
                if frames > room:
                    for rest in messages[i:]:
                        receiver.submit_settle("release", rest)
                    sent = i
                    break
        delivered = messages if sent == len(messages) else messages[:sent]
        if sent:
            # each tag is the token's ``bytes_le`` (.NET order), without its 2 calls
            tags = [_tag_pack(*_uuid_unpack(m.lock_token.int.to_bytes(16, "big"))) for m in delivered]
            # (the payloads past ``sent`` were given back)
            self.amqp.send_deliveries(link, list(zip(tags, payloads, strict=False)), settled=settled)
        _observe_ages(RECEIVE_SECONDS, [m.enqueued_time_ms for m in delivered], now_ms)
        if settled and sent:
            for future in receiver.submit_complete(delivered):
                self._log_failure_of(future)
        return sent

    def _wait_for_messages(self, link: Any, state: _ReceiveLink) -> None:
        target = state.receiver.target
        if not state.listening:

            def wake() -> None:
                self._later(lambda: self._pump(link))

            state.listening = wake
            target.add_listener(wake)
        # What time makes receivable (lock expiry, scheduled messages) the partitions' upkeep finds every 100 ms
        # and announces like a send, so the timer is only a safety net; asking every partition for its next due
        # time here would block this loop on their workers.
        if state.timer is not None:
            state.timer.cancel()
        state.timer = self.loop.call_later(1.0, lambda: self._later(lambda: self._pump(link)))

    def _on_disposition(self, e: ev.DispositionReceived) -> None:
        if not e.role:
            return  # the client settling what it sent: nothing to do
        if type(e.state) is Accepted:  # completes, gathered for ``_flush_completes`` (see ``events_done``)
            pending, receivers, settled = self._pending_completes, self._receivers, e.settled
            refs = e.deliveries
            if len(refs) > 1:  # a range: usually all of one link, kept as one run (``_flush_run``)
                link = refs[0].link
                state = receivers.get(link)
                if state is not None:
                    # the lock tokens' ``int``s (``uuid_of_bytes_le`` without the UUIDs): all a partition finds a
                    # lock by; a UUID is made only where a delivery is settled on its own (``_token_of``)
                    keys = [
                        _from_bytes(_uuid_pack(*_tag_unpack(ref.delivery_tag)), "big")
                        for ref in refs
                        if ref.link is link and len(ref.delivery_tag) == 16
                    ]
                    if len(keys) == len(refs):
                        pending.append((refs, state.receiver, keys, settled))
                        return
            link = receiver = None
            for ref in refs:  # a range's deliveries are mostly of one link: its receiver is looked up once
                if ref.link is not link:
                    link = ref.link
                    state = receivers.get(link)
                    receiver = None if state is None else state.receiver
                tag = ref.delivery_tag
                if receiver is None or len(tag) != 16:
                    continue
                # the lock token's ``int`` (``uuid_of_bytes_le`` without the UUID): all a partition finds a lock
                # by; a UUID is made only where a delivery is settled on its own (``_token_of``)
                pending.append((ref, receiver, _from_bytes(_uuid_pack(*_tag_unpack(tag)), "big"), settled))
            return
        for ref in e.deliveries:
            state = self._receivers.get(ref.link)
            if state is None or len(ref.delivery_tag) != 16:
                continue
            token = uuid_of_bytes_le(ref.delivery_tag)
            if self._pending_completes:
                self._flush_completes()  # keep settlements in the order the client sent them
            if isinstance(e.state, TransactionalState):
                self._settle_in_transaction(ref, state.receiver, token, e.state, e.settled)
            else:
                self._settle_delivery(ref, state.receiver, token, e.state, e.settled)

    def _flush_completes(self) -> None:
        """Complete what the client accepted, one store operation per receiver and partition (all-or-nothing
        there, so a group with a lost lock is settled one by one to give each delivery its own outcome); echo
        the unsettled ones with range dispositions. Runs while the transport dispatches a read's events, whose
        write follows."""
        pending, self._pending_completes = self._pending_completes, []
        if not pending or self.closed or self.amqp.is_done:
            return
        if len(pending) == 1:  # the SDK completes one message per call: the loop below for one, inlined
            if pending[0][0].__class__ is list:  # one range's run (our client's ranged complete)
                self._flush_run(*pending[0])
                return
            ref, receiver, key, settled = pending[0]
            try:  # the token's partition given (``partition_of_lock_token``, inlined): no grouping to do
                future = receiver.submit_complete_keys([key], key & 0xFFFF)[0]
            except ShardbusError:
                self._settle_delivery(ref, receiver, _token_of(key), Accepted(), settled)
                return
            if isinstance(future, RemoteVerdict):
                future.verdict.add_done_callback(partial(self._later_verdict, receiver=receiver, items=pending))
                return
            if future is not self._watched:  # ``_log_failure_of``, inlined
                self._log_failure_of(future)
            link = ref.link
            if not settled and link.attached:
                self.amqp.disposition(link, ref.delivery_id, None, state=_ACCEPTED)
            return
        if any(item[0].__class__ is list for item in pending):  # runs as their deliveries, in their order
            pending = [
                one
                for item in pending
                for one in (
                    zip(item[0], repeat(item[1]), item[2], repeat(item[3])) if item[0].__class__ is list else (item,)
                )
            ]
        # (receiver, partition) -> the receiver, the partition, its items (receivers hash by identity)
        by_key: dict[tuple[Any, int], tuple[Any, int, list[tuple[Any, Any, int, bool]]]] = {}
        last_receiver: Any = None
        last_pid = -1
        items: list[tuple[Any, Any, int, bool]] = []
        for item in pending:
            receiver = item[1]
            pid = item[2] & 0xFFFF  # ``partition_of_lock_token``, inlined
            if pid != last_pid or receiver is not last_receiver:  # a range's deliveries come in runs of one
                last_receiver, last_pid = receiver, pid  # partition (a take's chunk is its answers, one by one)
                group = by_key.get((receiver, pid))
                if group is None:
                    group = by_key[(receiver, pid)] = (receiver, pid, [])
                items = group[2]
            items.append(item)
        groups = by_key.values()
        echo: dict[int, tuple[Any, list[int]]] = {}  # session -> (a link of it, delivery ids)
        for receiver, pid, items in groups:
            try:  # grouped by partition here: the receiver hands them on without grouping them again
                futures = receiver.submit_complete_keys([key for _, _, key, _ in items], pid)
            except ShardbusError:
                for ref, _, key, settled in items:
                    self._settle_delivery(ref, receiver, _token_of(key), Accepted(), settled)
                continue
            if any(isinstance(f, RemoteVerdict) for f in futures):
                for future in futures:  # a remote partition's refusal comes with its reply: echo after it
                    future.verdict.add_done_callback(partial(self._later_verdict, receiver=receiver, items=items))
                continue
            # As in ``_settle_delivery``: applied and queued, so the echo need not wait for the fsync.
            for future in futures:
                self._log_failure_of(future)
            self._echo_accepted(items, echo)
        self._send_echoes(echo)

    def _flush_run(self, refs: list[Any], receiver: Any, keys: list[int], settled: bool) -> None:
        """``_flush_completes`` of a read whose completes are one run: one range of one link's deliveries
        (``refs``, their lock tokens' ints ``keys``), as our client settles a receive. The same groups, calls
        and echoes, with nothing made per delivery unless a group fails: its keys grouped by partition in their
        order (runs of one partition, as a take's chunk brings them), and the run echoed whole."""
        groups: dict[int, list[int]] = {}
        for pid, run in groupby(keys, _PARTITION_OF_KEY):
            group = groups.get(pid)
            if group is None:
                groups[pid] = list(run)
            else:
                group += run
        failed: set[int] = set()
        remote: dict[int, list[Future]] = {}  # partitions on workers: their echo waits for their verdicts
        for pid, group in groups.items():
            try:  # grouped by partition here: the receiver hands them on without grouping them again
                futures = receiver.submit_complete_keys(group, pid)
            except ShardbusError:
                failed.add(pid)
                for ref, key in zip(refs, keys, strict=True):
                    if key & 0xFFFF == pid:
                        self._settle_delivery(ref, receiver, _token_of(key), Accepted(), settled)
                continue
            if any(isinstance(f, RemoteVerdict) for f in futures):
                failed.add(pid)
                remote[pid] = futures
                continue
            # As in ``_settle_delivery``: applied and queued, so the echo need not wait for the fsync.
            for future in futures:
                self._log_failure_of(future)
        if not failed:
            if not settled and refs[0].link.attached:
                link = refs[0].link
                self._send_echoes({id(link.session): (link, [ref.delivery_id for ref in refs])})
            return
        # Each delivery to its worker's group (echoed once the verdict comes) or to the echo now, in one pass: a
        # range over many partitions of workers was walked once per partition.
        items_of: dict[int, list[tuple[Any, Any, int, bool]]] = {pid: [] for pid in remote}
        local: list[tuple[Any, Any, int, bool]] = []
        for ref, key in zip(refs, keys, strict=True):
            pid = key & 0xFFFF
            items = items_of.get(pid)
            if items is not None:
                items.append((ref, receiver, key, settled))
            elif pid not in failed:
                local.append((ref, receiver, key, settled))
        for pid, futures in remote.items():
            for future in futures:  # a remote partition's refusal comes with its reply: echo after it
                future.verdict.add_done_callback(partial(self._later_verdict, receiver=receiver, items=items_of[pid]))
        if local and not settled:
            echo: dict[int, tuple[Any, list[int]]] = {}
            self._echo_accepted(local, echo)
            self._send_echoes(echo)

    @staticmethod
    def _echo_accepted(items: list[tuple[Any, Any, int, bool]], echo: dict[int, tuple[Any, list[int]]]) -> None:
        """Note the unsettled deliveries of ``items`` for an ``accepted`` echo, by session (``_send_echoes``)."""
        link = items[0][0].link
        ids = [ref.delivery_id for ref, _, _, settled in items if not settled and ref.link is link]
        if len(ids) == len(items):  # the usual group: all unsettled, of one link (a range's run) in one pass
            if not link.attached:
                return
            noted = echo.get(id(link.session))
            if noted is None:
                echo[id(link.session)] = (link, ids)
            else:
                noted[1].extend(ids)
            return
        last: Any = None
        ids: list[int] | None = None
        for ref, _, _, settled in items:
            if settled:
                continue
            link = ref.link
            if link is not last:  # a range's deliveries are mostly of one link: its session is looked up once
                last, ids = link, None
                if link.attached:
                    noted = echo.get(id(link.session))
                    if noted is None:
                        noted = echo[id(link.session)] = (link, [])
                    ids = noted[1]
            if ids is not None:
                ids.append(ref.delivery_id)

    def _send_echoes(self, echo: dict[int, tuple[Any, list[int]]]) -> None:
        """Echo ``accepted`` for the noted deliveries: one range disposition per run of consecutive ids."""
        for link, ids in echo.values():
            start = ids[0]
            if ids == [*range(start, start + len(ids))]:  # the usual echo: one run, in order (a range accepted)
                self.amqp.disposition(link, start, None if len(ids) == 1 else ids[-1], state=_ACCEPTED)
                continue
            # Only ids in the list may be covered: the others in between may be another link's deliveries.
            ids.sort()
            start = prev = ids[0]
            for did in ids[1:]:
                if did != prev + 1:
                    self.amqp.disposition(link, start, None if prev == start else prev, state=_ACCEPTED)
                    start = did
                prev = did
            self.amqp.disposition(link, start, None if prev == start else prev, state=_ACCEPTED)

    def _settle_delivery(self, ref: Any, receiver: Any, token: uuid.UUID, outcome: Any, settled: bool) -> None:
        reason = description = None
        if isinstance(outcome, Accepted):
            kind = "complete"
        elif isinstance(outcome, Released):
            kind = "release"
        elif isinstance(outcome, Modified):
            kind = "defer" if outcome.undeliverable_here else "abandon"
        elif isinstance(outcome, Rejected):
            kind = "dead_letter"
            err = outcome.error
            info = {str(k): v for k, v in ((err.info if err else None) or {}).items()}
            reason = info.get("DeadLetterReason")
            description = info.get("DeadLetterErrorDescription") or (err.description if err else None)
            outcome = Rejected()  # the echo carries no error: an error would mean the dead-lettering failed
        else:
            return
        try:
            future = receiver.submit_settle(kind, token, reason, description)
        except ShardbusError as exc:
            if not settled:
                self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=Rejected(error=_error(exc)))
            return
        # The outcome is applied (the message is no longer deliverable) and its write is queued behind earlier
        # ones, so the echo need not wait for the fsync. Should the write not reach the disk, the message comes
        # back after a restart: at-least-once, as with the service.
        if isinstance(future, RemoteVerdict):
            if not settled:
                future.verdict.add_done_callback(lambda f: self._later(lambda: self._echo_verdict(ref, f, outcome)))
            return
        if future is not None:
            self._log_failure_of(future)
        if not settled:
            self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=outcome)

    def _later_verdict(self, future: Future, receiver: Any, items: list[tuple[Any, Any, int, bool]]) -> None:
        self._later(lambda: self._group_verdict(future, receiver, items))

    def _group_verdict(self, future: Future, receiver: Any, items: list[tuple[Any, Any, int, bool]]) -> None:
        """A remote partition answered a grouped complete: echo it, or settle one by one for each own outcome.
        The echo waits for the end of the ``_later`` batch this runs in (``connection._run_later``), with the
        other partitions' verdicts of that batch: a client's range of completes spread over 16 partitions got 16
        range dispositions back, one per partition, where one process sends one (bench/scale.py's receive phase
        with --workers 1: 0.084 dispositions per message against 0.010)."""
        if future.exception() is None:
            self._echo_accepted(items, self._verdict_echoes)  # range dispositions, as for local partitions
            return
        for ref, _, key, settled in items:
            self._settle_delivery(ref, receiver, _token_of(key), Accepted(), settled)

    def _echo_verdict(self, ref: Any, future: Future, outcome: Any) -> None:
        if not ref.link.attached:
            return
        exc = future.exception()
        state = outcome if exc is None else Rejected(error=_error(exc))
        self.amqp.disposition(ref.link, ref.delivery_id, settled=True, state=state)
