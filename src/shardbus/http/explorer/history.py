"""Messages in and out per second, per partition, over the last minutes: differences of the counters that
``/metrics`` exports (``PartitionBroker.stats``: incoming, delivered), sampled when a partitions page is viewed.

No thread samples in the background: an entity nobody looks at costs nothing. Each view (the page refreshes
itself every few seconds) records one sample per partition, at most one per ``MIN_SPACING`` seconds, and the rates
are the differences between consecutive samples (a gap while nobody looked shows as its average). Memory is
bounded: ``SAMPLES`` samples per entity, for at most ``ENTITIES`` entities (the least recently viewed are dropped).
A counter that went down (its partition restarted) counts as zero for that interval.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

MIN_SPACING = 2.0  # seconds between two samples of one entity
WINDOW = 300.0  # what the sparklines show: the last five minutes
SAMPLES = int(WINDOW / MIN_SPACING) + 1
ENTITIES = 256


@dataclass(frozen=True, slots=True)
class Rates:
    """One partition's rates, oldest first (one value per interval between samples), and the last one."""

    incoming: list[float]
    outgoing: list[float]

    @property
    def incoming_now(self) -> float | None:
        return self.incoming[-1] if self.incoming else None

    @property
    def outgoing_now(self) -> float | None:
        return self.outgoing[-1] if self.outgoing else None


class RateHistory:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # (namespace, entity path) -> samples of (time, per-partition (incoming, delivered) counters)
        self._samples: OrderedDict[tuple[str, str], deque[tuple[float, list[tuple[int, int]]]]] = OrderedDict()

    def record(self, key: tuple[str, str], counters: list[tuple[int, int]]) -> list[Rates]:
        """Add a sample of each partition's (incoming, delivered) counters; the rates per partition."""
        now = self._clock()
        with self._lock:
            samples = self._samples.get(key)
            if samples is None or (samples and len(samples[-1][1]) != len(counters)):
                samples = deque(maxlen=SAMPLES)  # new, or the partition count changed: start over
            self._samples[key] = samples
            self._samples.move_to_end(key)
            while len(self._samples) > ENTITIES:
                self._samples.popitem(last=False)
            if not samples or now - samples[-1][0] >= MIN_SPACING:
                samples.append((now, list(counters)))
            while samples and now - samples[0][0] > WINDOW + MIN_SPACING:
                samples.popleft()
            points = list(samples)
        out = []
        for pid in range(len(counters)):
            incoming, outgoing = [], []
            for (t0, c0), (t1, c1) in itertools.pairwise(points):
                span = max(t1 - t0, 1e-6)
                incoming.append(max(0, c1[pid][0] - c0[pid][0]) / span)
                outgoing.append(max(0, c1[pid][1] - c0[pid][1]) / span)
            out.append(Rates(incoming, outgoing))
        return out
