"""Client senders: messages a client sends to a queue or topic, stored and then settled.

``SendLinks`` is a part of ``ServiceBusConnection`` (connection.py): it owns the path from a transfer on a sender
link to its disposition. A socket read's transfers are decoded as they come (``_on_send``), stored together when
the read's events are done (``_flush_sends``: one store operation per partition), and settled accepted, or
rejected with the domain error's condition, only once their store has them (``_acknowledge``). In memory: the
sends of the socket read being handled (``_pending_sends``), bounded by what one read brings.
"""

from __future__ import annotations

import bisect
import time
from functools import partial
from typing import Any

from .. import stalltrace
from ..amqp import events as ev
from ..amqp.codec import DecodeError
from ..amqp.message import BATCH_MESSAGE_FORMAT
from ..amqp.performatives import Error, Rejected
from ..amqp.types import Symbol
from ..entity.entity import QueueEntity, TopicEntity
from ..metrics import SEND_SECONDS
from ..model.errors import ShardbusError
from ..model.message import Message
from .links import _ACCEPTED, _SENDER_CREDIT_LOW, SENDER_CREDIT, _error, log
from .mapping import _decode_plain, decode_batch_to_messages, decode_to_message

MESSAGE_SIZE_EXCEEDED = Symbol("amqp:link:message-size-exceeded")
_DELIVERY_RECEIVED = ev.DeliveryReceived


def _observe_repeated(histogram: Any, value: float, count: int) -> None:
    """``histogram.observe(value)`` ``count`` times (a group of sends stored together took one time)."""
    histogram._sum.inc(value * count)
    histogram._buckets[bisect.bisect_left(histogram._upper_bounds, value)].inc(count)


