"""Reading: batch snapshots (``spark.read``) and replayable streams (``spark.readStream``) of one queue or
subscription, one Spark input partition per broker partition's sequence range.

Offsets are ``{"<partition>": next partition-relative sequence number}``. A micro-batch reads [start, end) of
every partition with the broker's non-destructive ``browse-range``; nothing is locked or removed, so a failed
batch re-reads the same rows. ``commit(end)`` (which Spark calls once the batch after it is planned) completes
everything below ``end`` with one cumulative ``complete-below`` per partition: from then on the broker forgets
those messages. A stream must therefore be the only consumer of its entity.

Where each part runs (SPARK_DATASOURCE.md): the stream reader's planning methods run in one long-lived Python
process per query, which may keep state (the availableNow target); ``read`` runs in executors on a pickled copy
that sees only what ``__init__`` set, so it reaches the broker through the per-process client pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ..client import PartitionOffsets
from ..model.routing import LOCAL_SEQUENCE_MASK
from .columns import arrow_schema, needed_columns, to_record_batch
from .options import Options, by_partition, canonical, client_for, log, parse_offsets, retrying


class DataLossError(RuntimeError):
    """Messages the query had not read yet were completed by someone else (see ``failOnDataLoss``)."""


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark input partition: partition-relative sequence numbers [start, end) of one broker partition."""

    partition: int
    start: int
    end: int


def split_ranges(start: dict[int, int], end: dict[int, int], max_span: int) -> list[RangePartition]:
    """Deterministic input partitions: each partition's range cut into pieces of at most ``max_span``."""
    out = []
    for p in sorted(end):
        lo, hi = start.get(p, end[p]), end[p]
        while lo < hi:
            out.append(RangePartition(p, lo, min(hi, lo + max_span)))
            lo += max_span
    return out


