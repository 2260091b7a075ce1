"""df.write and df.writeStream with format("shardbus"): mapping, retried tasks, broker → broker exactly-once."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from support.faults import Faults


def write(df, conn_str, entity, **options):
    writer = df.write.format("shardbus").mode("append").option("connectionString", conn_str)
    writer = writer.option("entityPath", entity)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()


def ids_in(ns, entity):
    return [str(m.message_id) for m in ns.browse(entity)]


def test_batch_write_maps_columns_to_message_fields(spark, ns, conn_str, name):
    ns.create_queue(name, enable_partitioning=True)
    rows = [
        ("order 1", "id-1", "customer-7", "order", {"region": "eu"}),
        ("order 2", None, None, None, None),
    ]
    schema = "body string, message_id string, partition_key string, subject string"
    df = spark.createDataFrame(rows, schema + ", application_properties map<string,string>")
    write(df, conn_str, name)
    got = {m.body: m for m in ns.browse(name)}
    assert set(got) == {b"order 1", b"order 2"}
    first = got[b"order 1"]
    assert (first.message_id, first.partition_key, first.subject) == ("id-1", "customer-7", "order")
    assert first.application_properties == {"region": "eu"}
    assert got[b"order 2"].message_id  # a derived id: every written message has one


def test_typed_properties_round_trip_through_the_json_column(spark, ns, client, fill, conn_str, name):
    ns.create_queue(name)
    ns.create_queue(name + "copy")
    from shardbus.client import OutgoingMessage

    client.send(name, [OutgoingMessage(body=b"x", application_properties={"n": 7, "ok": True, "f": 2.5})])
    df = spark.read.format("shardbus").option("connectionString", conn_str).option("entityPath", name).load()
    write(df.select("body", "application_properties_json"), conn_str, name + "copy")
    (copy,) = list(ns.browse(name + "copy"))
    assert copy.application_properties == {"n": 7, "ok": True, "f": 2.5}


@pytest.mark.parametrize("dedup", [True, False])
def test_retried_write_task_sends_no_duplicates(spark, ns, conn_str, name, dedup):
    entity = f"{name}{'d' if dedup else 'n'}"
    ns.create_queue(entity, enable_partitioning=True, requires_duplicate_detection=dedup)
    # Partition 3 refuses the first send that reaches it (the broker refuses the socket read's group, then that
    # send alone): its task fails after its other sends were stored, and Spark (local[2,2]) runs it again.
    Faults(ns).busy_sends(entity, 3, count=2)
    df = spark.range(0, 12000, numPartitions=2).selectExpr(
        "cast(id as string) as body", "cast(id % 64 as string) as partition_key"
    )
    write(df, conn_str, entity)
    bodies = [m.body for m in ns.browse(entity)]
    assert set(bodies) == {str(i).encode() for i in range(12000)}
    if dedup:
        assert len(bodies) == 12000  # the retry's resends were dropped as duplicates: exactly once
    else:
        assert len(bodies) > 12000  # what the failed attempt stored arrived twice: the retry really resent


def test_broker_to_broker_stream_is_exactly_once(spark, ns, client, conn_str, name, tmp_path):
    from shardbus.client import OutgoingMessage

    source, target = name + "src", name + "dst"
    ns.create_queue(source, enable_partitioning=True)
    ns.create_queue(target, enable_partitioning=True, requires_duplicate_detection=True)
    client.send(source, [OutgoingMessage(body=str(i).encode()) for i in range(3000)])  # no message ids

    def run():
        df = (
            spark.readStream.format("shardbus")
            .option("connectionString", conn_str)
            .option("entityPath", source)
            .load()
            .select("body", "partition", "sequence_number")
        )
        query = (
            df.writeStream.format("shardbus")
            .option("connectionString", conn_str)
            .option("entityPath", target)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()

    ns.faults.stop_partition(target, 5)  # sends keyed to partition 5 fail: the first run fails half-written
    with pytest.raises(StreamingQueryException):
        run()
    partial = len(list(ns.browse(target)))
    assert 0 < partial < 3000
    ns.faults.restore_partition(target, 5)
    run()  # replays the failed batch with the same ids: what already arrived is dropped
    bodies = [m.body for m in ns.browse(target)]
    assert len(bodies) == 3000 and set(bodies) == {str(i).encode() for i in range(3000)}
    assert all(str(m.message_id).count(":") == 1 for m in ns.browse(target))  # "<partition>:<sequence number>"


def test_overwrite_is_refused(spark, ns, conn_str, name):
    ns.create_queue(name)
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="append"):
        df.write.format("shardbus").mode("overwrite").option("connectionString", conn_str).option(
            "entityPath", name
        ).save()
