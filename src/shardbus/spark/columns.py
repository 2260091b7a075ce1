"""The connector's rows: the read schema, browse-range columns → Arrow record batches, and rows → messages.

Reads yield ``pyarrow.RecordBatch`` built column by column from the broker's columnar browse-range replies
(no per-row Python objects on the way to the JVM). The batch's Arrow schema must equal exactly what Spark
derives from the Spark schema (``to_arrow_schema(schema, timezone="UTC")``), nullability included.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..client import OutgoingMessage, body_bytes
from ..model.routing import PARTITION_SHIFT

SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("message_id", StringType()),
        StructField("partition_key", StringType()),
        StructField("session_id", StringType()),
        StructField("correlation_id", StringType()),
        StructField("subject", StringType()),
        StructField("content_type", StringType()),
        StructField("to", StringType()),
        StructField("reply_to", StringType()),
        StructField("application_properties", MapType(StringType(), StringType())),
        StructField("application_properties_json", StringType()),
        StructField("sequence_number", LongType()),
        StructField("partition", IntegerType()),
        StructField("enqueued_time", TimestampType()),
        StructField("expires_at", TimestampType()),
        StructField("delivery_count", IntegerType()),
    ]
)

MAX_TIMESTAMP_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: later expiry times mean "never" (null)


def arrow_schema(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


_NONE = type(None)


def _text(values: list[Any]) -> list[str | None]:
    if set(map(type, values)) <= {str, _NONE}:  # the usual case: no per-value work
        return values
    return [None if v is None else str(v) for v in values]


def _bodies(bodies: list[Any], types: list[int]) -> list[bytes]:
    if types.count(0) == len(types):  # every body one data section: bytes as they are
        return bodies
    return [body_bytes(x, y) for x, y in zip(bodies, types, strict=True)]


def _property_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def _json_value(value: Any) -> Any:
    """Application property values as JSON: numbers, booleans and strings as themselves; others tagged."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return {"$binary": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {"$timestamp": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    return str(value)


def _properties_map(values: list[Any]) -> list[list[tuple[str, str]] | None]:
    return [None if v is None else [(str(k), _property_text(x)) for k, x in v.items()] for v in values]


def _properties_json(values: list[Any]) -> list[str | None]:
    return [None if v is None else json.dumps({str(k): _json_value(x) for k, x in v.items()}) for v in values]


def _micros(values: list[Any]) -> pa.Array:
    """Milliseconds → microseconds, computed by Arrow; times past MAX_TIMESTAMP_MS (never) become null."""
    ms = pa.array(values, type=pa.int64())
    ms = pc.if_else(pc.greater(ms, _MAX_MS), _NULL_LONG, ms)
    return pc.multiply(ms, _THOUSAND)


def _longs(values: list[Any]) -> pa.Array:
    return pa.array(values, type=pa.int64())


def _partitions(sequence_numbers: list[Any]) -> pa.Array:
    return pc.shift_right(pa.array(sequence_numbers, type=pa.int64()), _SHIFT)


# Arrow scalars, not Python numbers: pyarrow.compute converts a Python number with an import attempt per call.
_MAX_MS = pa.scalar(MAX_TIMESTAMP_MS, pa.int64())
_NULL_LONG = pa.scalar(None, pa.int64())
_THOUSAND = pa.scalar(1000, pa.int64())
_SHIFT = pa.scalar(PARTITION_SHIFT, pa.int64())


# Spark column -> (the browse-range columns it needs, how to build its values from them: a list, or an Arrow
# array that to_record_batch casts to the column's type)
_BUILDERS: dict[str, tuple[tuple[str, ...], Callable[..., list[Any] | pa.Array]]] = {
    "body": (("body", "body-type"), _bodies),
    "message_id": (("message-id",), _text),
    "partition_key": (("partition-key",), _text),
    "session_id": (("session-id",), _text),
    "correlation_id": (("correlation-id",), _text),
    "subject": (("subject",), _text),
    "content_type": (("content-type",), _text),
    "to": (("to",), _text),
    "reply_to": (("reply-to",), _text),
    "application_properties": (("application-properties",), _properties_map),
    "application_properties_json": (("application-properties",), _properties_json),
    "sequence_number": (("sequence-number",), _longs),
    "partition": (("sequence-number",), _partitions),
    "enqueued_time": (("enqueued-time",), _micros),
    "expires_at": (("expires-at",), _micros),
    "delivery_count": (("delivery-count",), _longs),
}


def needed_columns(schema: StructType) -> list[str]:
    """The browse-range columns a read schema needs (sequence-number always: it drives paging)."""
    wanted = {"sequence-number"}
    for name in schema.fieldNames():
        if name not in _BUILDERS:
            raise ValueError(f"shardbus has no column '{name}'; columns are: {', '.join(SCHEMA.fieldNames())}")
        wanted.update(_BUILDERS[name][0])
    return sorted(wanted)


def to_record_batch(columns: dict[str, list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    arrays = []
    for field in schema:
        sources, build = _BUILDERS[field.name]
        values = build(*(columns[s] for s in sources))
        if isinstance(values, pa.Array):
            arrays.append(values if values.type == field.type else values.cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --------------------------------------------------------------------------------------------------- writing
WRITABLE = (
    "body",
    "message_id",
    "partition_key",
    "session_id",
    "correlation_id",
    "subject",
    "content_type",
    "to",
    "reply_to",
    "reply_to_session_id",
    "time_to_live_ms",
    "application_properties",
    "application_properties_json",
)


def check_writable(names: list[str]) -> None:
    if "body" not in names:
        raise ValueError("Writing to shardbus needs a 'body' column (binary or string).")


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$binary":
            return base64.b64decode(inner)
        if tag == "$timestamp":
            return dt.datetime.fromisoformat(inner)
        if tag == "$uuid":
            return uuid.UUID(inner)
    return value


def messages_of(
    batch: pa.RecordBatch, default_ids: Callable[[dict[str, list[Any]], int], list[str]]
) -> list[OutgoingMessage]:
    """One message per row; ``default_ids(columns, rows)`` gives the ids of rows whose message_id is null."""
    cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    n = batch.num_rows
    fallback: list[str] | None = None
    nothing = [None] * n
    bodies = cols["body"]
    ids = cols.get("message_id", nothing)
    props = cols.get("application_properties", nothing)
    props_json = cols.get("application_properties_json", nothing)
    plain = {k: cols[k] for k in WRITABLE[2:11] if k in cols}  # absent columns keep OutgoingMessage's None
    out = []
    for i in range(n):
        body = bodies[i]
        if isinstance(body, str):
            body = body.encode("utf-8")
        app: dict[str, Any] | None = None
        if props_json[i] is not None:
            app = {k: _from_json(v) for k, v in json.loads(props_json[i]).items()}
        elif props[i] is not None:
            app = dict(props[i])
        message_id = ids[i]
        if message_id is None:
            if fallback is None:
                fallback = default_ids(cols, n)
            message_id = fallback[i]
        fields = {k: v[i] for k, v in plain.items()}
        out.append(OutgoingMessage(body=body or b"", message_id=message_id, application_properties=app, **fields))
    return out