class SendLinks:
    """The sender-link part of ``ServiceBusConnection`` (its state lives on the connection)."""

    def _on_too_large(self, e: ev.DeliveryTooLarge) -> None:
        """Refuse a delivery that passed its link's bound (the engine discards the rest of it); the link goes on."""
        description = (
            f"The received message (delivery-id:{int(e.delivery_id)}, size:{e.size} bytes) exceeds the limit "
            f"({e.limit} bytes) currently allowed on the link."
        )
        log.info("refused: %s", description, extra=self._context(e.link))
        if e.link.link_credit < _SENDER_CREDIT_LOW and e.link in self._senders:
            self.amqp.flow(e.link, link_credit=SENDER_CREDIT)
        if not e.settled:
            self.amqp.settle(e.link, e.delivery_id, Rejected(error=Error(MESSAGE_SIZE_EXCEEDED, description)))

    def _on_send(self, e: ev.DeliveryReceived, entity: QueueEntity | TopicEntity) -> None:
        """Decode now; store together with everything else this socket read brought (see ``_flush_sends``)."""
        try:
            if e.message_format == BATCH_MESSAGE_FORMAT:
                messages = decode_batch_to_messages(e.payload)
            else:
                # ``decode_to_message``'s fast path called here: one Python call fewer for nearly every send
                m = _decode_plain(e.payload) if type(e.payload) is bytes else None
                messages = [decode_to_message(e.payload) if m is None else m]
        except DecodeError as exc:
            self._settle(e, Rejected(error=Error(condition=Symbol("amqp:decode-error"), description=str(exc))))
            return
        # The messages have what they need of the payload: the event, kept until the store answers, need not keep
        # it too (a 100 MB message would otherwise be held twice while it is written).
        e.payload = b""
        if stalltrace.SENDS and not self._pending_sends:
            # the read's arrival (the engine notes it before parsing the read's frames; 0 if it no longer does)
            # and its first send decoded: the group's "arrived" and "read" in its trace line
            self._sends_read_at = (getattr(self.amqp, "_last_received", 0.0), time.monotonic())
        # stored in ``events_done``, grouped by entity as they come (no tuple per send, no regrouping there)
        group = self._pending_sends.get(entity)  # (entities hash by identity)
        if group is None:
            group = self._pending_sends[entity] = (entity, [], [])
        group[1].append(e)
        group[2].append(messages)

    def _on_sends(self, events: list[ev.Event] | tuple[ev.Event, ...], i: int) -> int:
        """``handle_events``' shortcut for a run of sends: from ``events[i]`` on, each ``DeliveryReceived`` without a
        state on a client's sender link gets ``_on_delivery``'s credit top-up and ``_on_send``'s work, in one loop
        (the plain message decoded here, anything else through ``_on_send`` itself); returns where the run ends. A
        read of a sender's window is a run, and a call per send and the group's look-up per send were a tenth of
        its Python work. The caller checks that no settlements wait (sends add none)."""
        senders = self._senders
        pending = self._pending_sends
        last_link: Any = None  # the last send's link and its entity
        target: Any = None
        entity: Any = None  # the entity of the last group looked up, and its lists
        group_events: list[ev.DeliveryReceived] = []
        group_messages: list[list[Message]] = []
        kind, low, batch, decode = _DELIVERY_RECEIVED, _SENDER_CREDIT_LOW, BATCH_MESSAGE_FORMAT, _decode_plain
        traced = stalltrace.SENDS
        n = len(events)
        while i < n:
            e: Any = events[i]
            if e.__class__ is not kind or e.state is not None:
                break
            link = e.link
            if link is not last_link:  # (a run is mostly one link's: its entity looked up once)
                target = senders.get(link)
                if target is None:
                    break
                last_link = link
            i += 1
            if link.link_credit < low:
                self.amqp.flow(link, link_credit=SENDER_CREDIT)
            payload = e.payload
            m = decode(payload) if payload.__class__ is bytes and e.message_format != batch else None
            if m is None:  # a batch, or a message the general decoder takes (with its errors)
                try:
                    self._on_send(e, target)
                except ShardbusError as exc:  # a refusal already answered on the wire (as ``handle_events``)
                    log.info("refused: %s", exc, extra=self._context(link))
                continue
            e.payload = b""  # (see ``_on_send``)
            if traced and not pending:
                self._sends_read_at = (getattr(self.amqp, "_last_received", 0.0), time.monotonic())
            if target is not entity:
                group = pending.get(target)
                if group is None:
                    group = pending[target] = (target, [], [])
                entity, group_events, group_messages = target, group[1], group[2]
            group_events.append(e)
            group_messages.append([m])
        return i

    def _flush_sends(self) -> None:
        """Hand all pending sends to the core at once: one store operation per partition, one callback each."""
        pending, self._pending_sends = self._pending_sends, {}
        started = time.monotonic()
        read_at = self._sends_read_at  # (``stalltrace.SENDS``)
        for entity, events, batches in pending.values():

            def done(indices: list[int], outcomes: list[Any], events: list[ev.DeliveryReceived] = events) -> None:
                _observe_repeated(SEND_SECONDS, time.monotonic() - started, len(indices))
                if not stalltrace.SENDS and len(indices) == len(events) and outcomes.count(None) == len(outcomes):
                    # the usual answer: every send of the group stored, ``indices`` all of them in order
                    self._later(partial(self._accept, events))
                    return
                settled = [(events[i], outcome) for i, outcome in zip(indices, outcomes, strict=True)]
                if stalltrace.SENDS:
                    times = (*read_at, started, *stalltrace.commit_times(), time.monotonic())
                    self._later(partial(self._acknowledge_traced, settled, times))
                    return
                self._later(lambda: self._acknowledge(settled))

            entity.submit_many(batches, done, owned=True)  # decoded here, for this send alone

    def _acknowledge_traced(
        self, results: list[tuple[ev.DeliveryReceived, BaseException | None]], times: tuple[float, ...]
    ) -> None:
        """``_acknowledge`` noting the group's life for ``stalltrace.SENDS`` (``times``: arrived, read, flushed,
        the commit's queued, picked, stored and CPU, and when the group's callback ran)."""
        loop = time.monotonic()
        self._acknowledge(results)
        stalltrace.send_acknowledged((len(results), *times, loop, time.monotonic()))

    def _accept(self, events: list[ev.DeliveryReceived]) -> None:
        """``_acknowledge`` of sends that were all stored, without an (event, outcome) pair made per send."""
        link: Any = None  # the link of the run of deliveries, and its first and last delivery ids
        first = last = 0
        for e in events:
            if e.settled:
                continue
            if e.link is link and e.delivery_id - last == 1:  # (a difference of 1 is a cached int; ``last + 1`` is not)
                last = e.delivery_id  # the run goes on
                continue
            if link is not None:
                self.amqp.disposition(link, first, last, state=_ACCEPTED)
            link, first, last = e.link, e.delivery_id, e.delivery_id
        if link is not None:
            self.amqp.disposition(link, first, last, state=_ACCEPTED)

    def _acknowledge(self, results: list[tuple[ev.DeliveryReceived, BaseException | None]]) -> None:
        """Settle stored sends: consecutive accepted deliveries of one link share a range disposition."""
        link: Any = None  # the link of the run of accepted deliveries, and its first and last delivery ids
        first = last = 0
        for e, exc in results:
            if e.settled:
                continue
            if exc is None and e.link is link and e.delivery_id == last + 1:
                last = e.delivery_id  # the run goes on
                continue
            if link is not None:
                self.amqp.disposition(link, first, last, state=_ACCEPTED)
                link = None
            if exc is None:
                link, first, last = e.link, e.delivery_id, e.delivery_id
            else:
                self._settle(e, Rejected(error=_error(exc)))
        if link is not None:
            self.amqp.disposition(link, first, last, state=_ACCEPTED)
