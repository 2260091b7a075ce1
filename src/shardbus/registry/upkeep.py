"""The namespace's upkeep thread: every ``MAINTENANCE_INTERVAL`` (or at once when a forwarding source gains
messages) it catches up with the catalog, ticks every partition (lock expiry, scheduled messages, time to live), prunes
duplicate detection once a minute, and forwards what auto-forwarding sources hold. It never stands long in a
send's way: a partition's tick holds its lock in slices (``PartitionBroker.tick``), and the thread lets the GIL go
between partitions once it has held it for ``YIELD_AFTER``.

``Upkeep`` is a part of ``Namespace``. It keeps nothing of its own; the forwarder it drives keeps one cursor per
forwarding source (entity/forwarding.py).
"""

from __future__ import annotations

import logging
import time
import weakref
from functools import partial

from .. import stalltrace
from ..entity.entity import QueueEntity, Target
from ..model.errors import ShardbusError
from ..model.message import SubQueue

MAINTENANCE_INTERVAL = 0.1
YIELD_AFTER = 0.0005  # seconds of a round between two yields of the GIL to other threads (see ``_maintain``)
log = logging.getLogger("shardbus.namespace")


class Upkeep:
    """The upkeep-thread part of ``Namespace``."""

    def _maintain(self) -> None:
        """Upkeep thread: lock expiry, scheduled messages, duplicate-detection pruning, auto-forwarding."""
        last_prune = 0.0
        while not self._maintenance_stop.is_set():
            self._wake.wait(MAINTENANCE_INTERVAL)
            self._wake.clear()
            if self._maintenance_stop.is_set():
                return
            try:
                self._refresh()  # another front end's deletions stop here within a tick
            except Exception:  # upkeep must never stop; the next lookup tries again
                log.exception("reading the catalog failed")
            now = time.monotonic()
            prune = now - last_prune > 60
            round_started = held_since = time.monotonic()
            round_cpu = time.thread_time() if stalltrace.ON else 0.0
            for entity in list(self._entities.values()):
                for p in entity.partitions:
                    try:
                        tick_started = time.monotonic()
                        p.tick()
                        if stalltrace.ON:
                            stalltrace.record(
                                "tick", tick_started, time.monotonic() - tick_started, f"{getattr(p, 'id', '')}"
                            )
                        if prune:
                            p.prune_dedup()
                    except Exception:  # upkeep must never stop; the partition reports its own health
                        pass
                    # Let the GIL go between partitions once the round has held it YIELD_AFTER: a thread waiting
                    # for it (the event loop with a send) would otherwise wait up to the switch interval (5 ms) for
                    # a round that is all Python code. Not after every partition: a tick with nothing due takes a
                    # few us, and a sleep(0) after each of 16 was most of an idle round's CPU (a system call and a
                    # GIL hand-off each). A tick with work due yields between its own slices (PartitionBroker.tick).
                    if time.monotonic() - held_since > YIELD_AFTER:
                        time.sleep(0)
                        held_since = time.monotonic()
            if prune:
                last_prune = now
            self._forward_all()
            if stalltrace.ON:  # the CPU the round used: its waits for the GIL between partitions stall nobody
                wall = time.monotonic() - round_started
                stalltrace.record("upkeep", round_started, time.thread_time() - round_cpu, f"wall={wall * 1000:.1f}ms")

    def _forwarding_sources(self) -> list[tuple[int, Target, SubQueue, str]]:
        sources = []
        for entity in list(self._entities.values()):
            targets = [entity] if isinstance(entity, QueueEntity) else list(entity.subscriptions.values())
            for target in targets:
                desc = target.description
                source_id = target.entity_id if isinstance(target, QueueEntity) else target.slot
                if desc.forward_to:
                    sources.append((source_id, target, SubQueue.MAIN, desc.forward_to))
                if desc.forward_dead_lettered_messages_to:
                    sources.append((source_id, target, SubQueue.DEAD_LETTER, desc.forward_dead_lettered_messages_to))
        return sources

    def _forward_all(self, rounds: int = 8) -> None:
        for _ in range(rounds):
            moved = 0
            for source_id, target, sub_queue, destination in self._forwarding_sources():
                if not all(p.healthy for p in target.partitions):
                    continue  # an unavailable partition forwards once it is back
                try:
                    moved += self._forwarder.forward(source_id, target, sub_queue, destination)
                except ShardbusError as exc:
                    log.debug("forwarding from '%s' paused: %s", target.path, exc)
                except Exception:  # forwarding must never stop the upkeep thread
                    log.exception("forwarding from '%s' failed", target.path)
            if not moved:
                return

    def _watch(self, target: Target) -> None:
        """Wake the upkeep thread when a forwarding source gains messages (forwarding acts at once, not on the next
        tick). Only then: a round ticks every partition and reads the catalog, and a target without forwarding
        gains messages with every commit of sends (bench/scale.py's "both": a round per ~70 messages, against one
        per 100 ms, on a thread that takes the GIL from the event loop). The description is read at each event,
        so forwarding set later is woken for too. A weak reference: the listener the target holds keeps no cycle."""
        target.add_listener(partial(self._gained, weakref.ref(target)))

    def _gained(self, target_ref: weakref.ref[Target]) -> None:
        """(Any thread, once per commit that made messages receivable.) Wake the upkeep if the target forwards."""
        target = target_ref()
        if target is None:
            return
        desc = target.description
        if desc.forward_to or desc.forward_dead_lettered_messages_to:
            self._wake.set()
