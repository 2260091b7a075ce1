"""Writing: batch (``df.write``) and streaming (``df.writeStream``) sends into a queue or topic.

Each task opens (or reuses, per process) one connection and sends its rows as pipelined transfers, one Arrow
batch at a time; ``write`` returns only once the broker has stored every row. Nothing is transactional: a failed
task may leave some rows sent. Exactly-once therefore comes from the broker's duplicate detection and ids that a
retry reproduces exactly: a row's own ``message_id``; else, for rows read from shardbus (they carry
``partition`` and ``sequence_number``), ``<idPrefix><partition>:<sequence_number>``; else the writer's
position: batch writes ``<job id>:<task partition>:<row ordinal>`` (the job id is drawn once, on the driver,
so every attempt of a task shares it), streams ``<query id>:<batch id>:<task partition>:<row ordinal>`` (the
query id survives restarts from the checkpoint, and a replayed batch keeps its id).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from .columns import check_writable, messages_of
from .options import Options, client_for, log

SEND_CHUNK = 2000  # rows per send() call: bounds memory, keeps the pipe full


@dataclass
class WriteResult(WriterCommitMessage):
    rows: int


def _positional_ids(prefix: str, start: int) -> Any:
    def ids(columns: dict[str, list[Any]], rows: int) -> list[str]:
        return [f"{prefix}{start + i}" for i in range(rows)]

    return ids


def _source_ids(id_prefix: str, fallback: Any) -> Any:
    """Ids from the shardbus position a row was read at, where the row has one."""

    def ids(columns: dict[str, list[Any]], rows: int) -> list[str]:
        seqs, parts = columns.get("sequence_number"), columns.get("partition")
        if seqs is None or parts is None:
            return fallback(columns, rows)
        backup = fallback(columns, rows)
        return [
            backup[i] if seqs[i] is None or parts[i] is None else f"{id_prefix}{parts[i]}:{seqs[i]}"
            for i in range(rows)
        ]

    return ids


def send_rows(options: Options, batches: Iterator[pa.RecordBatch], id_base: str) -> int:
    """Send every row; ``id_base`` prefixes positional ids (row ordinal appended)."""
    client = client_for(options)
    sent = 0
    for batch in batches:
        for offset in range(0, batch.num_rows, SEND_CHUNK):
            chunk = batch.slice(offset, SEND_CHUNK)
            default_ids = _source_ids(options.id_prefix, _positional_ids(id_base, sent))
            sent += client.send(options.entity_path, messages_of(chunk, default_ids))
    return sent


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Options, schema: StructType) -> None:
        check_writable(schema.fieldNames())
        self.options = options
        self.job_id = uuid.uuid4().hex  # drawn once on the driver: every task attempt sees the same

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        task = TaskContext.get()
        partition = task.partitionId() if task is not None else 0
        return WriteResult(send_rows(self.options, iterator, f"{self.job_id}:{partition}:"))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteResult))
        log.info("wrote %d rows to %s", rows, self.options.entity_path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("a write to %s failed; rows sent before the failure stay sent", self.options.entity_path)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options, schema: StructType) -> None:
        check_writable(schema.fieldNames())
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        task = TaskContext.get()
        query = batch = None
        partition = 0
        if task is not None:
            query = task.getLocalProperty("sql.streaming.queryId")
            batch = task.getLocalProperty("streaming.sql.batchId")
            partition = task.partitionId()
        return WriteResult(send_rows(self.options, iterator, f"{query}:{batch}:{partition}:"))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %s to %s failed; it is replayed with the same ids", batchId, self.options.entity_path)
