"""spark.read and spark.readStream with format("shardbus") against a real broker."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import StreamingQueryException

from shardbus.client import OutgoingMessage
from shardbus.model.routing import decode_sequence_number
from support.faults import Faults


def read(spark, conn_str, entity, **options):
    reader = spark.read.format("shardbus").option("connectionString", conn_str).option("entityPath", entity)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def stream(spark, conn_str, entity, **options):
    reader = spark.readStream.format("shardbus").option("connectionString", conn_str).option("entityPath", entity)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_to_parquet(df, out, checkpoint):
    """One availableNow run of ``df`` into Parquet; returns the query (raises StreamingQueryException)."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    return query


def test_batch_read_is_a_snapshot_with_every_column(spark, ns, client, fill, conn_str, name):
    ns.create_queue(name, enable_partitioning=True)
    fill(name, 300)
    client.send(
        name,
        [
            OutgoingMessage(
                body=b"\x00\x01binary",
                message_id="special",
                partition_key="customer-7",
                correlation_id="corr",
                subject="order",
                content_type="application/octet-stream",
                to="dest",
                reply_to="back",
                application_properties={"flag": True, "count": 3, "price": 1.5, "who": "me"},
            ),
            OutgoingMessage(body=b"s", session_id="sess-1", message_id="sess"),
        ],
    )
    df = read(spark, conn_str, name)
    rows = {r.message_id: r for r in df.collect()}
    assert len(rows) == 302
    special = rows["special"]
    assert bytes(special.body) == b"\x00\x01binary"
    assert (special.partition_key, special.correlation_id, special.subject) == ("customer-7", "corr", "order")
    assert (special.content_type, special.to, special.reply_to) == ("application/octet-stream", "dest", "back")
    assert special.application_properties == {"flag": "true", "count": "3", "price": "1.5", "who": "me"}
    assert json.loads(special.application_properties_json) == {"flag": True, "count": 3, "price": 1.5, "who": "me"}
    assert special.partition == decode_sequence_number(special.sequence_number)[0]
    assert special.delivery_count == 0 and special.enqueued_time is not None and special.expires_at is None
    assert rows["sess"].session_id == "sess-1" and rows["sess"].partition_key is None
    assert bytes(rows["m5"].body) == b"body-m5" and rows["m5"].application_properties_json == '{"n": 5}'
    assert df.select("partition").distinct().count() > 1  # keyless sends spread over partitions
    # analytics on what is waiting, and nothing was consumed
    depth = {r.partition: r["count"] for r in df.groupBy("partition").count().collect()}
    assert sum(depth.values()) == 302
    assert ns.get_runtime_properties(name).active_message_count == 302


def test_batch_read_of_a_subscription_ranges_and_columns(spark, ns, client, fill, conn_str, name):
    ns.create_topic(name, enable_partitioning=True)
    ns.create_subscription(name, "all")
    fill(name, 200)
    path = f"{name}/Subscriptions/all"
    assert read(spark, conn_str, path).count() == 200
    # a column subset, and explicit offsets: only partition 0 from its start (-2), the rest from the end (-1)
    starting = {str(p): -1 for p in range(1, 16)} | {"0": -2}
    df = read(spark, conn_str, path, startingOffsets=json.dumps(starting))
    only = df.select("partition", "sequence_number").collect()
    assert only and {r.partition for r in only} == {0}
    assert read(spark, conn_str, path, maxRecordsPerPartition="3").count() == 200  # ranges split finely


def test_stream_resumes_from_checkpoint_and_commits_to_the_broker(spark, ns, client, fill, conn_str, name, tmp_path):
    ns.create_queue(name, enable_partitioning=True)
    fill(name, 2500)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = run_to_parquet(stream(spark, conn_str, name, maxRecordsPerTrigger="1000"), out, checkpoint)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [1000, 1000, 500]  # maxRecordsPerTrigger honoured, under availableNow too
    assert spark.read.parquet(str(out)).count() == 2500
    # Spark commits a batch to the source only when it plans the next one: the last 500 are still held
    assert ns.get_runtime_properties(name).active_message_count == 500

    fill(name, 300, start=2500)
    run_to_parquet(stream(spark, conn_str, name, maxRecordsPerTrigger="1000"), out, checkpoint)
    result = spark.read.parquet(str(out))
    assert result.count() == 2800 == result.select("message_id").distinct().count()
    assert ns.get_runtime_properties(name).active_message_count == 300


def test_failed_read_replays_with_no_loss_and_no_duplicates(spark, ns, client, fill, conn_str, name, tmp_path):
    ns.create_queue(name, enable_partitioning=True)
    ids = fill(name, 2000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    Faults(ns).fail_reads(name, 3, count=2)  # the task reading partition 3 fails, and so does its retry
    with pytest.raises(StreamingQueryException):
        run_to_parquet(stream(spark, conn_str, name, retries="0"), out, checkpoint)
    assert ns.get_runtime_properties(name).active_message_count == 2000  # nothing completed

    run_to_parquet(stream(spark, conn_str, name, retries="0"), out, checkpoint)  # replays batch 0
    rows = spark.read.parquet(str(out)).select("message_id", "partition", "sequence_number").collect()
    assert sorted(r.message_id for r in rows) == sorted(ids)
    assert len({(r.partition, r.sequence_number) for r in rows}) == 2000


def test_data_loss_is_detected_unless_allowed(spark, ns, client, fill, conn_str, name, tmp_path):
    ns.create_queue(name, enable_partitioning=False)
    fill(name, 50)
    df = stream(spark, conn_str, name, startingOffsets='{"0": 1}')
    client.complete_below(name, {0: 20})  # someone else consumed messages 1..19
    with pytest.raises(StreamingQueryException, match="were completed before this query read them"):
        run_to_parquet(df, tmp_path / "a", tmp_path / "ca")
    lenient = stream(spark, conn_str, name, startingOffsets='{"0": 1}', failOnDataLoss="false")
    run_to_parquet(lenient, tmp_path / "b", tmp_path / "cb")
    assert spark.read.parquet(str(tmp_path / "b")).count() == 31


def test_bad_options_fail_clearly(spark, conn_str):
    with pytest.raises(Exception, match="entityPath"):
        spark.read.format("shardbus").option("connectionString", conn_str).load().collect()
