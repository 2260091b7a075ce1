"""The streaming job: orders from a partitioned topic subscription → totals per customer in Parquet, and alerts
for large orders into a session-aware queue (one session per customer).

    python job.py --connection-string "..." --output ./out [--checkpoint ./checkpoint] [--follow]

Exactly-once end to end: the source is replayable (a failed micro-batch is read again, and the broker forgets
the orders only after Spark committed the batch); each batch's totals are written to its own Parquet partition
(``batch_id=N``), overwritten whole when a batch is replayed; alerts carry a deterministic message id
(``alert-<order id>``), so the alerts queue's duplicate detection drops a replayed batch's second copies.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

ORDER = "order_id string, customer string, amount double"
ALERT_AMOUNT = 900.0


def spark_session() -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("shardbus-orders")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start(spark: SparkSession, connection_string: str, output: Path, checkpoint: Path, follow: bool = False):
    """Start the streaming query (availableNow unless ``follow``); returns it."""
    orders = (
        spark.readStream.format("shardbus")
        .option("connectionString", connection_string)
        .option("entityPath", "orders/Subscriptions/spark")
        .option("maxRecordsPerTrigger", "10000")
        .load()
        .select(F.from_json(F.col("body").cast("string"), ORDER).alias("order"), "enqueued_time")
        .select("order.*", "enqueued_time")
    )

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        totals = batch.groupBy("customer").agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
        totals.withColumn("batch_id", F.lit(batch_id)).write.mode("overwrite").partitionBy("batch_id").parquet(
            str(output / "totals")
        )
        alerts = batch.where(F.col("amount") >= ALERT_AMOUNT).select(
            F.to_json(F.struct("order_id", "customer", "amount")).alias("body"),
            F.col("customer").alias("session_id"),
            F.concat(F.lit("alert-"), F.col("order_id")).alias("message_id"),
            F.lit("large-order").alias("subject"),
        )
        (
            alerts.write.format("shardbus")
            .mode("append")
            .option("connectionString", connection_string)
            .option("entityPath", "alerts")
            .save()
        )
        batch.unpersist()

    writer = orders.writeStream.foreachBatch(each_batch).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(processingTime="2 seconds") if follow else writer.trigger(availableNow=True)
    return writer.start()


def totals(spark: SparkSession, output: Path) -> dict[str, float]:
    rows = spark.read.parquet(str(output / "totals")).groupBy("customer").agg(F.sum("amount").alias("amount"))
    return {r.customer: round(r.amount, 2) for r in rows.collect()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connection-string", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--follow", action="store_true", help="keep running (a trigger every 2 s) until Ctrl-C")
    args = parser.parse_args()
    spark = spark_session()
    query = start(
        spark, args.connection_string, args.output, args.checkpoint or args.output / "_checkpoint", args.follow
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    result = totals(spark, args.output)
    print(f"{sum(1 for _ in result)} customers, {round(sum(result.values()), 2)} in orders; totals in {args.output}")


if __name__ == "__main__":
    main()