def read_range(options: Options, part: RangePartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """The messages of one input partition as Arrow record batches, page by page."""
    client = client_for(options)
    target = arrow_schema(schema)
    columns = needed_columns(schema)
    start = part.start
    first_page = True
    while start < part.end:
        page = retrying(
            options,
            f"reading partition {part.partition} of '{options.entity_path}'",
            lambda s=start: client.browse_range(
                options.entity_path, part.partition, s, part.end, options.page_size, columns
            ),
        )
        if first_page:
            first_page = False
            mark = int(page["mark"])
            if mark > part.start:
                message = (
                    f"Messages {part.start}..{mark - 1} of partition {part.partition} of '{options.entity_path}' "
                    "were completed before this query read them (another consumer or query?)."
                )
                if options.fail_on_data_loss:
                    raise DataLossError(message + " Set failOnDataLoss=false to skip them.")
                log.warning("%s Skipped (failOnDataLoss=false).", message)
        count = int(page["count"])
        if count:
            yield to_record_batch(page, target)
        if count < options.page_size:
            return
        start = (int(page["sequence-number"][-1]) & LOCAL_SEQUENCE_MASK) + 1


def _healthy(offsets: list[PartitionOffsets], entity: str) -> list[PartitionOffsets]:
    down = [o.partition for o in offsets if not o.healthy]
    if down:
        raise RuntimeError(
            f"Partitions {down} of '{entity}' are unavailable, so where to start reading is unknown; retry later."
        )
    return offsets


def resolve_offsets(spec: dict[int, int] | str, offsets: list[PartitionOffsets], earliest_default: bool) -> dict:
    """Concrete start/end sequence numbers per partition for ``earliest``/``latest``/JSON (-2, -1, missing)."""
    earliest = {o.partition: max(o.first, o.mark) for o in offsets}
    latest = {o.partition: o.end for o in offsets}
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return latest
    assert isinstance(spec, dict)
    out = {}
    for o in offsets:
        value = spec.get(o.partition, -2 if earliest_default else -1)
        out[o.partition] = earliest[o.partition] if value == -2 else latest[o.partition] if value == -1 else value
    return out


# ------------------------------------------------------------------------------------------------- batch
class BatchReader(DataSourceReader):
    """``spark.read``: a snapshot of what is waiting, read without consuming anything."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        needed_columns(schema)  # refuse unknown columns while planning

    def partitions(self) -> list[InputPartition]:
        o = self.options
        offsets = _healthy(client_for(o).range_offsets(o.entity_path), o.entity_path)
        start = resolve_offsets(parse_offsets(o.starting_offsets, "startingOffsets"), offsets, True)
        end = resolve_offsets(parse_offsets(o.ending_offsets, "endingOffsets"), offsets, False)
        return list(split_ranges(start, end, o.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition, self.schema)


# ------------------------------------------------------------------------------------------------ stream
def fair_shares(counts: dict[int, int], budget: int) -> dict[int, int]:
    """Split ``budget`` rows over partitions holding ``counts`` rows: equal shares, and what a small partition
    cannot use goes to the others (water filling)."""
    shares = {p: 0 for p in counts}
    left = budget
    open_ = sorted((c, p) for p, c in counts.items() if c > 0)
    while open_ and left > 0:
        each = max(1, left // len(open_))
        rest = []
        for c, p in open_:
            give = min(each, c - shares[p], left)
            shares[p] += give
            left -= give
            if shares[p] < c:
                rest.append((c, p))
        open_ = rest
    return shares


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: replayable micro-batches, completed in the broker when Spark commits them."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        needed_columns(schema)
        self._initial: dict[str, int] | None = None
        self._target: dict[int, int] | None = None  # availableNow: nothing past these ends
        self._latest: dict[str, int] | None = None

    def _offsets(self, count_from: dict[int, int] | None = None) -> list[PartitionOffsets]:
        o = self.options
        return retrying(o, "reading offsets", lambda: client_for(o).range_offsets(o.entity_path, count_from))

    def initialOffset(self) -> dict:
        if self._initial is None:  # Spark may ask twice for a new query: the answer must not change
            spec = parse_offsets(self.options.starting_offsets, "startingOffsets")
            self._initial = canonical(resolve_offsets(spec, _healthy(self._offsets(), self.options.entity_path), True))
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {o.partition: o.end for o in self._offsets() if o.healthy}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = by_partition(start)
        offsets = self._offsets(begin)
        ends: dict[int, int] = {}
        counts: dict[int, int] = {}
        for o in offsets:
            s = begin.get(o.partition, max(o.first, o.mark))
            if not o.healthy:  # nothing from it this time; its messages wait for a later batch
                ends[o.partition] = s
                continue
            e = o.end if self._target is None else min(o.end, self._target.get(o.partition, o.end))
            ends[o.partition] = max(s, e)
            counts[o.partition] = o.count if e > s else 0
        self._latest = canonical({o.partition: o.end if o.healthy else ends[o.partition] for o in offsets})
        if isinstance(limit, ReadMaxRows) and sum(counts.values()) > limit.max_rows:
            for p, share in fair_shares(counts, limit.max_rows).items():
                if share < counts[p]:
                    ends[p] = self._end_after(p, begin.get(p, ends[p]), ends[p], share)
        return canonical(ends)

    def _end_after(self, partition: int, start: int, end: int, rows: int) -> int:
        """Where a range from ``start`` holding ``rows`` readable messages ends."""
        if rows <= 0:
            return start
        o = self.options
        page = retrying(
            o,
            "sizing a micro-batch",
            lambda: client_for(o).browse_range(o.entity_path, partition, start, end, rows, ["sequence-number"]),
        )
        seqs = page["sequence-number"]
        return (int(seqs[-1]) & LOCAL_SEQUENCE_MASK) + 1 if len(seqs) >= rows else end

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return split_ranges(by_partition(start), by_partition(end), self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition, self.schema)

    def commit(self, end: dict) -> None:
        # Best effort: an exception here would kill the query, and the next commit covers this one anyway.
        o = self.options
        try:
            client_for(o).complete_below(o.entity_path, by_partition(end))
        except Exception as exc:
            log.warning("completing %s below %s failed (a later commit will cover it): %s", o.entity_path, end, exc)

    def stop(self) -> None:
        pass
