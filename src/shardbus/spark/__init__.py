"""The PySpark connector: ``spark.read`` / ``readStream`` / ``write`` / ``writeStream`` with
``.format("shardbus")`` over PySpark's Python Data Source API (no JVM code).

    from shardbus.spark import register
    register(spark)
    df = (spark.readStream.format("shardbus")
          .option("connectionString", CONN).option("entityPath", "orders/Subscriptions/spark").load())

Installing shardbus also installs the top-level module ``pyspark_shardbus``, which PySpark registers by itself.
"""

from __future__ import annotations

from ..extras import MissingExtra

try:  # every module of the connector needs both
    import pyarrow  # noqa: F401
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
    from pyspark.sql.types import StructType
except ImportError as exc:
    raise MissingExtra('format("shardbus")', "spark", exc.name or "pyspark") from exc

from .columns import SCHEMA
from .options import Options
from .reader import BatchReader, StreamReader
from .writer import BatchWriter, StreamWriter

__all__ = ["SCHEMA", "ShardbusDataSource", "register"]


class ShardbusDataSource(DataSource):
    """``format("shardbus")``: options connectionString, entityPath (queue, topic for writes, or
    ``topic/Subscriptions/name`` for reads), startingOffsets, endingOffsets, maxRecordsPerTrigger,
    maxRecordsPerPartition, failOnDataLoss, timeout, pageSize, retries, idPrefix (see the README)."""

    @classmethod
    def name(cls) -> str:
        return "shardbus"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(Options.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(Options.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _refuse_overwrite(overwrite)
        return BatchWriter(Options.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _refuse_overwrite(overwrite)
        return StreamWriter(Options.parse(self.options), schema)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ValueError("shardbus entities can only be appended to: use mode('append').")


def register(spark: SparkSession) -> None:
    """Register ``format("shardbus")`` with a session (needed only where auto-registration is off)."""
    spark.dataSource.register(ShardbusDataSource)
